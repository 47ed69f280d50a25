"""The columnar path for chat JSON lines gives exactly the frames of the general path."""

from __future__ import annotations

import json

import polars as pl
import pytest

from analysis.dumps._fast import read_chat_jsonl
from analysis.dumps._read import parse_source, read_dumps


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
        lambda lines: lines.append({"response": {"choices": []}, "band_c": 4}),  # an envelope line
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
    from analysis import DumpError

    with pytest.raises(DumpError, match="line 2.choices\\[0\\].logprobs.content\\[0\\].logprob: expected a logprob <= 0, got 0.5"):
        read_dumps(path)


def test_read_dumps_uses_it(tmp_path):
    path = _write(tmp_path, LINES)
    d = read_dumps(path)
    assert d.formats == {str(path): ["openai_chat"]}
    assert d.tokens.height == 6 and d.requests.height == 4
    assert d.requests["record"].to_list() == [1, 2, 2, 4]
    assert d.tokens.filter(pl.col("record") == 2)["token_id"].to_list() == [88, None]
