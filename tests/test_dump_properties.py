"""Corrupted valid payloads give correct frames or a DumpError, never another exception."""

from __future__ import annotations

import json

from conftest import ROOT, corrupted, examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from analysis.dumps import DumpError
from analysis.dumps._read import parse_source

SAMPLES = ROOT / "tests" / "samples"
CHAT = json.loads((SAMPLES / "vllm_chat_nonstream_token_ids__OpenPipe-ART.json").read_text())
COMPACT = {"request_id": "g", "choices": [json.loads((SAMPLES / "DERIVED_compact_logprobs_u32-f32-le-v1.json").read_text())["choice"]]}
SGLANG = json.loads((SAMPLES / "sglang_generate_meta_info_logprobs__sglang-jax-pr13.partial.json").read_text())
STREAM = (SAMPLES / "openai_chat_stream_include_usage__langchain.reframed.sse").read_bytes()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _check(raw: bytes, fmt: str = "auto") -> None:
    try:
        rows, _ = parse_source(raw, "x.json", fmt)
    except DumpError as error:
        assert error.source == "x.json" and str(error).startswith("x.json: ")
        return
    tokens, candidates, requests = rows.frames()
    statuses = set(tokens["value_status"].to_list())
    assert statuses <= {"ok", "sentinel_9999", "null_in_source", "neg_inf", "float_lowest", "nonfinite", "zero_prob", "missing"}
    ok = tokens.filter(tokens["value_status"] == "ok")
    assert ok["logprob"].null_count() == 0 and (ok["logprob"] <= 1e-6).all()
    assert tokens.filter(tokens["value_status"] != "ok")["logprob"].null_count() == tokens.filter(tokens["value_status"] != "ok").height


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), replacement=json_values, which=st.sampled_from(["chat", "compact", "sglang"]))
def test_corrupted_payloads(data, replacement, which):
    original, fmt = {"chat": (CHAT, "openai_chat"), "compact": (COMPACT, "vllm_generate"), "sglang": (SGLANG, "sglang")}[which]
    payload = corrupted(data, original, replacement)
    _check(json.dumps(payload).encode(), fmt)


CHUNKS = [json.loads(line[6:]) for line in STREAM.decode().split("\n\n") if line.startswith("data: {")]


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), replacement=json_values)
def test_corrupted_stream_chunks(data, replacement):
    chunks = corrupted(data, CHUNKS, replacement)
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    _check(text.encode(), "openai_chat_sse")


@settings(max_examples=examples(150), deadline=None)
@given(cut=st.integers(0, len(STREAM)), junk=st.binary(max_size=8))
def test_cut_or_garbled_streams(cut, junk):
    _check(STREAM[:cut] + junk, "openai_chat_sse")


@settings(max_examples=examples(100), deadline=None)
@given(raw=st.binary(max_size=64))
@example(raw=b"\x80\x00")  # a pickle header and then nothing: torch raises an EOFError with no message
def test_arbitrary_bytes_are_detected_or_refused(raw):
    try:
        parse_source(raw, "x.json")
    except DumpError:
        pass
