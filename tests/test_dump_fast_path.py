"""The columnar path for chat JSON lines, bare or in capture envelopes, gives exactly the frames of the general path, or leaves the file to it."""

from __future__ import annotations

import json
import random

import orjson
import polars as pl
import pytest
from conftest import ROOT, examples
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from analysis import DumpError
from analysis.dumps.formats import read_capture_jsonl, read_chat_jsonl, read_jsonl
from analysis.dumps._read import parse_source, read_dumps
from analysis.metrics.parity import request_decode_rates
from analysis.run import read_run


def _entry(token, logprob, top=None, with_bytes=True, **extra):
    e = {"token": token, "logprob": logprob, **extra}
    if with_bytes:
        e["bytes"] = list(token.encode())
    if top is not None:
        e["top_logprobs"] = [{"token": t, "logprob": v, "bytes": list(t.encode()), **x} for t, v, x in top]
    return e


LINES = [
    {"id": "a", "object": "chat.completion", "model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6, "prompt_tokens_details": None},
     "choices": [{"index": 0, "finish_reason": "length", "message": {"content": "Hi!"}, "logprobs": {"content": [
         _entry("token_id:5", -0.25, [("token_id:5", -0.25, {}), ("token_id:7", -1.5, {}), ("token_id:5", -0.25, {}), ("token_id:9", -9999.0, {})]),
         _entry("token_id:6", -9999.0, []),
         _entry("token_id:8", -3.4028234663852886e38, None),
     ]}}]},
    {"id": "b", "object": "chat.completion", "model": "m",
     "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "yo"}, "logprobs": {"content": [
         _entry("y", -0.5, [("y", -0.5, {}), ("Y", -1.0, {}), ("y", -0.5, {})], id=88),
         _entry("o", 0.0, [("o", 0.0, {"id": 3}), ("0", -4.0, {"id": 4})], with_bytes=False),
     ]}}, {"index": 1, "finish_reason": "stop", "message": {"content": None}, "logprobs": None}]},
    {"id": "c", "object": "chat.completion", "model": "m", "choices": []},
    {"id": "d", "model": "m", "choices": [{"index": 0, "message": {"content": "é"}, "logprobs": {"content": [_entry("é", -1e-7, [("é", -1e-7, {}), ("e", -20.0, {})])]}}]},
]


def _write(tmp_path, lines):
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(line, ensure_ascii=False) for line in lines) + "\n", encoding="utf-8")
    return path


def test_fast_path_equals_general_path(tmp_path):
    path = _write(tmp_path, LINES)
    fast = read_chat_jsonl(path, str(path))
    assert fast is not None, "the columnar path must take this file"
    rows, formats = parse_source(path.read_bytes(), str(path))
    assert formats == {"openai_chat"}
    for name, expected, got in zip(("tokens", "candidates", "requests"), rows.frames(), fast):
        assert got.schema == expected.schema, name
        assert got.equals(expected), (name, got, expected)
    tokens = fast[0]
    assert tokens["value_status"].to_list() == ["ok", "sentinel_9999", "float_lowest", "ok", "ok", "ok"]
    assert fast[1]["is_duplicate"].to_list() == [False, False, True, False, False, False, True, False, False, False, False]


@pytest.mark.parametrize(
    "change",
    [
        lambda lines: lines[0]["choices"][0]["logprobs"]["content"][1].update(logprob=None),  # null: missing or null? the general path knows
        lambda lines: lines.append({"response": {"choices": []}, "c": 4}),  # an envelope line
        lambda lines: lines[1]["choices"][0].update(token_ids=[1, 2]),  # a generate choice
        lambda lines: lines[3]["choices"][0]["logprobs"]["content"][0].update(prob=0.5),  # a llama.cpp post-sampling entry
        lambda lines: lines.insert(1, {"meta_info": {}}),
    ],
)
def test_other_shapes_take_the_general_path(tmp_path, change):
    lines = json.loads(json.dumps(LINES))
    change(lines)
    path = _write(tmp_path, lines)
    assert read_chat_jsonl(path, str(path)) is None


def test_refusals_in_the_general_path_are_named(tmp_path):
    lines = json.loads(json.dumps(LINES))
    lines[1]["choices"][0]["logprobs"]["content"][0]["logprob"] = 0.5
    path = _write(tmp_path, lines)
    assert read_chat_jsonl(path, str(path)) is None
    with pytest.raises(DumpError, match="line 2.choices\\[0\\].logprobs.content\\[0\\].logprob: expected a logprob <= 0, got 0.5"):
        read_dumps(path)


def test_a_named_format_is_left_to_the_general_path(tmp_path):
    path = _write(tmp_path, LINES)
    assert read_jsonl(path, str(path), "openai_chat") is None
    with pytest.raises(DumpError, match="not valid JSON"):  # the general path reads a named payload format as one document
        read_dumps(path, format="openai_chat")
    assert read_dumps(path, format="jsonl").requests.height == 4


def test_read_dumps_uses_it(tmp_path):
    path = _write(tmp_path, LINES)
    d = read_dumps(path)
    assert d.formats == {str(path): ["openai_chat"]}
    assert d.tokens.height == 6 and d.requests.height == 4
    assert d.requests["record"].to_list() == [1, 2, 2, 4]
    assert d.tokens.filter(pl.col("record") == 2)["token_id"].to_list() == [88, None]


# --- capture envelopes ---------------------------------------------------------------------------
#
# A run's captures/*.jsonl: one request a line, {"response": {...}, ...} or {"sse": "<raw SSE>", "arrival_times": [...], ...}.

EXPERIMENT = sorted((ROOT / "data" / "experiment-cpu").glob("*/captures/requests.jsonl"))
TEXTS = ["Hel", "lo", " é", "{", '"', "\\", "token_id:42", "\n", "日本", "}", "text", ""]


def _general(path, raw=None):
    rows, formats = parse_source(path.read_bytes() if raw is None else raw, str(path))
    return rows.frames(), formats


def _assert_same(got, expected):
    for name, a, b in zip(("tokens", "candidates", "requests"), got, expected):
        assert a.schema == b.schema, name
        assert_frame_equal(a, b, check_exact=True)


def _fast_equals_general(path):
    fast = read_capture_jsonl(path, str(path))
    assert fast is not None, "the columnar path must take this file"
    frames, formats = fast
    expected, found = _general(path)
    assert formats == found
    _assert_same(frames, expected)
    assert read_jsonl(path, str(path)) is not None  # read_dumps's entry takes it too
    return frames


def _cand(token, logprob, **extra):
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), **extra}


def _entries(texts, seed=0, top=3):
    """Entries as vLLM and llama.cpp give them: placeholders with their own bytes, ids, duplicates, sentinels."""
    rng = random.Random(seed)
    out = []
    for k, text in enumerate(texts):
        value = rng.choice([-0.25, -1.5, -9999.0, -3.4028234663852886e38, 0.0, -1e-7, -0.1 * (k + 1)])
        cands = [_cand(text, value)] + [_cand(rng.choice(TEXTS + ["token_id:7", "token_id:99"]), -2.0 - j) for j in range(rng.randrange(top))]
        if rng.random() < 0.3:
            cands.append(dict(cands[0]))  # a repeated candidate: flagged as a duplicate
        entry = _cand(text, value, top_logprobs=cands)
        if rng.random() < 0.3 and not text.startswith("token_id:"):
            entry["id"] = 1000 + k
            for c in cands:
                c.pop("bytes")
        out.append(entry)
    return out


def _chat(rid, texts, *, n_choices=1, usage=True, seed=0, logprobs=True, timings=None):
    choices = [{"index": c, "finish_reason": "length", "message": {"role": "assistant", "content": "".join(texts)},
                "logprobs": {"content": _entries(texts, seed + c)} if logprobs else None} for c in range(n_choices)]
    out = {"id": rid, "object": "chat.completion", "model": "m", "choices": choices, **({"timings": timings} if timings else {})}
    if usage:
        out["usage"] = {"prompt_tokens": 5, "completion_tokens": len(texts), "total_tokens": 5 + len(texts), "prompt_tokens_details": None}
    return out


def _response_envelopes():
    """Several prompts, roles and bands; keys before and after the response; missing optional keys; extra keys."""
    lines = []
    for p, prompt in enumerate(["p0", "p1", 7]):  # an integer prompt_id is read as its text
        lines.append({"response": _chat(f"r{p}", TEXTS[: 3 + p], seed=p), "prompt_id": prompt, "role": "reference", "slot": 0, "t_sent": 0})
        lines.append({"unit": f"{prompt}/band/c4/r0", "prompt_id": prompt, "role": "band", "c": 4, "slot": 1, "repeat": 0,
                      "response": _chat(f"b{p}", TEXTS[p:], seed=10 + p), "gpu": "H200", "t_sent": 0.5, "batch_row": [1, 2]})
    lines.append({"sample_key": "k1", "meta": {"nested": ["x", None, 1.5], "é": True}, "usage": "the response's usage wins",
                  "response": _chat("multi", TEXTS[:4], n_choices=2, usage=False)})
    lines.append({"response": {"id": "", "object": "chat.completion", "model": "m", "choices": []}, "role": "band"})  # no choice: no row
    lines.append({"format": "openai_chat", "response": _chat("", TEXTS[:2], logprobs=False), "c": 16, "slot": 15})
    lines.append({"response": _chat("u", TEXTS[5:8], usage=False, timings={"predicted_n": 3, "predicted_ms": 3, "prompt_n": 1}),
                  "arrival_times": [0.25]})  # arrival times mean nothing without a stream; the server's timings are kept
    lines.append({"role": "band", "response": _chat("o", TEXTS[:3], seed=5), "sampler": {"top_k": {"n": 20}, "s": "}, \"x\": {"}, "after": {},
                  "slot": 2})  # objects after the response
    return lines


WRITERS = {
    "json": lambda line: json.dumps(line).encode(),
    "json-utf8": lambda line: json.dumps(line, ensure_ascii=False).encode(),
    "orjson": orjson.dumps,
}


def _write_lines(path, lines, writer="json-utf8"):
    path.write_bytes(b"".join(WRITERS[writer](line) + b"\n" for line in lines))
    return path


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_response_envelopes_equal_the_general_path(tmp_path, writer):
    frames = _fast_equals_general(_write_lines(tmp_path / "captures.jsonl", _response_envelopes(), writer))
    tokens, _, requests = frames
    assert requests["record"].to_list() == [1, 2, 3, 4, 5, 6, 7, 7, 9, 10, 11]
    assert json.loads(requests["extra"][10])["sampler"] == {"top_k": {"n": 20}, "s": '}, "x": {'}  # objects after the response
    assert requests["prompt_id"].to_list()[:6] == ["p0", "p0", "p1", "p1", "7", "7"]
    assert json.loads(requests["extra"][1]) == {"batch_row": [1, 2], "gpu": "H200", "unit": "p0/band/c4/r0",
                                                "usage": {"completion_tokens": 12, "prompt_tokens": 5, "total_tokens": 17}}
    assert json.loads(requests["extra"][6])["usage"] == "the response's usage wins"  # no usage in that response: the envelope's stays
    assert requests["request_id"][8] is None  # "" is no id
    assert json.loads(requests["extra"][9])["timings"] == {"predicted_n": 3, "predicted_ms": 3.0}
    assert tokens.filter(pl.col("record") == 7)["sample_key"].unique().to_list() == ["k1"]


def _sse(chunks, end="\n\n"):
    return "".join(f"data: {json.dumps(c, ensure_ascii=False)}{end}" for c in chunks) + f"data: [DONE]{end}"


def _chunk(rid, choices, **extra):
    return {"id": rid, "object": "chat.completion.chunk", "model": "m", **extra, "choices": choices}


def _delta(index, content=None, entries=None, finish=None):
    return {"index": index, "delta": {} if content is None else {"content": content}, "logprobs": None if entries is None else {"content": entries},
            "finish_reason": finish}


def _stream_envelope(rid, texts, *, n=1, live=True, usage=True, arrivals=True, together=False, seed=0, **meta):
    """A streamed chat completion in its envelope: a role chunk, one chunk per token (choices interleaved or together), usage."""
    entries = [_entries(texts, seed + i) for i in range(n)]
    chunks = [_chunk(rid, [{"index": i, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None} for i in range(n)],
                     **({"stream_mode": "live"} if live else {}))]
    for k, text in enumerate(texts):
        finish = "length" if k == len(texts) - 1 else None
        deltas = [_delta(i, text, [entries[i][k]], finish) for i in range(n)]
        chunks += [_chunk(rid, deltas)] if together else [_chunk(rid, [d]) for d in deltas]
    if usage:
        chunks.append(_chunk(rid, [], usage={"prompt_tokens": 4, "completion_tokens": len(texts), "total_tokens": 4 + len(texts)}))
    envelope = {"sse": _sse(chunks), **meta}
    if arrivals:
        envelope["arrival_times"] = [0.125 * j if j % 3 else j // 3 for j in range(len(chunks) + 1)]  # integers too
    return envelope


def _stream_envelopes():
    lines = []
    for p, prompt in enumerate(["p0", "p1"]):
        lines.append(_stream_envelope(f"{prompt}-ref", TEXTS[: 4 + p], seed=p, prompt_id=prompt, role="reference", slot=0, t_sent=0.0,
                                      unit=f"{prompt}/reference/s0", sent_at_s=1.5))
        for slot in range(2):
            lines.append(_stream_envelope(f"{prompt}-c2-s{slot}", TEXTS[p : p + 5], seed=20 + slot, prompt_id=prompt, role="band", c=2,
                                          slot=slot, repeat=0, batch_row=slot))
    lines.append(_stream_envelope("two", TEXTS[:3], n=2, prompt_id="p2", role="band", c=2, slot=0, sample_key="s"))
    lines.append(_stream_envelope("two-together", TEXTS[:3], n=2, together=True, live=False, usage=False, format="openai_chat_sse"))
    lines.append(_stream_envelope("no-times", TEXTS[6:], arrivals=False, role="observer"))
    odd = [_chunk("odd", [_delta(0, "", None)], stream_mode="buffered"), {"id": "odd2", "usage": {"completion_tokens": 2}},  # no choices key
           _chunk("odd2", [_delta(1, "A", _entries(["A"])), _delta(0, "B", None, "stop")]), _chunk("odd2", [_delta(1, None, _entries(["C"]), "length")]),
           _chunk("odd2", [{"delta": {"content": "D"}, "logprobs": {"content": []}}])]  # index omitted: its position, 0
    lines.append({"sse": _sse(odd), "arrival_times": [0.5, None, 0.75, 1.0, 1.25, 1.5], "prompt_id": "p3"})
    rushed = _stream_envelope("rushed", TEXTS[:4], live=False, prompt_id="p4", arrivals=False)
    rushed["arrival_times"] = [0.25, 1.0, 1.00002, 1.00004, 1.00006, 1.00008, 1.0001]  # role chunk, 4 tokens 20 us apart after 1 s, usage, [DONE]
    lines.append(rushed)
    packed = [_chunk("packed", [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]),
              _chunk("packed", [_delta(0, "".join(TEXTS[:4]), _entries(TEXTS[:4]))]),
              _chunk("packed", [_delta(0, "".join(TEXTS[4:8]), _entries(TEXTS[4:8], 1), "length")])]
    lines.append({"sse": _sse(packed), "arrival_times": [0.25, 1.0, 1.0002, 1.0003], "prompt_id": "p5"})  # 8 tokens in 2 chunks 0.2 ms apart
    # said live, read 20 us a token apart; the server's own timing in the usage chunk, as llama.cpp and bia serve send it (an
    # integer where a float is meant, and fields bia does not keep), and an empty one after it, which keeps nothing
    timed = _stream_envelope("said-live", TEXTS[:4], prompt_id="p6", arrivals=False)
    chunks = [json.loads(event.removeprefix("data: ")) for event in timed["sse"].split("\n\n")[:-2]]
    chunks[-1]["timings"] = {"prompt_n": 4, "prompt_ms": 1.5, "predicted_n": 4, "predicted_ms": 2, "predicted_per_second": 2000.0, "cache_n": 0}
    chunks.append(_chunk("said-live", [], timings={}))
    timed["sse"] = _sse(chunks)
    timed["arrival_times"] = [0.25, 1.0, 1.00002, 1.00004, 1.00006, 1.00008, 1.0001, 1.00012]
    lines.append(timed)
    return lines


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_stream_envelopes_equal_the_general_path(tmp_path, writer):
    tokens, _, requests = _fast_equals_general(_write_lines(tmp_path / "captures.jsonl", _stream_envelopes(), writer))
    first = requests.row(0, named=True)
    assert (first["ttft_s"], first["t_last_content"], first["n_content_chunks"], first["stream_live"]) == (0.125, 0.5, 4, True)
    no_mode = requests.filter(pl.col("record") == 8)  # no stream_mode: judged from its arrival times, 0.125 s apart or more
    assert no_mode["liveness"].to_list() == ["observed live"] * 2 and no_mode["stream_live"].to_list() == [True, True]
    assert requests.filter(pl.col("record") == 10)["liveness"].to_list() == ["declared replay"] * 2  # stream_mode "buffered"
    assert requests.filter(pl.col("record") == 10)["choice_index"].to_list() == [0, 1]
    # 4 content chunks 1.0 .. 1.00006 s: span 6e-5 < 0.2 * 1.00006 and < 0.1 ms * 3 gaps
    assert requests.filter(pl.col("record") == 11)["liveness"].to_list() == ["observed rush"]
    # 8 tokens in 2 content chunks at 1.0 and 1.0002 s: 0.2 ms < 0.1 ms * 7 tokens' gaps, and < 0.2 * 1.0002
    assert requests.filter(pl.col("record") == 12)["liveness"].to_list() == ["observed rush"]
    said = requests.filter(pl.col("record") == 13).row(0, named=True)  # said live, read in a rush: the server's timing is its rate
    assert said["liveness"] == "observed rush" and json.loads(said["extra"])["timings"] == {"predicted_n": 4, "predicted_ms": 2.0,
                                                                                             "predicted_per_second": 2000.0}
    assert request_decode_rates(requests.filter(pl.col("record") == 13))["decode_tok_s"].to_list() == [2000.0]
    assert tokens.filter(pl.col("record") == 10)["request_id"].to_list() == ["odd2", "odd2"]
    assert tokens["t_arrival"].null_count() > 0 and tokens["stream_chunk"].null_count() == 0


@pytest.mark.parametrize("odd", [None, "token_id:+5", "token_id: 5", "token_id:5 "])
def test_placeholders_with_zeros_a_sign_or_spaces(tmp_path, odd):
    texts = ["token_id:007", "token_id:-0", "token_id:9223372036854775807", "x", *([odd] if odd else [])]
    lines = [{"response": _chat("r", texts), "prompt_id": "p0"}, {"response": _chat("s", texts[::-1], seed=1), "prompt_id": "p1"}]
    tokens = _fast_equals_general(_write_lines(tmp_path / "captures.jsonl", lines))[0]
    assert tokens["token_id"].head(3).to_list() == [7, 0, 9223372036854775807]  # what is not plain digits is text


def test_the_careful_cut_is_searched_only_where_a_key_after_the_response_holds_an_object(tmp_path, monkeypatch):
    import analysis.dumps.formats._capture_fast as capture

    searched = []
    search = capture._object_pair_ending
    monkeypatch.setattr(capture, "_object_pair_ending", lambda *args: searched.append(1) or search(*args))
    plain = [line for line in _response_envelopes() if "sampler" not in line]
    _fast_equals_general(_write_lines(tmp_path / "plain.jsonl", plain, "orjson"))
    assert not searched  # the last brace before the pairs after it ends the response: the JSON reader confirms it
    _fast_equals_general(_write_lines(tmp_path / "objects.jsonl", _response_envelopes(), "orjson"))
    assert searched  # the reader refused the first cut (the response and "after": {} as one line), the careful one it reads


@pytest.mark.parametrize("path", EXPERIMENT, ids=lambda p: p.parent.parent.name)
def test_committed_experiment_captures_equal_the_general_path(path):
    tokens, candidates, requests = _fast_equals_general(path)
    assert requests.height == 62 and requests["stream_live"].all() and requests["ttft_s"].null_count() == 0


@pytest.mark.parametrize("arm", ["cache-prompt", "no-cache-prompt"])
def test_llamacpp_captures_keep_the_servers_timings_on_both_paths(arm):
    """Issue 32 item 9: llama.cpp times each request itself (``timings`` in its last chunk); both paths keep its decode part."""
    requests = _fast_equals_general(ROOT / "data" / "llamacpp-cpu" / arm / "captures" / "requests.jsonl")[2]
    timings = requests["extra"].str.json_path_match("$.timings.predicted_per_second").cast(pl.Float64)
    assert timings.null_count() == 0 and timings.min() > 100


def test_envelope_keys_spelled_with_escapes(tmp_path):
    path = tmp_path / "captures.jsonl"
    lines = _response_envelopes()[:2] + _stream_envelopes()[:2]
    for line in lines:
        line["note"] = "é"
    data = b"".join(WRITERS["json"](line) + b"\n" for line in lines)
    data = data.replace(b'"note"', b'"n\\u006fte"').replace(b', "role"', b', "r\\u006fle"')  # the envelope's role, not the message's
    path.write_bytes(data)
    _, _, requests = _fast_equals_general(path)
    assert requests["role"].to_list() == ["reference", "band", "reference", "band"]


def test_numbers_as_python_writes_nan_and_infinity(tmp_path):
    data = b"".join(WRITERS["json"](line) + b"\n" for line in _response_envelopes()[:3])
    for old, new in [(b'"logprob": -0.25', b'"logprob": NaN'), (b'"logprob": -1.5', b'"logprob": -Infinity'), (b'"logprob": -2.0', b'"logprob": Infinity')]:
        assert old in data
        data = data.replace(old, new, 1)
    path = tmp_path / "captures.jsonl"
    path.write_bytes(data)
    tokens, candidates, _ = _fast_equals_general(path)  # orjson refuses them, the general path reads them with json
    assert {"nonfinite", "neg_inf"} <= set(tokens["value_status"].to_list()) | set(candidates["cand_status"].to_list())


def test_mixed_kinds_in_one_file(tmp_path):
    responses, streams = _response_envelopes(), _stream_envelopes()
    lines = [streams[0], responses[0], responses[1], streams[1], streams[2], responses[2]]
    frames = _fast_equals_general(_write_lines(tmp_path / "captures.jsonl", lines))
    sse, chat = "openai_chat_sse", "openai_chat"
    assert frames[2]["source_format"].to_list() == [sse, chat, chat, sse, sse, chat]


@pytest.mark.slow
@pytest.mark.parametrize("chunk_bytes", [4096, 50_000])
def test_small_chunks_lines_longer_than_a_chunk_and_reading_ahead(tmp_path, monkeypatch, chunk_bytes):
    import analysis.dumps._fastkit as fast

    monkeypatch.setattr(fast, "_CHUNK_BYTES", chunk_bytes)  # many chunks, a reused buffer that must grow for long lines
    responses, streams = _response_envelopes(), _stream_envelopes()
    lines = [line for pair in zip(responses, streams) for line in pair] * 3
    lines.append({"response": _chat("long", TEXTS * 40, seed=3), "prompt_id": "p9"})  # longer than a chunk
    _fast_equals_general(_write_lines(tmp_path / "captures.jsonl", lines))
    bare = _write(tmp_path, [_chat(f"b{i}", TEXTS[i % 5 :], seed=i) for i in range(40)] + [_chat("long", TEXTS * 40)])
    expected, _ = _general(bare)
    _assert_same(read_chat_jsonl(bare, str(bare)), expected)


def test_the_scratch_buffer_grows_and_holds_only_this_chunks_lines():
    from analysis.dumps._fastkit import _Scratch

    scratch = _Scratch()
    assert bytes(scratch.lines([b"ab", memoryview(b"xcdx")[1:3]])) == b"ab\ncd"
    held = scratch.lines([b"0123456789"] * 3)  # more than it holds: a new buffer
    assert bytes(held) == b"0123456789\n0123456789\n0123456789"
    assert bytes(scratch.lines([b"e", b""])) == b"e\n"  # the longer lines before it left out
    assert bytes(held[:4]) == b"e\n\n3"  # a view is valid until the next call only


@pytest.mark.parametrize("where", ["reading", "building frames"])
def test_no_reading_thread_outlives_a_refusal(tmp_path, monkeypatch, where):
    import threading

    import analysis.dumps._fastkit as fast

    monkeypatch.setattr(fast, "_CHUNK_BYTES", 50_000)
    lines = _stream_envelopes() * 4
    if where == "reading":  # the thread that reads ahead refuses
        lines[-1] = {**lines[-1], "c": "2"}
    else:  # the caller refuses while the thread has read ahead
        lines[3] = {**lines[3], "sse": lines[3]["sse"].replace('"logprob": ', '"logprob": 0.5, "x": ', 1)}
    path = _write_lines(tmp_path / "captures.jsonl", lines)
    assert read_capture_jsonl(path, str(path)) is None
    assert not [t for t in threading.enumerate() if t.name == "bia-read-ahead"]


def test_read_dumps_and_read_run_take_it(tmp_path, monkeypatch):
    import analysis.dumps._read as reader

    run = tmp_path / "run"
    (run / "captures").mkdir(parents=True)
    (run / "manifest.json").write_text((EXPERIMENT[0].parent.parent / "manifest.json").read_text())
    (run / "captures" / "requests.jsonl").write_bytes(EXPERIMENT[0].read_bytes())
    # other prompts than the experiment's: one request of a run's plan has one capture line
    others = [{**line, "prompt_id": f"other-{line['prompt_id']}"} if "prompt_id" in line else line for line in _response_envelopes()]
    _write_lines(run / "captures" / "responses.jsonl", others)
    expected = {name: _general(run / "captures" / name)[0] for name in ("requests.jsonl", "responses.jsonl")}

    def general_only(*args, **kwargs):
        raise AssertionError("the general path was taken")

    monkeypatch.setattr(reader, "parse_source", general_only)
    dump = read_run(run).dump
    assert dump.formats == {str(run / "captures" / "requests.jsonl"): ["openai_chat_sse"], str(run / "captures" / "responses.jsonl"): ["openai_chat"]}
    # a run's requests also carry the control arm each was fired in (read from its envelope; here a run made before
    # arms: its references, and copies for the rest); the rest is the general path's, column for column
    assert dump.requests.select(pl.col("arm") == pl.when(pl.col("role") == "reference").then(pl.lit("reference")).otherwise(pl.lit("copies")))["arm"].all()
    for i, frame in enumerate((dump.tokens, dump.candidates, dump.requests.drop("arm"))):
        assert_frame_equal(frame, pl.concat([expected["requests.jsonl"][i], expected["responses.jsonl"][i]]), check_exact=True)


@pytest.mark.parametrize("kind", ["response", "sse"])
def test_a_torn_tail_is_left_out_and_the_rest_read_columnar(tmp_path, kind):
    lines = _response_envelopes()[:4] if kind == "response" else _stream_envelopes()[:4]
    path = _write_lines(tmp_path / "captures.jsonl", lines)
    whole = path.read_bytes()
    path.write_bytes(whole + WRITERS["json-utf8"](lines[0])[:-40])  # a killed writer's half line
    fast = read_jsonl(path, str(path), limit=len(whole))
    assert fast is not None
    d = read_dumps(path, torn_tail=True)
    assert [str(e) for e in d.skipped] == [f"{path}: line 5: cut short ({len(path.read_bytes()) - len(whole)} bytes, no newline, not JSON): "
                                           "an append the writer did not finish; left out"]
    _assert_same((d.tokens, d.candidates, d.requests), _general(path, whole)[0])
    _assert_same(fast[0], _general(path, whole)[0])
    path.write_bytes(whole[:-1])  # a whole last line that merely lacks its newline: read, nothing skipped
    d = read_dumps(path, torn_tail=True)
    assert not d.skipped and d.requests.height == _general(path)[0][2].height


# --- what the columnar path leaves to the general path ------------------------------------------------


def _replace_sse(index, old, new, count=1):
    def change(lines):
        lines[index]["sse"] = lines[index]["sse"].replace(old, new, count)
    return change


def _set(index, **values):
    return lambda lines: lines[index].update(values)


def _set_response(index, path, value):
    def change(lines):
        target = lines[index]["response"]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


STREAM_FALLBACKS = {
    "CRLF line ends": (_replace_sse(0, "\n", "\r\n", -1), None),
    "a comment": (_replace_sse(0, "data: ", ": keep-alive\n\ndata: "), None),
    "an event field": (_replace_sse(0, "data: ", "event: message\ndata: "), None),
    "an id field": (_replace_sse(0, "data: ", "id: 7\ndata: "), None),
    "a multi-line data event": (_replace_sse(0, '", "object"', '",\ndata: "object"'), None),
    "data: without a space": (_replace_sse(0, "data: {", "data:{", -1), None),
    "no [DONE]": (_replace_sse(0, "data: [DONE]\n\n", ""), "the stream ended without \\[DONE\\]"),
    "data after [DONE]": (lambda lines: lines[0].update(sse=lines[0]["sse"] + 'data: {"choices": []}\n\n'), "data after \\[DONE\\]"),
    "an error event": (_replace_sse(0, "data: ", 'data: {"error": {"message": "CUDA out of memory"}}\n\ndata: '),
                       "the server sent an error event: .*CUDA out of memory"),
    "event data that is not JSON": (_replace_sse(0, "data: ", "data: {not json\n\ndata: "), "event data is not JSON"),
    "arrival times that do not match": (_set(0, arrival_times=[0.1]), "holds 1 times for 7 events"),
    "a null model": (_replace_sse(0, '"model": "m"', '"model": null', -1), None),
    "a null stream_mode": (_replace_sse(0, '"stream_mode": "live"', '"stream_mode": null'), None),
    "choices: null": (_replace_sse(0, '"choices": []', '"choices": null'), "choices: expected a list"),
    "a legacy text choice": (_replace_sse(0, '"delta": {"role": "assistant"}', '"text": null, "delta": {"role": "assistant"}'), None),
    "usage that disagrees": (_replace_sse(0, '"completion_tokens": 4', '"completion_tokens": 9'), "says 9 tokens but the stream carried 4"),
    "another stream format": (_set(0, format="openai_completion_sse"), None),
    "a line separator in the text": (_replace_sse(0, '"content": "Hel"', '"content": "H\u2028l"', -1), "neither JSON, JSON lines, SSE nor a torch file"),
    "a positive logprob": (_replace_sse(0, '"top_logprobs": [{"token": "Hel", "logprob": ', '"top_logprobs": [{"token": "Hel", "logprob": 0.5, "x": '),
                           "expected a logprob <= 0, got 0.5"),
    "c as text": (_set(1, c="2"), "c: expected Int64"),
    "a bool arrival time": (_set(0, arrival_times=[True] * 7), "arrival_times: expected a list of seconds"),
    # the events are cut out of the text by one replace (_streams_fast._sse_events): what that must not take for events
    "a [DONE] before the last event": (_replace_sse(0, "data: {", "data: [DONE]\n\ndata: {"), "data after \\[DONE\\]"),
    "an empty data line": (_replace_sse(0, "data: {", "data: \n\ndata: {"), "event data is not JSON"),
    "two objects in one event, then an empty one": (
        lambda lines: lines[0].update(sse=lines[0]["sse"].replace("}\n\ndata: {", "}\n{", 1).replace("data: [DONE]", "data: \n\ndata: [DONE]")),
        "event data is not JSON"),
    "a CR in an event": (_replace_sse(0, '"content": "Hel"', '"content": "H\rl"', -1), "event data is not JSON"),
    "a NEL in the text": (_replace_sse(0, '"content": "Hel"', '"content": "H\x85l"', -1), "neither JSON, JSON lines, SSE nor a torch file"),
}


@pytest.mark.parametrize("case", sorted(STREAM_FALLBACKS))
def test_streams_the_columnar_path_leaves_to_the_general_path(tmp_path, case):
    change, error = STREAM_FALLBACKS[case]
    lines = _stream_envelopes()[:3]
    lines[0] = _stream_envelope("p0-ref", ["Hel", "lo", "A", "B"], seed=1, prompt_id="p0")  # 4 tokens, 6 events
    change(lines)
    _expect_general(_write_lines(tmp_path / "captures.jsonl", lines), error)


def _expect_general(path, error):
    assert read_capture_jsonl(path, str(path)) is None and read_jsonl(path, str(path)) is None
    if error is not None:
        with pytest.raises(DumpError, match=error):
            read_dumps(path)
        return
    d = read_dumps(path)
    expected, found = _general(path)
    assert d.formats == {str(path): sorted(found)}
    _assert_same((d.tokens, d.candidates, d.requests), expected)


RESPONSE_FALLBACKS = {
    "another format": (_set(0, format="vllm_generate"), None),
    "a bare response among envelopes": (lambda lines: lines.insert(1, _chat("bare", TEXTS[:2])), None),
    "a null response": (_set(1, response=None), "matches no known dump format"),
    "c as text": (_set(0, c="4"), "c: expected Int64"),
    "a role that is not text": (_set(0, role=3), "role: expected String"),
    "token_ids as a list in a chat choice": (_set_response(0, ["choices", 0, "token_ids"], [1, 2, 3]), r"token id 1000 disagrees with token_ids\[0\] = 1"),
    "a legacy object": (_set_response(0, ["object"], "text_completion"), None),
    "usage that disagrees": (_set_response(0, ["usage", "completion_tokens"], 9), "says 9 tokens but logprobs hold 3 entries"),
    "a later duplicate response key": (lambda lines: lines.__setitem__(0, {**lines[0], "tail": 1}), r"line 1\.response: key appears more than once"),
    "a line separator in an extra key": (_set(0, note="a\u2028b"), "neither JSON, JSON lines, SSE nor a torch file"),
    "both sse and response": (lambda lines: lines[0].update(sse=_stream_envelopes()[0]["sse"]), None),
    "a printed Logprob repr early in the file": (_set(0, note="Logprob("), None),
    "a key spelled with escapes in the response": (lambda lines: None, None),
}


@pytest.mark.parametrize("case", sorted(RESPONSE_FALLBACKS))
def test_responses_the_columnar_path_leaves_to_the_general_path(tmp_path, case):
    change, error = RESPONSE_FALLBACKS[case]
    lines = _response_envelopes()[:3]
    change(lines)
    data = b"".join(WRITERS["json-utf8"](line) + b"\n" for line in lines)
    if case == "a later duplicate response key":
        data = data.replace(b', "tail": 1}', b', "response": ' + json.dumps(_chat("later", TEXTS[:1])).encode() + b"}", 1)
    if case == "a key spelled with escapes in the response":
        data = data.replace(b'"finish_reason"', b'"finish_re\\u0061son"', 1)
    path = tmp_path / "captures.jsonl"
    path.write_bytes(data)
    _expect_general(path, error if case != "a printed Logprob repr early in the file" else "not a complete Python repr of logprobs")


def _vllm_032(chat: dict) -> dict:
    """vLLM 0.32's chat completion: token_ids and routed_experts in each choice, prompt_token_ids beside them, null unless asked for."""
    for choice in chat["choices"]:
        choice.update(token_ids=None, routed_experts=None, stop_reason=None)
    return {**chat, "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None}


@pytest.mark.parametrize("enveloped", [True, False])
def test_vllm_chat_completions_with_null_token_ids_take_the_columnar_path(tmp_path, enveloped):
    """A null token_ids is absent on both paths: a chat completion at the chat endpoint, read the same way by each."""
    lines = _response_envelopes()
    for line in lines:
        line["response"] = _vllm_032(line["response"])
    if not enveloped:
        lines = [line["response"] for line in lines]
    path = _write_lines(tmp_path / "captures.jsonl", lines)
    fast = read_jsonl(path, str(path))
    assert fast is not None, "the columnar path must take this file"
    expected, found = _general(path)
    assert fast[1] == found == {"openai_chat"}
    _assert_same(fast[0], expected)
    assert set(fast[0][2]["endpoint"]) == {"chat"}


def test_blank_lines_and_a_single_line_take_the_general_path(tmp_path):
    lines = _response_envelopes()[:3]
    path = tmp_path / "captures.jsonl"
    path.write_bytes(b"\n\n".join(WRITERS["json"](line) for line in lines) + b"\n")
    _expect_general(path, None)
    _write_lines(path, lines[:1])
    assert read_jsonl(path, str(path)) is None  # one document: the general path hashes it its own way


# --- the property: any envelope file, the columnar path agrees or steps aside --------------------------
#
# Each drawn file is clean (what servers and the probe write, in any key order and with any extra keys) or odd
# (wrong types, positive logprobs, usage that disagrees, SSE the columnar path leaves alone, null keys...).

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False, width=32) | st.text(max_size=4)
    | st.sampled_from(['}, "a": {', '"response": {', "\\u0041", "data: [DONE]"]),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from(["a", "usage", "é", "response", '}, "x": {', '"', "\\"]), inner, max_size=2),
    max_leaves=4,
)
_tokens = st.sampled_from(TEXTS + ["token_id:7", "token_id:-1", "a b"])
_CLEAN_VALUES = [-0.5, -1.25, -9999.0, -3.4028234663852886e38, 0.0, -1e-7, -20.0]


def _pick(draw, odd, clean, weird):
    """A clean value, or (in an odd file, now and then) a weird one."""
    return draw(st.sampled_from(weird)) if odd and draw(st.integers(0, 4)) == 0 else draw(st.sampled_from(clean))


@st.composite
def _entry_st(draw, odd):
    token = draw(_tokens)
    entry = {"token": token, "logprob": _pick(draw, odd, _CLEAN_VALUES, [0.5, None])}
    if draw(st.booleans()):
        entry["bytes"] = list(token.encode())
    if draw(st.integers(0, 4)) == 0 and not token.startswith("token_id:"):
        entry["id"] = draw(st.integers(0, 50))
    entry["top_logprobs"] = [_cand(t, v) for t, v in draw(st.lists(st.tuples(_tokens, st.sampled_from(_CLEAN_VALUES)), max_size=3))]
    return entry


@st.composite
def _choices_st(draw, stream, odd):
    out = []
    for c in range(draw(st.integers(0 if odd or stream else 1, 2))):
        choice = {"index": c} if draw(st.integers(0, 5)) else {}
        choice["delta" if stream else "message"] = {"content": draw(st.sampled_from(["", "x", "yz", None]))}
        choice["finish_reason"] = draw(st.sampled_from([None, "length", "stop", ""]))
        choice["logprobs"] = draw(st.sampled_from([None, {"content": None}, {"content": draw(st.lists(_entry_st(odd), max_size=3))}]))
        if odd and draw(st.integers(0, 6)) == 0:
            choice[draw(st.sampled_from(["token_ids", "text"]))] = None
        out.append(choice)
    return out


def _scored(choices):
    return sum(len((c.get("logprobs") or {}).get("content") or []) for c in choices)


@st.composite
def _envelope_st(draw, odd):
    meta = {}
    for key, clean, weird in (("prompt_id", ["p0", "p1", 3], []), ("role", ["reference", "band"], [5]), ("c", [1, 4], ["4", True]),
                              ("slot", [0, 3], [1.5]), ("repeat", [0, 2], []), ("t_sent", [0, 0.5, None], ["0"]),
                              ("sample_key", ["k", None], [7]), ("unit", ["p0/band/c4/r0"], [])):
        if draw(st.booleans()):
            meta[key] = _pick(draw, odd, clean, weird or clean)
    for key in draw(st.lists(st.sampled_from(["gpu", "sent_at_s", "note", "é"]), max_size=2, unique=True)):
        meta[key] = draw(_json_values)
    if draw(st.booleans()):  # a non-streamed response
        choices = draw(_choices_st(False, odd))
        response = {"id": draw(st.sampled_from(["r", "", None])), "object": _pick(draw, odd, ["chat.completion"], [None, "text_completion"]),
                    "model": "m", "choices": choices}
        if draw(st.booleans()):
            response["usage"] = {"prompt_tokens": 3, "completion_tokens": _pick(draw, odd, [_scored(choices)], [_scored(choices) + 1])}
        body = {"response": response}
    else:
        chunks = []
        for _ in range(draw(st.integers(1, 4))):
            chunk = {"id": draw(st.sampled_from(["c", "d"])), "object": "chat.completion.chunk", "model": "m"}
            if draw(st.integers(0, 3)) == 0:
                chunk["stream_mode"] = _pick(draw, odd, ["live", "buffered"], [None])
            if draw(st.integers(0, 5)):
                chunk["choices"] = draw(_choices_st(True, odd))
            if odd and draw(st.integers(0, 10)) == 0:
                chunk["model"] = None
            chunks.append(chunk)
        scored = sum(_scored(c.get("choices") or []) for c in chunks)
        if draw(st.booleans()):
            chunks.append({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": _pick(draw, odd, [scored], [scored + 1])}})
        sse = _sse(chunks)
        oddity = _pick(draw, odd, [None], ["crlf", "comment", "no-done", "error"])
        if oddity == "crlf":
            sse = sse.replace("\n", "\r\n")
        elif oddity == "comment":
            sse = ": hi\n\n" + sse
        elif oddity == "no-done":
            sse = sse.removesuffix("data: [DONE]\n\n")
        elif oddity == "error":
            sse = 'data: {"error": "boom"}\n\n' + sse
        body = {"sse": sse}
        times = _pick(draw, odd, ["match", "none"], ["short"])
        if times != "none":
            body["arrival_times"] = [0.25 * j for j in range(len(chunks) + (1 if times == "match" else 0))]
    order = draw(st.permutations(list(body) + list(meta)))
    merged = {**body, **meta}
    return {key: merged[key] for key in order}


@st.composite
def _file_st(draw):
    odd = draw(st.integers(0, 2)) == 0
    return odd, draw(st.lists(_envelope_st(odd), min_size=2, max_size=4))


@pytest.mark.slow
@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_file_st(), st.sampled_from(sorted(WRITERS)))
def test_property_the_columnar_path_agrees_or_steps_aside(tmp_path_factory, drawn, writer):
    odd, lines = drawn
    path = _write_lines(tmp_path_factory.mktemp("prop") / "captures.jsonl", lines, writer)
    fast = read_jsonl(path, str(path))
    try:
        expected, found = _general(path)
    except Exception as error:  # noqa: BLE001 - whatever the general path refuses, the columnar one must not read
        assert fast is None, f"the columnar path read what the general path refuses: {error}"
        event("the general path refuses")
        return
    event(f"{'odd' if odd else 'clean'} file: {'columnar' if fast is not None else 'general'} path")
    if fast is not None:
        frames, formats = fast
        assert formats == found
        _assert_same(frames, expected)
