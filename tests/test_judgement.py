"""The judgement (analysis.judge, analysis.studies._judgement and its _judgement_* modules): each rule on request,
reference and band rows written by hand, and runs assembled from hand-written streams. Fast enough for mutation testing;
tests/test_judgement_surfaces.py reads whole runs and holds every surface to the same verdict."""

from __future__ import annotations

import copy
import json
import math
import re

import polars as pl
import pytest

from analysis import RunError, assemble_run, certificate, judge, write_run
from analysis.studies._certificate import certificate_document
from analysis.views.html import answer_html
from analysis.views.html.blocks import JUPYTER_STYLE
from analysis.studies import judge_runs
from analysis.studies._judgement import Subject, _alone_states, _formation, _states, judge_arm
from analysis.studies._judgement_cost import _with_measured_fix, cost_words
from analysis.studies._judgement_frame import SCHEMA, Judgement, worst

CP = {"target_rate": 0.01, "confidence": 0.95}
_SLOT = {"arm": pl.String, "prompt_id": pl.String, "c": pl.Int64, "repeat": pl.Int64, "slot": pl.Int64, "diverged": pl.Boolean,
         "divergence_at": pl.Int64, "bitwise_prefix": pl.Int64, "length": pl.Int64, "reference_length": pl.Int64, "max_ulp": pl.Int64,
         "decode_tok_s": pl.Float64, "decode_rate_origin": pl.String}
_MISSING = {"prompt_id": pl.String, "role": pl.String, "c": pl.Int64, "slot": pl.Int64, "repeat": pl.Int64, "arm": pl.String, "state": pl.String}


def _as_evidence(rows: pl.DataFrame) -> pl.DataFrame:
    """Rows told in the comparison's words (``diverged``, ``divergence_at``, ``bitwise_prefix``, ``max_ulp``: null when no
    logprob was compared) with the evidence columns the judgement counts, as the slot table derives them."""
    common = pl.min_horizontal(pl.col("length"), pl.col("reference_length"))
    recorded = pl.col("max_ulp").is_not_null()
    return rows.with_columns(
        has_reference=pl.lit(True),
        parted_at=pl.when(pl.col("diverged")).then(pl.col("divergence_at")),
        token_unknown_at=pl.lit(None, pl.Int64),
        bits_known=pl.when(recorded).then(common).otherwise(0),
        bits_differ_at=pl.when(recorded & ~pl.col("diverged") & (pl.col("bitwise_prefix") < common)).then(pl.col("bitwise_prefix")),
        bits_unknown_at=pl.when(~recorded & (common > 0)).then(pl.lit(0, pl.Int64)),
        text_same=pl.lit(None, pl.Boolean),
    )


def _slots(n: int, *, arm: str = "copies", c: int = 4, **changes) -> pl.DataFrame:
    """n requests of prompt p at c, each 5 tokens bit-identical to m=1 (5 tokens long too); ``changes`` maps a column to
    {row: value}."""
    rows = {"arm": [arm] * n, "prompt_id": ["p"] * n, "c": [c] * n, "repeat": [k // c for k in range(n)], "slot": [k % c for k in range(n)],
            "diverged": [False] * n, "divergence_at": [None] * n, "bitwise_prefix": [5] * n, "length": [5] * n, "reference_length": [5] * n,
            "max_ulp": [0] * n, "decode_tok_s": [None] * n, "decode_rate_origin": [None] * n}
    for column, values in changes.items():
        for row, value in values.items():
            rows[column][row] = value
    return _as_evidence(pl.DataFrame(rows, schema=_SLOT))


def _refs(**changes) -> pl.DataFrame:
    """Prompt p's ref #2 against its ref #1: bit-identical, 5 tokens, unless ``changes`` says otherwise."""
    row = {"prompt_id": "p", "diverged": False, "divergence_at": None, "bitwise_prefix": 5, "length": 5, "reference_length": 5, "max_ulp": 0}
    return _as_evidence(pl.DataFrame([row | changes], schema={k: _SLOT.get(k, pl.Boolean) for k in row}))


def _bands(slots: pl.DataFrame, **widths) -> pl.DataFrame:
    """Each band of ``slots`` seen formed at its c by the log, unless ``widths`` maps its repeat to (m_formed, width_evidence)."""
    bands = slots.select("arm", "prompt_id", "c", "repeat").unique(maintain_order=True)
    formed = [widths.get(f"r{r}", (c, "log")) for c, r in bands.select("c", "repeat").rows()]
    return bands.with_columns(pl.Series("m_formed", [m for m, _ in formed], dtype=pl.Int64),
                              pl.Series("width_evidence", [e for _, e in formed], dtype=pl.String))


def _judge(slots: pl.DataFrame, *, refs: pl.DataFrame | None = None, bands: pl.DataFrame | None = None, ladder=(1, 4), missing: int = 0,
           subject: Subject | None = None, arm: str = "copies", target_rate: float = 0.01, confidence: float = 0.95, needed: int = 299) -> dict:
    states = _states(slots)
    subject = subject or Subject("hand", {}, list(ladder))
    gone = pl.DataFrame([{"prompt_id": "p", "role": "band", "c": 4, "slot": k, "repeat": 9, "arm": arm, "state": "not sent"}
                         for k in range(missing)], schema=_MISSING)
    return judge_arm(subject, arm, states.filter(pl.col("arm") == arm), _alone_states(_refs() if refs is None else refs, states),
                     _formation(_bands(slots) if bands is None else bands).filter(pl.col("arm") == arm), gone, target_rate, confidence, needed)


# --- the bound: only batched requests count ----------------------------------------------------------


def test_zero_divergences_in_299_batched_requests_is_green_at_one_percent_and_298_is_amber():
    # 0 of 299: the one-sided 95% bound 1 - 0.05^(1/299) = 0.00996915 < 1% (worked out in test_bounds.py)
    alone = _slots(3, c=1)
    green = _judge(pl.concat([alone, _slots(299)]))
    assert green["verdict"] == "GREEN" and green["requests"] == 299 and green["divergent"] == 0 and green["cause"] is None
    assert (green["alone"], green["alone_parted"]) == (4, 0)  # ref #2 and the three c=1 requests: run-to-run evidence, not batches
    assert green["upper_bound"] == pytest.approx(0.00996915, abs=2e-8)
    assert green["rule_of_three"] == pytest.approx(3 / 299)
    assert green["reason"] == ("0 of 299 batched requests part from m=1, every band seen formed; the 95% upper bound on the divergence "
                               "rate is 0.997%, below the 1% target")
    assert green["next_step"] == "none: keep it in CI with bia certify"
    # 0 of 298 batched, however many c=1 requests stand beside them: 0.01000243, not below 1%; one more would do
    amber = _judge(pl.concat([_slots(400, c=1), _slots(298)]))
    assert amber["verdict"] == "AMBER" and amber["requests"] == 298 and amber["upper_bound"] == pytest.approx(0.01000243, abs=2e-8)
    assert amber["reason"].endswith("is 1%, not below the 1% target: 299 batched requests would do (1 more)")
    assert (amber["first"], amber["first_request"], amber["unformed"], amber["bands_unformed"]) == (None, None, [], 0)


def test_c1_requests_alone_never_certify_at_any_target():
    # a run of m=1 references and c=1 requests only: no batched request, whatever the target
    for ladder in ((1,), (1, 4, 8, 16)):
        row = _judge(_slots(299, c=1), ladder=ladder, target_rate=0.9, needed=3)
        assert row["verdict"] == "UNVERIFIED" and row["requests"] == 0 and row["upper_bound"] is None
    assert _judge(_slots(299, c=1), ladder=(1,))["reason"] == ("no request parts from m=1, but its ladder holds no batch size above 1: "
                                                                 "nothing was batched")
    cut = _judge(_slots(299, c=1), ladder=(1, 4, 8, 16))
    assert cut["reason"] == "no request parts from m=1, but no batched request came back (c > 1): nothing to compare with m=1"
    assert cut["cs_missing"] == [4, 8, 16]


def test_a_missing_c_or_request_is_unverified_and_says_how_to_finish():
    # the ladder asks 1, 4 and 8; only c=4 came back
    row = _judge(_slots(8), ladder=(1, 4, 8), target_rate=0.9, needed=3)
    assert (row["verdict"], row["cs_missing"]) == ("UNVERIFIED", [8])
    assert row["reason"] == "no request parts from m=1, but no batched request at c=8 of its ladder" and row["cause"] == "incomplete evidence"
    subject = Subject("runs/x", {"url": "http://127.0.0.1:8080/v1/chat/completions"}, [1, 4])
    gone = _judge(_slots(8), subject=subject, missing=3, target_rate=0.9, needed=3)
    assert gone["verdict"] == "UNVERIFIED" and gone["missing"] == 3
    assert gone["reason"] == "no request parts from m=1, but 3 batched request(s) of its plan never came back"
    assert gone["next_step"] == "finish the run: bia probe http://127.0.0.1:8080 -o runs/x --resume"
    stopped = _judge(_slots(8), subject=Subject("x", {"complete": False}, [1, 4]), target_rate=0.9, needed=3)
    assert stopped["verdict"] == "UNVERIFIED" and stopped["reason"].endswith("the run did not finish")
    # each gap named, one after the other
    both = _judge(_slots(4, max_ulp={0: None}), subject=Subject("x", {"complete": False}, [1, 4]))
    assert both["reason"] == ("no request parts from m=1, but the run did not finish; 1 of 4 batched requests have their bits unknown "
                              "(a logprob not recorded, or null, NaN or infinite, on either side)")


# --- RED: alone first, then batched ---------------------------------------------------------------


def test_references_that_differ_are_red_run_to_run_and_name_no_batch():
    # every batched request bit-identical, but ref #2 differs from ref #1 in bits from token 0 (26 ULP): not reproducible alone
    refs = _refs(bitwise_prefix=0, max_ulp=26)
    row = _judge(pl.concat([_slots(2, c=1), _slots(8, bitwise_prefix={3: 2})]), refs=refs)
    assert (row["verdict"], row["cause"], row["alone_parted"], row["alone"]) == ("RED", "run-to-run", 1, 3)
    assert row["first_request"] == {"prompt_id": "p", "c": None, "repeat": None, "slot": 1, "role": "ref #2", "position": 0, "max_ulp": 26,
                                    "parted": "bits"}
    assert row["first"] == "p ref #2, sent alone: its logprob bits differ from ref #1 from token 0 (up to 26 ULP)"
    assert row["reason"] == ("not reproducible alone (run to run): 1 of 3 requests sent alone part from ref #1 of their prompt, the first "
                             "p ref #2, sent alone: its logprob bits differ from ref #1 from token 0 (up to 26 ULP); batching is not "
                             "judged until the server repeats itself alone")
    # ref #2 and the c=1 request of repeat 1 both part: ref #2, told of first, is named
    both = _judge(pl.concat([_slots(2, c=1, diverged={1: True}, divergence_at={1: 3}), _slots(8)]), refs=refs)
    assert (both["alone_parted"], both["first_request"]["role"]) == (2, "ref #2")
    # the batched request that parted is still counted, but not named
    assert row["divergent"] == 1 and "c=4" not in row["first"]
    # the cache counters grew while it ran: the cause is the prompt cache, and the step turns it off
    cached = Subject("hand", {"identity": {"engine": "llama.cpp server"}}, [1, 4], cache_served=lambda: True)
    row = _judge(_slots(8), refs=refs, subject=cached)
    assert (row["cause"], row["next_step"]) == ("prompt cache", "turn the cache off: llama-server --no-cache-prompt, then probe again")


def test_a_request_alone_that_differs_is_run_to_run_not_a_batch_of_one():
    row = _judge(pl.concat([_slots(2, c=1, diverged={1: True}, divergence_at={1: 3}), _slots(8)]))
    assert (row["verdict"], row["cause"], row["alone_parted"]) == ("RED", "run-to-run", 1)
    assert row["first"] == "p sent alone (copies c=1 repeat 1 slot 0): its tokens part at token 3"
    assert row["first_request"]["c"] == 1 and row["first_request"]["parted"] == "tokens"


def test_one_bit_difference_in_a_batch_is_red_and_named():
    # 8 requests at c=4 in two repeats; request 6 (repeat 1, slot 2) has the same tokens, its logprob bits differ from token 3
    red = _judge(_slots(8, bitwise_prefix={6: 3}, max_ulp={6: 2}))
    assert (red["verdict"], red["cause"]) == ("RED", "co-batching")
    assert (red["divergent"], red["tokens_parted"], red["bits_only"]) == (1, 0, 1)
    assert red["first_request"] == {"prompt_id": "p", "c": 4, "repeat": 1, "slot": 2, "role": "copies c=4", "position": 3, "max_ulp": 2, "parted": "bits"}
    assert red["reason"] == ("1 of 8 batched requests part from m=1 (0 in tokens, 1 only in bits); the first is p c=4 repeat 1 slot 2: "
                             "its logprob bits differ from ref #1 from token 3 (up to 2 ULP)")
    # 1 of 8 bounds the rate at the 95% quantile of Beta(2, 7): P(0 or 1 of 8 part) = (1-p)^8 + 8p(1-p)^7 = 0.05 at p = 0.4707
    assert red["upper_bound"] == pytest.approx(0.4707, abs=1e-4) and red["rule_of_three"] is None
    assert red["max_ulp"] == 2
    # the mixed arm's cause is mixing, and each engine's step is its own batch-invariant setting
    assert _judge(_slots(4, arm="mixed", bitwise_prefix={0: 1}), arm="mixed")["cause"] == "mixing"
    vllm = _judge(_slots(4, bitwise_prefix={0: 1}), subject=Subject("v", {"identity": {"engine": "vLLM"}}, [1, 4]))
    assert vllm["next_step"] == "batch-invariant kernels: VLLM_BATCH_INVARIANT=1"


def test_the_first_request_is_the_smallest_c_whatever_the_row_order():
    # c=4 rows first; the c=2 request parts in bits (5 ULP before them) and is still the first
    slots = pl.concat([_slots(4, diverged={3: True}, divergence_at={3: 0}), _slots(2, c=2, bitwise_prefix={1: 2}, max_ulp={1: 5})])
    red = _judge(slots, ladder=(1, 2, 4))
    assert red["first_request"]["c"] == 2 and red["first_request"]["slot"] == 1 and red["first_request"]["parted"] == "bits"
    assert red["first"] == "p c=2 repeat 0 slot 1: its logprob bits differ from ref #1 from token 2 (up to 5 ULP)"
    assert (red["divergent"], red["tokens_parted"], red["bits_only"]) == (2, 1, 1)


def test_a_stream_that_ends_early_parts_in_tokens_where_it_ends():
    red = _judge(_slots(4, length={2: 4}, bitwise_prefix={2: 4}))
    assert (red["verdict"], red["tokens_parted"], red["bits_only"]) == ("RED", 1, 0)
    assert red["first_request"]["slot"] == 2 and red["first_request"]["position"] == 4


# --- UNVERIFIED: formed, recorded ----------------------------------------------------------------------


def test_a_band_never_seen_formed_is_unverified():
    slots = _slots(8)
    unknown = _judge(slots, bands=_bands(slots, r1=(None, None)))
    assert unknown["verdict"] == "UNVERIFIED" and unknown["bands_unformed"] == 1
    assert unknown["unformed"] == [{"prompt_id": "p", "c": 4, "repeat": 1, "widest_seen": None}]
    assert unknown["reason"] == ("no request parts from m=1, but 1 of 2 batched bands never seen formed at their c (the first p c=4 repeat 1: "
                                 "no width seen)")
    assert unknown["next_step"] == "raise the batch limit so each c forms: a batch limit of 4"
    narrow = _judge(slots, bands=_bands(slots, r1=(3, "metrics")))
    assert narrow["verdict"] == "UNVERIFIED" and narrow["unformed"][0]["widest_seen"] == 3
    assert narrow["reason"].endswith("(the first p c=4 repeat 1: the widest seen m=3)")
    # the gauge saw 1, the streams 4 at once: the strongest evidence present (the server's gauge) did not see it formed
    gauge = _judge(slots, bands=_bands(slots, r1=(1, "metrics; streams 4")))
    assert gauge["verdict"] == "UNVERIFIED" and "contradicts" not in gauge["reason"]  # a gauge is a lower bound: no contradiction
    # the server's own per-step log says m=1 where the streams say 4: evidence that contradicts itself, named
    log = _judge(slots, bands=_bands(slots, r1=(1, "log; streams 4")))
    assert log["verdict"] == "UNVERIFIED" and log["reason"].endswith(
        "the width evidence of 1 band(s) contradicts itself (the first p c=4 repeat 1: the server's own record says m=1, "
        "weaker evidence (log; streams 4) says more)")
    # a band of one needs no width evidence: there is no batch to form
    both = pl.concat([_slots(3, c=1), slots])
    assert _judge(both, bands=_bands(both, r0=(4, "log"), r1=(4, "log"), r2=(None, None)))["verdict"] == "AMBER"


def test_a_divergence_outranks_an_unformed_band_and_unknown_bits_are_unverified():
    slots = _slots(8, diverged={0: True}, divergence_at={0: 1})
    assert _judge(slots, bands=_bands(slots, r1=(None, None)))["verdict"] == "RED"
    unknown = _judge(_slots(4, max_ulp={0: None, 3: None}))
    assert unknown["verdict"] == "UNVERIFIED" and unknown["bits_unknown"] == 2
    # a stream whose logprobs were dropped compares no step bit for bit: its prefix stops at 0, its bits are unknown, not parted
    dropped = _judge(_slots(4, bitwise_prefix={1: 0}, max_ulp={1: None}))
    assert (dropped["verdict"], dropped["bits_unknown"], dropped["divergent"]) == ("UNVERIFIED", 1, 0)
    assert unknown["reason"] == ("no request parts from m=1, but 2 of 4 batched requests have their bits unknown (a logprob not recorded, "
                                 "or null, NaN or infinite, on either side)")


def test_edges_of_the_request_states_and_band_formation():
    states = _states(_slots(5, length={1: 0, 2: 5}, bitwise_prefix={1: 0, 2: None}, max_ulp={1: None, 2: None},
                            reference_length={4: None})).select("state", "tokens_parted", "bits_parted", "bits_unknown", "position").rows()
    # empty where m=1 has 5, and no m=1 length: nothing compared, evidence missing (never a match, never a part); bits unknown
    assert states == [("identical", False, False, False, None), ("no evidence", False, False, False, None),
                      ("bits unknown", False, False, True, None), ("identical", False, False, False, None),
                      ("no evidence", False, False, False, None)]
    # a stream as empty as m=1's is no evidence either; a one-token stream without its logprob has its bits unknown
    short = _states(_slots(2, length={0: 0, 1: 1}, reference_length={0: 0, 1: 1}, bitwise_prefix={0: 0, 1: 0}, max_ulp={0: None, 1: None}))
    assert short.select("state", "no_evidence", "bits_unknown").rows() == [("no evidence", True, False), ("bits unknown", False, True)]
    longer = _states(_slots(1, length={0: 6}, bitwise_prefix={0: 5}))
    assert longer.select("tokens_parted", "position").row(0) == (True, 5)  # parts where m=1 ended, not at its own end
    # no tokens recorded on either side (logprobs: null): the message texts decide, and equal texts leave the bits unknown
    texts = _states(_slots(3, length={0: 0, 1: 0, 2: 0}, reference_length={0: 0, 1: 0, 2: 0}).with_columns(
        text_same=pl.Series([False, True, None], dtype=pl.Boolean)))
    assert texts.select("state", "position").rows() == [("tokens", None), ("bits unknown", None), ("no evidence", None)]
    # a prompt without ref #1 is unjudged; a token that cannot be compared (no id, no text in common) leaves it unknown
    edges = _states(_slots(3).with_columns(has_reference=pl.Series([False, True, True]), token_unknown_at=pl.Series([None, 2, None]),
                                           bits_differ_at=pl.Series([None, 1, 4]), bits_unknown_at=pl.Series([None, None, 2])))
    # a recorded bit difference is RED even where another token's bits are unknown; an unknown token alone is not
    assert edges.select("state").to_series().to_list() == ["no reference", "bits", "bits"]
    assert _states(_slots(1).with_columns(token_unknown_at=pl.lit(2, pl.Int64))).select("state").item() == "bits unknown"
    bands = pl.DataFrame({"prompt_id": ["p"] * 5, "c": [4, 4, 8, 1, 4], "repeat": [0, 1, 0, 0, 2], "m_formed": [2, None, 8, None, 4],
                          "width_evidence": ["log; metrics 3; streams 4", None, "log", None, "metrics; streams 4"]})
    # the strongest evidence decides: the log's 2 is not c=4, whatever the streams say (and they contradict it)
    assert _formation(bands).select("widest_seen", "formed", "contradicted").rows() == [
        (2, False, True), (None, False, False), (8, True, False), (None, True, False), (4, True, False)]


def test_the_unformed_bands_are_listed_by_c_then_prompt_then_repeat():
    # four batched bands never seen formed, given out of order: c=4 p repeat 1, c=8 p repeat 0, c=4 q repeat 0, c=4 p repeat 0
    slots = pl.concat([_slots(8), _slots(8, c=8), _slots(4).with_columns(prompt_id=pl.lit("q"))])
    bands = pl.DataFrame({"arm": ["copies"] * 4, "prompt_id": ["p", "p", "q", "p"], "c": [4, 8, 4, 4], "repeat": [1, 0, 0, 0],
                          "m_formed": [None] * 4, "width_evidence": [None] * 4}, schema_overrides={"m_formed": pl.Int64, "width_evidence": pl.String})
    row = _judge(slots, bands=bands, ladder=(1, 4, 8))
    assert [(band["c"], band["prompt_id"], band["repeat"]) for band in row["unformed"]] == [(4, "p", 0), (4, "p", 1), (4, "q", 0), (8, "p", 0)]
    assert row["reason"] == ("no request parts from m=1, but 4 of 4 batched bands never seen formed at their c (the first p c=4 repeat 0: "
                             "no width seen)")


def test_every_c_missing_from_the_ladder_is_named():
    row = _judge(_slots(8), ladder=(1, 4, 8, 16))  # only c=4 came back
    assert row["reason"] == "no request parts from m=1, but no batched request at c=8, 16 of its ladder"


def test_references_that_part_in_tokens_and_a_request_alone_that_parts_in_bits_are_run_to_run():
    # ref #2 takes another token at token 2 (its bits the same until then)
    tokens = _judge(_slots(8), refs=_refs(diverged=True, divergence_at=2, bitwise_prefix=2, max_ulp=None))
    assert (tokens["verdict"], tokens["cause"], tokens["alone_parted"]) == ("RED", "run-to-run", 1)
    assert tokens["first"] == "p ref #2, sent alone: its tokens part at token 2"
    # the c=1 request of repeat 1 has m=1's tokens, its logprob bits differ from token 3 (4 ULP)
    bits = _judge(pl.concat([_slots(2, c=1, bitwise_prefix={1: 3}, max_ulp={1: 4}), _slots(8)]))
    assert (bits["verdict"], bits["cause"], bits["alone_parted"], bits["alone"]) == ("RED", "run-to-run", 1, 3)
    assert bits["first_request"] == {"prompt_id": "p", "c": 1, "repeat": 1, "slot": 0, "role": "copies c=1", "position": 3, "max_ulp": 4, "parted": "bits"}
    assert bits["first"] == "p sent alone (copies c=1 repeat 1 slot 0): its logprob bits differ from ref #1 from token 3 (up to 4 ULP)"
    assert bits["bands"] == 2  # c=4's two repeats; the c=1 bands batch nothing


# --- cost, schema, documents -------------------------------------------------------------------------


def test_the_cost_compares_rates_of_one_origin_with_an_interval_from_three_each():
    rates = {"decode_tok_s": {0: 100.0, 1: 100.0, 2: 100.0}, "decode_rate_origin": {0: "stream", 1: "stream", 2: "stream"}}
    alone = _slots(3, c=1, **rates)
    batched = _slots(4, decode_tok_s={0: 50.0, 1: 50.0, 2: 50.0, 3: 60.0}, decode_rate_origin={k: "stream" for k in range(4)})
    row = _judge(pl.concat([alone, batched]))
    # medians 50 / 100; a resample of the three 100s has median 100, one of (50, 50, 50, 60) median 50, 55 or 60
    assert row["cost_by_c"][0]["ratio"] == 0.5 and row["cost_by_c"][0]["origin"] == "streams"
    assert 0.5 <= row["cost_by_c"][0]["low"] <= row["cost_by_c"][0]["high"] <= 0.6
    # the batched rates from the server's timing and c=1's from streams: no ratio across origins
    server = batched.with_columns(decode_rate_origin=pl.lit("server: t_sum / t_count, band mean"))
    assert _judge(pl.concat([alone, server]))["cost_by_c"] == [] and _judge(pl.concat([alone, server]))["cost"] is None
    # two rates a side: the ratio with no interval
    two = _judge(pl.concat([alone.head(2), batched.head(2)]))
    assert two["cost_by_c"][0] == {"c": 4, "ratio": 0.5, "low": None, "high": None, "origin": "streams", "base_rates": 2, "rates": 2,
                                   "median": 50.0, "base_median": 100.0}
    assert cost_words(two["cost_by_c"]) == (
        "c=4 0.50× the per-request decode rate at c=1 (baseline 100 tok/s: the median of 2 c=1 requests, streams’ timings)") == two["cost"]
    # an interval where there is one; the one baseline named once, its rate rounded for people
    base = {"origin": "server", "base_median": 2577.4, "base_rates": 1}
    assert cost_words([{"c": 4, "ratio": 0.8, "low": 0.7, "high": 0.9, **base}, {"c": 8, "ratio": 0.5, **base}]) == (
        "c=4 0.80× (0.70–0.90), c=8 0.50× the per-request decode rate at c=1 (baseline 2,577 tok/s: the median of 1 c=1 request, "
        "the server’s timings)")


def test_the_cost_skips_a_c_with_no_rates_of_c1s_origin_and_unmeasured_rates():
    # c=1: 80 tok/s and an unmeasured 0 (left out); c=2: 0.5 and 0.25 tok/s, slow but measured; c=4 timed by the server only
    # (c=1 by the streams: no ratio, skipped); c=8: 40 tok/s
    stream, server = "stream", "server: t_sum / t_count, band mean"
    slots = pl.concat([_slots(2, c=1, decode_tok_s={0: 80.0, 1: 0.0}, decode_rate_origin={0: stream, 1: stream}),
                       _slots(2, c=2, decode_tok_s={0: 0.5, 1: 0.25}, decode_rate_origin={0: stream, 1: stream}),
                       _slots(4, decode_tok_s={0: 60.0}, decode_rate_origin={0: server}),
                       _slots(8, c=8, decode_tok_s={0: 40.0}, decode_rate_origin={0: stream})])
    row = _judge(slots, ladder=(1, 2, 4, 8))
    # median(0.5, 0.25) / 80 = 0.375 / 80 = 0.0046875; 40 / 80 = 0.5
    assert row["cost_by_c"] == [{"c": 2, "ratio": 0.0046875, "low": None, "high": None, "origin": "streams", "base_rates": 1, "rates": 2,
                                 "median": 0.375, "base_median": 80.0},
                                {"c": 8, "ratio": 0.5, "low": None, "high": None, "origin": "streams", "base_rates": 1, "rates": 1,
                                 "median": 40.0, "base_median": 80.0}]


def test_a_red_torch_run_is_told_what_row_invariant_cost_beside_it():
    from analysis.studies._judgement_cost import _with_measured_fix

    def row(run, verdict, step, base, medians):
        cost = [{"c": c, "ratio": m / base, "low": None, "high": None, "origin": "streams", "base_rates": 2, "rates": 2, "median": m,
                 "base_median": base} for c, m in medians.items()]
        return _judge(_slots(4)) | {"run": run, "verdict": verdict, "next_step": step, "cost_by_c": cost}

    red = row("runs/x/default", "RED", "batch-invariant kernels: bia experiment --modes row-invariant", 100.0, {4: 80.0, 8: 50.0})
    fix = row("runs/x/row-invariant", "AMBER", "more", 107.0, {4: 88.0, 8: 60.0})
    elsewhere = row("runs/y/default", "RED", red["next_step"], 100.0, {4: 80.0})
    frame = _with_measured_fix(pl.DataFrame([red, fix, elsewhere], schema=SCHEMA, orient="row"))
    # 107 / 100 at c=1, 88 / 80 at c=4, 60 / 50 at c=8; a run in another folder has no row-invariant run beside it
    assert frame["next_step"].to_list() == [
        "batch-invariant kernels: bia experiment --modes row-invariant (measured beside it, its decode rate over this run's: 1.07× at c=1, "
        "1.10× at c=4, 1.20× at c=8)", "more", "batch-invariant kernels: bia experiment --modes row-invariant"]


def test_an_amber_run_says_how_many_more_repeats_or_prompts_would_do():
    # 56 batched requests in one repeat: 299 needs ceil(299 / 56) = 6 repeats, in a new run (a resume keeps its repeats)
    probe = Subject("runs/p", {"url": "http://h:1/v1/chat/completions", "repeats": 1}, [1, 4])
    assert _judge(_slots(56), subject=probe)["next_step"] == (
        "243 more batched requests: a new run with 6 prompts, bia probe http://h:1 -o runs/p-more --prompts FILE (its prompts, one per "
        "line), or one in the rotating layout (--layout rotating), whose every repeat is a new context")
    # 23 repeats of one context count once: 1 distinct context of 1 prompt, so 299 prompts would do
    repeats = _slots(23).with_columns(context=pl.lit("p/4/0"))
    row = _judge(repeats, subject=probe, target_rate=0.5, needed=5)
    assert (row["verdict"], row["requests"], row["contexts"], row["prompts"]) == ("AMBER", 23, 1, 1)
    assert row["upper_bound"] == pytest.approx(0.95)  # 0 of 1: 1 - 0.05^(1/1)
    assert row["reason"].startswith("0 of 23 batched requests (1 distinct batch context of 1 prompt) part from m=1")
    two = pl.concat([repeats, repeats.with_columns(prompt_id=pl.lit("q"), context=pl.lit("q/4/0"))])
    assert _judge(two, subject=probe, target_rate=0.5, needed=5)["reason"].startswith(
        "0 of 46 batched requests (2 distinct batch contexts of 2 prompts) part from m=1")
    assert row["reason"].endswith("not below the 50% target: 5 distinct batch contexts would do (4 more)")
    assert row["next_step"].startswith("4 more distinct batch contexts: a new run with 5 prompts")
    # the experiment has no repeats: 2 prompts of 28 batched requests each, so ceil(299 / 28) = 11 prompts
    experiment = Subject("runs/e", {"producer": "bia experiment", "prompts": [{"prompt_id": "p0"}, {"prompt_id": "p1"}]}, [1, 4])
    two = _slots(56).with_columns(prompt_id=pl.Series(["p0"] * 28 + ["p1"] * 28))
    assert _judge(two, subject=experiment)["next_step"] == "243 more batched requests: bia experiment --prompts FILE of 11 prompts"


def test_the_rows_carry_their_target_and_the_bound_must_be_below_it():
    from analysis.metrics.parity._bounds import divergence_bound

    at = divergence_bound(0, 4)  # 0 of 4: 1 - 0.05^(1/4) = 0.5271; a target equal to it is not "below"
    row = _judge(_slots(4), target_rate=at, needed=5)
    assert (row["verdict"], row["target_rate"], row["confidence"], row["requests_needed"]) == ("AMBER", at, 0.95, 5)
    assert _judge(_slots(4), target_rate=math.nextafter(at, 1.0), needed=4)["verdict"] == "GREEN"
    frame = pl.DataFrame([row], schema=SCHEMA, orient="row")
    assert frame.schema == pl.Schema(SCHEMA)


def test_the_evidence_in_a_line():
    # 0 of 8 at c=4, repeat 1's band unformed: the bound 1 - 0.05^(1/8) = 31.2%; ref #2 matches
    slots = _slots(8)
    assert _judge(slots, bands=_bands(slots, r1=(None, None)))["evidence"] == (
        "8 batched requests, 1 of 2 bands seen formed; bound 31.2% at 95% (299 needed); alone: 1 of 1 match ref #1")
    # nothing batched: no bound; ref #2 and the three c=1 requests match
    assert _judge(_slots(3, c=1), ladder=(1,))["evidence"] == "0 batched requests, 0 of 0 bands seen formed (299 needed); alone: 4 of 4 match ref #1"
    # ref #2 parts: 2 of the 3 sent alone match (the two c=1 requests)
    red = _judge(pl.concat([_slots(2, c=1), _slots(4)]), refs=_refs(bitwise_prefix=0, max_ulp=26))
    assert red["evidence"].endswith("; alone: 2 of 3 match ref #1")


def test_the_certificate_document_and_the_answer_hold_every_row_under_the_worst_verdict():
    rows = [_judge(_slots(4)) | {"run": "a"}, _judge(_slots(4, bitwise_prefix={3: 1})) | {"run": "<b>b</b>"}]
    judgement = Judgement(pl.DataFrame(rows, schema=SCHEMA, orient="row"))
    document = certificate_document(judgement, target_rate=0.01, confidence=0.95)
    assert {k: v for k, v in document.items() if k not in ("arms", "domain")} == {
        "certificate_version": 4, "verdict": "RED", "exit_code": 5, "target_rate": 0.01, "confidence": 0.95,
        "bound": ("one-sided exact Clopper-Pearson upper bound on the divergence rate over distinct batch contexts of batched requests "
                  "(c > 1): (prompt, c, slot, the prompts it was batched with, arm); a repeat of a context is checked but counted once"),
        "requests_needed": 299}
    # what both rows cover: their contexts summed, the hand-made rows' ladder
    assert (document["domain"]["contexts"], document["domain"]["ladder"], document["domain"]["arms"]) == (8, [1, 4], ["copies"])
    assert [(arm["run"], arm["verdict"]) for arm in document["arms"]] == [("a", "AMBER"), ("<b>b</b>", "RED")]
    json.dumps(document)  # plain JSON types all through
    assert (judgement.verdict, judgement.exit_code) == ("RED", 5)
    assert (Judgement(judgement.frame.head(1)).verdict, Judgement(judgement.frame.head(1)).exit_code) == ("AMBER", 8)
    html = answer_html(judgement)
    assert html.count("<tr data-run=") == 2 and 'data-run="&lt;b&gt;b&lt;/b&gt;"' in html and "<b>b</b>" not in html
    assert 'data-verdict="AMBER"' in html and 'data-verdict="RED"' in html



def test_the_certificate_document_joins_one_frame_per_run_in_order():
    # one frame per run, as bia certify hands them over; a 5% target at 90% needs 45 batched requests (ln 0.1 / ln 0.95 = 44.9)
    cp = {"target_rate": 0.05, "confidence": 0.9}
    amber = pl.DataFrame([_judge(_slots(4), **cp, needed=45) | {"run": "a"}], schema=SCHEMA, orient="row")
    red = pl.DataFrame([_judge(_slots(4, bitwise_prefix={3: 1}), **cp, needed=45) | {"run": "b"}], schema=SCHEMA, orient="row")
    document = certificate_document([amber, red], **cp)
    assert (document["verdict"], document["exit_code"], document["requests_needed"]) == ("RED", 5, 45)
    assert (document["target_rate"], document["confidence"]) == (0.05, 0.9)
    assert [(arm["run"], arm["verdict"]) for arm in document["arms"]] == [("a", "AMBER"), ("b", "RED")]
    assert document["arms"] == amber.to_dicts() + red.to_dicts()


def test_the_worst_verdict_goes_by_severity_not_the_alphabet_and_nothing_judged_is_green():
    # RED over UNVERIFIED over AMBER over GREEN; by the alphabet UNVERIFIED would top RED, and GREEN top AMBER
    assert worst(["GREEN", "AMBER"]) == "AMBER"
    assert worst(["AMBER", "UNVERIFIED", "GREEN"]) == "UNVERIFIED"
    assert worst(["UNVERIFIED", "RED", "AMBER"]) == "RED"
    # nothing judged: GREEN, exit code 0, for the judgement and the certificate alike
    assert worst([]) == "GREEN"
    nothing = Judgement(pl.DataFrame(schema=SCHEMA))
    assert (nothing.verdict, nothing.exit_code) == ("GREEN", 0)
    assert {k: certificate_document([], **CP)[k] for k in ("verdict", "exit_code", "arms")} == {"verdict": "GREEN", "exit_code": 0, "arms": []}


def _answer_cells(rows: list[dict], **options) -> list[list[str]]:
    """Each row of the answer table (or, with ``full``, Jupyter's view) as the text of its cells."""
    html = answer_html(Judgement(pl.DataFrame(rows, schema=SCHEMA, orient="row")), **options)
    return [re.findall(r"<td[^>]*>(.*?)</td>", tr) for tr in re.findall(r"<tr data-run=.*?</tr>", html)]


def test_the_answer_table_is_one_row_of_six_cells_per_run_and_arm():
    # 0 of 4 at c=4: AMBER, the bound 1 - 0.05^(1/4) = 52.7%; its cost and next step set by hand (escaped where they hold markup)
    cost = [{"c": 4, "ratio": 0.8, "low": 0.7, "high": 0.9, "origin": "streams", "base_rates": 3, "rates": 3, "base_median": 52.0},
            {"c": 8, "ratio": 0.5, "low": None, "high": None, "origin": "streams", "base_rates": 3, "rates": 2, "base_median": 52.0}]
    row = _judge(_slots(4)) | {"run": "r<1>", "cost_by_c": cost, "next_step": "wait & see"}
    judgement = Judgement(pl.DataFrame([row], schema=SCHEMA, orient="row"))
    tr = (f'<tr data-run="r&lt;1&gt;" data-arm="copies" data-verdict="AMBER" title="{row["reason"]}"><td class="bia-warn" data-verdict-cell><b>AMBER</b></td>'
          '<td><code>r&lt;1&gt;</code> (<span title="every slot a copy of the prompt">copies</span>)</td><td>0/4 batched part; bound 52.7% ≥ 1%</td>'
          '<td title="baseline 52 tok/s: the median of 3 c=1 requests, streams’ timings">0.80× / 0.50× at c=4 / 8</td>'
          '<td>4 batched, 1/1 bands formed</td><td>wait &amp; see</td></tr>')
    head = ("<thead><tr><th>verdict</th><th>run (arm)</th><th>why</th><th>per-request decode rate vs c=1</th><th>evidence</th><th>next step</th>"
            "</tr></thead>")
    assert answer_html(judgement) == f'<table id="answer" class="bia-table bia-answer">{head}<tbody>{tr}</tbody></table>'
    assert answer_html(judgement, table_id="t&1").startswith('<table id="t&amp;1" class="bia-table bia-answer"><thead>')
    # Jupyter's view: no id, the why column holds the whole reason (AMBER has no cause), and the arm says what it sent (issue 32 item 10)
    # and the cost's baseline in words a reader sees, not only as a tooltip (issue 44)
    full = tr.replace("0/4 batched part; bound 52.7% ≥ 1%", row["reason"]).replace(
        '<span title="every slot a copy of the prompt">copies</span>', "copies: every slot a copy of the prompt").replace(
        '<td title="baseline 52 tok/s: the median of 3 c=1 requests, streams’ timings">0.80× / 0.50× at c=4 / 8</td>',
        '<td>0.80× / 0.50× at c=4 / 8 <span class="bia-muted">(over baseline 52 tok/s: the median of 3 c=1 requests, streams’ timings)</span></td>')
    box = '<div class="bia-scroll" style="max-width:100%;overflow-x:auto">'  # its own sideways scroll in a narrow notebook
    card = f'{box}<table class="bia-table bia-answer">{head}<tbody>{full}</tbody></table></div>'
    assert judgement._repr_html_() == f'<div class="bia-jupyter">{JUPYTER_STYLE}{card}</div>'  # styled: Jupyter loads no report CSS
    # two rows side by side, nothing between them; no cost measured, no next step
    bare = row | {"run": "b", "cost_by_c": [], "next_step": None}
    assert answer_html(Judgement(pl.DataFrame([row, bare], schema=SCHEMA, orient="row"))).count("</tr><tr data-run=") == 1
    assert _answer_cells([bare])[0][3:] == ["unmeasured", "4 batched, 1/1 bands formed", ""]


def test_the_answer_says_why_in_a_line_and_jupyter_says_it_in_full():
    refs = _refs(bitwise_prefix=0, max_ulp=26)
    alone_ref = _judge(pl.concat([_slots(2, c=1), _slots(8)]), refs=refs)  # ref #2 parts in bits from token 0
    alone_c1 = _judge(pl.concat([_slots(2, c=1, diverged={1: True}, divergence_at={1: 3}), _slots(8)]))  # c=1 repeat 1 parts at token 3
    batched_bits = _judge(_slots(8, bitwise_prefix={6: 3}, max_ulp={6: 2}))  # repeat 1 slot 2, bits from token 3
    batched_tokens = _judge(_slots(4, diverged={1: True}, divergence_at={1: 0}))  # slot 1, tokens from token 0
    slots = _slots(8)
    unformed = _judge(slots, bands=_bands(slots, r1=(None, None)))  # repeat 1's band never seen formed: 1 of 2 formed
    green = _judge(_slots(299))
    rows = [alone_ref, alone_c1, batched_bits, batched_tokens, unformed, green]
    assert [cells[2] for cells in _answer_cells(rows)] == [
        "run-to-run: 1/3 alone part; first p ref #2 alone, bits from token 0",
        "run-to-run: 1/3 alone part; first p alone (c=1), tokens at 3",
        "co-batching: 1/8 batched part; first p c=4 slot 2, bits from token 3",
        "co-batching: 1/4 batched part; first p c=4 slot 1, tokens at 0",
        "1 of 2 batched bands never seen formed at their c (the first p c=4 repeat 1: no width seen)",
        "0/299 batched part; bound 0.997% &lt; 1%",
    ]
    assert _answer_cells([unformed])[0][4] == "8 batched, 1/2 bands formed"
    # a witness's requests have no prompt: nothing stands in for it
    nameless = [r | {"first_request": r["first_request"] | {"prompt_id": None}} for r in (alone_ref, alone_c1, batched_bits)]
    assert [cells[2] for cells in _answer_cells(nameless)] == [
        "run-to-run: 1/3 alone part; first ref #2 alone, bits from token 0", "run-to-run: 1/3 alone part; first alone (c=1), tokens at 3",
        "co-batching: 1/8 batched part; first c=4 slot 2, bits from token 3"]
    # in full: the cause, then the whole reason; a row with no cause shows its reason alone
    full = [cells[2] for cells in _answer_cells([batched_bits, green], table_id=None, full=True)]
    assert full == [f"co-batching: {batched_bits['reason']}", green["reason"]]


def test_a_judgement_prints_a_line_a_row_and_copies_like_any_object():
    rows = [_judge(_slots(4)) | {"run": "a"}, _judge(_slots(4, bitwise_prefix={3: 1})) | {"run": "b"}]
    judgement = Judgement(pl.DataFrame(rows, schema=SCHEMA, orient="row"))
    assert repr(judgement) == f"AMBER a (copies): {rows[0]['reason']}\nRED b (copies): {rows[1]['reason']}"
    assert repr(Judgement(pl.DataFrame(schema=SCHEMA))) == "Judgement(nothing judged)"
    assert [row["run"] for row in judgement] == ["a", "b"] and (judgement + judgement)["run"].to_list() == ["a", "b", "a", "b"]
    # the frame's public methods pass through; private names do not, so copy and pickle find no frame's state to follow
    assert judgement.height == 2 and judgement.select("run").rows() == [("a",), ("b",)]
    with pytest.raises(AttributeError, match="^_df$"):
        judgement._df  # noqa: B018
    twin = copy.deepcopy(judgement)
    assert twin.frame.equals(judgement.frame) and twin.verdict == "RED"


def test_a_bit_difference_with_no_ulp_and_a_request_alone_with_no_repeat_are_worded_without_them():
    # +0.0 and -0.0: bits differ at token 1, 0 ULP apart (max_ulp 0): no "(up to 0 ULP)"
    assert _judge(_slots(4, bitwise_prefix={0: 1}))["first"] == "p c=4 repeat 0 slot 0: its logprob bits differ from ref #1 from token 1"
    # an assembled run's request alone has no repeat
    row = _judge(pl.concat([_slots(1, c=1, repeat={0: None}, diverged={0: True}, divergence_at={0: 3}), _slots(8)]))
    assert row["first"] == "p sent alone (copies c=1 slot 0): its tokens part at token 3"


def test_the_cost_from_the_servers_timing_on_both_sides():
    # two requests a side timed by the server (its t_sum / t_count): 40 / 80 = 0.5, no interval below three rates a side
    origin = "server: t_sum / t_count, band mean"
    alone = _slots(2, c=1, decode_tok_s={0: 80.0, 1: 80.0}, decode_rate_origin={0: origin, 1: origin})
    batched = _slots(4, decode_tok_s={0: 40.0, 1: 40.0}, decode_rate_origin={0: origin, 1: origin})
    row = _judge(pl.concat([alone, batched]))
    assert row["cost_by_c"] == [{"c": 4, "ratio": 0.5, "low": None, "high": None, "origin": "server", "base_rates": 2, "rates": 2,
                                 "median": 40.0, "base_median": 80.0}]
    assert row["cost"] == "c=4 0.50× the per-request decode rate at c=1 (baseline 80 tok/s: the median of 2 c=1 requests, the server’s timings)"


# --- runs assembled from streams written by hand ---------------------------------------------------


def _chat(path, tokens: list[tuple[str, float]], arm: str | None = None) -> str:
    """A chat completion of ``tokens``; with ``arm``, in the capture envelope a run with arms writes (its arm named)."""
    entries = [{"token": t, "bytes": list(t.encode()), "logprob": lp, "top_logprobs": [{"token": t, "bytes": list(t.encode()), "logprob": lp}]}
               for t, lp in tokens]
    payload = {"id": path.stem, "object": "chat.completion", "model": "m", "choices": [{
        "index": 0, "message": {"role": "assistant", "content": "".join(t for t, _ in tokens)}, "finish_reason": "length",
        "logprobs": {"content": entries}}], "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)}}
    path.write_text(json.dumps(payload if arm is None else {"response": payload, "arm": arm}))
    return str(path)


A = [("a", -0.5), ("b", -0.25), ("c", -0.125)]


def _run(tmp_path, band, *, widths=(2,), layout=None, prompt="p", second=A, cache=None):
    """A prompt: m=1 references A and ``second``, and one band of c=2 with the given streams (its widths as the server log saw them,
    and ``cache``: its cache counters before and after)."""
    mapping = [{"source": _chat(tmp_path / f"r{k}.json", s), "prompt_id": prompt, "role": "reference", "slot": k} for k, s in enumerate((A, second))]
    mapping += [{"source": _chat(tmp_path / f"b{k}.json", s), "prompt_id": prompt, "role": "band", "c": 2, "slot": k}
                for k, s in enumerate(band)]
    manifest = {"ladder": [2], "prompts": [{"prompt_id": prompt, "text": "x"}],
                "m_formed": [{"prompt_id": prompt, "c": 2, "widths": list(widths)} | ({"cache": cache} if cache else {})]}
    if layout:
        manifest["requested"] = {"layout": layout}
    return assemble_run(mapping, manifest)


def test_a_run_with_one_bit_difference_is_red(tmp_path):
    # slot 1's token 1 carries -0.2500001 for -0.25: float32 -0.25000009, 3 ULP away (2**-25 apart just past 0.25)
    run = _run(tmp_path, [A, [("a", -0.5), ("b", -0.2500001), ("c", -0.125)]])
    row = certificate(run).row(0, named=True)
    assert (row["run"], row["arm"], row["verdict"], row["requests"], row["divergent"], row["max_ulp"]) == ("assembled run", "copies", "RED", 2, 1, 3)
    # an assembled band has no repeat: its words name it without one
    assert row["first_request"] == {"prompt_id": "p", "c": 2, "repeat": None, "slot": 1, "role": "copies c=2", "position": 1, "max_ulp": 3, "parted": "bits"}
    assert row["first"] == "p c=2 slot 1: its logprob bits differ from ref #1 from token 1 (up to 3 ULP)"


def test_a_run_whose_references_differ_is_red_for_run_to_run(tmp_path):
    run = _run(tmp_path, [A, A], second=[("a", -0.5), ("b", -0.2500001), ("c", -0.125)])
    row = judge(run).frame.row(0, named=True)
    assert (row["verdict"], row["cause"], row["divergent"]) == ("RED", "run-to-run", 0)
    assert row["first"] == "p ref #2, sent alone: its logprob bits differ from ref #1 from token 1 (up to 3 ULP)"


def test_a_run_read_from_its_folder_with_two_prompts(tmp_path):
    mapping = []
    for prompt in ("p", "q"):
        mapping += [{"source": _chat(tmp_path / f"{prompt}r{k}.json", A), "prompt_id": prompt, "role": "reference", "slot": k} for k in (0, 1)]
        mapping += [{"source": _chat(tmp_path / f"{prompt}b{k}.json", A), "prompt_id": prompt, "role": "band", "c": 2, "slot": k} for k in (0, 1)]
    manifest = {"ladder": [2], "prompts": [{"prompt_id": p, "text": p} for p in ("p", "q")],
                "m_formed": [{"prompt_id": p, "c": 2, "widths": [2]} for p in ("p", "q")]}
    folder = write_run(assemble_run(mapping, manifest), tmp_path / "run")
    row = certificate(folder, target_rate=0.05, confidence=0.9).row(0, named=True)
    assert (row["run"], row["verdict"], row["requests"], row["bands"], row["alone"]) == (str(folder), "AMBER", 4, 2, 2)
    # at 90%: 0 of 4 bounds the rate at 1 - 0.1^(1/4) = 0.4377; 1 - 0.1^(1/n) < 5% first at n = 45 (ln 0.1 / ln 0.95 = 44.9)
    assert row["upper_bound"] == pytest.approx(0.43766, abs=1e-5) and row["requests_needed"] == 45
    assert row["reason"].endswith("the 90% upper bound on the divergence rate is 43.8%, not below the 5% target: 45 batched requests would do (41 more)")


def test_a_band_never_formed_and_a_needle_run_in_a_run(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    assert judge(_run(tmp_path / "a", [A, A], widths=(1, 1))).verdict == "UNVERIFIED"
    assert judge_runs(_run(tmp_path / "b", [A, A], layout="needle")).frame["arm"].to_list() == ["mixed"]


def test_bad_arguments_are_named_before_the_run_is_read(tmp_path):
    with pytest.raises(ValueError, match=r"max_rate must be a rate in \(0, 1\], got 0"):
        judge(tmp_path / "nothing-here", target_rate=0)
    with pytest.raises(ValueError, match=r"confidence must lie in \(0, 1\), got 1"):
        certificate(tmp_path / "nothing-here", confidence=1)
    with pytest.raises(RunError, match="no manifest.json"):
        judge(tmp_path)


B = [("a", -0.5), ("b", -0.2500001), ("c", -0.125)]  # A with token 1's float32 logprob 3 ULP away


def test_references_that_differ_are_the_prompt_cache_only_when_its_counters_grew(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    grew = _run(tmp_path / "a", [A, A], second=B, cache={"llamacpp:prompt_tokens_cached_total": {"before": 10, "after": 11}})
    row = judge(grew).frame.row(0, named=True)
    assert (row["verdict"], row["cause"]) == ("RED", "prompt cache")  # 1 cached prompt token served: +1 > 0
    assert row["reason"].startswith("not reproducible alone (its prompt cache): 1 of 1 requests sent alone part from ref #1")
    # the counter stood still (+0): the references differ run to run, not from the cache
    still = _run(tmp_path / "b", [A, A], second=B, cache={"llamacpp:prompt_tokens_cached_total": {"before": 10, "after": 10}})
    row = judge(still).frame.row(0, named=True)
    assert row["cause"] == "run-to-run" and row["reason"].startswith("not reproducible alone (run to run): ")


def _off(k: int) -> list[tuple[str, float]]:
    """A with token k's logprob 1e-7 lower: its float32 bits differ at token k, by 1e-7 over float32's spacing there (2^-24 on
    [0.5, 1), 2^-25 on [0.25, 0.5), 2^-26 on [0.125, 0.25)): 1.7, 3.4 and 6.7, so 2, 3 and 7 ULP for tokens 0, 1 and 2."""
    return [(t, lp - 1e-7 if j == k else lp) for j, (t, lp) in enumerate(A)]


def test_a_batched_request_that_parts_takes_its_cause_from_the_attribution_ladder(tmp_path):
    # a run with the cache, copies and mixed arms: the cache arm's request (warm, alone) parts from token 1, copies' c=2 slot 0
    # from token 2 (so the warm cache, on the ladder before co-batching, already explains it), copies' slot 1 not at all, and
    # mixed's slot 0 from token 0 (before the cache's part: only mixing explains it)
    streams = {"k": (_off(1), 1, 0, "cache"), "c0": (_off(2), 2, 0, "copies"), "c1": (A, 2, 1, "copies"), "m0": (_off(0), 2, 0, "mixed")}
    mapping = [{"source": _chat(tmp_path / f"r{k}.json", A, "reference"), "prompt_id": "p", "role": "reference", "slot": k} for k in (0, 1)]
    mapping += [{"source": _chat(tmp_path / f"{name}.json", stream, arm), "prompt_id": "p", "role": "band", "c": c, "slot": slot, "repeat": 0}
                for name, (stream, c, slot, arm) in streams.items()]
    run = assemble_run(mapping, {"ladder": [2], "arms": ["cache", "copies", "mixed"], "prompts": [{"prompt_id": "p", "text": "x"}],
                                 "m_formed": [{"prompt_id": "p", "c": 2, "widths": [2]}]})
    rows = judge(run).frame.select("arm", "verdict", "cause", "first").rows()
    assert rows == [("copies", "RED", "cache state", "p c=2 repeat 0 slot 0: its logprob bits differ from ref #1 from token 2 (up to 7 ULP)"),
                    ("mixed", "RED", "mixing", "p c=2 repeat 0 slot 0: its logprob bits differ from ref #1 from token 0 (up to 2 ULP)")]


def test_a_stream_that_ends_early_is_co_batching_or_mixing_by_its_arm(tmp_path):
    # slot 1 stops after 2 of m=1's 3 tokens, the 2 bit for bit: the ladder (which compares bits) lists no part, so the arm names it
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    for folder, layout, cause in (("a", None, "co-batching"), ("b", "needle", "mixing")):
        row = judge(_run(tmp_path / folder, [A, A[:2]], layout=layout)).frame.row(0, named=True)
        assert (row["verdict"], row["cause"], row["first"]) == ("RED", cause, "p c=2 slot 1: its tokens part at token 2")


def test_the_batched_arms_are_judged_and_a_run_with_none_is_judged_by_its_first(tmp_path):
    # references and one c=2 band of two; the plan of each arm decides what is missing
    def arms_of(name, arms):
        (tmp_path / name).mkdir()
        mapping = [{"source": _chat(tmp_path / name / f"r{k}.json", A), "prompt_id": "p", "role": "reference", "slot": k} for k in (0, 1)]
        mapping += [{"source": _chat(tmp_path / name / f"b{k}.json", A), "prompt_id": "p", "role": "band", "c": 2, "slot": k, "repeat": 0}
                    for k in (0, 1)]
        manifest = {"ladder": [2], "arms": arms, "prompts": [{"prompt_id": "p", "text": "x"}], "m_formed": [{"prompt_id": "p", "c": 2, "widths": [2]}]}
        return judge(assemble_run(mapping, manifest)).frame
    assert arms_of("none", [])["arm"].to_list() == ["copies"]  # an empty list reads as a run made before arms
    controls = arms_of("controls", ["cache", "repeat"])  # no batched arm: the first, once
    assert controls["arm"].to_list() == ["cache"]
    assert controls["missing"].to_list() == [0]  # its plan's missing request alone (c=1) is not a batched one
    assert arms_of("cache", ["cache", "copies"])["arm"].to_list() == ["copies"]
    both = arms_of("both", ["copies", "mixed"])
    # the mixed arm's request (the needle, slot 0 at c=2) was never sent: 1 missing, and no batched request of its own
    assert both.select("arm", "requests", "missing").rows() == [("copies", 2, 0), ("mixed", 0, 1)]
    assert both["reason"][1] == ("no request parts from m=1, but no batched request came back (c > 1): nothing to compare with m=1; "
                                 "1 batched request(s) of its plan never came back")



def test_runs_judged_together_give_a_row_each_in_order(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    runs = [write_run(_run(tmp_path / "a", [A, A]), tmp_path / "a" / "run"), write_run(_run(tmp_path / "b", [A, _off(1)]), tmp_path / "b" / "run")]
    judgement = judge_runs(runs)
    assert judgement.frame.select("run", "verdict").rows() == [(str(runs[0]), "AMBER"), (str(runs[1]), "RED")]
    assert judgement.verdict == "RED" and len(judge_runs([])) == 0 and judge_runs([]).frame.schema == pl.Schema(SCHEMA)


def test_the_serial_arm_is_sent_alone_and_named_so():
    # the serial arm sends the widest c one request after another: each is alone, whatever its c, and one that parts is
    # run-to-run evidence, named as sent alone, before any batch is judged
    serial = _slots(4, arm="serial", c=4, bitwise_prefix={2: 1}, max_ulp={2: 3})
    row = _judge(pl.concat([serial, _slots(8)]))
    assert (row["verdict"], row["cause"], row["alone"], row["alone_parted"]) == ("RED", "run-to-run", 5, 1)
    assert row["first_request"]["role"] == "serial c=4" and row["first_request"]["c"] == 4
    assert row["first"] == "p sent alone (serial c=4 repeat 0 slot 2): its logprob bits differ from ref #1 from token 1 (up to 3 ULP)"
    # a batched arm's c=4 is batched, not alone: the copies arm's own request that parts is co-batching
    assert _judge(_slots(8, bitwise_prefix={2: 1}, max_ulp={2: 3}))["cause"] == "co-batching"


def test_evidence_missing_never_makes_green_and_each_gap_is_named():
    # every batched request bit-identical, 299 distinct contexts: GREEN; then each kind of missing evidence alone
    base = _slots(299)
    assert _judge(base)["verdict"] == "GREEN"
    empty = _judge(_slots(299, length={5: 0}))  # one batched request with no token (an empty completion)
    assert (empty["verdict"], empty["no_evidence"]) == ("UNVERIFIED", 1)
    assert "1 of 299 batched requests have no token to compare (an empty completion on either side; the first p c=4 repeat 1 slot 1)" in empty["reason"]
    orphan = _judge(_slots(299).with_columns(has_reference=pl.Series([True] * 298 + [False])))
    assert (orphan["verdict"], orphan["unjudged"]) == ("UNVERIFIED", 1)
    assert "1 batched request(s) have no ref #1 of their prompt to compare with (p)" in orphan["reason"]
    assert orphan["next_step"] == "finish the run: bia probe URL -o hand --resume"
    refused = judge_arm(Subject("hand", {}, [1, 4]), "copies", _states(base), _alone_states(_refs(), _states(base)),
                        _formation(_bands(base)), pl.DataFrame([{"prompt_id": "p", "role": "band", "c": 4, "slot": 3, "repeat": 75,
                                                                 "arm": "copies", "state": "refused: HTTP 503"}], schema=_MISSING),
                        0.01, 0.95, 299)
    assert (refused["verdict"], refused["refused"], refused["missing"]) == ("UNVERIFIED", 1, 0)
    assert refused["reason"] == ("no request parts from m=1, but 1 batched request(s) were refused or failed, so their bands are "
                                 "incomplete (the first p c=4 repeat 75 slot 3: HTTP 503)")
    assert refused["next_step"] == "fire the refused requests again: bia probe URL -o hand --resume --retry-refused"
    lacking = pl.DataFrame({"prompt_id": ["q", "p"], "slot": [1, 0], "how": ["refused", "not sent"]})
    gone = judge_arm(Subject("hand", {}, [1, 4]), "copies", _states(base), _alone_states(_refs(), _states(base)),
                     _formation(_bands(base)), pl.DataFrame(schema=_MISSING), 0.01, 0.95, 299,
                     shared={"references_lacking": lacking})
    assert gone["verdict"] == "UNVERIFIED" and gone["alone_unknown"] == 1  # q's ref #2: the alone check lacks it
    many = pl.DataFrame({"prompt_id": ["p4", "p3", "p2", "p1"], "slot": [0, 0, 0, 0], "how": ["not sent"] * 4})
    four = judge_arm(Subject("hand", {}, [1, 4]), "copies", _states(base), _alone_states(_refs(), _states(base)),
                     _formation(_bands(base)), pl.DataFrame(schema=_MISSING), 0.01, 0.95, 299, shared={"references_lacking": many})
    assert four["reason"].endswith("4 prompt(s) lack a reference, so they are unjudged: p1 ref #1 (not sent), p2 ref #1 (not sent), "
                                   "p3 ref #1 (not sent) and 1 more")  # the first three by prompt, then how many more
    assert ("2 prompt(s) lack a reference, so they are unjudged: p ref #1 (not sent), q ref #2 (refused); 1 request(s) sent "
            "alone have no token or bits to compare with ref #1 (or never came back)") in gone["reason"]
    alone = _judge(pl.concat([_slots(2, c=1, length={1: 0}), base]))  # a request sent alone with nothing compared
    assert (alone["verdict"], alone["alone_unknown"]) == ("UNVERIFIED", 1)
    assert alone["reason"].endswith("1 request(s) sent alone have no token or bits to compare with ref #1 (or never came back) (the "
                                    "first p copies c=1 repeat 1 slot 0: no evidence), so the server is not shown to repeat itself alone")
    unknown = _judge(pl.concat([_slots(2, c=1, max_ulp={0: None}), base]))  # its logprobs not recorded: bits unknown
    assert unknown["alone_unknown"] == 1 and "(the first p copies c=1 repeat 0 slot 0: bits unknown)" in unknown["reason"]
    empty_second = _judge(base, refs=_refs(length=0))  # ref #2 came back empty: named as itself
    assert "(the first p ref #2), so the server" in empty_second["reason"]
    assembled = _judge(pl.concat([_slots(1, c=1, repeat={0: None}, length={0: 0}), base]))  # an assembled run: no repeat to name
    assert "(the first p copies c=1 slot 0: no evidence)" in assembled["reason"]
    # and a single batched request's bits unknown is enough: the other 298 do not carry it
    assert _judge(_slots(299, max_ulp={7: None}))["verdict"] == "UNVERIFIED"


def test_the_gaps_name_their_first_in_order_and_say_how_many_more():
    base = _slots(299)
    states = _states(base)

    def gaps(**shared) -> str:
        return judge_arm(Subject("hand", {}, [1, 4]), "copies", states, _alone_states(_refs(), states), _formation(_bands(base)),
                         pl.DataFrame(schema=_MISSING), 0.01, 0.95, 299, shared=shared)["reason"]

    # one prompt lacking both references, given ref #2 first, then another prompt: by prompt, then by reference
    lacking = pl.DataFrame({"prompt_id": ["p", "o", "p"], "slot": [1, 0, 0], "how": ["refused", "not sent", "not sent"]})
    assert gaps(references_lacking=lacking).endswith(
        "2 prompt(s) lack a reference, so they are unjudged: o ref #1 (not sent), p ref #1 (not sent), p ref #2 (refused); 1 request(s) "
        "sent alone have no token or bits to compare with ref #1 (or never came back), so the server is not shown to repeat itself alone")
    assert "(refused) and" not in gaps(references_lacking=lacking)  # three named: none more to count
    # batched requests of prompts without ref #1, with no plan to say why: the first three prompts by name
    orphans = _slots(8).with_columns(prompt_id=pl.Series(["s", "r", "q", "p"] * 2), has_reference=pl.lit(False))
    row = _judge(orphans)
    assert row["reason"] == "no request parts from m=1, but 8 batched request(s) have no ref #1 of their prompt to compare with (p, q, r)"
    # bands whose server log says less than c while their streams say c: counted, and the first by c, prompt, repeat named
    slots = pl.concat([_slots(8), _slots(8).with_columns(prompt_id=pl.lit("o")), _slots(8, c=8)])
    bands = pl.DataFrame({"arm": ["copies"] * 6, "prompt_id": ["a", "p", "o", "o", "p", "o"], "c": [8, 4, 4, 4, 4, 4],
                          "repeat": [0, 1, 2, 1, 0, 0], "m_formed": [2, 3, 2, 1, 3, 4],
                          "width_evidence": ["log; streams 8"] + ["log; streams 4"] * 5})
    row = _judge(slots, bands=bands, ladder=(1, 4, 8))
    assert row["reason"].endswith("the width evidence of 5 band(s) contradicts itself (the first o c=4 repeat 1: the server's own record "
                                  "says m=1, weaker evidence (log; streams 4) says more)")
