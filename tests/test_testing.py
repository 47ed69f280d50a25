"""analysis.testing (issue 34 item 2): assertions that pass quietly or say what differs, on the bundled runs, toy engines, a real
bia serve on loopback, and dumps made by hand; and the docs' pytest example run with pytest."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from analysis.serve import BackgroundServer
from analysis.testing import assert_batch_invariant, assert_dumps_equal

pytestmark = pytest.mark.slow


def test_the_bundled_row_invariant_run_passes_and_its_target_asks_for_more():
    assert assert_batch_invariant(ROOT / "data" / "experiment-cpu" / "row-invariant").verdict == "AMBER"
    with pytest.raises(AssertionError) as failed:
        assert_batch_invariant(ROOT / "data" / "experiment-cpu" / "row-invariant", target_rate=0.01)
    lines = str(failed.value).splitlines()
    assert lines[0] == f"Batch invariance assertion failed: AMBER for {ROOT / 'data' / 'experiment-cpu' / 'row-invariant'} (copies)"
    assert lines[1].startswith("[why] 0 of 56 batched requests part from m=1") and lines[1].endswith("299 batched requests would do (243 more)")
    assert lines[2] == "[next] 243 more batched requests: bia experiment --prompts FILE of 11 prompts" and len(lines) == 3  # none parts


def test_the_bundled_default_run_fails_naming_its_first_request_where_and_by_how_much():
    with pytest.raises(AssertionError) as failed:
        assert_batch_invariant(str(ROOT / "data" / "experiment-cpu" / "default"))
    lines = str(failed.value).splitlines()
    assert lines[0] == f"Batch invariance assertion failed: RED (co-batching) for {ROOT / 'data' / 'experiment-cpu' / 'default'} (copies)"
    assert lines[2] == "[first] p0 c=4 repeat 0 slot 0: its logprob bits differ from ref #1 from token 1 (up to 127 ULP)"
    assert lines[3] == "[next] batch-invariant kernels: bia experiment --modes row-invariant" and len(lines) == 4


def test_a_callable_is_probed_in_process():
    def steady(prompts):
        return [{"token_ids": [len(p), 1], "logprobs": [-0.5, -0.75]} for p in prompts]

    def shifted(prompts):
        return [{"token_ids": [len(p), 1], "logprobs": [-0.5, -0.75 + (len(prompts) > 2) * 2 ** -20]} for p in prompts]

    assert assert_batch_invariant(steady, prompts=["a"], ladder=[1, 2, 4]).to_dicts()[0]["divergent"] == 0
    with pytest.raises(AssertionError, match=r"\[first\] p0 c=4 repeat 0 slot 0: its logprob bits differ from ref #1 from token 1 \(up to 16 ULP\)"):
        assert_batch_invariant(shifted, prompts=["a"], ladder=[1, 2, 4])  # c=2 is untouched; 2**-20 at 0.75 is 16 float32 ULPs


@pytest.mark.engine
def test_a_server_url_is_probed_first(tmp_path):
    """bia serve on loopback: its fixed-tiles mode keeps each row's bits, so the assertion passes on the URL itself."""
    with BackgroundServer("fixed-tiles") as server:
        judgement = assert_batch_invariant(server.url, prompts=["If the argument is"], ladder=[1, 2], output=tmp_path / "run")
    assert judgement.to_dicts()[0]["divergent"] == 0 and (tmp_path / "run" / "manifest.json").is_file()


def test_anything_else_is_refused_by_type():
    with pytest.raises(TypeError, match="takes a Run, a run directory, a URL or a generate function, not int"):
        assert_batch_invariant(3)


def _chat(tokens, logprobs):
    return {"id": "r", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "".join(tokens)},
                         "logprobs": {"content": [{"token": t, "logprob": v, "top_logprobs": []} for t, v in zip(tokens, logprobs)]}}]}


def _dump(tmp_path, name, *responses):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in responses))
    return path


# just below -0.25 (magnitudes in [0.25, 0.5)) a float32 ULP is 2**-2 * 2**-23 = 2**-25: -0.25 - k * 2**-25 is k ULPs from -0.25
@pytest.mark.parametrize("right, ulp, message", [
    ((["a", "b"], [-0.5, -0.25]), 0, None),
    ((["a", "b"], [-0.5, -0.25 - 2 ** -25]), 0, "request 2 of 2: logprob at token 1 is 1 ULP apart, more than 0"),
    ((["a", "b"], [-0.5, -0.25 - 2 ** -25]), 1, None),
    ((["a", "b"], [-0.5, -0.25 - 3 * 2 ** -25]), 2, "request 2 of 2: logprob at token 1 is 3 ULP apart, more than 2"),
    ((["a", "c"], [-0.5, -0.25]), 5, "request 2 of 2: tokens part at token 1"),
    ((["a"], [-0.5]), 0, "request 2 of 2: one side ends at token 1"),
])
def test_dumps_compare_request_by_request_with_ulps_worked_out_by_hand(tmp_path, right, ulp, message):
    left = _dump(tmp_path, "left", _chat(["x"], [-1.0]), _chat(["a", "b"], [-0.5, -0.25]))
    other = _dump(tmp_path, "right", _chat(["x"], [-1.0]), _chat(*right))
    if message is None:
        assert_dumps_equal(left, other, ulp=ulp)
        return
    with pytest.raises(AssertionError) as failed:
        assert_dumps_equal(left, other, ulp=ulp)
    first, left_line, right_line = str(failed.value).splitlines()
    assert first == f"Dumps are different ({message})"
    assert left_line.startswith(f"[left] {left} record 2: 'b'") and right_line.startswith(f"[right] {other} record 2: ")


def test_dumps_of_other_sizes_and_bad_ulps_are_said(tmp_path):
    left = _dump(tmp_path, "left", _chat(["x"], [-1.0]), _chat(["a"], [-0.5]))
    with pytest.raises(AssertionError, match=r"Dumps are different \(number of requests\)\n\[left\] 2\n\[right\] 1"):
        assert_dumps_equal(left, _dump(tmp_path, "right", _chat(["x"], [-1.0])))
    with pytest.raises(ValueError, match="ulp: expected an integer >= 0, got -1"):
        assert_dumps_equal(left, left, ulp=-1)


def test_the_docs_pytest_example_runs_with_pytest():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "docs/examples/test_batch_invariance.py"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout
