"""Fuzzing what users hand bia: witness, dump, manifest and policy files, the CLI over them, and
``bia serve``'s request bodies. Each input is a real file (or a real HTTP request on loopback) made
by mutating a real document or from scratch; the answer must be a correct result or the project's
own error, never another exception, a hang or a 500.

The budget is fixed (``FUZZ_EXAMPLES`` per target, 150 by default); under CI the examples are
derandomized so a run is repeatable. ``BIA_FUZZ_EXAMPLES=5000 pytest tests/test_fuzz.py`` searches longer.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import analysis
from analysis import DumpError, PolicyError, V3Policy, WitnessError
from analysis.cli import app
from analysis.run import RunError, band_table, read_run, to_witness

pytestmark = pytest.mark.slow

FUZZ_EXAMPLES = int(os.environ.get("BIA_FUZZ_EXAMPLES", "150"))
BUDGET = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")), database=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])

WITNESS = json.loads((ROOT / "data" / "aprender-lambda" / "witness@464c168e62.json").read_text())
RUN = ROOT / "data" / "experiment-cpu" / "default"
MANIFEST = json.loads((RUN / "manifest.json").read_text())
CAPTURE_LINE = (RUN / "captures" / "requests.jsonl").read_text().splitlines()[0]
VLLM_DUMP = (ROOT / "tests" / "samples" / "vllm_chat_nonstream_token_ids__OpenPipe-ART.json").read_text()

_DELETE = object()
scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
           | st.sampled_from(["token_id:-5", "token_id:99999999999999999999999", "NaN", "", "\u0000", "<script>"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)


def _paths(node, prefix=()):
    """Every path to a value inside a JSON document."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


def _set(document, path, value):
    if not path:
        return document if value is _DELETE else value
    out = copy.deepcopy(document)
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE and isinstance(node, dict):
        del node[path[-1]]
    elif value is not _DELETE:
        node[path[-1]] = value
    return out


def mutated(document):
    """A real document with one value replaced by any JSON value, or a key left out."""
    paths = list(_paths(document))
    return st.tuples(st.sampled_from(paths), json_values | st.just(_DELETE)).map(lambda pv: _set(document, *pv))


def texts_of(document):
    """The JSON text of a mutated document, sometimes damaged as files are: cut short, bytes inserted, nested deep."""
    text = mutated(document).map(lambda d: json.dumps(d))
    damaged = st.tuples(text, st.integers(min_value=0, max_value=10_000), st.binary(max_size=8)).map(
        lambda t: (t[0].encode()[: t[1] % (len(t[0]) + 1)] + t[2]))
    deep = st.integers(min_value=100, max_value=200_000).map(lambda n: ("[" * n + "]" * n).encode())
    duplicate = text.map(lambda t: (t[:-1] + ', "bands": []}' if t.endswith("}") else t).encode())
    return text.map(str.encode) | damaged | deep | duplicate


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@BUDGET
@given(data=texts_of(WITNESS))
def test_witness_files(scratch, data):
    path = scratch / "witness.json"
    path.write_bytes(data)
    verdict = analysis.shape_check(path)  # never raises for a local file: RED says why
    assert verdict.status in ("ADMISSIBLE", "NOT ADMISSIBLE", "RED") and verdict.reasons is not None
    try:
        ws = analysis.read_witnesses([str(path)], progress=False)
    except WitnessError as exc:
        assert str(path) in str(exc)
    else:
        ws.shape_checks()
        ws.bands.height  # noqa: B018 - the frames are built


@BUDGET
@given(data=texts_of(json.loads(VLLM_DUMP)) | texts_of(json.loads(CAPTURE_LINE)))
def test_dump_files(scratch, data):
    path = scratch / "dump.json"
    path.write_bytes(data)
    try:
        dump = analysis.read_dumps([str(path)])
    except DumpError as exc:
        assert str(path) in str(exc)
    else:
        assert dump.tokens.height >= 0


@pytest.fixture(scope="module")
def run_folder(scratch) -> Path:
    folder = scratch / "run"
    shutil.copytree(RUN, folder)
    read_run(folder)  # derived/ written once: each example reads only its manifest anew
    return folder


@BUDGET
@given(manifest=mutated(MANIFEST))
def test_run_manifests(run_folder, manifest):
    (run_folder / "manifest.json").write_text(json.dumps(manifest))
    try:
        run = read_run(run_folder)
        band_table(run)
        for prompt in ("p0", "p1"):
            to_witness(run, prompt)
    except RunError as exc:
        assert "manifest.json" in str(exc) or str(run_folder) in str(exc)


def test_a_manifest_integer_past_64_bits_is_refused_by_name(run_folder):
    # found by test_run_manifests: a width of 2**63 reached polars, which could not hold it
    manifest = json.loads((RUN / "manifest.json").read_text())
    manifest["m_formed"][1]["widths"] = [2**63]
    (run_folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RunError, match=r'"m_formed\[1\]\.widths": expected a list of integers >= 0 \(integers are 64-bit'):
        read_run(run_folder)


@BUDGET
@given(policy=st.dictionaries(st.sampled_from(["model_prefix", "model_label", "bands", "near_tie_epsilon", "near_tie_cap",
                                                "declared_min_floor", "s7_ratio", "s7_base_c", "s7_batched_c", "other"]),
                              json_values, max_size=4),
       as_toml=st.booleans())
def test_policy_files(scratch, policy, as_toml):
    path = scratch / ("policy.toml" if as_toml else "policy.json")
    if as_toml:
        lines = [f"{k} = {json.dumps(v)}" for k, v in policy.items() if not isinstance(v, dict) and v is not None]
        path.write_text("\n".join(lines))
    else:
        path.write_text(json.dumps(policy))
    try:
        V3Policy.from_file(path)
    except PolicyError as exc:
        assert str(path) in str(exc)


@settings(BUDGET, max_examples=max(10, FUZZ_EXAMPLES // 5))
@given(data=texts_of(WITNESS), command=st.sampled_from(["shape-check", "witness"]))
def test_cli_on_fuzzed_witnesses(scratch, data, command):
    path = scratch / "cli-witness.json"
    path.write_bytes(data)
    result = CliRunner().invoke(app, [command, str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 2, 3, 4, 5) and "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("torch")
    from analysis.serve import BackgroundServer

    with BackgroundServer("default") as running:
        yield running


chat_bodies = mutated({"messages": [{"role": "user", "content": "If the argument is"}], "max_tokens": 2, "temperature": 0,
                       "logprobs": True, "top_logprobs": 2, "stream": False})


@pytest.mark.engine
@BUDGET
@given(body=chat_bodies.map(lambda b: json.dumps(b).encode()) | st.binary(max_size=64)
       | st.integers(min_value=100, max_value=100_000).map(lambda n: ("[" * n + "]" * n).encode()))
def test_serve_request_bodies(server, body):
    response = httpx.post(f"{server.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code in (200, 400, 413, 422), (response.status_code, response.text[:300])
    if response.status_code != 200:
        assert "error" in response.json()
