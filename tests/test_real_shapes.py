"""Shapes found in real captures (issue 11): a final ``data: [DONE]`` whose blank line was stripped
is a complete stream, for the dump reader and for the probe's event clock alike; SGLang prompt
rows scored from ``logprob_start_len`` sit at their real prompt positions."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from conftest import examples
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


@settings(max_examples=examples(200), deadline=None)
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
    manifest["m_formed"] = [{"prompt_id": "p0", "c": c, "widths": [], "running": []} for c in (1, 4)]
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


# --- issue 23 item 7: vLLM 0.32's chat response, lmdeploy's pairs, the Responses API's count ---------------------------
# Each payload in tests/samples/*__written-for-test.* was written for these tests in the real shape (see its README).

SAMPLES = "tests/samples/"
VLLM_CHAT_NULL = SAMPLES + "vllm-0.32_chat_completion_token_ids_null__written-for-test.json"
VLLM_CHAT_IDS = SAMPLES + "vllm-0.32_chat_completion_return_token_ids__written-for-test.json"
VLLM_GENERATE = SAMPLES + "renderers_generate_response_fixture__renderers-tests-test_client.json"
LMDEPLOY_STREAM = SAMPLES + "lmdeploy_generate_stream_logprob_pairs__written-for-test.sse"
LMDEPLOY = SAMPLES + "lmdeploy_generate_logprob_pairs__written-for-test.json"
RESPONSES = SAMPLES + "openai_responses_stream_end_of_message_uncounted__written-for-test.sse"


@pytest.mark.parametrize("sample", [VLLM_CHAT_NULL, VLLM_CHAT_IDS])
def test_vllm_chat_completion_with_token_ids_keys_is_a_chat_completion(sample):
    """vLLM 0.32 adds token_ids and routed_experts to each choice and prompt_token_ids beside them (null unless asked for)."""
    d = read_dump(sample)
    assert d.formats[sample] == ["openai_chat"]
    request = d.requests.row(0, named=True)
    assert (request["endpoint"], request["source_format"], request["stream"]) == ("chat", "openai_chat", False)
    assert (request["completion_text"], request["finish_reason"], request["completion_tokens"], request["n_completion_scored"]) == ("Paris.", "stop", 3, 3)
    assert "routed_experts" not in json.loads(request["extra"])
    asked = sample == VLLM_CHAT_IDS  # with return_token_ids the ids join the entries; without, none is invented
    assert d.tokens.select("token_id", "token_text", "logprob").rows() == [
        (12095 if asked else None, "Paris", -0.0001234), (13 if asked else None, ".", -0.4519), (151645 if asked else None, "", -0.0312)]
    assert d.candidates.filter(position=1).select("cand_token_text", "cand_logprob", "is_sampled").rows() == [(".", -0.4519, True), ("!", -1.0144, False)]


def test_vllm_generate_is_still_generate():
    d = read_dump(VLLM_GENERATE)
    assert d.formats[VLLM_GENERATE] == ["vllm_generate"]
    assert d.requests.select("endpoint", "source_format").rows() == [("generate", "vllm_generate")]
    assert d.tokens.select("token_id", "logprob").rows() == [(7, -0.1), (8, -0.2)]


def test_a_chat_completion_whose_token_ids_disagree_with_its_entries_is_refused(tmp_path):
    payload = json.load(open(VLLM_CHAT_IDS, encoding="utf-8"))
    payload["choices"][0]["token_ids"] = [12095, 13]
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(DumpError, match=r"choices\[0\]\.logprobs\.content: holds 3 entries for 2 token_ids"):
        read_dump(path)


def test_lmdeploy_generate_stream_sends_pairs(tmp_path):
    """lmdeploy's streamed /generate: only the new tokens, each as [logprob, token_id]; the last event has no logprobs."""
    d = read_dump(LMDEPLOY_STREAM)
    assert d.formats[LMDEPLOY_STREAM] == ["sglang_sse"]
    assert d.tokens.select("position", "token_id", "token_text", "logprob", "stream_chunk").rows() == [
        (0, 12095, None, -0.0002703, 0), (1, 285, None, -0.0107, 1), (2, 13, None, -0.3921, 2)]
    request = d.requests.row(0, named=True)
    assert (request["endpoint"], request["completion_text"], request["finish_reason"], request["prompt_tokens"], request["completion_tokens"]) == (
        "generate", "Paris.", "stop", 9, 3)
    assert json.loads(request["extra"])["resent"] is False
    whole = read_dump(LMDEPLOY)
    assert whole.formats[LMDEPLOY] == ["sglang"] and whole.requests["endpoint"].to_list() == ["generate"]
    assert whole.tokens.select("token_id", "token_text", "logprob").rows() == d.tokens.select("token_id", "token_text", "logprob").rows()


@pytest.mark.parametrize(("entry", "message"), [
    ([-0.5], r"output_token_logprobs\[1\]: expected \[logprob, token_id, text\|null\] or \[logprob, token_id\], got \[-0.5\]"),
    ([-0.5, 285, None, "x"], r"output_token_logprobs\[1\]: expected \[logprob, token_id, text\|null\] or \[logprob, token_id\]"),
    ([-0.5, "285"], r"output_token_logprobs\[1\]\.\[1\] token_id: expected an integer"),
    ({"logprob": -0.5}, r"output_token_logprobs\[1\]: expected \[logprob, token_id"),
])
def test_malformed_lmdeploy_entries_are_still_refused(tmp_path, entry, message):
    events = [json.loads(line.removeprefix("data: ")) for line in open(LMDEPLOY_STREAM, encoding="utf-8").read().split("\n\n") if line[6:7] == "{"]
    events[1]["meta_info"]["output_token_logprobs"] = [[-0.0002703, 12095], entry]
    path = tmp_path / "lmdeploy.sse"
    path.write_text("".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n")
    with pytest.raises(DumpError, match=message):
        read_dump(path)


def test_the_responses_api_counts_its_end_of_message_token(tmp_path):
    """usage.output_tokens is one more than the logprob entries: recorded in requests.extra and on the card, not refused."""
    d = read_dump(RESPONSES)
    assert d.formats[RESPONSES] == ["openai_responses_sse"] and d.skipped == []
    assert d.tokens.select("token_text", "token_bytes", "logprob").rows() == [("Ol", b"Ol", -0.00071), ("á", "á".encode(), -0.0000019), ("!", b"!", -0.1602)]
    request = d.requests.row(0, named=True)
    assert (request["endpoint"], request["completion_text"], request["finish_reason"], request["prompt_tokens"]) == ("responses", "Olá!", "completed", 11)
    assert (request["completion_tokens"], request["n_completion_scored"]) == (4, 3)
    extra = json.loads(request["extra"])
    assert extra["usage_minus_entries"] == 1 and "end-of-message token" in extra["usage_minus_entries_reason"]
    card = d._repr_html_()
    assert "usage counts tokens never sent" in card and "usage counts 4 tokens, 3 logprob entries (1 more: the end-of-message token" in card
    assert "usage counts tokens never sent" not in read_dump(LMDEPLOY)._repr_html_()


def _responses_events(text: str) -> list[tuple[str, dict]]:
    blocks = [b.split("\n", 1) for b in text.split("\n\n") if b]
    return [(kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))) for kind, data in blocks]


def _write_responses(path, events) -> None:
    path.write_text("".join(f"event: {k}\ndata: {json.dumps(b)}\n\n" for k, b in events))


def _completed(events) -> dict:
    return next(b for k, b in events if k == "response.completed")["response"]


@pytest.mark.parametrize("change", ["a byte token's entry lost", "two more", "incomplete"])
def test_a_responses_count_that_lost_entries_stays_an_error(tmp_path, change):
    """llama.cpp held a byte token back and sent its text without its entry: the entries no longer spell the text."""
    events = _responses_events(open(RESPONSES, encoding="utf-8").read())
    deltas = [b for k, b in events if k == "response.output_text.delta"]
    if change == "a byte token's entry lost":  # "á" as two byte tokens, the first one's entry lost: 4 counted, 3 entries
        deltas[1]["logprobs"] = [{"token": "\\xa1", "logprob": -0.25, "bytes": [0xA1], "top_logprobs": []}]
        for k, body in events:
            if k == "response.output_text.done":
                body["logprobs"][1] = {**deltas[1]["logprobs"][0]}
        _completed(events)["usage"]["output_tokens"] = 4
    elif change == "two more":
        _completed(events)["usage"]["output_tokens"] = 5
    else:  # cut by max_output_tokens: no end-of-message token to count
        _completed(events).update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    path = tmp_path / "responses.sse"
    _write_responses(path, events)
    with pytest.raises(DumpError, match=r"usage\.output_tokens: says [45] tokens but the stream carried 3 logprob entries"):
        read_dump(path)
    d = read_dump(path, lenient=True)  # lenient keeps the rows, names the problem, records no reason
    assert len(d.skipped) == 1 and "usage_minus_entries" not in json.loads(d.requests["extra"][0])


def _reasoning_stream(tmp_path, counted: int, status: str):
    """The recorded Responses stream (3 entries) as a reasoning model's: 64 reasoning tokens, ``counted`` output tokens."""
    events = _responses_events(open(RESPONSES, encoding="utf-8").read())
    response = _completed(events)
    response["usage"].update(output_tokens=counted, output_tokens_details={"reasoning_tokens": 64})
    if status == "incomplete":
        response.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    path = tmp_path / "responses.sse"
    _write_responses(path, events)
    return path


@pytest.mark.parametrize(("counted", "status", "gap", "reasons"), [
    (3 + 64 + 1, "completed", 65, ["64 reasoning tokens", "end-of-message token"]),
    (3 + 64, "completed", 64, ["64 reasoning tokens"]),  # a count that leaves the end token out
    (3 + 64, "incomplete", 64, ["64 reasoning tokens"]),  # cut short: reasoning, no end token
])
def test_a_reasoning_models_unstreamed_tokens_are_recorded_not_refused(tmp_path, counted, status, gap, reasons):
    """A reasoning model's usage.output_tokens counts its reasoning tokens (output_tokens_details.reasoning_tokens),
    which the stream never sends with logprobs: 3 entries + 64 reasoning (+ 1 end token when completed) is a fact."""
    extra = json.loads(read_dump(_reasoning_stream(tmp_path, counted, status)).requests["extra"][0])
    assert extra["usage_minus_entries"] == gap
    assert [r in extra["usage_minus_entries_reason"] for r in reasons] == [True] * len(reasons)
    assert ("end-of-message" in extra["usage_minus_entries_reason"]) == (gap == 65)


@pytest.mark.parametrize(("counted", "status"), [(3 + 63, "completed"), (3 + 66, "completed"), (3 + 65, "incomplete")])
def test_a_reasoning_count_that_does_not_add_up_stays_an_error(tmp_path, counted, status):
    with pytest.raises(DumpError, match=rf"usage\.output_tokens: says {counted} tokens but the stream carried 3 logprob entries"):
        read_dump(_reasoning_stream(tmp_path, counted, status))


def test_a_llamacpp_chat_stream_that_lost_a_byte_token_entry_stays_an_error(tmp_path):
    """llama.cpp's chat stream: "é" came as two byte tokens, only the second with its entry; usage counts both."""
    def chunk(content, entries, **more):
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None, "logprobs": {"content": entries}}], **more}
    events = [chunk("Caf", [{"id": 34, "token": "Caf", "logprob": -0.5, "bytes": list(b"Caf"), "top_logprobs": []}]),
              chunk("é", [{"id": 114, "token": "\\xa9", "logprob": -0.01, "bytes": [0xA9], "top_logprobs": []}]),
              {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}]
    path = tmp_path / "llamacpp.sse"
    path.write_text("".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n")
    with pytest.raises(DumpError, match=r"usage\.completion_tokens: says 3 tokens but the stream carried 2 logprob entries"):
        read_dump(path)


def _npy_b64(array) -> str:
    import base64
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return base64.b64encode(buffer.getvalue()).decode()


def test_vllm_chat_routed_experts_are_npy_bytes_kept_undecoded(tmp_path):
    """vLLM 0.32's chat choice gives routed experts as base64 .npy bytes of [tokens - 1, layers, top_k] (the last token has none)."""
    payload = json.load(open(VLLM_CHAT_IDS, encoding="utf-8"))
    text = _npy_b64(np.arange(8, dtype=np.uint16).reshape(2, 2, 2))
    payload["choices"][0]["routed_experts"] = text
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(payload))
    d = read_dump(path)
    assert d.formats[str(path)] == ["openai_chat"] and d.requests["endpoint"].to_list() == ["chat"]
    assert json.loads(d.requests["extra"][0])["routed_experts"] == {"format": "npy", "data": text, "shape": [2, 2, 2], "dtype": "uint16"}
    for bad, message in ((_npy_b64(np.zeros((2, 2), dtype=np.uint8)), "expected a 3-d integer array"),
                         (_npy_b64(np.zeros((2, 2, 2), dtype=np.float32)), "expected a 3-d integer array"),
                         (_npy_b64(np.zeros((2, 2, 2), dtype=np.uint8))[:-4], "holds 7 bytes of data; shape \\[2, 2, 2\\] of uint8 needs 8"),
                         ("QUJD", "expected base64 .npy bytes")):
        payload["choices"][0]["routed_experts"] = bad
        path.write_text(json.dumps(payload))
        with pytest.raises(DumpError, match=r"choices\[0\]\.routed_experts: " + message):
            read_dump(path)
