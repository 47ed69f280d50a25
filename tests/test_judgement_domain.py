"""What a verdict covers (its domain), the refused and missing requests it counts, and the precision it compares at: the
helpers of analysis.studies._judgement_evidence and the certificate's merged domain, on values worked out by hand."""

from __future__ import annotations

import polars as pl
import pytest

from analysis.studies._certificate import merged_domain
from analysis.studies._judgement_domain import domain, domain_words, sampling_words
from analysis.studies._judgement_evidence import (
    missing_frame,
    precision_compared,
    refused_requests,
)

ONE = {"ladder": [1, 4], "widths": [4], "prompts": 2, "contexts": 8, "requests": 8, "prompt_tokens_min": 5,
       "prompt_tokens_max": 9, "completion_tokens_min": 16, "completion_tokens_max": 16,
       "sampling": "greedy (temperature 0)", "precision": "float32", "arms": ["copies"]}


def test_the_precision_is_float32_only_when_every_recorded_value_is_one():
    # -0.25 is a float32; -0.25 - 2**-40 is not (float32 keeps 24 bits of mantissa), nor is 0.1 (a float64 parse of "0.1")
    assert precision_compared(pl.Series([-0.5, -0.25, -0.125])) == "float32"
    assert precision_compared(pl.Series([-0.5, -0.25 - 2**-40])) == "float64"
    assert precision_compared(pl.Series([-0.1])) == "float64"
    # what is not finite is not recorded: it neither makes nor unmakes a precision
    assert precision_compared(pl.Series([-0.5, float("nan"), float("-inf"), None])) == "float32"
    assert precision_compared(pl.Series([float("nan"), float("inf")])) == "none"
    assert precision_compared(pl.Series([], dtype=pl.Float64)) == "none"
    assert precision_compared(pl.Series([-0.5], dtype=pl.Float32)) == "float32"  # a float32 column reads as float32


def test_sampling_is_greedy_at_temperature_zero_or_none_recorded():
    assert sampling_words({"sampler": {"temperature": 0.0}}) == "greedy (temperature 0)"
    assert sampling_words({"sampler": {"temperature": 0}}) == "greedy (temperature 0)"
    assert sampling_words({"sampler": {}}) == sampling_words({}) == "greedy (temperature 0)"
    assert sampling_words({"sampler": {"temperature": 0.7}}) == "temperature 0.7"
    assert sampling_words({"sampler": None}) == "greedy (temperature 0)"


def test_refused_requests_are_rows_with_their_arm_and_reason():
    manifest = {"refused": [
        {"prompt_id": 7, "role": "band", "c": 4, "slot": 2, "repeat": 1, "arm": "mixed", "reason": "HTTP 503"},
        {"prompt_id": "p1", "role": "reference", "slot": 0},  # no arm: a reference's; no reason: refused
        {"prompt_id": "p2", "role": "band", "c": 8, "slot": 0, "repeat": 0},  # no arm: the run's legacy arm
        {"role": "band", "c": 8, "slot": 1, "repeat": 0},  # no prompt named: none, not the word "None"
        "not an entry",
    ]}
    frame = refused_requests(manifest, "copies")
    assert frame.rows() == [("7", "band", 4, 2, 1, "mixed", "HTTP 503"), ("p1", "reference", None, 0, None, "reference", "refused"),
                            ("p2", "band", 8, 0, 0, "copies", "refused"), (None, "band", 8, 1, 0, "copies", "refused")]
    assert frame.columns == ["prompt_id", "role", "c", "slot", "repeat", "arm", "reason"]
    assert refused_requests({}, "copies").height == 0 and refused_requests({"refused": None}, "copies").height == 0


def test_missing_requests_as_a_frame():
    rows = [{"prompt_id": "p0", "role": "band", "c": 4, "slot": 1, "repeat": 0, "arm": "copies", "state": "not sent"}]
    frame = missing_frame(rows)
    assert frame.rows() == [("p0", "band", 4, 1, 0, "copies", "not sent")]
    assert missing_frame([]).columns == ["prompt_id", "role", "c", "slot", "repeat", "arm", "state"]


def test_a_domain_counts_its_batched_requests_and_the_widths_its_bands_were_seen_at():
    batched = pl.DataFrame({"length": [16, 12, 20], "prompt_tokens": [5, 9, 7]})
    bands = pl.DataFrame({"c": [1, 4, 4, 8], "widest_seen": [1, 4, None, 6]})
    row = {"prompts": 2, "contexts": 3, "requests": 3}
    got = domain(row, batched, bands, [8, 1, 4], sampling="greedy (temperature 0)", precision="float64", arms=["copies"])
    assert got == {"ladder": [1, 4, 8], "widths": [4, 6], "prompts": 2, "contexts": 3, "requests": 3, "prompt_tokens_min": 5,
                   "prompt_tokens_max": 9, "completion_tokens_min": 12, "completion_tokens_max": 20,
                   "sampling": "greedy (temperature 0)", "precision": "float64", "arms": ["copies"]}
    # no prompt lengths recorded (a witness, a transformers run): unknown, not 0
    unknown = domain(row, batched.drop("prompt_tokens"), bands, [1, 4])
    assert (unknown["prompt_tokens_min"], unknown["prompt_tokens_max"]) == (None, None)


def test_a_domain_in_one_line():
    assert domain_words(ONE) == (
        "covers: ladder 1,4 (widths measured 4), 2 prompts in 8 distinct batch contexts (8 batched requests), prompts of 5-9 "
        "tokens, completions of 16 tokens, greedy (temperature 0), logprobs compared as float32, arms copies")
    assert "(widths measured 4,8,16)" in domain_words({**ONE, "widths": [4, 8, 16]})
    none = {**ONE, "widths": [], "prompt_tokens_min": None, "prompt_tokens_max": None, "completion_tokens_min": 3,
            "completion_tokens_max": 64, "arms": ["copies", "mixed"]}
    words = domain_words(none)
    assert "(widths measured none)" in words and "prompts of ? tokens" in words and "completions of 3-64 tokens" in words
    assert words.endswith("arms copies, mixed")


def test_a_certificates_domain_joins_its_rows():
    assert merged_domain([]) is None and merged_domain([None, None]) is None
    assert merged_domain([None, ONE]) == ONE and merged_domain([ONE]) is not ONE  # a copy
    other = {**ONE, "ladder": [1, 8], "widths": [7], "prompts": 3, "contexts": 20, "requests": 30, "prompt_tokens_min": 3,
             "prompt_tokens_max": 12, "completion_tokens_min": 8, "completion_tokens_max": 32, "precision": "float64",
             "sampling": "temperature 0.7", "arms": ["mixed"]}
    assert merged_domain([ONE, other, None]) == {
        "ladder": [1, 4, 8], "widths": [4, 7], "prompts": 5, "contexts": 28, "requests": 38, "prompt_tokens_min": 3,
        "completion_tokens_min": 8, "prompt_tokens_max": 12, "completion_tokens_max": 32,
        "sampling": "greedy (temperature 0), temperature 0.7", "precision": "float32, float64", "arms": ["copies", "mixed"]}
    # a row that counted nothing adds nothing (a count it does not have is 0, not 1)
    assert merged_domain([{**ONE, "contexts": 0, "prompts": None}, other])["contexts"] == 20
    assert merged_domain([{**ONE, "contexts": 0, "prompts": None}, other])["prompts"] == 3
    # a length one row does not know is left out of the extremes, not read as 0
    blind = {**other, "prompt_tokens_min": None, "prompt_tokens_max": None}
    assert merged_domain([ONE, blind])["prompt_tokens_min"] == 5 and merged_domain([ONE, blind])["prompt_tokens_max"] == 9
    assert merged_domain([{**ONE, "prompt_tokens_min": None}, blind])["prompt_tokens_min"] is None


@pytest.mark.parametrize("target", [0.5, 0.01])
def test_the_certificate_of_a_bundled_run_states_its_domain(target):
    from analysis import judge
    from analysis.studies._certificate import certificate_document

    document = certificate_document(judge("data/experiment-cpu/row-invariant", target_rate=target), target_rate=target, confidence=0.95)
    # 2 prompts x (4 + 8 + 16) slots, one repeat: 56 contexts of 56 batched requests, 64 tokens each, float32 as torch writes
    assert document["domain"] == {"ladder": [1, 4, 8, 16], "widths": [4, 8, 16], "prompts": 2, "contexts": 56, "requests": 56,
                                  "prompt_tokens_min": 18, "prompt_tokens_max": 21, "completion_tokens_min": 64,
                                  "completion_tokens_max": 64, "sampling": "greedy (temperature 0)", "precision": "float32",
                                  "arms": ["copies"]}


def _without(src, dst, drop, refused=None):
    """A copy of a bundled run without the capture lines ``drop`` accepts (by envelope), listed as refused when ``refused``."""
    import json
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("derived"))
    capture = dst / "captures" / "requests.jsonl"
    lines = capture.read_text().splitlines()
    capture.write_text("".join(line + "\n" for line in lines if not drop(json.loads(line))))
    if refused:
        manifest = json.loads((dst / "manifest.json").read_text())
        manifest["refused"] = refused
        (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def test_a_run_whose_references_are_missing_or_refused_names_each_prompt(tmp_path):
    from pathlib import Path

    from analysis import judge

    src = Path("data/experiment-cpu/batch-invariant")
    gone = _without(src, tmp_path / "gone", lambda e: e.get("prompt_id") == "p1" and e.get("role") == "reference" and e.get("slot") == 0)
    row = judge(gone).frame.row(0, named=True)
    assert (row["verdict"], row["unjudged"], row["alone_unknown"]) == ("UNVERIFIED", 28, 0)  # p1's 28 batched requests
    assert row["reason"] == "no request parts from m=1, but 1 prompt(s) lack a reference, so they are unjudged: p1 ref #1 (not sent)"
    # an experiment run is run again, never resumed as a probe's is (issue 41); its folder is renamed, so where it lands is said
    assert row["next_step"].startswith("finish the run: run the experiment again") and "bia probe" not in row["next_step"]
    assert "this run's mode is batch-invariant" in row["next_step"]
    # ref #2 of p0 refused by the server: p0's alone check lacks it, and the refusal is named
    second = {"prompt_id": "p0", "role": "reference", "slot": 1, "c": None, "repeat": None, "reason": "HTTP 503"}
    refused = _without(src, tmp_path / "refused", lambda e: e.get("prompt_id") == "p0" and e.get("role") == "reference" and e.get("slot") == 1,
                       [second])
    row = judge(refused).frame.row(0, named=True)
    assert (row["verdict"], row["unjudged"], row["alone_unknown"], row["refused"]) == ("UNVERIFIED", 0, 1, 0)
    assert row["reason"] == ("no request parts from m=1, but 1 prompt(s) lack a reference, so they are unjudged: p0 ref #2 (refused); 1 "
                             "request(s) sent alone have no token or bits to compare with ref #1 (or never came back), so the server is "
                             "not shown to repeat itself alone")
