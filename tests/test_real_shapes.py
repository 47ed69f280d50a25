"""Shapes found in real captures (issue 11): a final ``data: [DONE]`` whose blank line was stripped
is a complete stream, for the dump reader and for the probe's event clock alike; SGLang prompt
rows scored from ``logprob_start_len`` sit at their real prompt positions."""

from __future__ import annotations

import itertools
import json

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from analysis import DumpError, read_dump
from analysis.dumps._sse import parse_sse
from analysis.probe._capture import EventClock, stream_problem

SAMPLE = "tests/samples/openai_chat_stream_include_usage__langchain.reframed.sse"


def test_a_capture_without_the_blank_line_after_done_reads_as_the_whole_stream(tmp_path):
    whole = open(SAMPLE, encoding="utf-8").read()
    assert whole.endswith("data: [DONE]\n\n")
    stripped = tmp_path / "stripped.sse"
    stripped.write_text(whole.rstrip(), encoding="utf-8")
    for lenient in (False, True):
        got, want = read_dump(stripped, lenient=lenient), read_dump(SAMPLE, lenient=lenient)
        assert got.skipped == [] and got.formats[str(stripped)] == want.formats[SAMPLE]
        for name in ("tokens", "candidates"):
            assert_frame_equal(getattr(got, name).drop("source"), getattr(want, name).drop("source"))
        assert_frame_equal(got.requests.drop("source", "raw_sha256"), want.requests.drop("source", "raw_sha256"))
    assert stream_problem(whole.rstrip()) is None


def test_an_open_event_other_than_done_is_still_cut():
    assert parse_sse('data: {}\n\ndata: {"x": 1}').cut_mid_event
    assert stream_problem("data: {}\n\ndata: [DONE]\ndata: more") == "the stream was cut mid-event (line 3)"


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.sampled_from(["data: {}", "data: é€", ": note", "event: x\ndata: a"]), max_size=5),
       done=st.sampled_from(["data: [DONE]", "data:[DONE]", "data: [DONE]\n", "data: [DONE]\r", "data: [DONE]\r\n", "event: end\ndata: [DONE]"]),
       cuts=st.sets(st.integers(0, 200), max_size=5))
def test_the_event_clock_agrees_with_the_reader_on_a_done_without_its_blank_line(events, done, cuts):
    text = "".join(e + "\n\n" for e in events) + done
    raw = text.encode()
    clock = EventClock()
    bounds = [0, *sorted(c for c in cuts if c < len(raw)), len(raw)]
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        clock.feed(raw[a:b], float(k))
    clock.finish(float(len(bounds)))
    assert len(clock.arrivals) == len(parse_sse(text).events) == len([e for e in events if "data" in e]) + 1
    assert clock.problem() is None and stream_problem(text) is None


def test_sglang_prompt_rows_sit_at_their_prompt_positions(tmp_path):
    """logprob_start_len=4 on a 6-token prompt: input_token_logprobs holds positions 4 and 5."""
    payload = {"text": "ok", "meta_info": {"id": "r", "prompt_tokens": 6, "completion_tokens": 1,
                                           "input_token_logprobs": [[-1.5, 40, None], [-0.25, 41, None]],
                                           "output_token_logprobs": [[-0.5, 7, None]], "finish_reason": {"type": "length"}}}
    path = tmp_path / "sglang.json"
    path.write_text(json.dumps(payload))
    prompt = read_dump(path).tokens.filter(segment="prompt")
    assert prompt.select("position", "token_id", "logprob").rows() == [(4, 40, -1.5), (5, 41, -0.25)]
    payload["meta_info"]["prompt_tokens"] = 1  # fewer prompt tokens than scored ones: named, not guessed
    path.write_text(json.dumps(payload))
    with pytest.raises(DumpError, match=r"meta_info\.input_token_logprobs: holds 2 positions for prompt_tokens 1"):
        read_dump(path)


def test_a_band_whose_width_was_never_observed_has_an_unknown_width(tmp_path):
    """The gauge missed a short c=1 band and the c=4 band: m_formed is null (V3 says "not recorded"), never 0."""
    from test_run import make_run

    from analysis import shape_check_data
    from analysis.run import read_run, to_witness

    folder = make_run(tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["m_formed"] = [{"prompt_id": "p0", "band_c": c, "widths": [], "running": []} for c in (1, 4)]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    witness = to_witness(read_run(folder))
    c1, c4 = witness["bands"]
    assert (c1["m_formed"], c1["result"], c1["divergence_at"]) == (None, "PASS", 4)  # c=1 needs no batch: still measured
    assert (c4["m_formed"], c4["result"]) == (None, "UNMEASURABLE") and c4["reason"].startswith("no batch width was observed")
    reasons = shape_check_data(witness).reasons
    assert "c=1: m_formed not recorded (shape not shown)" in reasons and not any("m_formed 0" in r for r in reasons)


def test_tgi_with_return_full_text_keeps_the_prompt_out_of_the_completion(tmp_path):
    payload = {"generated_text": "The capital of France is Paris.",
               "details": {"finish_reason": "length", "generated_tokens": 2, "seed": None,
                           "prefill": [{"id": 1, "text": "<s>", "logprob": None}, {"id": 415, "text": "The", "logprob": -9.1}],
                           "tokens": [{"id": 5465, "text": " Paris", "logprob": -0.4, "special": False},
                                      {"id": 28723, "text": ".", "logprob": -0.9, "special": False}]}}
    path = tmp_path / "tgi.json"
    path.write_text(json.dumps(payload))
    request = read_dump(path).requests.row(0, named=True)
    assert request["completion_text"] == " Paris."
    assert json.loads(request["extra"])["full_text"] == "The capital of France is Paris."
    payload["generated_text"] = " Paris."  # return_full_text off: the text as it came, no full_text
    path.write_text(json.dumps(payload))
    request = read_dump(path).requests.row(0, named=True)
    assert request["completion_text"] == " Paris." and "full_text" not in json.loads(request["extra"] or "{}")


def sglang_events(resend: bool) -> list[dict]:
    """Three tokens in two events, then a final event with the finish reason: SGLang resends, lmdeploy sends the new part."""
    triples = [[-0.5, 11, " Par"], [-0.25, 12, "is"], [-1.0, 13, "."]]
    tops = [[[-0.5, 11, " Par"], [-1.5, 99, " Lyon"]], [[-0.25, 12, "is"]], [[-1.0, 13, "."], [-1.25, 14, "!"]]]
    cuts, texts = [(0, 2), (2, 3), (3, 3)], [" Paris", ".", ""]
    events = []
    for k, (a, b) in enumerate(cuts):
        start = 0 if resend else a
        info = {"id": "req-1", "prompt_tokens": 7, "completion_tokens": b, "output_token_logprobs": triples[start:b],
                "output_top_logprobs": tops[start:b], "finish_reason": {"type": "length", "length": 3} if k == 2 else None}
        events.append({"text": "".join(texts[: k + 1]) if resend else texts[k], "output_ids": [11, 12, 13][start:b], "meta_info": info})
    return events


@pytest.mark.parametrize("resend", [True, False])
def test_sglang_and_lmdeploy_generate_streams(tmp_path, resend):
    sse = "".join(f"data: {json.dumps(e)}\n\n" for e in sglang_events(resend)) + "data: [DONE]\n\n"
    path = tmp_path / "capture.jsonl"
    path.write_text(json.dumps({"sse": sse, "arrival_times": [0.25, 0.5, 0.75, 0.8], "prompt_id": "p0", "role": "reference", "slot": 0}) + "\n")
    d = read_dump(path)
    assert d.formats[str(path)] == ["sglang_sse"]
    assert d.tokens.select("position", "token_id", "logprob", "stream_chunk", "t_arrival").rows() == [
        (0, 11, -0.5, 0, 0.25), (1, 12, -0.25, 0, 0.25), (2, 13, -1.0, 1, 0.5)]  # each token once, at the event that first carried it
    assert d.candidates.filter(position=0).select("cand_token_id", "cand_logprob").rows() == [(11, -0.5), (99, -1.5)]
    request = d.requests.row(0, named=True)
    assert (request["completion_text"], request["finish_reason"], request["completion_tokens"], request["prompt_tokens"]) == (" Paris.", "length", 3, 7)
    assert (request["ttft_s"], request["t_last_content"], request["n_content_chunks"], request["request_id"]) == (0.25, 0.5, 2, "req-1")
    assert json.loads(request["extra"])["resent"] is resend


def test_an_sglang_stream_whose_count_disagrees_is_named(tmp_path):
    events = sglang_events(True)
    events[-1]["meta_info"]["completion_tokens"] = 5
    path = tmp_path / "s.sse"
    path.write_text("".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n")
    with pytest.raises(DumpError, match=r"meta_info\.completion_tokens: says 5 tokens but the stream carried 3"):
        read_dump(path)


def responses_stream(*, done_logprob: float = -0.1234, complete: bool = True) -> str:
    """Two deltas ("Hi", " there") with logprobs, the done event repeating them rounded, then response.completed."""
    first = {"token": "Hi", "bytes": [72, 105], "logprob": -0.123412, "top_logprobs": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.123412},
                                                                                    {"token": "Hello", "bytes": [72, 101, 108, 108, 111], "logprob": -2.5}]}
    second = {"token": " there", "bytes": [32, 116, 104, 101, 114, 101], "logprob": -0.5, "top_logprobs": []}
    response = {"id": "resp_1", "model": "m", "status": "in_progress"}
    events = [("response.created", {"response": response}),
              ("response.output_text.delta", {"delta": "Hi", "logprobs": [first]}),
              ("response.output_text.delta", {"delta": " there", "logprobs": [second]}),
              ("response.output_text.done", {"text": "Hi there", "logprobs": [{**first, "logprob": done_logprob}, {**second, "logprob": -0.5}]})]
    if complete:
        events.append(("response.completed", {"response": {**response, "status": "completed", "usage": {"input_tokens": 9, "output_tokens": 2}}}))
    return "".join(f"event: {kind}\ndata: {json.dumps({'type': kind, **body})}\n\n" for kind, body in events)


def test_the_responses_api_stream_reads_its_deltas_and_checks_the_rounded_copies(tmp_path):
    path = tmp_path / "responses.sse"
    path.write_text(responses_stream())
    d = read_dump(path)
    assert d.formats[str(path)] == ["openai_responses_sse"]
    assert d.tokens.select("position", "token_text", "logprob").rows() == [(0, "Hi", -0.123412), (1, " there", -0.5)]  # the deltas' values
    assert d.candidates.select("cand_token_text", "cand_logprob").rows() == [("Hi", -0.123412), ("Hello", -2.5)]
    request = d.requests.row(0, named=True)
    assert (request["completion_text"], request["finish_reason"], request["prompt_tokens"], request["completion_tokens"], request["request_id"]) == (
        "Hi there", "completed", 9, 2, "resp_1")
    path.write_text(responses_stream(done_logprob=-0.2))  # a copy that is not the same value rounded
    with pytest.raises(DumpError, match=r"logprobs: the done event's 2 logprobs disagree with the 2 the deltas carried"):
        read_dump(path)
    path.write_text(responses_stream(complete=False))
    with pytest.raises(DumpError, match="the stream ended without response.completed"):
        read_dump(path)
