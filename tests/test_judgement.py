"""The judgement (analysis.judge, analysis.studies._judgement): each rule on request, reference and band rows written by hand,
and runs assembled from hand-written streams. Fast enough for mutation testing; tests/test_judgement_surfaces.py reads whole
runs and holds every surface to the same verdict."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest

from analysis import RunError, assemble_run, certificate, judge, write_run
from analysis.studies._certificate import certificate_document
from analysis.studies._judgement import (SCHEMA, Judgement, Subject, _alone_states, _formation, _states, answer_html, cost_words, judge_arm,
                                         judge_runs, worst)

CP = {"target_rate": 0.01, "confidence": 0.95}
_SLOT = {"arm": pl.String, "prompt_id": pl.String, "band_c": pl.Int64, "repeat": pl.Int64, "slot": pl.Int64, "diverged": pl.Boolean,
         "divergence_at": pl.Int64, "bitwise_prefix": pl.Int64, "length": pl.Int64, "reference_length": pl.Int64, "max_ulp": pl.Int64,
         "decode_tok_s": pl.Float64, "decode_rate_origin": pl.String}
_MISSING = {"prompt_id": pl.String, "role": pl.String, "band_c": pl.Int64, "slot": pl.Int64, "repeat": pl.Int64, "arm": pl.String, "state": pl.String}


def _slots(n: int, *, arm: str = "copies", c: int = 4, **changes) -> pl.DataFrame:
    """n requests of prompt p at c, each 5 tokens bit-identical to m=1 (5 tokens long too); ``changes`` maps a column to
    {row: value}."""
    rows = {"arm": [arm] * n, "prompt_id": ["p"] * n, "band_c": [c] * n, "repeat": [k // c for k in range(n)], "slot": [k % c for k in range(n)],
            "diverged": [False] * n, "divergence_at": [None] * n, "bitwise_prefix": [5] * n, "length": [5] * n, "reference_length": [5] * n,
            "max_ulp": [0] * n, "decode_tok_s": [None] * n, "decode_rate_origin": [None] * n}
    for column, values in changes.items():
        for row, value in values.items():
            rows[column][row] = value
    return pl.DataFrame(rows, schema=_SLOT)


def _refs(**changes) -> pl.DataFrame:
    """Prompt p's ref #2 against its ref #1: bit-identical, 5 tokens, unless ``changes`` says otherwise."""
    row = {"prompt_id": "p", "diverged": False, "divergence_at": None, "bitwise_prefix": 5, "length": 5, "reference_length": 5, "max_ulp": 0}
    return pl.DataFrame([row | changes], schema={k: _SLOT.get(k, pl.Boolean) for k in row})


def _bands(slots: pl.DataFrame, **widths) -> pl.DataFrame:
    """Each band of ``slots`` seen formed at its c by the log, unless ``widths`` maps its repeat to (m_formed, width_evidence)."""
    bands = slots.select("arm", "prompt_id", "band_c", "repeat").unique(maintain_order=True)
    formed = [widths.get(f"r{r}", (c, "log")) for c, r in bands.select("band_c", "repeat").rows()]
    return bands.with_columns(pl.Series("m_formed", [m for m, _ in formed], dtype=pl.Int64),
                              pl.Series("width_evidence", [e for _, e in formed], dtype=pl.String))


def _judge(slots: pl.DataFrame, *, refs: pl.DataFrame | None = None, bands: pl.DataFrame | None = None, ladder=(1, 4), missing: int = 0,
           subject: Subject | None = None, arm: str = "copies", target_rate: float = 0.01, confidence: float = 0.95, needed: int = 299) -> dict:
    states = _states(slots)
    subject = subject or Subject("hand", {}, list(ladder))
    gone = pl.DataFrame([{"prompt_id": "p", "role": "band", "band_c": 4, "slot": k, "repeat": 9, "arm": arm, "state": "not sent"}
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
    assert row["reason"] == "no request parts from m=1, but no batched request at c=8 of its ladder"
    subject = Subject("runs/x", {"url": "http://127.0.0.1:8080/v1/chat/completions"}, [1, 4])
    gone = _judge(_slots(8), subject=subject, missing=3, target_rate=0.9, needed=3)
    assert gone["verdict"] == "UNVERIFIED" and gone["missing"] == 3
    assert gone["reason"] == "no request parts from m=1, but 3 batched request(s) of its plan never came back"
    assert gone["next_step"] == "finish the run: bia probe http://127.0.0.1:8080 -o runs/x --resume"
    stopped = _judge(_slots(8), subject=Subject("x", {"complete": False}, [1, 4]), target_rate=0.9, needed=3)
    assert stopped["verdict"] == "UNVERIFIED" and stopped["reason"].endswith("the run did not finish")


# --- RED: alone first, then batched ---------------------------------------------------------------


def test_references_that_differ_are_red_run_to_run_and_name_no_batch():
    # every batched request bit-identical, but ref #2 differs from ref #1 in bits from token 0 (26 ULP): not reproducible alone
    refs = _refs(bitwise_prefix=0, max_ulp=26)
    row = _judge(pl.concat([_slots(2, c=1), _slots(8, bitwise_prefix={3: 2})]), refs=refs)
    assert (row["verdict"], row["cause"], row["alone_parted"], row["alone"]) == ("RED", "run-to-run", 1, 3)
    assert row["first_request"] == {"prompt_id": "p", "c": None, "repeat": None, "slot": 1, "role": "ref #2", "at": 0, "max_ulp": 26,
                                    "parted": "bits"}
    assert row["first"] == "p ref #2, sent alone: its logprob bits differ from ref #1 from token 0 (up to 26 ULP)"
    assert row["reason"] == ("not reproducible alone (run to run): 1 of 3 requests sent alone part from ref #1 of their prompt, the first "
                             "p ref #2, sent alone: its logprob bits differ from ref #1 from token 0 (up to 26 ULP); batching is not "
                             "judged until the server repeats itself alone")
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
    assert red["first_request"] == {"prompt_id": "p", "c": 4, "repeat": 1, "slot": 2, "role": "copies c=4", "at": 3, "max_ulp": 2, "parted": "bits"}
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
    assert red["first_request"]["slot"] == 2 and red["first_request"]["at"] == 4


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
    # the gauge saw 1, the streams 4 at once: another kind of evidence saw it formed
    assert _judge(slots, bands=_bands(slots, r1=(1, "metrics; streams 4")))["verdict"] == "AMBER"
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
    assert unknown["reason"] == "no request parts from m=1, but 2 of 4 batched requests have no logprobs recorded, so their bits are unknown"


def test_edges_of_the_request_states_and_band_formation():
    states = _states(_slots(5, length={1: 0, 2: 5}, bitwise_prefix={1: 0, 2: None}, max_ulp={1: None, 2: None},
                            reference_length={4: None})).select("tokens_parted", "bits_parted", "bits_unknown", "at").rows()
    assert states == [(False, False, False, None), (True, False, False, 0), (False, False, True, None), (False, False, False, None),
                      (True, False, False, 5)]  # empty where m=1 has 5; bits unknown; no m=1 length: parts at its own end
    longer = _states(_slots(1, length={0: 6}, bitwise_prefix={0: 5}))
    assert longer.select("tokens_parted", "at").row(0) == (True, 5)  # parts where m=1 ended, not at its own end
    bands = pl.DataFrame({"prompt_id": ["p"] * 4, "band_c": [4, 4, 8, 1], "repeat": [0, 1, 0, 0], "m_formed": [2, None, 8, None],
                          "width_evidence": ["log; metrics 3; streams 4", None, "log", None]})
    assert _formation(bands).select("widest_seen", "formed").rows() == [(4, True), (None, False), (8, True), (None, True)]


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
    assert cost_words(two["cost_by_c"]) == "c=4 0.50× of c=1’s decode rate per request (streams’ timings)"


def test_a_red_torch_run_is_told_what_row_invariant_cost_beside_it():
    from analysis.studies._judgement import _with_measured_fix

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
    assert _judge(_slots(56), subject=probe)["next_step"] == ("243 more batched requests: a new run, bia probe http://h:1 -o runs/p-more "
                                                              "--prompts FILE --repeats 6 (its prompts, one per line)")
    # the experiment has no repeats: 2 prompts of 28 batched requests each, so ceil(299 / 28) = 11 prompts
    experiment = Subject("runs/e", {"producer": "bia experiment", "prompts": [{"prompt_id": "p0"}, {"prompt_id": "p1"}]}, [1, 4])
    assert _judge(_slots(56), subject=experiment)["next_step"] == "243 more batched requests: bia experiment --prompts FILE of 11 prompts"


def test_the_rows_carry_their_target_and_the_bound_must_be_below_it():
    from analysis.metrics._bounds import divergence_bound

    at = divergence_bound(0, 4)  # 0 of 4: 1 - 0.05^(1/4) = 0.5271; a target equal to it is not "below"
    row = _judge(_slots(4), target_rate=at, needed=5)
    assert (row["verdict"], row["target_rate"], row["confidence"], row["requests_needed"]) == ("AMBER", at, 0.95, 5)
    assert _judge(_slots(4), target_rate=math.nextafter(at, 1.0), needed=4)["verdict"] == "GREEN"
    frame = pl.DataFrame([row], schema=SCHEMA, orient="row")
    assert frame.schema == pl.Schema(SCHEMA)


def test_worst_verdict():
    assert worst(["GREEN", "GREEN"]) == "GREEN"
    assert worst(["AMBER", "GREEN"]) == "AMBER"
    assert worst(["AMBER", "UNVERIFIED"]) == "UNVERIFIED"
    assert worst(["UNVERIFIED", "RED", "AMBER"]) == "RED"
    assert worst(["RED", "GREEN"]) == "RED"
    assert worst([]) == "GREEN"  # nothing certified fails nothing; bia certify refuses an input with no run before this


def test_the_certificate_document_and_the_answer_hold_every_row_under_the_worst_verdict():
    rows = [_judge(_slots(4)) | {"run": "a"}, _judge(_slots(4, bitwise_prefix={3: 1})) | {"run": "<b>b</b>"}]
    judgement = Judgement(pl.DataFrame(rows, schema=SCHEMA, orient="row"))
    document = certificate_document(judgement, target_rate=0.01, confidence=0.95)
    assert {k: v for k, v in document.items() if k != "arms"} == {
        "certificate_version": 2, "verdict": "RED", "exit_code": 5, "target_rate": 0.01, "confidence": 0.95,
        "bound": "one-sided exact Clopper-Pearson upper bound on the divergence rate of batched requests (c > 1)", "requests_needed": 299}
    assert [(arm["run"], arm["verdict"]) for arm in document["arms"]] == [("a", "AMBER"), ("<b>b</b>", "RED")]
    json.dumps(document)  # plain JSON types all through
    assert (judgement.verdict, judgement.exit_code) == ("RED", 5)
    assert (Judgement(judgement.frame.head(1)).verdict, Judgement(judgement.frame.head(1)).exit_code) == ("AMBER", 8)
    html = answer_html(judgement)
    assert html.count("<tr data-run=") == 2 and 'data-run="&lt;b&gt;b&lt;/b&gt;"' in html and "<b>b</b>" not in html
    assert 'data-verdict="AMBER"' in html and 'data-verdict="RED"' in html


# --- runs assembled from streams written by hand ---------------------------------------------------


def _chat(path, tokens: list[tuple[str, float]]) -> str:
    entries = [{"token": t, "bytes": list(t.encode()), "logprob": lp, "top_logprobs": [{"token": t, "bytes": list(t.encode()), "logprob": lp}]}
               for t, lp in tokens]
    path.write_text(json.dumps({"id": path.stem, "object": "chat.completion", "model": "m", "choices": [{
        "index": 0, "message": {"role": "assistant", "content": "".join(t for t, _ in tokens)}, "finish_reason": "length",
        "logprobs": {"content": entries}}], "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)}}))
    return str(path)


A = [("a", -0.5), ("b", -0.25), ("c", -0.125)]


def _run(tmp_path, band, *, widths=(2,), layout=None, prompt="p", second=A):
    """A prompt: m=1 references A and ``second``, and one band of c=2 with the given streams (its widths as the server log saw them)."""
    mapping = [{"source": _chat(tmp_path / f"r{k}.json", s), "prompt_id": prompt, "role": "reference", "slot": k} for k, s in enumerate((A, second))]
    mapping += [{"source": _chat(tmp_path / f"b{k}.json", s), "prompt_id": prompt, "role": "band", "band_c": 2, "slot": k}
                for k, s in enumerate(band)]
    manifest = {"ladder": [2], "prompts": [{"prompt_id": prompt, "text": "x"}],
                "m_formed": [{"prompt_id": prompt, "band_c": 2, "widths": list(widths)}]}
    if layout:
        manifest["requested"] = {"layout": layout}
    return assemble_run(mapping, manifest)


def test_a_run_with_one_bit_difference_is_red(tmp_path):
    # slot 1's token 1 carries -0.2500001 for -0.25: float32 -0.25000009, 3 ULP away (2**-25 apart just past 0.25)
    run = _run(tmp_path, [A, [("a", -0.5), ("b", -0.2500001), ("c", -0.125)]])
    row = certificate(run).row(0, named=True)
    assert (row["run"], row["arm"], row["verdict"], row["requests"], row["divergent"], row["max_ulp"]) == ("assembled run", "copies", "RED", 2, 1, 3)
    # an assembled band has no repeat: its words name it without one
    assert row["first_request"] == {"prompt_id": "p", "c": 2, "repeat": None, "slot": 1, "role": "copies c=2", "at": 1, "max_ulp": 3, "parted": "bits"}
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
        mapping += [{"source": _chat(tmp_path / f"{prompt}b{k}.json", A), "prompt_id": prompt, "role": "band", "band_c": 2, "slot": k} for k in (0, 1)]
    manifest = {"ladder": [2], "prompts": [{"prompt_id": p, "text": p} for p in ("p", "q")],
                "m_formed": [{"prompt_id": p, "band_c": 2, "widths": [2]} for p in ("p", "q")]}
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
