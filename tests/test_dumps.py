"""Per-token dumps: every shared sample the formats cover, values checked by hand, and the traps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT, serve_folder, write_json

from analysis import DumpError, read_dump, read_dumps, scan_dump

SAMPLES = ROOT / "tests" / "samples"


def sample(name: str) -> Path:
    return SAMPLES / name


def load(path, **kw):
    return read_dump(path, **kw)


def col(frame: pl.DataFrame, name: str) -> list:
    return frame[name].to_list()


# --- the shared samples -------------------------------------------------------------------------


def test_vllm_chat_with_token_id_placeholders():
    d = load(sample("vllm_chat_nonstream_token_ids__OpenPipe-ART.json"))
    assert d.formats == {str(sample("vllm_chat_nonstream_token_ids__OpenPipe-ART.json")): ["openai_chat"]}
    t = d.tokens
    assert col(t, "token_id") == [9707, 0, 2585, 646, 358, 7789, 498, 3351, 30, 151645]
    assert col(t, "token_text") == [None] * 10  # the text is unknown: only placeholders came
    assert col(t, "token_bytes")[:2] == [b"Hello", b"!"] and col(t, "token_bytes")[-1] == b""
    assert col(t, "logprob")[0] == -0.0017243054462596774
    assert col(t, "logprob")[6] == 0.0 and col(t, "value_status") == ["ok"] * 10
    assert col(t, "segment") == ["completion"] * 10 and col(t, "position") == list(range(10))
    assert col(t, "n_candidates") == [0] * 10 and d.candidates.is_empty()
    r = d.requests.row(0, named=True)
    assert (r["request_id"], r["finish_reason"], r["prompt_tokens"], r["completion_tokens"], r["n_completion_scored"]) == (
        "chatcmpl-293ce9f37dba40e5be39448acaf6fb49", "stop", 31, 10, 10)
    assert r["completion_text"] == "Hello! How can I assist you today?" and r["stream"] is False


def test_vllm_chat_stream_fixture_with_doubled_done():
    path = sample("vllm_chat_stream_token_ids__OpenPipe-ART.sse")
    with pytest.raises(DumpError, match=r"event 7 \(line 15\): a second \[DONE\]"):
        load(path)
    d = load(path, lenient=True)
    assert [str(e) for e in d.skipped] == [f"{path}: record 0 event 7 (line 15): a second [DONE]"]
    assert col(d.tokens, "token_id") == [314, 314, 3417, 3417]  # the fixture repeats each event: kept, not guessed away
    assert col(d.tokens, "stream_chunk") == [2, 3, 4, 5]
    assert col(d.tokens, "token_bytes") == [b" {", b" {", b"}}", b"}}"]
    assert d.requests["n_completion_scored"].item() == 4


def test_openai_stream_with_usage_chunk():
    d = load(sample("openai_chat_stream_include_usage__langchain.reframed.sse"))
    assert d.tokens.is_empty()
    r = d.requests.row(0, named=True)
    assert (r["completion_text"], r["finish_reason"], r["prompt_tokens"], r["completion_tokens"], r["stream"]) == ("我是助手。", "stop", 14, 3, True)
    assert r["model"] == "gpt-4o-2024-05-13"


def test_cut_excerpt_without_done():
    path = sample("vllm_chat_stream_no_logprobs__vllm-issue6083.excerpt.sse")
    with pytest.raises(DumpError, match="the stream ended without \\[DONE\\]"):
        load(path)
    d = load(path, lenient=True)
    assert len(d.skipped) == 1 and d.requests["completion_text"].item().startswith("我是阿里")


def test_legacy_completion_with_echo_and_text_keyed_tops(tmp_path):
    partial = json.loads(sample("vllm_completions_echo_logprobs5__llama.cpp-pr15189.partial.json").read_text())
    logprobs = {
        "tokens": partial["tokens"][:4],
        "token_logprobs": partial["token_logprobs"][:4],
        "text_offset": partial["text_offset"][:4],
        "top_logprobs": partial["top_logprobs_first4"],
    }
    payload = {"object": "text_completion", "choices": [{"index": 0, "text": "The step of boiling", "logprobs": logprobs, "finish_reason": "length"}],
               "usage": {"prompt_tokens": 2, "completion_tokens": 2}}
    d = load(write_json(tmp_path / "legacy.json", payload))
    t = d.tokens
    assert col(t, "segment") == ["prompt", "prompt", "completion", "completion"]
    assert col(t, "position") == [0, 1, 0, 1]
    assert col(t, "token_text") == ["The", " step", " of", " boiling"]
    assert col(t, "value_status")[0] == "null_in_source" and col(t, "logprob")[0] is None
    assert col(t, "logprob")[1:] == [-8.818763732910156, -1.552642822265625, -13.55989933013916]
    assert col(t, "text_offset") == [0, 3, 8, 11]
    step = d.candidates.filter(segment="prompt", position=1)
    assert col(step, "cand_token_text") == [" step", " is", " ", " are", " type", ":"]  # 6: the sampled one is outside the top 5
    assert col(step, "is_sampled") == [True, False, False, False, False, False]
    assert d.requests.select("n_prompt_scored", "n_completion_scored").row(0) == (2, 2)


def test_sglang_meta_info(tmp_path):
    raw = json.loads(sample("sglang_generate_meta_info_logprobs__sglang-jax-pr13.partial.json").read_text())
    info = raw["meta_info"]
    info["output_top_logprobs"] = info.pop("output_top_logprobs_first2") + [None] * 4
    d = load(write_json(tmp_path / "sglang.json", raw))
    prompt = d.tokens.filter(segment="prompt")
    out = d.tokens.filter(segment="completion")
    assert col(prompt, "token_id") == [6722, 315, 9625, 374]
    assert col(prompt, "value_status")[0] == "null_in_source" and col(prompt, "logprob")[1] == -0.58203125
    assert col(out, "token_id") == [12095, 13, 1084, 374, 7407, 304]
    assert col(out, "logprob") == [-0.73046875, -0.9765625, -1.3984375, -0.171875, -0.42578125, -0.060546875]
    assert col(out, "n_candidates") == [3, 3, None, None, None, None]
    first = d.candidates.filter(segment="completion", position=0)
    assert col(first, "cand_token_id") == [12095, 2130, 32671] and col(first, "is_sampled") == [True, False, False]
    r = d.requests.row(0, named=True)
    assert (r["request_id"], r["finish_reason"], r["prompt_tokens"], r["completion_text"]) == (
        "26223ea355df4c0ab45e5af04505ed67", "length", 5, " Paris. It is located in")


def test_llamacpp_legacy_probabilities():
    d = load(sample("llamacpp_completion_probabilities_legacy__llama.cpp-pr4714.partial.json"))
    t = d.tokens
    assert col(t, "token_text") == [" to", " be", " happy"]
    assert col(t, "value_kind") == ["prob"] * 3
    assert col(t, "prob") == [0.966502845287323, 0.2765404284000397, 0.5727741122245789]
    assert col(t, "logprob")[0] == math.log(0.966502845287323)
    assert col(d.candidates, "is_sampled") == [True, False, False] * 3
    assert col(d.candidates, "cand_token_text")[3:6] == [" be", " find", " live"]


def test_vllm_generate_response_and_routed_experts():
    d = load(sample("renderers_generate_response_fixture__renderers-tests-test_client.json"))
    assert col(d.tokens, "token_id") == [7, 8] and col(d.tokens, "logprob") == [-0.1, -0.2]
    extra = json.loads(d.requests["extra"].item())
    assert extra["routed_experts"] == {"data": "AQI=", "shape": [2, 1, 1]}  # kept, undecoded
    assert d.requests["endpoint"].item() == "generate"


def test_dynamo_ids_from_nvext():
    d = load(sample("renderers_dynamo_chat_response_fixture__renderers-tests-test_client.json"))
    assert col(d.tokens, "token_id") == [7, 8]
    assert json.loads(d.requests["extra"].item())["routed_experts"]["shape"] == [4, 1, 1]


def test_prompt_logprobs_fixture():
    d = load(sample("prime-rl_generate_prompt_logprobs_fixture__test_prefill_logprobs.json"))
    assert col(d.tokens, "segment") == ["prompt"] * 3
    assert col(d.tokens, "logprob") == [None, -0.7, -0.3]
    assert col(d.tokens, "value_status") == ["null_in_source", "ok", "ok"]
    assert col(d.tokens, "token_id") == [None, 11, 12]


def _generate(choice: dict) -> dict:
    return {"request_id": "gen", "choices": [choice]}


def test_compact_logprobs(tmp_path):
    doc = json.loads(sample("DERIVED_compact_logprobs_u32-f32-le-v1.json").read_text())
    d = load(write_json(tmp_path / "c.json", _generate(doc["choice"])))
    assert col(d.tokens, "token_id") == [7, 8, 10]
    assert col(d.tokens, "logprob") == [-0.5, -1.5, -2.5]
    assert col(d.tokens, "top_k_requested") == [2, 2, 2]
    c = d.candidates
    assert col(c, "cand_token_id") == doc["_decoded"]["ids_u32le"]
    assert col(c, "cand_status") == ["ok", "ok", "sentinel_9999", "ok"]
    assert col(c, "cand_raw_value")[2] == -9999.0 and col(c, "cand_logprob")[2] is None


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda c: c["compact_logprobs"].update(data="BwAAAA=="), "decodes to 4 bytes; 4 entries need exactly 32"),
        (lambda c: c["compact_logprobs"].update(data="not base64!"), "malformed base64"),
        (lambda c: c["compact_logprobs"].update(offsets=[0, 1, 1, 4]), "must strictly increase"),
        (lambda c: c["compact_logprobs"].update(offsets=[1, 2, 3, 4]), "must start at 0"),
        (lambda c: c.update(token_ids=[7, 8, 11]), "the sampled id 11 is missing from its row"),
        (lambda c: c.update(token_ids=[7, 8]), "hold 3 rows for 2 token_ids"),
    ],
)
def test_compact_logprobs_errors(tmp_path, change, problem):
    choice = json.loads(sample("DERIVED_compact_logprobs_u32-f32-le-v1.json").read_text())["choice"]
    change(choice)
    with pytest.raises(DumpError, match=problem) as info:
        load(write_json(tmp_path / "c.json", _generate(choice)))
    assert "choices[0]" in str(info.value)


def test_kept_tokens_csr(tmp_path):
    kept = json.loads(sample("DERIVED_kept_tokens_int32_b64.json").read_text())["kept_tokens"]
    choice = {"index": 0, "token_ids": [7, 5, 8], "logprobs": None, "kept_tokens": kept}
    d = load(write_json(tmp_path / "k.json", _generate(choice)))
    assert col(d.tokens, "support_size") == [3, None, 2]  # count 0: nothing recorded for token 1
    assert col(d.tokens, "value_status") == ["missing"] * 3
    support = d.candidates.filter(list_kind="sampling_support")
    assert col(support, "position") == [0, 0, 0, 2, 2]
    assert col(support, "cand_token_id") == [7, 3, 11, 8, 9]
    assert col(support, "is_sampled") == [True, False, False, True, False]


def test_nd_sampling_mask(tmp_path):
    mask = json.loads(sample("DERIVED_verifiers_nd_sampling_mask.json").read_text())["sampling_mask"]
    d = load(write_json(tmp_path / "nd.json", _generate({"index": 0, "token_ids": [11, 1, 9], "sampling_mask": mask})))
    assert col(d.candidates, "cand_token_id") == [7, 3, 11, 8, 9]
    assert col(d.tokens, "support_size") == [3, None, 2]


def test_packed_int64_mask(tmp_path):
    doc = json.loads(sample("DERIVED_prime-rl_packed_sampling_mask_int64.json").read_text())
    from analysis.dumps._masks import decode_sampling_mask

    class S:
        source = "s"

    with pytest.raises(DumpError, match="support probabilities sum to"):
        decode_sampling_mask(doc["packed_int64_rows"], None, S, "$")  # the DERIVED values are not a distribution
    from analysis.dumps._masks import _unpack_int64

    unpacked = [[_unpack_int64(v) for v in row] for row in doc["packed_int64_rows"]]
    assert [[i for i, _ in r] for r in unpacked] == doc["unpacked"]["sampling_mask"]
    assert [[round(lp, 6) for _, lp in r] for r in unpacked] == doc["unpacked"]["sampling_mask_logprobs"]


def test_sampling_mask_rules(tmp_path):
    base = {"index": 0, "token_ids": [3, 1]}
    cases = [
        ({"sampling_mask": [[3, 1], [1, 1]]}, "repeats an id"),
        ({"sampling_mask": [[3, 1], []]}, "an empty support row"),
        ({"sampling_mask": [[3, 1], [2]]}, "the sampled id 1 is missing from its support"),
        ({"sampling_mask": [[3, 1]]}, "holds 1 rows for 2 completion tokens"),
        ({"sampling_mask": [[3], [1]], "sampling_mask_logprobs": [[0.0], [-0.5]]}, "sum to"),
    ]
    for extra, problem in cases:
        with pytest.raises(DumpError, match=problem):
            load(write_json(tmp_path / "m.json", _generate(base | extra)))
    d = load(write_json(tmp_path / "ok.json", _generate(base | {"sampling_mask": [[3], [1, 4]], "sampling_mask_logprobs": [[0.0], [math.log(0.25), math.log(0.75)]]})))
    assert col(d.candidates, "cand_prob") == pytest.approx([1.0, 0.25, 0.75])


# --- sentinels, placeholders, duplicates -------------------------------------------------------


def chat(entries: list, **choice) -> dict:
    return {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "x"}, "logprobs": {"content": entries}, **choice}]}


def entry(token, logprob, top=()):
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top]}


def test_sentinels_never_reach_numeric_columns(tmp_path):
    lowest = -3.4028234663852886e38
    entries = [entry("a", -9999.0), entry("b", None), entry("c", lowest), entry("d", -0.25), entry("e", -12345.5)]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(chat(entries)).replace("-12345.5", "-Infinity"))  # as Python's json.dumps writes -inf
    t = load(path).tokens
    assert col(t, "value_status") == ["sentinel_9999", "null_in_source", "float_lowest", "ok", "neg_inf"]
    assert col(t, "logprob") == [None, None, None, -0.25, None]
    assert col(t, "raw_value")[:4] == [-9999.0, None, lowest, -0.25] and col(t, "raw_value")[4] == -math.inf
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(chat([entry("a", -12345.5)])).replace("-12345.5", "NaN"))
    assert col(load(nan).tokens, "value_status") == ["nonfinite"]


def test_candidate_order_and_duplicates_are_kept(tmp_path):
    e = entry("b", -0.7, top=[("b", -0.7), ("a", -0.9), ("b", -0.7), ("c", -9999.0)])
    c = load(write_json(tmp_path / "d.json", chat([e]))).candidates
    assert col(c, "cand_token_text") == ["b", "a", "b", "c"]
    assert col(c, "list_index") == [0, 1, 2, 3]
    assert col(c, "is_duplicate") == [False, False, True, False]
    assert col(c, "is_sampled") == [True, False, True, False]
    assert col(c, "cand_status") == ["ok", "ok", "ok", "sentinel_9999"]


def test_placeholder_candidates_drop_the_placeholder_bytes(tmp_path):
    e = {"token": "token_id:5", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": [
        {"token": "token_id:5", "logprob": -0.1, "bytes": list(b"token_id:5")}, {"token": "token_id:6", "logprob": -2.5, "bytes": list(b"token_id:6")}]}
    d = load(write_json(tmp_path / "p.json", chat([e])))
    assert col(d.tokens, "token_bytes") == [b"Hi"]
    assert col(d.candidates, "cand_token_id") == [5, 6]
    assert col(d.candidates, "cand_token_bytes") == [None, None]
    assert col(d.candidates, "is_sampled") == [True, False]


def test_llamacpp_post_sampling_probs_and_ids(tmp_path):
    payload = {"content": " hi", "tokens_predicted": 2, "completion_probabilities": [
        {"id": 11, "token": " h", "prob": 0.75, "bytes": [32, 104], "top_probs": [{"id": 11, "token": " h", "prob": 0.75}, {"id": 12, "token": " x", "prob": 0.0}]},
        {"id": 13, "token": "i", "logprob": -3.4028234663852886e38, "bytes": [105], "top_logprobs": []}]}
    d = load(write_json(tmp_path / "l.json", payload))
    assert d.formats[str(tmp_path / "l.json")] == ["llamacpp"]
    assert col(d.tokens, "token_id") == [11, 13]
    assert col(d.tokens, "value_kind") == ["prob", "logprob"]
    assert col(d.tokens, "logprob")[0] == math.log(0.75) and col(d.tokens, "value_status") == ["ok", "float_lowest"]
    assert col(d.candidates, "cand_status") == ["ok", "zero_prob"]


def test_tgi_details(tmp_path):
    payload = [{"generated_text": " world", "details": {"finish_reason": "length", "generated_tokens": 2, "seed": None,
                "prefill": [{"id": 1, "text": "<s>", "logprob": None}, {"id": 15043, "text": "Hello", "logprob": -10.5}],
                "tokens": [{"id": 3186, "text": " world", "logprob": -0.25, "special": False}, {"id": 2, "text": "</s>", "logprob": -1.0, "special": True}],
                "top_tokens": [[{"id": 3186, "text": " world", "logprob": -0.25}, {"id": 29991, "text": "!", "logprob": -2.0}],
                               [{"id": 2, "text": "</s>", "logprob": -1.0}]]}}]
    d = load(write_json(tmp_path / "t.json", payload))
    assert d.formats[str(tmp_path / "t.json")] == ["tgi"]
    assert col(d.tokens, "segment") == ["prompt", "prompt", "completion", "completion"]
    assert col(d.tokens, "token_id") == [1, 15043, 3186, 2]
    assert col(d.tokens, "value_status") == ["null_in_source", "ok", "ok", "ok"]
    assert col(d.candidates, "cand_token_id") == [3186, 29991, 2]
    assert d.requests.select("finish_reason", "completion_tokens", "completion_text").row(0) == ("length", 2, " world")


def test_primerl_export_lines(tmp_path):
    lines = [
        {"schema_version": 1, "sample_id": "s0", "token_ids": [5, 6, 7], "inference_logprobs": [-0.1, None, -0.3], "trainer_logprobs": [-0.11, -0.2, None], "loss_mask": [0, 1, 1]},
        {"schema_version": 1, "sample_id": "s1", "token_ids": [8], "inference_logprobs": [-0.5], "trainer_logprobs": [-0.5], "loss_mask": [1]},
    ]
    path = tmp_path / "export.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    d = load(path)
    assert d.formats[str(path)] == ["primerl"]
    assert col(d.tokens, "record") == [1, 1, 1, 2]
    assert col(d.tokens, "logprob") == [-0.1, None, -0.3, -0.5]
    assert col(d.tokens, "loss_mask") == [False, True, True, True]
    assert col(d.tokens, "sample_key") == ["s0", "s0", "s0", "s1"]
    trainer = d.candidates.filter(list_kind="trainer_recompute")
    assert col(trainer, "cand_logprob") == [-0.11, -0.2, None, -0.5]
    assert col(trainer, "cand_status") == ["ok", "ok", "null_in_source", "ok"]


# --- streams ------------------------------------------------------------------------------------


def sse(*events: str, end: str = "\n\n") -> str:
    return "".join(f"data: {e}{end}" for e in events)


def chunk(content=None, entries=None, finish=None, **extra):
    return json.dumps({"id": "c1", "object": "chat.completion.chunk", "model": "m", **extra,
                       "choices": [{"index": 0, "delta": {} if content is None else {"content": content},
                                    "logprobs": None if entries is None else {"content": entries}, "finish_reason": finish}]})


def test_capture_envelope_with_arrival_times(tmp_path):
    stream = sse(chunk(stream_mode="live"), chunk("A", [entry("A", -0.5)]), chunk("B", [entry("B", -0.25), entry("b", -1.0)]), chunk(finish="length"),
                 json.dumps({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}), "[DONE]")
    lines = [{"sse": stream, "arrival_times": [0.1, 0.2, 0.35, 0.36, 0.37, 0.38], "c": 4, "slot": 2, "prompt_id": "p0", "t_sent": 0.0, "gpu": "H200"}]
    path = tmp_path / "capture.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    d = load(path)
    assert d.formats[str(path)] == ["openai_chat_sse"]
    assert col(d.tokens, "t_arrival") == [0.2, 0.35, 0.35]
    assert col(d.tokens, "stream_chunk") == [1, 2, 2]
    r = d.requests.row(0, named=True)
    assert (r["c"], r["slot"], r["prompt_id"], r["ttft_s"], r["stream_live"], r["completion_text"]) == (4, 2, "p0", 0.2, True, "AB")
    assert json.loads(r["extra"])["gpu"] == "H200"
    lines[0]["arrival_times"] = [0.1]
    path.write_text(json.dumps(lines[0]))
    with pytest.raises(DumpError, match="holds 1 times for 6 events"):
        load(path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (sse(chunk("A", [entry("A", -0.5)])) + 'data: {"choices": [', "cut mid-event"),
        (sse(chunk("A", [entry("A", -0.5)])), "ended without \\[DONE\\]"),
        (sse(chunk("A", [entry("A", -0.5)]), json.dumps({"error": {"message": "CUDA out of memory"}}), "[DONE]"), "the server sent an error event: .*CUDA out of memory"),
        (sse(chunk("A", [entry("A", -0.5)]), "{not json", "[DONE]"), "event data is not JSON"),
        (sse(chunk("A", [entry("A", -0.5)]), "[DONE]", chunk("B")), "data after \\[DONE\\]"),
        (sse(chunk("A", [entry("A", 0.5)]), "[DONE]"), "expected a logprob <= 0, got 0.5"),
        (sse(chunk("A", [entry("A", -0.5)]), json.dumps({"choices": [], "usage": {"completion_tokens": 2}}), "[DONE]"), "says 2 tokens but the stream carried 1"),
    ],
)
def test_broken_streams(tmp_path, text, problem):
    path = tmp_path / "s.sse"
    path.write_text(text)
    with pytest.raises(DumpError, match=problem) as info:
        load(path)
    assert info.value.source == str(path)


def test_sse_line_endings_and_comments(tmp_path):
    body = sse(chunk("A", [entry("A", -0.5)]), "[DONE]").replace("\n", "\r\n")
    path = tmp_path / "crlf.sse"
    path.write_text(": keep-alive\r\n\r\n" + body, newline="")
    assert col(load(path).tokens, "token_text") == ["A"]
    split = tmp_path / "multi.sse"
    first = chunk("A", [entry("A", -0.5)])
    cut = first.index(", ") + 1  # between two members, where a newline is allowed
    split.write_text(f"data: {first[:cut]}\ndata: {first[cut:]}\n\ndata: [DONE]\n\n")
    assert col(load(split).tokens, "token_text") == ["A"]  # two data lines join with "\n", which JSON allows between tokens


def test_llamacpp_native_stream(tmp_path):
    events = [json.dumps({"content": "He", "stop": False, "completion_probabilities": [{"id": 1, "token": "He", "logprob": -0.1, "top_logprobs": []}]}),
              json.dumps({"content": "y", "stop": False, "completion_probabilities": [{"id": 2, "token": "y", "logprob": -0.2, "top_logprobs": []}]}),
              json.dumps({"content": "", "stop": True, "stop_type": "limit", "tokens_predicted": 2, "tokens_evaluated": 3})]
    path = tmp_path / "l.sse"
    path.write_text(sse(*events))
    d = load(path)
    assert d.formats[str(path)] == ["llamacpp_sse"]
    assert col(d.tokens, "token_id") == [1, 2]
    assert d.requests.select("finish_reason", "completion_tokens", "completion_text").row(0) == ("limit", 2, "Hey")
    path.write_text(sse(*events[:2]))
    with pytest.raises(DumpError, match="before an event with stop: true"):
        load(path)


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (chat([entry("a", -0.1)]) | {"usage": {"completion_tokens": 2}}, "says 2 tokens but logprobs hold 1 entries"),
        (chat([entry("a", "low")]), "expected a number or null, got str 'low'"),
        (chat([{"token": "a", "logprob": -0.1, "bytes": [300]}]), "expected a list of integers 0..255"),
        ({"choices": [{"index": 0, "token_ids": [1, 2], "logprobs": {"content": [{"token": "token_id:1", "logprob": -0.1}]}}]}, "holds 1 entries for 2 token_ids"),
        ({"choices": [{"index": 0, "token_ids": [1], "logprobs": {"content": [{"token": "token_id:2", "logprob": -0.1}]}}]}, "token id 2 disagrees with token_ids\\[0\\] = 1"),
        ({"object": "text_completion", "choices": [{"text": "a", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.1], "top_logprobs": None}}]}, "holds 1 entries for 2 tokens"),
        ({"meta_info": {"output_token_logprobs": [[-0.1]]}}, "expected \\[logprob, token_id, text\\|null\\] or \\[logprob, token_id\\]"),
        ({"error": {"message": "model not found"}}, "matches no known dump format"),
    ],
)
def test_validation_errors_name_record_and_field(tmp_path, payload, problem):
    path = write_json(tmp_path / "bad.json", payload)
    with pytest.raises(DumpError, match=problem) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: ")


def test_unknown_and_ambiguous_sources(tmp_path):
    unknown = write_json(tmp_path / "u.json", {"hello": 1})
    with pytest.raises(DumpError, match="matches no known dump format; known: openai_chat"):
        load(unknown)
    both = write_json(tmp_path / "a.json", {"meta_info": {}, "details": {"tokens": []}, "generated_text": ""})
    with pytest.raises(DumpError, match="ambiguous: it matches sglang, tgi"):
        load(both)
    assert col(load(both, format="tgi").requests, "source_format") == ["tgi"]
    with pytest.raises(ValueError, match="format must be"):
        load(both, format="nope")


def test_lenient_jsonl_reports_every_skip(tmp_path):
    good = json.dumps(chat([entry("a", -0.1)]))
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join([good, "{broken", json.dumps(chat([entry("a", 3.0)])), good]))
    with pytest.raises(DumpError, match="line 2: not valid JSON"):
        load(path)
    d = load(path, lenient=True)
    assert col(d.tokens, "record") == [1, 4]
    assert [(e.record, e.problem.split(" (")[0]) for e in d.skipped] == [("line 2", "not valid JSON at line 2 column 2"), ("line 3.choices[0].logprobs.content[0]", "expected a logprob <= 0, got 3.0")]


# --- many files, URLs, Parquet, backends ------------------------------------------------------------


def test_directory_glob_and_concatenation(tmp_path):
    write_json(tmp_path / "a.json", chat([entry("a", -0.1)]))
    write_json(tmp_path / "b.json", chat([entry("b", -0.2), entry("c", -0.3)]))
    (tmp_path / "notes.txt").write_text("not a dump")
    d = read_dumps(tmp_path)
    assert col(d.tokens, "source") == [str(tmp_path / "a.json")] + [str(tmp_path / "b.json")] * 2
    assert read_dumps(str(tmp_path / "*.json")).tokens.height == 3


def test_url_on_loopback(tmp_path, monkeypatch):
    monkeypatch.setenv("BIA_CACHE_DIR", str(tmp_path / "cache"))
    with serve_folder(SAMPLES) as base:
        url = f"{base}/vllm_chat_nonstream_token_ids__OpenPipe-ART.json"
        d = read_dump(url)
        assert d.tokens.height == 10 and col(d.tokens, "source") == [url] * 10
        assert read_dump(f"{base}/openai_chat_stream_include_usage__langchain.reframed.sse").requests["completion_text"].item() == "我是助手。"


def test_parquet_round_trip(tmp_path):
    d = read_dumps([sample("vllm_chat_nonstream_token_ids__OpenPipe-ART.json"), sample("llamacpp_completion_probabilities_legacy__llama.cpp-pr4714.partial.json")])
    scanned = scan_dump(d.write_parquet(tmp_path / "dump"))
    assert scanned.tokens.collect().equals(d.tokens)
    assert scanned.candidates.collect().equals(d.candidates)
    assert scanned.requests.collect().equals(d.requests)
    assert scanned.formats == d.formats


def test_polars_and_pandas_equal(tmp_path):
    path = sample("sglang_generate_meta_info_logprobs__sglang-jax-pr13.partial.json")
    as_polars, as_pandas = read_dump(path), read_dump(path, backend="pandas")
    for name in ("tokens", "candidates", "requests"):
        left, right = getattr(as_polars, name), getattr(as_pandas, name)
        assert list(right.columns) == left.columns and len(right) == left.height
        assert pl.from_pandas(right, schema_overrides=left.schema).equals(left)


# --- vLLM offline -------------------------------------------------------------------------------


def test_vllm_offline_repr_with_unclamped_inf(tmp_path):
    text = sample("vllm_offline_logprobs_repr_with_-inf__vllm-issue11397.excerpt.txt").read_text()
    cut = text.index(", {315:")  # the excerpt is truncated: keep its first four complete steps
    path = tmp_path / "offline.txt"
    path.write_text(text[:cut] + "]")
    d = load(path)
    assert d.formats[str(path)] == ["vllm_offline_repr"]
    assert col(d.tokens, "token_id") == [785, 4462, 594, 2400]
    assert col(d.tokens, "token_text") == ["The", " member", "'s", " date"]
    assert col(d.tokens, "logprob") == [0.0] * 4 and col(d.tokens, "vocab_rank") == [1] * 4
    first = d.candidates.filter(position=0)
    assert col(first, "cand_token_id") == [785, 2, 0, 3, 1]
    assert col(first, "cand_status") == ["ok"] + ["neg_inf"] * 4  # -inf is not clamped offline, and never reaches the number
    assert col(first, "cand_raw_value")[1] == -math.inf and col(first, "cand_vocab_rank") == [1, 2, 3, 4, 5]


def test_vllm_offline_json_and_logprobs_mode(tmp_path):
    steps = [{"11": {"logprob": 3.5, "rank": 1, "decoded_token": "a"}, "12": {"logprob": 1.0, "rank": 2, "decoded_token": "b"}}]
    path = tmp_path / "offline.jsonl"
    path.write_text(json.dumps({"response": steps, "logprobs_mode": "raw_logits", "format": "vllm_offline"}))
    d = load(path)
    assert col(d.tokens, "value_kind") == ["logit"] and col(d.tokens, "logprob_semantics") == ["raw"]
    assert col(d.tokens, "logprob") == [None] and col(d.tokens, "raw_value") == [3.5]  # a logit is kept raw, never as a logprob
    plain = write_json(tmp_path / "steps.json", steps[:1] and [{"11": {"logprob": -0.5, "rank": 1, "decoded_token": "a"}}])
    assert load(plain).formats[str(plain)] == ["vllm_offline"]
    path.write_text(json.dumps({"response": steps, "logprobs_mode": "sampled"}))
    with pytest.raises(DumpError, match="logprobs_mode: expected one of"):
        load(path)


def test_offline_repr_is_parsed_never_evaluated(tmp_path):
    path = tmp_path / "evil.txt"
    path.write_text("[{1: Logprob(logprob=__import__('os').system('echo pwned'), rank=1, decoded_token='a')}]")
    with pytest.raises(DumpError, match="unexpected Python syntax"):
        load(path)


# --- every format from a file, a folder and a URL -------------------------------------------------


def _one_file_per_format(folder: Path) -> dict[str, str]:
    """A small valid dump of each format, written into ``folder``; returns file name -> format."""
    files = {
        "chat.json": ("openai_chat", json.dumps(chat([entry("a", -0.1)]))),
        "chat.sse": ("openai_chat_sse", sse(chunk("A", [entry("A", -0.5)]), "[DONE]")),
        "completion.json": ("openai_completion", json.dumps({"object": "text_completion", "choices": [{"text": "a", "logprobs": {"tokens": ["a"], "token_logprobs": [-0.2], "top_logprobs": [{"a": -0.2}], "text_offset": [0]}}]})),
        "completion.sse": ("openai_completion_sse", sse(json.dumps({"object": "text_completion", "choices": [{"index": 0, "text": "a", "logprobs": {"tokens": ["a"], "token_logprobs": [-0.2], "top_logprobs": None, "text_offset": [0]}}]}), "[DONE]")),
        "generate.json": ("vllm_generate", (SAMPLES / "renderers_generate_response_fixture__renderers-tests-test_client.json").read_text()),
        "sglang.json": ("sglang", json.dumps({"text": "x", "meta_info": {"id": "s", "output_token_logprobs": [[-0.1, 5, None]]}})),
        "llamacpp.json": ("llamacpp", (SAMPLES / "llamacpp_completion_probabilities_legacy__llama.cpp-pr4714.partial.json").read_text()),
        "llamacpp.sse": ("llamacpp_sse", sse(json.dumps({"content": "a", "stop": True, "completion_probabilities": [{"id": 1, "token": "a", "logprob": -0.1, "top_logprobs": []}]}))),
        "tgi.json": ("tgi", json.dumps({"generated_text": "a", "details": {"tokens": [{"id": 1, "text": "a", "logprob": -0.1}]}})),
        "primerl.jsonl": ("primerl", json.dumps({"schema_version": 1, "token_ids": [1], "inference_logprobs": [-0.1]})),
        "offline.json": ("vllm_offline", json.dumps([{"1": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}}])),
        "many.jsonl": ("openai_chat", "\n".join(json.dumps(chat([entry("a", -0.1)])) for _ in range(2))),
    }
    for name, (_, text) in files.items():
        (folder / name).write_text(text)
    return {name: fmt for name, (fmt, _) in files.items()}


def test_every_format_from_a_folder_and_a_url(tmp_path, monkeypatch):
    folder = tmp_path / "dumps"
    folder.mkdir()
    expected = _one_file_per_format(folder)
    d = read_dumps(folder)
    assert {Path(s).name: f for s, f in d.formats.items()} == {n: [f] for n, f in expected.items()}
    assert set(d.tokens["source"].unique()) == {str(folder / n) for n in expected}
    monkeypatch.setenv("BIA_CACHE_DIR", str(tmp_path / "cache"))
    with serve_folder(folder) as base:
        for name, fmt in expected.items():
            remote = read_dump(f"{base}/{name}")
            assert remote.formats == {f"{base}/{name}": [fmt]}
            local = d.tokens.filter(source=str(folder / name)).drop("source")
            assert remote.tokens.drop("source").equals(local), name


def test_an_empty_dump_is_an_error_but_a_runs_empty_capture_file_is_no_record(tmp_path):
    # Issue 22: an empty .jsonl read as a dump gave Dump(0 tokens...) without a word, where an empty .json is an error.
    (tmp_path / "captures.jsonl").write_text("\n \n")
    with pytest.raises(DumpError, match=r"captures\.jsonl: \$: an empty file: no JSON line \(a run's capture file may be empty"):
        read_dumps(tmp_path / "captures.jsonl")
    d = read_dumps(tmp_path / "captures.jsonl", torn_tail=True)  # how read_run reads captures: a file before its first response
    assert d.tokens.is_empty() and d.requests.is_empty() and d.skipped == []
    (tmp_path / "response.json").write_text("  \n")
    with pytest.raises(DumpError, match="an empty file"):
        load(tmp_path / "response.json")


def test_a_folder_names_every_file_it_cannot_read(tmp_path):
    # Issue 22: read_dumps(folder) stopped at the first file it did not recognise; now one error names each, with its reason.
    (tmp_path / "a_notes.json").write_text('{"hello": "world"}')
    (tmp_path / "b_ok.json").write_text((SAMPLES / "vllm_chat_nonstream_token_ids__OpenPipe-ART.json").read_text())
    (tmp_path / "c_empty.json").write_text("")
    with pytest.raises(DumpError) as caught:
        read_dumps(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'a_notes.json'}: $: ")
    assert message.endswith(f"; 1 more source could not be read: {tmp_path / 'c_empty.json'}: $: an empty file")
    assert [e.source for e in caught.value.others] == [str(tmp_path / "c_empty.json")]
    assert "b_ok.json" not in message
