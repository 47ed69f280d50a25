"""analysis.testing (issue 34 item 2, issue 41 part 3): assertions that pass quietly or say what differs, on the bundled runs, toy
engines, a real bia serve on loopback, and dumps made by hand; pytest's own output of a failure; and docs/testing.md's pytest
file and failure messages, as shown."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from analysis import RunError
from analysis.probe import CallableError
from analysis.serve import BackgroundServer
from analysis.testing import assert_batch_invariant, assert_dumps_equal

pytestmark = pytest.mark.slow

EXPERIMENT = ROOT / "data" / "experiment-cpu"
TESTING_MD = ROOT / "docs" / "testing.md"


def _steady(prompts):
    return [{"token_ids": [len(p), 1], "logprobs": [-0.5, -0.75]} for p in prompts]


def test_an_amber_run_fails_unless_allowed_as_bia_certify_exits_8_on_it():
    run = EXPERIMENT / "row-invariant"
    with pytest.raises(AssertionError) as failed:
        assert_batch_invariant(run)
    lines = str(failed.value).splitlines()
    assert lines[0] == f"Batch invariance assertion failed: AMBER for {run} (copies)"
    assert lines[1].startswith("[why] 0 of 56 batched requests part from m=1") and lines[1].endswith("299 batched requests would do (243 more)")
    assert lines[2] == "[next] 243 more batched requests: bia experiment --prompts FILE of 11 prompts"
    assert lines[3] == "[allow] allow_amber=True passes AMBER, where bia certify exits 8" and len(lines) == 4  # none parts: no [first]
    assert assert_batch_invariant(run, allow_amber=True).verdict == "AMBER"
    # target_rate is the bound's rate: 0 of 56 contexts bound it at 5.21% (95%), below 6%, so GREEN passes at 6% and not at 5%
    assert assert_batch_invariant(run, target_rate=0.06).verdict == "GREEN"
    with pytest.raises(AssertionError, match="AMBER"):
        assert_batch_invariant(run, target_rate=0.05)
    # the bound's confidence: 1 - 0.05 ** (1 / 56) = 5.21% at 95% is not below 2%; 1 - 0.5 ** (1 / 56) = 1.23% at 50% is
    with pytest.raises(AssertionError, match="AMBER"):
        assert_batch_invariant(run, target_rate=0.02)
    assert assert_batch_invariant(run, target_rate=0.02, confidence=0.5).verdict == "GREEN"


def test_the_bundled_default_run_fails_naming_its_first_request_where_and_by_how_much():
    with pytest.raises(AssertionError) as failed:
        assert_batch_invariant(str(EXPERIMENT / "default"), allow_amber=True)
    lines = str(failed.value).splitlines()
    assert lines[0] == f"Batch invariance assertion failed: RED (co-batching) for {EXPERIMENT / 'default'} (copies)"
    assert lines[2] == "[first] p0 c=4 repeat 0 slot 0: its logprob bits differ from ref #1 from token 1 (up to 127 ULP)"
    # issue 43: what to hand the engine's maintainers, for a run that has a directory, on the next step's line
    assert lines[3] == ("[next] batch-invariant kernels: bia experiment --modes row-invariant; a repro for its maintainers: "
                        f"bia repro {EXPERIMENT / 'default'} -o {EXPERIMENT / 'default'}-repro") and len(lines) == 4


def test_a_folder_of_runs_is_judged_together_and_every_failing_row_is_reported_the_worst_first():
    """As bia certify data/experiment-cpu: its four runs, RED for default and AMBER for the other three, judged together, so the
    default run's next step names the fix measured beside it."""
    with pytest.raises(AssertionError) as failed:
        assert_batch_invariant(EXPERIMENT)
    heads = [line for line in str(failed.value).splitlines() if line.startswith("Batch invariance assertion failed: ")]
    assert heads == [f"Batch invariance assertion failed: RED (co-batching) for {EXPERIMENT / 'default'} (copies)"] + [
        f"Batch invariance assertion failed: AMBER for {EXPERIMENT / mode} (copies)" for mode in ("batch-invariant", "fixed-tiles", "row-invariant")]
    assert "[next] batch-invariant kernels: bia experiment --modes row-invariant (measured beside it" in str(failed.value)
    with pytest.raises(AssertionError) as failed:
        assert_batch_invariant(EXPERIMENT, allow_amber=True)
    assert str(failed.value).count("Batch invariance assertion failed: ") == 1 and "RED (co-batching)" in str(failed.value)
    both = assert_batch_invariant([EXPERIMENT / "fixed-tiles", str(EXPERIMENT / "row-invariant")], allow_amber=True)
    assert [row["run"] for row in both] == [str(EXPERIMENT / "fixed-tiles"), str(EXPERIMENT / "row-invariant")]


def test_a_callable_is_probed_in_process():
    def shifted(prompts):
        return [{"token_ids": [len(p), 1], "logprobs": [-0.5, -0.75 + (len(prompts) > 2) * 2 ** -20]} for p in prompts]

    # 11 prompts at c = 2, 4: 66 distinct batch contexts, none parted, bound the rate below 5% at 95% (59 would)
    assert assert_batch_invariant(_steady, prompts=[f"p{i}" for i in range(11)], ladder=[1, 2, 4], target_rate=0.05).verdict == "GREEN"
    with pytest.raises(AssertionError, match=r"AMBER .*\n\[why\] 0 of 6 batched requests"):  # one prompt: 6 contexts
        assert_batch_invariant(_steady, prompts=["a"], ladder=[1, 2, 4])
    assert assert_batch_invariant(_steady, prompts=["a"], ladder=[1, 2, 4], allow_amber=True).to_dicts()[0]["divergent"] == 0
    with pytest.raises(AssertionError, match=r"\[first\] p0 c=4 repeat 0 slot 0: its logprob bits differ from ref #1 from token 1 \(up to 16 ULP\)"):
        assert_batch_invariant(shifted, prompts=["a"], ladder=[1, 2, 4], allow_amber=True)  # c=2 is untouched; 2**-20 at 0.75 is 16 float32 ULPs


@pytest.mark.engine
def test_a_server_url_is_probed_first(tmp_path):
    """bia serve on loopback: its fixed-tiles mode keeps each row's bits, so the assertion passes on the URL itself (AMBER, allowed)."""
    with BackgroundServer("fixed-tiles") as server:
        judgement = assert_batch_invariant(server.url, prompts=["If the argument is"], ladder=[1, 2], output=tmp_path / "run", allow_amber=True)
    assert judgement.verdict == "AMBER" and judgement.to_dicts()[0]["divergent"] == 0  # 2 batched requests: too few to bound the rate
    assert (tmp_path / "run" / "manifest.json").is_file()


def test_a_path_that_is_not_a_run_is_named_and_is_no_assertion_error(tmp_path, monkeypatch):
    """A typo, or a run CI never wrote, must not pass pytest.raises(AssertionError): only a verdict is an AssertionError."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as missing:
        assert_batch_invariant("data/experiment-cpu/default")  # relative to bia's checkout, not to this folder
    assert str(missing.value) == (f"data/experiment-cpu/default: no such run directory or folder (looked for in {tmp_path}); "
                                  "bia's bundled runs are analysis.default_runs(), from any folder")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a run\n")
    with pytest.raises(RunError, match=r"^empty: holds no run directory \(a folder with manifest.json and captures/\); assert_batch_invariant reads run"):
        assert_batch_invariant("empty")
    with pytest.raises(RunError, match=r"^notes.txt: no manifest.json; .*; assert_batch_invariant reads run directories"):
        assert_batch_invariant("notes.txt")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(RunError, match=r"broken.*; assert_batch_invariant reads run directories") as unread:
        assert_batch_invariant(broken)
    assert not isinstance(unread.value, AssertionError)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: assert_batch_invariant(3), TypeError,
     "assert_batch_invariant takes a Run, a run directory or a folder of them (or a list of runs and directories), a URL or a generate function, not int"),
    (lambda: assert_batch_invariant([]), TypeError, "assert_batch_invariant takes a list of runs and run directories, not an empty one"),
    (lambda: assert_batch_invariant([EXPERIMENT, _steady]), TypeError, "a list of runs and run directories, not one holding a function"),
    (lambda: assert_batch_invariant(EXPERIMENT / "default", ladder=[1, 2]), TypeError,
     "ladder: what a URL or a generate function is probed with, not given with a run"),
    (lambda: assert_batch_invariant(str(EXPERIMENT), prompts=["a"], output="run"), TypeError, "prompts, output: what a URL"),
    (lambda: assert_batch_invariant(_steady, prompts="Hello"), TypeError, "prompts: expected a list, got 'Hello'"),
    (lambda: assert_batch_invariant(_steady, ladder=4), TypeError, "ladder: expected a list, got 4"),
    (lambda: assert_batch_invariant("ftp://example.com/run"), ValueError, "ftp://example.com/run: assert_batch_invariant probes an http(s) URL"),
    (lambda: assert_batch_invariant(EXPERIMENT, allow_amber=1), TypeError, "allow_amber: expected True or False, got 1"),
    (lambda: assert_batch_invariant(EXPERIMENT, target_rate=None), ValueError,
     "target_rate: expected a rate in (0, 1], got None; allow_amber=True passes AMBER"),
    (lambda: assert_batch_invariant(EXPERIMENT, target_rate=0), ValueError, "target_rate: expected a rate in (0, 1], got 0"),
    (lambda: assert_batch_invariant(EXPERIMENT, target_rate=1.5), ValueError, "got 1.5"),
    (lambda: assert_batch_invariant(EXPERIMENT, target_rate=True), ValueError, "got True"),
    (lambda: assert_batch_invariant(EXPERIMENT, target_rate=math.nan), ValueError, "got nan"),
    (lambda: assert_batch_invariant(EXPERIMENT, confidence=1), ValueError, "confidence: expected a probability in (0, 1), got 1"),
    (lambda: assert_batch_invariant(EXPERIMENT, confidence="0.9"), ValueError, "got '0.9'"),
], ids=["int", "empty list", "list of callables", "ladder with a run", "prompts with a folder", "prompts str", "ladder int", "ftp", "allow_amber 1",
        "target_rate None", "target_rate 0", "target_rate 1.5", "target_rate True", "target_rate nan", "confidence 1", "confidence str"])
def test_a_bad_subject_or_option_is_refused_with_its_name(call, error, message):
    with pytest.raises(error) as refused:
        call()
    assert message in str(refused.value) and not isinstance(refused.value, AssertionError)


def test_bad_options_are_refused_before_anything_is_probed():
    calls = []

    def generate(prompts):
        calls.append(prompts)
        return _steady(prompts)

    with pytest.raises(ValueError, match="target_rate"):
        assert_batch_invariant(generate, prompts=["a"], ladder=[1, 2], target_rate=2)
    assert calls == []


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


def test_a_generate_that_returns_a_bad_result_is_named_by_its_call_without_bias_frames():
    """CallableError keeps its type and message; its traceback starts at the assertion, whose frames pytest hides."""
    def no_logprobs(prompts):
        return [{"token_ids": [1]} for _ in prompts]

    with pytest.raises(CallableError, match="generate, call p0 ref #1, row 0: field logprobs: expected one finite logprob") as failed:
        assert_batch_invariant(no_logprobs, prompts=["a"], ladder=[1, 2])
    frames = [str(entry.path) for entry in failed.traceback]
    assert not any("probe" in Path(frame).parts for frame in frames), frames
    assert [entry.frame.f_locals.get("__tracebackhide__") for entry in failed.traceback][1:] == [True] * (len(frames) - 1)


def _pytest(folder, *args):
    """pytest as a user runs it: its default settings, from ``folder`` (no configuration of bia's applies there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def test_a_failure_under_pytest_reads_in_a_dozen_lines_without_bias_source(tmp_path):
    """Issue 41: a failure printed ~60 lines of bia's own source per test under pytest (435 lines for 6 failures); bia's frames
    now hide themselves, so the whole output of a run with one failing test stays within 25 lines."""
    (tmp_path / "test_engine.py").write_text(
        "from analysis.testing import assert_batch_invariant\n\n\n"
        "def test_the_default_kernels():\n"
        f"    assert_batch_invariant({str(EXPERIMENT / 'default')!r})\n")
    done = _pytest(tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "1 failed" in out, out
    lines = out.splitlines()
    assert len(lines) <= 25, out
    assert f"E       AssertionError: Batch invariance assertion failed: RED (co-batching) for {EXPERIMENT / 'default'} (copies)" in lines
    assert "E       [first] p0 c=4 repeat 0 slot 0: its logprob bits differ from ref #1 from token 1 (up to 127 ULP)" in lines
    assert any(line.startswith("E       [next] batch-invariant kernels: bia experiment --modes row-invariant; a repro") for line in lines)
    assert "__tracebackhide__" not in out and "testing.py" not in out and "judge(" not in out  # none of bia's source


def test_a_missing_run_under_pytest_is_an_error_naming_it_without_bias_source(tmp_path):
    (tmp_path / "test_engine.py").write_text(
        "from analysis.testing import assert_batch_invariant\n\n\n"
        "def test_a_run_ci_never_wrote():\n"
        "    assert_batch_invariant('runs/nightly')\n")
    done = _pytest(tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and len(out.splitlines()) <= 25, out
    assert f"E       FileNotFoundError: runs/nightly: no such run directory or folder (looked for in {tmp_path}); " in out
    assert "testing.py" not in out and "_read(" not in out


def _docs_blocks(language):
    return re.findall(rf"^```{language}\n(.*?)^```", TESTING_MD.read_text(), flags=re.M | re.S)


def test_the_docs_pytest_file_passes_copied_into_any_folder(tmp_path):
    """docs/testing.md's pytest file, as shown (GitHub renders it; a literalinclude showed a path), run from a folder that is
    not bia's checkout: its four tests pass, since it finds bia's runs through analysis.default_runs()."""
    block, = _docs_blocks("python")
    assert not (tmp_path / "data").exists()
    (tmp_path / "test_batch_invariance.py").write_text(block)
    done = _pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^=+ 4 passed in [\d.]+s =+$", done.stdout, flags=re.M), done.stdout


def test_the_docs_failure_messages_are_what_the_assertions_raise(monkeypatch):
    """docs/testing.md's "What a failure says", each block the message its call raises from bia's checkout."""
    monkeypatch.chdir(ROOT)
    red, amber, dumps = _docs_blocks("text")
    for shown, call in [(red, lambda: assert_batch_invariant("data/experiment-cpu/default")),
                        (amber, lambda: assert_batch_invariant("data/experiment-cpu/row-invariant")),
                        (dumps, lambda: assert_dumps_equal("data/experiment-cpu/default/captures", "data/experiment-cpu/fixed-tiles/captures"))]:
        with pytest.raises(AssertionError) as failed:
            call()
        assert shown == f"AssertionError: {failed.value}\n"
