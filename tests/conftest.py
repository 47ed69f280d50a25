"""Shared fixtures: the embedded real witnesses, a control witness, and Agg plotting."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import shutil
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
# MKL on AVX-512 may sum in a different order when a buffer lands at another alignment, so the same torch
# matmul can differ in its last bits between two calls once the heap is busy (the experiment tests saw it
# in the full suite only). Its conditional numerical reproducibility mode fixes the code path; set before
# any test loads torch, and inherited by CLI child processes. AVX2, not COMPATIBLE: COMPATIBLE's GEMM sums
# a row in an order that changes with the row count, which the row-invariant mode cannot use (rowwise.py).
os.environ.setdefault("MKL_CBWR", "AVX2")

ROOT = Path(__file__).resolve().parent.parent
LAMBDA = ROOT / "data" / "aprender-lambda"
V2_WITNESS = LAMBDA / "witness@464c168e62.json"

# Property tests draw a fixed number of examples each; the fast tier (scripts/check.sh) draws a third of them, so that
# make check stays a pre-commit check, while the whole suite and CI draw them all.
EXAMPLES_SCALE = float(os.environ.get("BIA_EXAMPLES_SCALE", "1"))


def examples(n: int) -> int:
    """A property test's example budget in this tier: ``n`` scaled by ``BIA_EXAMPLES_SCALE``, never under 10."""
    return max(10, round(n * EXAMPLES_SCALE))

# A control witness that passes every V3 rule (docs/v3.md), each case of test_v3 changing one thing in it.
CONTROL = {
    "binary_sha256": "a" * 64,
    "commit": "f" * 40,
    "host": "lambda",
    "prompt_sha256": "b" * 64,
    "model": {"path": "Qwen3.5-4B-Q4_K_M.gguf", "sha256": "c" * 64},
    "bands": [
        {"c": c, "m_formed": c, "result": "PASS", "declared_min": 64, "divergence_at": 127, "decode_tok_s": rate}
        for c, rate in ((1, 40.0), (4, 30.0), (8, 25.0), (16, 20.0))
    ],
}


# Mutation runs (scripts/mutation.sh) copy the project into mutants/ and run the tests there. CLI child
# processes must import the mutated package wherever their working directory is, and the functions they
# reach must count for the test that started them, so mutmut runs that test against those mutants.
MUTATION_RUN = ROOT.name == "mutants"
if MUTATION_RUN:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "mutmut_child"), str(ROOT)])
    os.environ["BIA_MUTMUT_HITS"] = tempfile.mkdtemp(prefix="bia-mutmut-hits-")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield
    if MUTATION_RUN and os.environ.get("MUTANT_UNDER_TEST") == "stats":
        from mutmut.state import state

        for path in Path(os.environ["BIA_MUTMUT_HITS"]).glob("*.txt"):
            state()._stats.update(path.read_text(encoding="utf-8").split())
            path.unlink()


@pytest.fixture(scope="module")
def server_binary():
    """The llama-server binary scripts/build_llama_server.sh built (tests/test_llamacpp*.py): skipped without it,
    except under CI, where a missing server is a failure."""
    from analysis.experiment.engines import find_llama_server

    found = find_llama_server()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have llama-server: scripts/test.sh builds it with scripts/build_llama_server.sh")
        pytest.skip("no llama-server here: run scripts/build_llama_server.sh (about 7 minutes, once per machine)")
    return found


@pytest.fixture
def control() -> dict:
    return copy.deepcopy(CONTROL)


@pytest.fixture
def lambda_copy(tmp_path: Path) -> Path:
    """A writable copy of the embedded real witnesses."""
    target = tmp_path / "aprender-lambda"
    shutil.copytree(LAMBDA, target)
    return target


@pytest.fixture(params=["compiled", "numpy"])
def per_token_pass(request, monkeypatch):
    """Run a mismatch test on each per-token pass: the compiled one (numba, the ``fast`` extra) and the numpy one,
    so that the hand-worked values and the property tests hold the fallback to the same answers."""
    from analysis.metrics.mismatch import _mismatch_blocks, _mismatch_kernel

    if request.param == "compiled" and not _mismatch_kernel.AVAILABLE:
        pytest.skip("numba is not installed (pip install 'bia[fast]')")
    monkeypatch.setattr(_mismatch_blocks, "COMPILED", request.param == "compiled")
    return request.param


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def json_spots(value):
    """Every (container, key) pair inside a JSON value, for property tests that corrupt one spot."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield value, key
            yield from json_spots(item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield value, index
            yield from json_spots(item)


def corrupted(data, document, replacement):
    """A deep copy of a JSON value with one spot, drawn with hypothesis' ``data``, set to ``replacement``."""
    from hypothesis import strategies as st

    copied = copy.deepcopy(document)
    spots = list(json_spots(copied))
    container, key = spots[data.draw(st.integers(0, len(spots) - 1))]
    container[key] = replacement
    return copied


@contextlib.contextmanager
def serve_folder(folder: Path):
    """A real HTTP server on loopback serving ``folder``; yields its base URL."""
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def pytest_configure(config):
    config.addinivalue_line("markers", "tutorials: runs the tutorial notebooks through papermill (tests/test_tutorials.py; part of the normal suite)")
