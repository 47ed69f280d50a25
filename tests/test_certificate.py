"""The certificate (analysis.certificate): each verdict on requests and bands written by hand, and one run assembled from
hand-written streams. Fast enough for mutation testing; tests/test_certificate_runs.py reads whole runs."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import polars as pl
import pytest
from conftest import ROOT

from analysis import RunError, assemble_run, certificate, write_run
from analysis.studies._certificate import (_band_arms, _with_arm, band_formation, certificate_document, judge, layout_arm,
                                           request_states, worst)

CP = {"target_rate": 0.01, "confidence": 0.95}


def _slots(n: int, *, arm: str = "copies", c: int = 4, **changes) -> pl.DataFrame:
    """n batched requests of prompt p at c, each 5 tokens bit-identical to m=1 (5 tokens long too); ``changes`` maps a
    column to {row: value}."""
    rows = {"arm": [arm] * n, "prompt_id": ["p"] * n, "band_c": [c] * n, "repeat": [k // c for k in range(n)], "slot": [k % c for k in range(n)],
            "diverged": [False] * n, "divergence_at": [None] * n, "bitwise_prefix": [5] * n, "length": [5] * n, "max_ulp": [0] * n}
    for column, values in changes.items():
        for row, value in values.items():
            rows[column][row] = value
    return pl.DataFrame(rows, schema={"arm": pl.String, "prompt_id": pl.String, "band_c": pl.Int64, "repeat": pl.Int64, "slot": pl.Int64,
                                      "diverged": pl.Boolean, "divergence_at": pl.Int64, "bitwise_prefix": pl.Int64, "length": pl.Int64,
                                      "max_ulp": pl.Int64})


def _bands(slots: pl.DataFrame, **widths) -> pl.DataFrame:
    """Each band of ``slots`` seen formed at its c by the log, unless ``widths`` maps its repeat to (m_formed, width_evidence)."""
    bands = slots.select("arm", "prompt_id", "band_c", "repeat").unique(maintain_order=True)
    formed = [widths.get(f"r{r}", (c, "log")) for c, r in bands.select("band_c", "repeat").rows()]
    return bands.with_columns(pl.Series("m_formed", [m for m, _ in formed], dtype=pl.Int64),
                              pl.Series("width_evidence", [e for _, e in formed], dtype=pl.String))


def _judge(slots: pl.DataFrame, bands: pl.DataFrame | None = None, needed: int = 299) -> dict:
    lengths = pl.DataFrame({"prompt_id": ["p"], "reference_length": [5]})
    table = judge(request_states(slots, lengths), band_formation(_bands(slots) if bands is None else bands), **CP, needed=needed, name="hand")
    assert table.height == 1
    return table.row(0, named=True)


def test_zero_divergences_in_299_requests_is_green_at_one_percent_and_298_is_amber():
    # 0 of 299: the one-sided 95% bound 1 - 0.05^(1/299) = 0.00996915 < 1% (worked out in test_bounds.py)
    green = _judge(_slots(299, c=1))
    assert green["verdict"] == "GREEN" and green["requests"] == 299 and green["divergent"] == 0
    assert green["upper_bound"] == pytest.approx(0.00996915, abs=2e-8)
    assert green["rule_of_three"] == pytest.approx(3 / 299)
    assert green["reason"] == ("0 of 299 requests part from m=1 and every batch was seen formed; the 95% upper bound on the divergence "
                               "rate is 0.997%, below the 1% target")
    # 0 of 298: 0.01000243, not below 1%; one more request would do
    amber = _judge(_slots(298, c=1))
    assert amber["verdict"] == "AMBER" and amber["upper_bound"] == pytest.approx(0.01000243, abs=2e-8)
    assert amber["reason"].endswith("is 1%, not below the 1% target: 299 requests would do (1 more)")
    assert (amber["first"], amber["unformed"], amber["bands_unformed"]) == (None, [], 0)


def test_one_bit_difference_is_red_and_named():
    # 8 requests at c=4 in two repeats; request 6 (repeat 1, slot 2) has the same tokens, its logprob bits differ from token 3
    slots = _slots(8, bitwise_prefix={6: 3}, max_ulp={6: 2})
    red = _judge(slots)
    assert red["verdict"] == "RED"
    assert (red["divergent"], red["tokens_parted"], red["bits_only"]) == (1, 1 - 1, 1)
    assert red["first"] == {"prompt_id": "p", "band_c": 4, "repeat": 1, "slot": 2, "parted": "bits", "at": 3, "max_ulp": 2}
    assert red["reason"] == ("1 of 8 requests part from m=1 (0 in tokens, 1 only in bits); the first is p c=4 repeat 1 slot 2: "
                             "only its logprob bits differ, from token 3 (up to 2 ULP)")
    # 1 of 8 bounds the rate at the 95% quantile of Beta(2, 7): P(0 or 1 of 8 part) = (1-p)^8 + 8p(1-p)^7 = 0.05 at p = 0.4707
    assert red["upper_bound"] == pytest.approx(0.4707, abs=1e-4) and red["rule_of_three"] is None


def test_tokens_parting_is_named_before_bits_by_c_and_said_as_tokens():
    # three requests part: slot 1 at c=4 only in bits (token 0), slot 5 at c=4 in tokens at token 2, and a c=2 request in tokens at
    # token 4 -- the first named is the one at the smallest c, whatever parted there
    slots = pl.concat([_slots(2, c=2, diverged={1: True}, divergence_at={1: 4}, bitwise_prefix={1: 4}),
                       _slots(8, bitwise_prefix={1: 0, 5: 2}, max_ulp={1: 7}, diverged={5: True}, divergence_at={5: 2})])
    red = _judge(slots)
    assert (red["verdict"], red["divergent"], red["tokens_parted"], red["bits_only"]) == ("RED", 3, 2, 1)
    assert red["first"] == {"prompt_id": "p", "band_c": 2, "repeat": 0, "slot": 1, "parted": "tokens", "at": 4, "max_ulp": 0}
    assert red["reason"].endswith("the first is p c=2 repeat 0 slot 1: its tokens part at token 4")


def test_a_stream_that_ends_early_parts_in_tokens():
    # the same 4 leading tokens, bit for bit, but the request stops at 4 of m=1's 5: it took another token (its end) at token 4
    red = _judge(_slots(4, length={2: 4}, bitwise_prefix={2: 4}))
    assert (red["verdict"], red["tokens_parted"], red["bits_only"]) == ("RED", 1, 0)
    assert red["first"]["slot"] == 2 and red["first"]["parted"] == "tokens" and red["first"]["at"] == 4


def test_a_band_never_seen_formed_is_unverified():
    slots = _slots(8)
    # repeat 1 at c=4: no width evidence at all (unknown, not 0)
    unknown = _judge(slots, _bands(slots, r1=(None, None)))
    assert unknown["verdict"] == "UNVERIFIED" and unknown["bands_unformed"] == 1
    assert unknown["unformed"] == [{"prompt_id": "p", "band_c": 4, "repeat": 1, "widest_seen": None}]
    assert unknown["reason"] == "no request parts from m=1, but 1 of 2 bands never seen formed at their c (the first p c=4 repeat 1: no width seen)"
    # the gauge saw 3 of the 4: the batch of 4 was never seen whole
    narrow = _judge(slots, _bands(slots, r1=(3, "metrics")))
    assert narrow["verdict"] == "UNVERIFIED" and narrow["unformed"][0]["widest_seen"] == 3
    # the gauge saw 1, the streams 4 at once: another kind of evidence saw it formed
    streams = _judge(slots, _bands(slots, r1=(1, "metrics; streams 4")))
    assert streams["verdict"] == "AMBER" and streams["bands_unformed"] == 0
    # a band of one needs no width evidence: there is no batch to form
    assert _judge(_slots(3, c=1), _bands(_slots(3, c=1), r0=(None, None), r1=(None, None), r2=(None, None)))["verdict"] == "AMBER"


def test_a_divergence_outranks_an_unformed_band_and_unknown_bits_are_unverified():
    slots = _slots(8, diverged={0: True}, divergence_at={0: 1})
    assert _judge(slots, _bands(slots, r1=(None, None)))["verdict"] == "RED"
    # tokens identical but no logprob recorded (max_ulp null): bits unknown, so no certificate
    unknown = _judge(_slots(4, max_ulp={0: None, 3: None}))
    assert unknown["verdict"] == "UNVERIFIED" and unknown["bits_unknown"] == 2
    assert unknown["reason"] == "no request parts from m=1, but 2 of 4 requests have no logprobs recorded, so their bits are unknown"


def test_each_arm_gets_its_own_verdict():
    slots = pl.concat([_slots(4, arm="copies"), _slots(4, arm="mixed", bitwise_prefix={3: 1})])
    lengths = pl.DataFrame({"prompt_id": ["p"], "reference_length": [5]})
    table = judge(request_states(slots, lengths), band_formation(_bands(slots)), **CP, needed=299, name="hand")
    assert table.select("run", "arm", "verdict", "requests").rows() == [("hand", "copies", "AMBER", 4), ("hand", "mixed", "RED", 4)]


def test_worst_verdict():
    assert worst(["GREEN", "GREEN"]) == "GREEN"
    assert worst(["AMBER", "GREEN"]) == "AMBER"
    assert worst(["AMBER", "UNVERIFIED"]) == "UNVERIFIED"
    assert worst(["UNVERIFIED", "RED", "AMBER"]) == "RED"
    assert worst(["RED", "GREEN"]) == "RED"
    assert worst([]) == "GREEN"  # nothing certified fails nothing; bia certify refuses an input with no run before this


def test_the_certificate_document_holds_every_arm_under_the_worst_verdict():
    slots = pl.concat([_slots(4, arm="copies"), _slots(4, arm="mixed", bitwise_prefix={3: 1})])
    lengths = pl.DataFrame({"prompt_id": ["p"], "reference_length": [5]})
    tables = [judge(request_states(slots, lengths), band_formation(_bands(slots)), **CP, needed=299, name=name) for name in ("a", "b")]
    document = certificate_document(tables, target_rate=0.01, confidence=0.95)
    assert {k: v for k, v in document.items() if k != "arms"} == {
        "certificate_version": 1, "verdict": "RED", "exit_code": 5, "target_rate": 0.01, "confidence": 0.95,
        "bound": "one-sided exact Clopper-Pearson upper bound on the divergence rate", "requests_needed": 299}
    assert [(arm["run"], arm["arm"], arm["verdict"]) for arm in document["arms"]] == [
        ("a", "copies", "AMBER"), ("a", "mixed", "RED"), ("b", "copies", "AMBER"), ("b", "mixed", "RED")]
    assert document["arms"][1]["first"] == {"prompt_id": "p", "band_c": 4, "repeat": 0, "slot": 3, "parted": "bits", "at": 1, "max_ulp": 0}
    json.dumps(document)  # plain JSON types all through
    amber = certificate_document(tables[:1], target_rate=0.05, confidence=0.9)
    # 1 - 0.1^(1/n) < 0.05 first at n = 45 (ln 0.1 / ln 0.95 = 44.9)
    assert (amber["verdict"], amber["exit_code"], amber["requests_needed"]) == ("RED", 5, 45)
    only_amber = certificate_document([tables[0].filter(pl.col("arm") == "copies")], target_rate=0.01, confidence=0.95)
    assert (only_amber["verdict"], only_amber["exit_code"]) == ("AMBER", 8)


# --- runs assembled from streams written by hand ---------------------------------------------------


def _chat(path, tokens: list[tuple[str, float]]) -> str:
    entries = [{"token": t, "bytes": list(t.encode()), "logprob": lp, "top_logprobs": [{"token": t, "bytes": list(t.encode()), "logprob": lp}]}
               for t, lp in tokens]
    path.write_text(json.dumps({"id": path.stem, "object": "chat.completion", "model": "m", "choices": [{
        "index": 0, "message": {"role": "assistant", "content": "".join(t for t, _ in tokens)}, "finish_reason": "length",
        "logprobs": {"content": entries}}], "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)}}))
    return str(path)


A = [("a", -0.5), ("b", -0.25), ("c", -0.125)]


def _run(tmp_path, band, *, widths=(2,), layout=None, prompt="p"):
    """A prompt: two m=1 references A, and one band of c=2 with the given streams (its widths as the server log saw them)."""
    mapping = [{"source": _chat(tmp_path / f"r{k}.json", A), "prompt_id": prompt, "role": "reference", "slot": k} for k in (0, 1)]
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
    assert (row["run"], row["arm"], row["verdict"], row["requests"], row["divergent"]) == ("assembled run", "copies", "RED", 2, 1)
    # an assembled band has no repeat: the reason names it without one
    assert row["first"] == {"prompt_id": "p", "band_c": 2, "repeat": None, "slot": 1, "parted": "bits", "at": 1, "max_ulp": 3}
    assert row["reason"].endswith("the first is p c=2 slot 1: only its logprob bits differ, from token 1 (up to 3 ULP)")


def test_a_run_read_from_its_folder_with_two_prompts(tmp_path):
    # prompts p and q, each with two m=1 references and a band of c=2, all bit-identical, both batches seen whole
    mapping = []
    for prompt in ("p", "q"):
        mapping += [{"source": _chat(tmp_path / f"{prompt}r{k}.json", A), "prompt_id": prompt, "role": "reference", "slot": k} for k in (0, 1)]
        mapping += [{"source": _chat(tmp_path / f"{prompt}b{k}.json", A), "prompt_id": prompt, "role": "band", "band_c": 2, "slot": k} for k in (0, 1)]
    manifest = {"ladder": [2], "prompts": [{"prompt_id": p, "text": p} for p in ("p", "q")],
                "m_formed": [{"prompt_id": p, "band_c": 2, "widths": [2]} for p in ("p", "q")]}
    folder = write_run(assemble_run(mapping, manifest), tmp_path / "run")
    row = certificate(folder, target_rate=0.05, confidence=0.9).row(0, named=True)
    assert (row["run"], row["verdict"], row["requests"], row["bands"]) == (str(folder), "AMBER", 4, 2)
    # at 90%: 0 of 4 bounds the rate at 1 - 0.1^(1/4) = 0.4377; 1 - 0.1^(1/n) < 5% first at n = 45 (ln 0.1 / ln 0.95 = 44.9)
    assert row["upper_bound"] == pytest.approx(0.43766, abs=1e-5) and row["requests_needed"] == 45
    assert row["reason"].endswith("the 90% upper bound on the divergence rate is 43.8%, not below the 5% target: 45 requests would do (41 more)")


def test_bad_arguments_are_named_before_the_run_is_read(tmp_path):
    with pytest.raises(ValueError, match=r"max_rate must be a rate in \(0, 1\], got 0"):
        certificate(tmp_path / "nothing-here", target_rate=0)
    with pytest.raises(ValueError, match=r"confidence must lie in \(0, 1\), got 1"):
        certificate(tmp_path / "nothing-here", confidence=1)
    with pytest.raises(RunError, match="no manifest.json"):
        certificate(tmp_path)


def test_the_first_request_is_the_smallest_c_whatever_the_row_order():
    # the c=4 rows come first; the c=2 request that parts in bits (max_ulp unknown: no "up to" in the reason) is still the first
    slots = pl.concat([_slots(4, diverged={3: True}, divergence_at={3: 0}),
                       _slots(2, c=2, bitwise_prefix={1: 2}, max_ulp={1: None})])
    red = _judge(slots)
    assert red["first"] == {"prompt_id": "p", "band_c": 2, "repeat": 0, "slot": 1, "parted": "bits", "at": 2, "max_ulp": None}
    assert red["reason"].endswith("the first is p c=2 repeat 0 slot 1: only its logprob bits differ, from token 2")


def test_request_states_by_hand():
    slots = _slots(5, length={1: 0, 2: 5, 3: 5}, bitwise_prefix={1: 0, 2: None}, max_ulp={1: None, 2: None}, prompt_id={4: "q"})
    lengths = pl.DataFrame({"prompt_id": ["p"], "reference_length": [5]}).vstack(pl.DataFrame({"prompt_id": ["z"], "reference_length": [0]}))
    states = request_states(slots, lengths).select("tokens_parted", "bits_parted", "bits_unknown", "at").rows()
    assert states == [
        (False, False, False, None),  # bit-identical
        (True, False, False, 0),      # empty where m=1 has 5 tokens: parts in tokens at 0
        (False, False, True, None),   # the same tokens, no bit comparison at all
        (False, False, False, None),
        (True, False, False, 5),      # prompt q has no m=1 length: it cannot be shown identical (at its own end)
    ]
    # an empty completion against an empty m=1 is identical: nothing to record, nothing unknown
    empty = _slots(1, length={0: 0}, bitwise_prefix={0: 0}, max_ulp={0: None})
    zero = pl.DataFrame({"prompt_id": ["p"], "reference_length": [0]})
    assert request_states(empty, zero).select("tokens_parted", "bits_parted", "bits_unknown").row(0) == (False, False, False)


def test_the_widest_width_of_any_evidence_counts():
    bands = pl.DataFrame({"prompt_id": ["p"] * 3, "band_c": [4, 4, 8], "repeat": [0, 1, 0], "m_formed": [2, None, 8],
                          "width_evidence": ["log; metrics 3; streams 4", None, "log"]})
    assert band_formation(bands).select("widest_seen", "formed").rows() == [(4, True), (None, False), (8, True)]


def test_arms_come_from_the_tables_else_the_requests_else_the_layout():
    # a stand-in for a run: what _with_arm reads of one (its requests and its manifest)
    plain = SimpleNamespace(requests=pl.DataFrame({"source": ["x", "y"], "record": [0, 0]}), manifest={})
    slots = pl.DataFrame({"source": ["y", "x"], "record": [0, 0], "arm": ["prefix", "cache"]})
    assert _with_arm(slots, plain)["arm"].to_list() == ["prefix", "cache"]
    assert _with_arm(slots.drop("arm"), plain)["arm"].to_list() == ["copies", "copies"]
    needle = SimpleNamespace(requests=plain.requests, manifest={"requested": {"layout": "needle"}})
    assert _with_arm(slots.drop("arm"), needle)["arm"].to_list() == ["mixed", "mixed"]
    assert layout_arm(SimpleNamespace(manifest={"requested": None})) == layout_arm(SimpleNamespace(manifest={"requested": {"layout": "copies"}})) == "copies"
    # requests that carry arms (issue 24's arms) give them to their rows, matched by source and record, in the rows' order
    armed = SimpleNamespace(requests=plain.requests.with_columns(arm=pl.Series(["mixed", "repeat"])), manifest={})
    assert _with_arm(slots.drop("arm"), armed)["arm"].to_list() == ["repeat", "mixed"]
    # a band keeps its own arm, else takes each arm its requests were fired in
    bands = pl.DataFrame({"arm": ["cache"], "prompt_id": ["p"], "band_c": [2], "repeat": [None]}, schema_overrides={"repeat": pl.Int64})
    states = pl.DataFrame({"arm": ["copies", "mixed", "copies"], "prompt_id": ["p"] * 3, "band_c": [2] * 3, "repeat": [None] * 3},
                          schema_overrides={"repeat": pl.Int64})
    assert _band_arms(bands, states)["arm"].to_list() == ["cache"]
    assert _band_arms(bands.drop("arm"), states)["arm"].to_list() == ["copies", "mixed"]  # a null repeat matches a null repeat


def test_an_arm_with_bands_and_no_request_and_both_unverified_reasons():
    slots = _slots(4, max_ulp={2: None})
    bands = pl.concat([_bands(slots, r0=(2, "metrics")), _bands(_slots(4, arm="cache"))])
    lengths = pl.DataFrame({"prompt_id": ["p"], "reference_length": [5]})
    table = judge(request_states(slots, lengths), band_formation(bands), target_rate=0.01, confidence=0.9, needed=22, name="hand")
    cache, copies = table.sort("arm").rows(named=True)
    assert (cache["arm"], cache["verdict"], cache["requests"], cache["upper_bound"], cache["rule_of_three"]) == ("cache", "UNVERIFIED", 0, None, None)
    assert (cache["tokens_parted"], cache["bits_only"], cache["bits_unknown"], cache["divergent"], cache["first"]) == (0, 0, 0, 0, None)
    # the other way round: requests of an arm no band stands for count no band
    lone = judge(request_states(_slots(2, arm="lone"), lengths), band_formation(bands), **CP, needed=299, name="hand")
    assert lone.filter(pl.col("arm") == "lone").select("requests", "bands", "bands_unformed").row(0) == (2, 0, 0)
    assert cache["reason"] == "no batched request came back: nothing to compare with m=1"
    assert copies["verdict"] == "UNVERIFIED" and copies["rule_of_three"] is None  # the rule of three is the 95% bound only
    assert copies["upper_bound"] == pytest.approx(1 - 0.1 ** (1 / 4))  # 0 of 4 at 90%: 1 - 0.1^(1/4) = 0.4377
    assert copies["reason"] == ("no request parts from m=1, but 1 of 1 bands never seen formed at their c (the first p c=4 repeat 0: the widest "
                                "seen m=2) and 1 of 4 requests have no logprobs recorded, so their bits are unknown")


def test_the_rows_carry_their_target_and_schema_and_the_bound_must_be_below_the_target():
    from analysis.metrics._bounds import divergence_bound
    from analysis.studies._certificate import SCHEMA

    slots = _slots(4)
    lengths = pl.DataFrame({"prompt_id": ["p"], "reference_length": [5]})
    states, bands = request_states(slots, lengths), band_formation(_bands(slots))
    # a target equal to the bound itself (0 of 4: 1 - 0.05^(1/4) = 0.5271) is not "below": AMBER
    at = divergence_bound(0, 4)
    table = judge(states, bands, target_rate=at, confidence=0.95, needed=5, name="hand")
    assert table.schema == pl.Schema(SCHEMA)
    row = table.row(0, named=True)
    assert (row["verdict"], row["target_rate"], row["confidence"], row["requests_needed"]) == ("AMBER", at, 0.95, 5)
    assert judge(states, bands, target_rate=math.nextafter(at, 1.0), confidence=0.95, needed=4, name="hand")["verdict"].to_list() == ["GREEN"]
    empty = judge(states.clear(), bands.clear(), target_rate=0.01, confidence=0.95, needed=299, name="hand")
    assert empty.height == 0 and empty.schema == pl.Schema(SCHEMA)


def test_unformed_bands_are_listed_by_c_then_prompt_then_repeat():
    bands = pl.DataFrame({"arm": ["copies"] * 5, "prompt_id": ["q", "p", "p", "p", "p"], "band_c": [4, 8, 4, 4, 2], "repeat": [0, 0, 1, 0, 0],
                          "m_formed": [None, 4, 2, 3, 2], "width_evidence": [None, "log", "log", "log", "log"]})
    states = request_states(_slots(2, c=2), pl.DataFrame({"prompt_id": ["p"], "reference_length": [5]}))
    row = judge(states, band_formation(bands), **CP, needed=299, name="hand").row(0, named=True)
    assert [(b["prompt_id"], b["band_c"], b["repeat"], b["widest_seen"]) for b in row["unformed"]] == [
        ("p", 4, 0, 3), ("p", 4, 1, 2), ("q", 4, 0, None), ("p", 8, 0, 4)]
    assert (row["bands"], row["bands_unformed"]) == (5, 4)


def test_edges_of_the_request_states_and_band_formation():
    lengths = pl.DataFrame({"prompt_id": ["p"], "reference_length": [5]})
    # one token long, the same token, no logprob recorded: unknown bits (a single token is as unknown as five)
    one = _slots(1, length={0: 1}, bitwise_prefix={0: 1}, max_ulp={0: None})
    assert request_states(one, pl.DataFrame({"prompt_id": ["p"], "reference_length": [1]}))["bits_unknown"].to_list() == [True]
    # a stream that runs past m=1's end parts where m=1 ended (token 5), not at its own end (6)
    longer = request_states(_slots(1, length={0: 6}, bitwise_prefix={0: 5}), lengths)
    assert longer.select("tokens_parted", "at").row(0) == (True, 5)
    # a band of 2 with no width evidence was never seen formed; only c = 1 needs none
    bands = pl.DataFrame({"prompt_id": ["p", "p"], "band_c": [2, 1], "repeat": [0, 0], "m_formed": [None, None], "width_evidence": [None, None]},
                         schema_overrides={"m_formed": pl.Int64, "width_evidence": pl.String})
    assert band_formation(bands)["formed"].to_list() == [False, True]
