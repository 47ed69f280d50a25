"""Hostile JSON: integers beyond 64 bits, nesting 100,000 deep, repeated keys and impossible token ids are each
refused with one line naming the file, the record and the field, by every reader and by ``bia serve``."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from _cli import bia
from conftest import CONTROL, ROOT, V2_WITNESS
from hypothesis import given
from hypothesis import strategies as st

from analysis import DumpError, WitnessError, read_witness, shape_check
from analysis.core._strictjson import MAX_DEPTH, NestingError, check_depth
from analysis.core._strictjson import loads_strict as loads
from analysis.dumps import read_dump
from analysis.dumps.formats import read_jsonl
from analysis.run import RunError, read_run

pytestmark = pytest.mark.slow

DEEP = "[" * 100_000 + "]" * 100_000  # far past every parser's limit
EXPERIMENT_RUN = ROOT / "data" / "experiment-cpu" / "default"


def _refused(result: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


# --- the nesting guard ----------------------------------------------------------------------------


def test_the_limit_is_serde_jsons_and_strings_do_not_count():
    assert MAX_DEPTH == 128
    check_depth("[" * 128 + "]" * 128)
    check_depth('["' + "[" * 500 + '"]')  # brackets in a string
    check_depth('["\\\\", ' + "[" * 127 + "]" * 127 + "]")  # an escaped backslash does not open a string
    with pytest.raises(NestingError, match="nested deeper than 128, at line 2 column 129"):
        check_depth("\n" + "[" * 129 + "]" * 129)
    with pytest.raises(NestingError):
        loads(DEEP)


def _first_too_deep(text: str, limit: int) -> int | None:
    """The guard worked out byte by byte: a quote after an even run of backslashes (none included) opens or closes a
    string, and brackets count outside strings only."""
    depth, inside, backslashes = 0, False, 0
    for at, char in enumerate(text):
        if char == '"' and backslashes % 2 == 0:
            inside = not inside
        elif not inside and char in "[{":
            depth += 1
            if depth > limit:
                return at
        elif not inside and char in "]}":
            depth -= 1
        backslashes = backslashes + 1 if char == "\\" else 0
    return None


@given(st.text(alphabet='[]{}"\\a', max_size=60), st.integers(0, 6))
def test_the_guard_finds_the_bracket_a_byte_by_byte_reading_finds(text, limit):
    from analysis.core._strictjson import _too_deep_at

    assert _too_deep_at(text.encode(), limit) == _first_too_deep(text, limit)


# --- witnesses and the V3 check -------------------------------------------------------------------


@pytest.fixture
def big_c(tmp_path):
    witness = json.loads(V2_WITNESS.read_text())
    witness["bands"][1]["c"] = 2**64 - 1
    path = tmp_path / "big.json"
    path.write_text(json.dumps(witness))
    return path


@pytest.fixture
def deep_witness(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"witness_version": 2, "notes": ' + DEEP + "}")
    return path


def test_a_witness_integer_beyond_64_bits_is_named(big_c):
    with pytest.raises(WitnessError) as caught:
        read_witness(big_c)
    error = caught.value
    assert (error.source, error.record, error.field) == (str(big_c), "$.bands[1]", "c")
    assert "expected a non-negative integer of at most 9223372036854775807" in str(error)


@pytest.mark.parametrize("field", ["seed", "max_m"])
def test_other_integers_beyond_64_bits_are_named(tmp_path, field):
    if field == "seed":
        doc = json.loads(V2_WITNESS.read_text())
        doc["sampler"]["seed"] = 2**63
    else:
        doc = {"cc": "sm_89", "max_m": 2**63, "status": "PASS", "started_utc": "2025-01-01T00:00:00+00:00", "exit": 0}
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(WitnessError, match=rf"{field}: expected a non-negative integer of at most"):
        read_witness(path)


def test_shape_check_names_a_c_beyond_u32(big_c):
    verdict = shape_check(big_c)
    assert verdict.exit_code == 4
    assert verdict.reasons == ("RED: unreadable witness: bands[1].c: invalid value: integer `18446744073709551615`, "
                               "expected a non-negative integer of at most 4294967295 (u32)",)


def test_shape_check_of_integers_beyond_a_double(tmp_path):
    witness = json.loads(json.dumps(CONTROL))
    path = tmp_path / "w.json"
    path.write_text(json.dumps(witness).replace('"decode_tok_s": 40.0', '"decode_tok_s": 1' + "0" * 400))
    assert shape_check(path).reasons[0].startswith("RED: unreadable witness: number 10000000000000000000... (401 digits) is out of range")


@pytest.mark.parametrize("command", ["witness", "report", "shape-check"])
def test_cli_on_an_integer_beyond_64_bits(big_c, command):
    needle = "bands[1].c: invalid value" if command == "shape-check" else "$.bands[1].c: expected a non-negative integer of at most"
    _refused(bia(command, str(big_c)), 4, str(big_c) if command != "shape-check" else "RED: unreadable witness", needle)


@pytest.mark.parametrize("command", ["witness", "report", "shape-check"])
def test_cli_on_a_witness_nested_100000_deep(deep_witness, command):
    _refused(bia(command, str(deep_witness)), 4, "arrays and objects nested deeper than 128, at line 1 column 160")


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("policy.toml", "bands = " + DEEP, "not a valid policy file: nested too deep"),
    ("policy.json", '{"bands": ' + DEEP + "}", "not a valid policy file: arrays and objects nested deeper than 128"),
    ("policy.json", '{"near_tie_cap": 1, "near_tie_cap": 5}', "near_tie_cap is given more than once"),
])
def test_a_hostile_policy_file(tmp_path, name, text, problem):
    policy = tmp_path / name
    policy.write_text(text)
    _refused(bia("shape-check", "--policy", str(policy), str(V2_WITNESS)), 2, f"{policy}: {problem}")


def test_a_witness_exactly_at_the_limit_reads(tmp_path):
    doc = json.loads(V2_WITNESS.read_text())
    doc["deep"] = json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))  # the witness's object is level 1
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    assert read_witness(path).witnesses.height == 1


# --- dumps ----------------------------------------------------------------------------------------


def _entry(token="a", **extra):
    return {"token": token, "logprob": -0.5, "bytes": list(token.encode()) if not token.startswith("token_id:") else [1], **extra}


def _chat(entry=None, **extra):
    entry = entry or _entry()
    return {"id": "r", "object": "chat.completion", "model": "m", **extra,
            "choices": [{"index": 0, "finish_reason": "length", "message": {"content": "a"}, "logprobs": {"content": [entry]}}]}


def _sse(chunk_extra: str = "") -> str:
    chunk = {"id": "s", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [_entry()]}, "finish_reason": None}]}
    return f"data: {json.dumps(chunk)[:-1]}{chunk_extra}}}\n\ndata: [DONE]\n\n"


def _jsonl(tmp_path, *lines: str):
    path = tmp_path / "captures.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _dump_refused(path, where: str, problem: str) -> None:
    """Neither the columnar path reads it nor the general path, whose one-line error names the source, the
    record and the field (``where``: the record, then the field's path, as the message writes them)."""
    assert read_jsonl(path, str(path)) is None
    with pytest.raises(DumpError) as caught:
        read_dump(path)
    assert str(caught.value).startswith(f"{path}: {where}: "), str(caught.value)
    assert problem in caught.value.problem and "\n" not in str(caught.value)


OK = json.dumps(_chat())
ENVELOPE = json.dumps({"response": _chat(), "c": 4, "slot": 0})
SSE_ENVELOPE = json.dumps({"sse": _sse(), "c": 4, "slot": 0, "arrival_times": [0.1, 0.2]})
REPEATED = "key appears more than once"
TOO_DEEP = "arrays and objects nested deeper than 128"


DUMP_CASES = {
    "a repeated logprob": ([OK, OK.replace('"logprob": -0.5', '"logprob": -0.5, "logprob": -7.0')],
                           "line 2.choices[0].logprobs.content[0].logprob", REPEATED),
    "a repeated key on the first line": ([OK.replace('"model": "m"', '"model": "m", "model": "n"'), OK], "line 1.model", REPEATED),
    "a repeated envelope key": ([ENVELOPE, ENVELOPE.replace('"c": 4', '"c": 4, "c": 8')], "line 2.c", REPEATED),
    "a repeated key in an envelope's extra": ([ENVELOPE, ENVELOPE[:-1] + ', "gpu": {"n": 1, "n": 2}}'], "line 2.gpu.n", REPEATED),
    "a repeated stream envelope key": ([SSE_ENVELOPE, SSE_ENVELOPE.replace('"slot": 0', '"slot": 0, "slot": 1')], "line 2.slot", REPEATED),
    "a second sse": ([SSE_ENVELOPE, SSE_ENVELOPE[:-1] + f', "sse": {json.dumps(_sse())}}}'], "line 2.sse", REPEATED),
    "a repeated key in a stream event": ([SSE_ENVELOPE, json.dumps({"sse": _sse(', "model": "n"'), "c": 4})],
                                         "record 2 event 0 (line 1).model", REPEATED),
    "an envelope nested 200 deep": ([ENVELOPE, ENVELOPE[:-1] + ', "gpu": ' + "[" * 200 + "]" * 200 + "}"], "line 2", TOO_DEEP),
    "a stream envelope nested past orjson's 1024": ([SSE_ENVELOPE, SSE_ENVELOPE[:-1] + ', "gpu": ' + DEEP + "}"], "line 2", TOO_DEEP),
    "a response nested 100000 deep": ([ENVELOPE, json.dumps({"response": {"choices": "X"}}).replace('"X"', DEEP)], "line 2", TOO_DEEP),
    "a first line nested 100000 deep": ([OK[:-1] + ', "x": ' + DEEP + "}", OK], "line 1", TOO_DEEP),
    "a stream event nested 200 deep": ([SSE_ENVELOPE, json.dumps({"sse": _sse().replace('"choices": [', '"choices": ' + "[" * 200, 1)
                                                                  .replace("}]}\n", "}" + "]" * 200 + "}\n", 1)})],
                                       "record 2 event 0 (line 1)", TOO_DEEP),
    "token_id:N beyond 64 bits": ([OK, json.dumps(_chat(_entry("token_id:99999999999999999999999")))],
                                  "line 2.choices[0].logprobs.content[0].token", "holds no token id"),
    "a negative token_id:N": ([OK, json.dumps(_chat(_entry("token_id:-5")))], "line 2.choices[0].logprobs.content[0].token",
                              "'token_id:-5' holds no token id"),
    "a negative candidate placeholder": ([OK, json.dumps(_chat(_entry(top_logprobs=[_entry("token_id:-5")])))],
                                         "line 2.choices[0].logprobs.content[0].top_logprobs[0].token", "holds no token id"),
    "a negative id": ([OK, json.dumps(_chat(_entry(id=-5)))], "line 2.choices[0].logprobs.content[0].id", "expected a token id"),
    "c beyond 64 bits": ([ENVELOPE, ENVELOPE.replace('"c": 4', f'"c": {2**64 - 1}')], "record 2.c",
                              "expected an integer that fits in 64 bits"),
}


@pytest.mark.parametrize("name", sorted(DUMP_CASES))
def test_dumps_refuse_and_name(tmp_path, name):
    lines, where, problem = DUMP_CASES[name]
    _dump_refused(_jsonl(tmp_path, *lines), where, problem)


def test_one_json_document_nested_100000_deep(tmp_path):
    path = tmp_path / "response.json"
    path.write_text(json.dumps(_chat(), indent=1).replace('"model": "m"', '"model": "m", "x": ' + DEEP))
    _dump_refused(path, "$", TOO_DEEP + ", at line 4 column 148")


def test_one_json_document_with_a_repeated_key(tmp_path):
    path = tmp_path / "response.json"
    path.write_text(json.dumps(_chat(_entry(token="token_id:7")), indent=1).replace('"index": 0', '"index": 0, "index": 1'))
    _dump_refused(path, "$.choices[0].index", REPEATED)


def test_a_whole_last_line_with_a_repeated_key_is_no_torn_tail(tmp_path):
    path = tmp_path / "captures.jsonl"
    path.write_text(ENVELOPE + "\n" + ENVELOPE.replace('"slot": 0', '"slot": 0, "slot": 1'))  # no newline at the end
    run = tmp_path / "run"
    (run / "captures").mkdir(parents=True)
    shutil.copy(EXPERIMENT_RUN / "manifest.json", run / "manifest.json")
    shutil.copy(path, run / "captures" / "requests.jsonl")
    with pytest.raises(DumpError, match=r"line 2\.slot: key appears more than once"):
        read_run(run, cache=False)


def test_colons_in_strings_and_escapes_are_no_repeated_key(tmp_path):
    line = json.dumps(_chat(_entry("a:b"), note={"k:": "\\u003a", "q": '"x": 1'}))
    path = _jsonl(tmp_path, line, line.replace('"q"', '"q\\u003a"'))
    assert read_dump(path).requests.height == 2


# --- run directories ------------------------------------------------------------------------------


def _run_copy(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(EXPERIMENT_RUN, run, ignore=shutil.ignore_patterns("derived"))
    return run


def test_a_run_manifest_nested_100000_deep(tmp_path):
    run = _run_copy(tmp_path)
    (run / "manifest.json").write_text('{"run_version": 1, "x": ' + DEEP + "}")
    with pytest.raises(RunError, match=r"manifest\.json: not valid JSON \(arrays and objects nested deeper than 128, at line 1 column 152\)"):
        read_run(run)


def test_report_on_a_run_whose_capture_repeats_a_key(tmp_path):
    run = _run_copy(tmp_path)
    captures = run / "captures" / "requests.jsonl"
    lines = captures.read_text().splitlines()
    assert '"band_c": ' in lines[3]  # a bundled run of run_version 1: the legacy key, which is read as c
    lines[3] = lines[3].replace('"band_c": ', '"band_c": 99, "band_c": ', 1)
    captures.write_text("\n".join(lines) + "\n")
    _refused(bia("report", str(run), "-o", str(tmp_path / "r.html")), 4, "line 4.band_c: key appears more than once")


# --- bia serve ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("torch")
    from analysis.serve import BackgroundServer

    with BackgroundServer("default") as running:
        yield running


BODY = {"messages": [{"role": "user", "content": "If the argument is"}], "max_tokens": 2, "temperature": 0}


@pytest.mark.engine
@pytest.mark.parametrize(("name", "body", "param", "message"), [
    ("an array", b"[1, 2]", None, "the body must be a JSON object, got list"),
    ("nested 100000 deep", ('{"messages": ' + DEEP + "}").encode(), None, "nested deeper than 128"),
    ("a repeated key", b'{"max_tokens": 2, "max_tokens": 9999}', "max_tokens", "the body names max_tokens more than once"),
    ("not UTF-8", b'{"messages": "\xff"}', None, "the body is not UTF-8 text"),
    ("NaN", b'{"temperature": NaN}', None, "NaN is not a JSON number"),
    ("n=3", json.dumps({**BODY, "n": 3}).encode(), "n", "n must be 1"),
    ("n as text", json.dumps({**BODY, "n": "1"}).encode(), "n", "n must be an integer"),
    ("stream_options a list", json.dumps({**BODY, "stream": True, "stream_options": [1]}).encode(), "stream_options", "must be an object"),
    ("include_usage a string", json.dumps({**BODY, "stream": True, "stream_options": {"include_usage": "yes"}}).encode(),
     "include_usage", "must be a boolean"),
    ("max_tokens true", json.dumps({**BODY, "max_tokens": True}).encode(), "max_tokens", "must be an integer"),
    ("top_logprobs beyond 20", json.dumps({**BODY, "top_logprobs": 21}).encode(), "top_logprobs", "top_logprobs must be 0..20"),
    ("logprobs a number", json.dumps({**BODY, "logprobs": 1}).encode(), "logprobs", "must be a boolean"),
    ("temperature false", json.dumps({**BODY, "temperature": False}).encode(), "temperature", "temperature must be 0"),
    ("a message without content", json.dumps({"messages": [{"role": "user"}]}).encode(), "messages", "messages must be"),
])
def test_serve_answers_a_malformed_body_with_400(server, name, body, param, message):
    import httpx

    response = httpx.post(f"{server.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param and message in error["message"]


@pytest.mark.engine
def test_serve_still_answers_n_1(server):
    import httpx

    response = httpx.post(f"{server.url}/v1/chat/completions", json={**BODY, "n": 1, "logprobs": True}, timeout=60)
    assert response.status_code == 200 and len(response.json()["choices"]) == 1
