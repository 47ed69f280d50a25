"""The judgement of witness files (analysis.studies._witness_judgement), on the bundled witnesses and on copies edited by
hand: run-to-run first, then co-batching, and never GREEN (a witness records tokens, not logprob bits)."""

from __future__ import annotations

import copy
import json

import polars as pl
import pytest
from conftest import LAMBDA, V2_WITNESS, write_json

from analysis import judge, read_witnesses
from analysis.studies._judgement_frame import SCHEMA
from analysis.studies._witness_judgement import judge_witnesses

V2 = json.loads(V2_WITNESS.read_text())


def _row(tmp_path, data, name="w.json") -> dict:
    judgement = judge_witnesses(read_witnesses(write_json(tmp_path / name, data), progress=False))
    assert len(judgement) == 1
    return judgement.frame.row(0, named=True)


def _every_slot_agrees(data) -> dict:
    data = copy.deepcopy(data)
    for band in data["bands"]:
        band["divergence_at"] = None
        for slot in band["slots"]:
            slot["agree_to"] = slot["completion_tokens"]
    data["reference"]["self_divergence_at"] = None
    return data


def test_the_bundled_witness_is_red_run_to_run_and_says_the_batches_part_earlier():
    # its m=1 references part at token 100 of 128; its batched requests part at token 3, before that
    row = judge(read_witnesses(V2_WITNESS, progress=False)).frame.row(0, named=True)
    assert (row["arm"], row["verdict"], row["cause"], row["alone"], row["alone_parted"]) == ("witness", "RED", "run-to-run", 2, 2)
    assert row["first"] == "the two m=1 references part at token 100 of 128"
    assert row["first_request"] == {"prompt_id": None, "c": None, "repeat": None, "slot": 1, "role": "ref #2", "position": 100, "max_ulp": None,
                                    "parted": "tokens"}
    assert row["reason"] == ("not reproducible alone (run to run): the two m=1 references part at token 100 of 128 (28 batched requests part "
                             "earlier than that, the first at c=4 token 3); batching is not judged until the server repeats itself alone")
    assert (row["requests"], row["divergent"], row["bits_unknown"], row["bands"], row["bands_unformed"]) == (28, 28, 0, 3, 0)


def test_a_witness_whose_references_agree_and_whose_batches_part_is_red_for_co_batching(tmp_path):
    data = copy.deepcopy(V2)
    data["reference"]["self_divergence_at"] = None
    for band in data["bands"]:
        if band["c"] == 1:
            band["divergence_at"] = None
            for slot in band["slots"]:
                slot["agree_to"] = slot["completion_tokens"]
    row = _row(tmp_path, data)
    assert (row["verdict"], row["cause"], row["divergent"], row["tokens_parted"]) == ("RED", "co-batching", 28, 28)
    assert row["first"] == "c=4 slot 0: its tokens part at token 3"
    assert row["reason"] == "28 of 28 batched requests part from m=1 in tokens; the first is c=4 slot 0: its tokens part at token 3"
    # 28 of 28: the bound is 1
    assert row["upper_bound"] == 1.0


def test_a_witness_in_which_nothing_parts_is_unverified_never_green(tmp_path):
    row = _row(tmp_path, _every_slot_agrees(V2))
    assert (row["verdict"], row["cause"], row["bits_unknown"]) == ("UNVERIFIED", "incomplete evidence", 28)
    assert row["reason"] == ("no request parts from m=1, but a witness records tokens, not logprob bits: 28 batched requests "
                             "token-identical to m=1, their bits unknown")
    assert row["next_step"] == "record logprobs: bia probe keeps every logprob's bits"
    # a band whose batch never formed whole, and a refused slot, are named too
    data = _every_slot_agrees(V2)
    data["bands"][2]["m_formed"] = 5
    data["bands"][3]["slots"][0]["refused"] = "timeout"
    row = _row(tmp_path, data, "w2.json")
    assert row["reason"].endswith("; 1 of 3 batched bands never seen formed at their c; 1 batched request(s) absent or refused")
    assert row["unformed"] == [{"prompt_id": None, "c": 8, "repeat": None, "widest_seen": 5}] and row["missing"] == 1


def test_a_request_alone_that_parts_is_run_to_run(tmp_path):
    data = _every_slot_agrees(V2)
    data["bands"][0]["slots"][0]["agree_to"] = 7
    row = _row(tmp_path, data)
    assert (row["verdict"], row["cause"], row["alone_parted"]) == ("RED", "run-to-run", 1)
    assert row["first"] == "the request sent alone (c=1 slot 0) parts from m=1 at token 7"
    assert row["first_request"]["c"] == 1 and row["first_request"]["position"] == 7


def test_the_cost_is_each_band_rate_over_c1s(tmp_path):
    data = _every_slot_agrees(V2)
    for band, rate in zip(data["bands"], (100.0, 80.0, 50.0, 25.0)):
        band["decode_tok_s"] = rate
    row = _row(tmp_path, data)
    assert [(c["c"], c["ratio"]) for c in row["cost_by_c"]] == [(4, 0.8), (8, 0.5), (16, 0.25)]
    assert row["cost"] == ("c=4 0.80×, c=8 0.50×, c=16 0.25× the per-request decode rate at c=1 (baseline 100 tok/s: the median of 1 "
                           "c=1 request, the witness’s recorded rates)")


@pytest.mark.parametrize("name", ["witness-v3.0-rule.json", "witness-variant-batched-prefill-0.json"])
def test_every_bundled_witness_is_judged_once(name):
    judgement = judge(read_witnesses(LAMBDA / name, progress=False))
    assert len(judgement) == 1 and judgement.verdict == "RED"


# --- witnesses written by hand: every field of the row -----------------------------------------------


def _slot(i, agree_to, completion_tokens=128, refused=None) -> dict:
    return {"i": i, "agree_to": agree_to, "completion_tokens": completion_tokens, "refused": refused}


def _witness(bands, *, span=None, tokens=128) -> dict:
    """V2's identity with the bands (c, m_formed, decode_tok_s, slots) given, and its m=1 references parting at ``span`` of ``tokens``."""
    data = copy.deepcopy(V2)
    data["bands"] = [{"c": c, "m_formed": m, "result": "PASS", "declared_min": 64, "divergence_at": None, "decode_tok_s": rate, "slots": slots}
                     for c, m, rate, slots in bands]
    data["reference"]["self_divergence_at"], data["reference"]["tokens"] = span, tokens
    return data


def test_a_hand_made_witness_at_its_own_target_gives_every_field(tmp_path):
    # c=1 (m_formed unknown: a band of one forms nothing), c=2 with m_formed unknown and slot 1 refused, c=4 formed; every slot
    # agrees with m=1 through m=1's 128 tokens, and slot 3's agreement was not recorded (not a parting)
    bands = [(1, None, 100.0, [_slot(0, 128)]), (2, None, 80.0, [_slot(0, 128), _slot(1, None, refused="timeout")]),
             (4, 4, 50.0, [_slot(0, 128), _slot(1, 128), _slot(2, 128), _slot(3, None)])]
    # the m=1 references agree through all 128 tokens (self_divergence_at 128 = their length): they do not part
    path = write_json(tmp_path / "w.json", _witness(bands, span=128))
    row = judge_witnesses(read_witnesses(path, progress=False), target_rate=0.05, confidence=0.9).frame.row(0, named=True)
    assert (row["verdict"], row["cause"], row["first"], row["first_request"]) == ("UNVERIFIED", "incomplete evidence", None, None)
    assert (row["run"], row["arm"], row["engine"]) == (str(path), "witness", "aprender (witness_version 2)")
    # 5 batched requests answered (the refused one is not), none parts; c=2's 2 and c=4's 4 were asked: 1 missing
    assert (row["requests"], row["divergent"], row["tokens_parted"], row["bits_only"], row["bits_unknown"]) == (5, 0, 0, 0, 5)
    assert (row["contexts"], row["prompts"]) == (5, 1)  # one prompt; each slot of each band its own context
    assert (row["alone"], row["alone_parted"], row["missing"], row["cs_missing"]) == (2, 0, 1, [])  # c=1's request and ref #2
    # c=2's band is batched and its width unknown, so never seen formed; c=1's needs no width
    assert (row["bands"], row["bands_unformed"]) == (2, 1)
    assert row["unformed"] == [{"prompt_id": None, "c": 2, "repeat": None, "widest_seen": None}]
    # 0 of 5 at 90%: 1 - 0.1^(1/5) = 0.36904; 1 - 0.1^(1/n) < 5% first at n = 45 (ln 0.1 / ln 0.95 = 44.9)
    assert row["upper_bound"] == pytest.approx(0.369043, abs=1e-6)
    assert (row["target_rate"], row["confidence"], row["requests_needed"]) == (0.05, 0.9, 45)
    assert (row["rule_of_three"], row["max_ulp"]) == (None, None)
    assert row["reason"] == ("no request parts from m=1, but a witness records tokens, not logprob bits: 5 batched requests token-identical "
                             "to m=1, their bits unknown; 1 of 2 batched bands never seen formed at their c; 1 batched request(s) absent or refused")
    assert row["evidence"] == "5 batched requests, 1 of 2 bands seen formed; tokens only (a witness keeps no logprobs)"
    # the band rates over c=1's 100 tok/s: 80 / 100 and 50 / 100, one rate a side
    assert row["cost_by_c"] == [{"c": 2, "ratio": 0.8, "low": None, "high": None, "origin": "witness", "base_rates": 1, "rates": 1,
                                 "median": 80.0, "base_median": 100.0},
                                {"c": 4, "ratio": 0.5, "low": None, "high": None, "origin": "witness", "base_rates": 1, "rates": 1,
                                 "median": 50.0, "base_median": 100.0}]
    assert row["cost"] == ("c=2 0.80×, c=4 0.50× the per-request decode rate at c=1 (baseline 100 tok/s: the median of 1 c=1 request, "
                           "the witness’s recorded rates)")
    assert row["next_step"] == "record logprobs: bia probe keeps every logprob's bits"


def test_a_slot_that_ends_while_its_reference_goes_on_has_parted_there(tmp_path):
    # c=4 slot 2 stopped at 100 tokens, agreeing with m=1 through all of them, while m=1 went on to 128: it took another token
    # (its end) at 100. Slot 1 ran on to 130 past m=1's end at 128: it parted at 128. Neither is a match.
    bands = [(1, 1, None, [_slot(0, 128)]), (4, 4, None, [_slot(0, 128), _slot(1, 128, 130), _slot(2, 100, 100), _slot(3, 128)])]
    row = _row(tmp_path, _witness(bands))
    assert (row["verdict"], row["cause"], row["divergent"], row["requests"]) == ("RED", "co-batching", 2, 4)
    assert row["first"] == "c=4 slot 1: its tokens part at token 128"
    ended = _row(tmp_path, _witness([(1, 1, None, [_slot(0, 128)]), (4, 4, None, [_slot(0, 128), _slot(1, 128), _slot(2, 100, 100),
                                                                                   _slot(3, 128)])]))
    assert (ended["verdict"], ended["first"]) == ("RED", "c=4 slot 2: its tokens part at token 100")


def test_the_first_batched_request_to_part_is_the_smallest_c_then_slot_whatever_the_file_order(tmp_path):
    # c=2's slots written slot 1 first, both parting; c=4 slot 0 parts earliest in tokens but at a larger c
    bands = [(1, 1, None, [_slot(0, 128)]), (2, 2, None, [_slot(1, 9), _slot(0, 7)]), (4, 4, None, [_slot(0, 2), *map(_slot, (1, 2, 3), [128] * 3)])]
    row = _row(tmp_path, _witness(bands))
    assert (row["verdict"], row["cause"], row["divergent"], row["requests"]) == ("RED", "co-batching", 3, 6)
    assert row["first_request"] == {"prompt_id": None, "c": 2, "repeat": None, "slot": 0, "role": "c=2", "position": 7, "max_ulp": None, "parted": "tokens"}
    assert row["first"] == "c=2 slot 0: its tokens part at token 7"
    assert row["next_step"] == "batch-invariant kernels or build, then record again"


def test_the_first_request_alone_to_part_is_named_with_its_slot(tmp_path):
    # two requests sent alone, both parting (slot 0 at 7, slot 1 at 9); the batched ones agree
    bands = [(1, 1, None, [_slot(0, 7), _slot(1, 9)]), (2, 2, None, [_slot(0, 128), _slot(1, 128)])]
    row = _row(tmp_path, _witness(bands))
    assert (row["verdict"], row["cause"], row["alone"], row["alone_parted"]) == ("RED", "run-to-run", 3, 2)
    assert row["first_request"] == {"prompt_id": None, "c": 1, "repeat": None, "slot": 0, "role": "c=1", "position": 7, "max_ulp": None, "parted": "tokens"}
    assert row["reason"] == ("not reproducible alone (run to run): the request sent alone (c=1 slot 0) parts from m=1 at token 7; "
                             "batching is not judged until the server repeats itself alone")
    assert row["next_step"] == "make it repeat itself alone (no prompt cache, deterministic kernels), then record again"


def test_references_that_part_count_only_the_batches_that_part_strictly_earlier(tmp_path):
    # the m=1 references part at token 10; c=2 slot 0 parts at 10 too (not earlier), c=2 slot 1 at 6 and c=4 slot 0 at 4 (earlier)
    bands = [(1, 1, None, [_slot(0, 128)]), (2, 2, None, [_slot(0, 10), _slot(1, 6)]), (4, 4, None, [_slot(0, 4), *map(_slot, (1, 2, 3), [128] * 3)])]
    row = _row(tmp_path, _witness(bands, span=10))
    assert (row["verdict"], row["cause"], row["alone"], row["alone_parted"], row["divergent"]) == ("RED", "run-to-run", 2, 1, 3)
    assert row["first_request"] == {"prompt_id": None, "c": None, "repeat": None, "slot": 1, "role": "ref #2", "position": 10, "max_ulp": None,
                                    "parted": "tokens"}
    assert row["reason"] == ("not reproducible alone (run to run): the two m=1 references part at token 10 of 128 (2 batched requests part "
                             "earlier than that, the first at c=2 token 6); batching is not judged until the server repeats itself alone")
    assert row["next_step"] == "make it repeat itself alone (no prompt cache, deterministic kernels), then record again"


def test_a_witness_with_no_bands_or_reference_length_and_a_set_with_no_witness(tmp_path):
    # nothing asked, nothing missing, nothing to bound; with no reference length there is no ref #2 to count as sent alone
    row = _row(tmp_path, _witness([], tokens=None))
    assert (row["verdict"], row["requests"], row["missing"], row["alone"], row["alone_parted"], row["upper_bound"]) == ("UNVERIFIED", 0, 0, 0, 0, None)
    assert (row["contexts"], row["prompts"]) == (0, 0)  # no batched request: no context, no prompt batched
    # a release marker carries no verdict: no row, the judgement's columns all the same
    empty = judge_witnesses(read_witnesses(LAMBDA / "marker@7e1b6e213b.json", progress=False))
    assert len(empty) == 0 and empty.frame.schema == pl.Schema(SCHEMA)


def test_the_card_of_a_witness_with_no_reference_length_reads(tmp_path):
    # the card computed its slots' lengths with fill_null(None), which polars refuses, as the judgement once did
    from analysis.views.html import witness_reviews

    data = _witness([(1, 1, None, [_slot(0, 40, 40)]), (4, 4, None, [_slot(i, 40, 40) for i in range(4)])], tokens=None)
    ws = read_witnesses(write_json(tmp_path / "w.json", data), progress=False)
    (card,) = witness_reviews(ws, epsilon=0.05)
    assert card.verdict == judge_witnesses(ws).verdict and card.headline.startswith(card.verdict)
