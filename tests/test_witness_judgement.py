"""The judgement of witness files (analysis.studies._witness_judgement), on the bundled witnesses and on copies edited by
hand: run-to-run first, then co-batching, and never GREEN (a witness records tokens, not logprob bits)."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import LAMBDA, V2_WITNESS, write_json

from analysis import judge, read_witnesses
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
    assert row["first_request"] == {"prompt_id": None, "c": None, "repeat": None, "slot": 1, "role": "ref #2", "at": 100, "max_ulp": None,
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
    assert row["first_request"]["c"] == 1 and row["first_request"]["at"] == 7


def test_the_cost_is_each_band_rate_over_c1s(tmp_path):
    data = _every_slot_agrees(V2)
    for band, rate in zip(data["bands"], (100.0, 80.0, 50.0, 25.0)):
        band["decode_tok_s"] = rate
    row = _row(tmp_path, data)
    assert [(c["c"], c["ratio"]) for c in row["cost_by_c"]] == [(4, 0.8), (8, 0.5), (16, 0.25)]
    assert row["cost"] == "c=4 0.80×, c=8 0.50×, c=16 0.25× of c=1’s decode rate per request (the server’s timings)"


@pytest.mark.parametrize("name", ["witness-v3.0-rule.json", "witness-variant-batched-prefill-0.json"])
def test_every_bundled_witness_is_judged_once(name):
    judgement = judge(read_witnesses(LAMBDA / name, progress=False))
    assert len(judgement) == 1 and judgement.verdict == "RED"
