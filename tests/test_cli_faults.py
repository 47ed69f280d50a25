"""Every command against every fault class that applies to it (docs/cli.md, "Bad input", "Exit codes" and "What is never
overwritten"): the documented exit code, one line on stderr, no traceback, and nothing written.

Each case runs the real command line in a process of its own, and each fails up front: none may read a model, start a
notebook kernel, listen on a port or fire a request (the per-case time limit would end one that did).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _cli import bia
from conftest import ROOT, V2_WITNESS

pytestmark = pytest.mark.slow

WITNESS = str(V2_WITNESS)
RUN = str(ROOT / "data" / "experiment-cpu" / "default")
DUMP = str(ROOT / "tests" / "samples" / "vllm_chat_nonstream_token_ids__OpenPipe-ART.json")
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing answers there

ERROR, RED, USAGE = "error", "RED", "usage"  # how the fault is said: "error: ...", shape-check's "RED: ..." (docs/v3.md), click's usage
# Fault classes, with their exit codes in docs/cli.md
OPTION, EXISTS, UNDER_FILE, UNWRITABLE, MISSING, EMPTY, MALFORMED, URL = 2, 2, 2, 2, 3, 3, 4, 6


def _case(name: str, words: str, code: int, said: str = ERROR, needle: str = ""):
    """One row of the matrix: ``words`` is the command line, each ``{place}`` in it a path from the fixture (split first, so a
    checkout in a folder with spaces stays one word); ``needle`` a phrase the line holds."""
    return pytest.param(words.split(), code, said, needle, id=name)


_TRUNCATED = "not valid JSON at line"  # and where: the same words from every reader (the test after the matrix)

CASES = [
    # bia witness
    _case("witness-bad-bands", "witness {witness} --bands x", OPTION, needle="--bands"),
    _case("witness-missing", "witness {missing}", MISSING),
    _case("witness-empty-folder", "witness {empty}", EMPTY),
    _case("witness-truncated", "witness {truncated}", MALFORMED, needle=_TRUNCATED),
    _case("witness-neither", "witness {neither}", MALFORMED),
    _case("witness-broken-run", "witness {broken}", MALFORMED, needle="is a run directory"),
    _case("witness-url", "witness {closed}/w.json", URL, needle=CLOSED),
    # bia shape-check: aprender's RED lines for its witness (docs/v3.md), bia's error lines for its options
    _case("shape-check-mistyped-epsilon", "shape-check {witness} --epsilon abc", OPTION, USAGE, "'--epsilon'"),
    _case("shape-check-bad-bands", "shape-check {witness} --bands x", OPTION, needle="--bands"),
    _case("shape-check-policy-cut-short", "shape-check {witness} --policy {truncated}", OPTION, needle=_TRUNCATED),
    _case("shape-check-missing", "shape-check {missing}", MISSING, RED),
    _case("shape-check-folder", "shape-check {empty}", MISSING, RED),
    _case("shape-check-truncated", "shape-check {truncated}", MALFORMED, RED),
    _case("shape-check-neither", "shape-check {neither}", MALFORMED, RED),
    _case("shape-check-url", "shape-check {closed}/w.json", URL, RED, CLOSED),
    # bia report
    _case("report-bad-epsilon", "report {witness} --epsilon -1 -o {out}", OPTION, needle="--epsilon"),
    _case("report-mistyped-epsilon", "report {witness} --epsilon abc -o {out}", OPTION, USAGE, "'--epsilon'"),
    _case("report-existing-output", "report {witness} -o {old}", EXISTS, needle="--force"),
    _case("report-existing-notebook", "report {witness} -o {out} --notebook {old}", EXISTS, needle="--notebook"),
    _case("report-output-under-file", "report {witness} -o {afile}/r.html", UNDER_FILE, needle="is a file, not a folder"),
    _case("report-notebook-under-file", "report {witness} -o {out} --notebook {afile}/n.ipynb", UNDER_FILE, needle="--notebook"),
    _case("report-output-unwritable", "report {witness} -o {unwritable}/r.html", UNWRITABLE, needle="not writable"),
    _case("report-missing", "report {missing} -o {out}", MISSING),
    _case("report-empty-folder", "report {empty} -o {out}", EMPTY),
    _case("report-truncated-witness", "report {truncated_witness} -o {out}", MALFORMED, needle=_TRUNCATED),
    _case("report-truncated", "report {truncated} -o {out}", MALFORMED, needle=_TRUNCATED),
    _case("report-neither", "report {neither} -o {out}", MALFORMED, needle="neither a witness"),
    _case("report-broken-run", "report {broken} -o {out}", MALFORMED, needle=_TRUNCATED),
    _case("report-url", "report {closed}/w.json -o {out}", URL, needle=CLOSED),
    # bia assemble
    _case("assemble-no-dumps", "assemble -o {out}", OPTION, needle="--mapping"),
    _case("assemble-existing-output", "assemble {dump} --band-per-file -o {full}", EXISTS, needle="--force"),
    _case("assemble-output-under-file", "assemble {dump} --band-per-file -o {afile}/run", UNDER_FILE, needle="is a file, not a folder"),
    _case("assemble-output-unwritable", "assemble {dump} --band-per-file -o {unwritable}/run", UNWRITABLE, needle="not writable"),
    _case("assemble-missing", "assemble {missing} -o {out}", MISSING),
    _case("assemble-missing-mapping", "assemble --mapping {missing} -o {out}", MISSING, needle="no such mapping file"),
    _case("assemble-empty-folder", "assemble {empty} -o {out}", EMPTY),
    _case("assemble-truncated", "assemble {truncated} -o {out}", MALFORMED, needle=_TRUNCATED),
    _case("assemble-neither", "assemble {neither} -o {out}", MALFORMED),
    _case("assemble-truncated-mapping", "assemble --mapping {truncated} -o {out}", OPTION, needle=_TRUNCATED),  # no dump: a bad input file
    _case("assemble-url", "assemble {closed}/d.json -o {out}", URL, needle=CLOSED),
    # bia experiment: every case is refused before the model is read
    _case("experiment-bad-ladder", "experiment --ladder 0 -o {out}", OPTION, needle="--ladder"),
    _case("experiment-bad-modes", "experiment --modes bogus -o {out}", OPTION, needle="bogus"),
    _case("experiment-mistyped-max-tokens", "experiment --max-tokens abc -o {out}", OPTION, USAGE, "'--max-tokens'"),
    _case("experiment-missing-prompts", "experiment --prompts {missing} -o {out}", OPTION, needle="--prompts"),
    _case("experiment-hf-missing", "experiment --hf {missing} -o {out}", OPTION, needle="--hf"),
    _case("experiment-hf-not-a-checkpoint", "experiment --hf {empty} -o {out}", OPTION, needle="not a Hugging Face checkpoint folder"),
    _case("experiment-existing-output", "experiment --modes default -o {full_runs}", EXISTS, needle="--force"),
    _case("experiment-output-under-file", "experiment --modes default -o {afile}/runs", UNDER_FILE, needle="is a file, not a folder"),
    _case("experiment-output-unwritable", "experiment --modes default -o {unwritable}/runs", UNWRITABLE, needle="not writable"),
    _case("experiment-recompute-missing", "experiment --trainer --recompute {missing} -o {out}", MISSING, needle="--recompute"),
    _case("experiment-recompute-empty-folder", "experiment --trainer --recompute {empty} -o {out}", EMPTY, needle="--recompute"),
    _case("experiment-recompute-broken-run", "experiment --trainer --recompute {broken} -o {out}", MALFORMED, needle=_TRUNCATED),
    # bia probe
    _case("probe-bad-ladder", "probe {closed} --ladder 0 -o {out}", OPTION, needle="--ladder"),
    _case("probe-mistyped-repeats", "probe {closed} --repeats abc -o {out}", OPTION, USAGE, "'--repeats'"),
    _case("probe-missing-prompts", "probe {closed} --prompts {missing} -o {out}", OPTION, needle="--prompts"),
    _case("probe-prompts-cut-short", "probe {closed} --prompts {prompts} -o {out}", OPTION, needle="line 2: not valid JSON at line 2 column"),
    _case("probe-existing-run", "probe {closed} -o {full_runs}/default", EXISTS, needle="--resume"),
    _case("probe-output-under-file", "probe {closed} -o {afile}/run", UNDER_FILE, needle="is a file, not a folder"),
    _case("probe-output-unwritable", "probe {closed} -o {unwritable}/run", UNWRITABLE, needle="not writable"),
    _case("probe-resume-missing", "probe {closed} --resume -o {missing}", MISSING, needle="no manifest.json to resume"),
    _case("probe-resume-broken-run", "probe {closed} --resume -o {broken}", MALFORMED, needle=_TRUNCATED),
    _case("probe-url", "probe {closed} -o {out}", URL, needle="127.0.0.1:9"),
    # bia serve: every case is refused before the model is read or a port is opened
    _case("serve-mistyped-port", "serve --port abc", OPTION, USAGE, "'--port'"),
    _case("serve-bad-mode", "serve --mode bogus", OPTION, needle="--mode"),
    _case("serve-missing-model", "serve --model {missing}", OPTION, needle="--model"),
    _case("serve-log-under-file", "serve --log-file {afile}/serve.log", UNDER_FILE, needle="is a file, not a folder"),
    _case("serve-log-unwritable", "serve --log-file {unwritable}/serve.log", UNWRITABLE, needle="not writable"),
    _case("serve-log-in-missing-folder", "serve --log-file {missing}/serve.log", OPTION, needle="--log-file"),
    # bia certify
    _case("certify-bad-target-rate", "certify {run} --target-rate 2 -o {out}", OPTION, needle="--target-rate"),
    _case("certify-mistyped-confidence", "certify {run} --confidence abc -o {out}", OPTION, USAGE, "'--confidence'"),
    _case("certify-existing-output", "certify {run} -o {old}", EXISTS, needle="--force"),
    _case("certify-output-under-file", "certify {run} -o {afile}/c.json", UNDER_FILE, needle="is a file, not a folder"),
    _case("certify-output-unwritable", "certify {run} -o {unwritable}/c.json", UNWRITABLE, needle="not writable"),
    _case("certify-url", "certify {closed} --run {out}/run -o {out}/c.json --ladder 1,2 --wait 0", URL, needle=CLOSED),  # probed first: nothing answers
    _case("certify-url-and-run", "certify {closed} {run} -o {out}", OPTION, needle="not both"),
    _case("certify-url-max-requests", "certify {closed} --run {out}/run -o {out}/c.json --max-requests 1", OPTION, needle="--max-requests"),
    _case("certify-missing", "certify {missing} -o {out}", MISSING),
    _case("certify-empty-folder", "certify {empty} -o {out}", EMPTY),
    _case("certify-truncated", "certify {truncated} -o {out}", MALFORMED),
    _case("certify-broken-run", "certify {broken} -o {out}", MALFORMED, needle=_TRUNCATED),
    # bia history: -o is a folder it adds to, so an existing one is no fault; one that is no history is
    _case("history-output-a-file", "history {witness} -o {old}", EXISTS, needle="history.json"),
    _case("history-output-not-a-history", "history {witness} -o {full}", EXISTS, needle="history.json"),
    _case("history-output-under-file", "history {witness} -o {afile}/h", UNDER_FILE, needle="is a file, not a folder"),
    _case("history-output-unwritable", "history {witness} -o {unwritable}/h", UNWRITABLE, needle="not writable"),
    _case("history-of-another-version", "history {witness} -o {old_history}", MALFORMED, needle="history_version 9"),
    _case("history-missing", "history {missing} -o {out}", MISSING),
    _case("history-empty-folder", "history {empty} -o {out}", EMPTY),
    _case("history-truncated", "history {truncated} -o {out}", MALFORMED, needle=_TRUNCATED),
    _case("history-neither", "history {neither} -o {out}", MALFORMED),
    _case("history-broken-run", "history {broken} -o {out}", MALFORMED, needle=_TRUNCATED),
    _case("history-url", "history {closed}/w.json -o {out}", URL, needle=CLOSED),
    # bia trend
    _case("trend-existing-output", "trend {witness} -o {old}", EXISTS, needle="--force"),
    _case("trend-output-under-file", "trend {witness} -o {afile}/t.html", UNDER_FILE, needle="is a file, not a folder"),
    _case("trend-output-unwritable", "trend {witness} -o {unwritable}/t.html", UNWRITABLE, needle="not writable"),
    _case("trend-missing", "trend {missing} -o {out}", MISSING),
    _case("trend-empty-folder", "trend {empty} -o {out}", EMPTY),
    _case("trend-truncated", "trend {truncated} -o {out}", MALFORMED, needle=_TRUNCATED),
    _case("trend-neither", "trend {neither} -o {out}", MALFORMED),
    _case("trend-broken-run", "trend {broken} -o {out}", MALFORMED, needle=_TRUNCATED),
    _case("trend-url", "trend {closed}/w.json -o {out}", URL, needle=CLOSED),
]


@pytest.fixture
def places(tmp_path: Path, unwritable: Path) -> dict[str, str]:
    """The paths the cases name: inputs with one fault each, and outputs that are occupied or cannot be written."""
    (tmp_path / "afile").write_text("a file, not a folder")
    (tmp_path / "empty").mkdir()
    (tmp_path / "truncated.json").write_text('{"id": "x", "choices": [{"logprobs": ')  # a dump cut short: no format can be told
    (tmp_path / "truncated-witness.json").write_text(V2_WITNESS.read_text()[:300])
    (tmp_path / "neither.json").write_text('{"hello": 1}\n')  # valid JSON: no witness, marker, dump nor run
    (tmp_path / "prompts.jsonl").write_text('{"text": "If the argument is"}\n{"text": ')
    (tmp_path / "broken" / "captures").mkdir(parents=True)
    (tmp_path / "broken" / "manifest.json").write_text('{"run_version": ')
    (tmp_path / "old.html").write_text("yesterday's output")
    (tmp_path / "old-history").mkdir()
    (tmp_path / "old-history" / "history.json").write_text('{"history_version": 9}')
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("someone's notes")
    (tmp_path / "runs" / "default").mkdir(parents=True)  # an experiment's earlier run of the same mode
    (tmp_path / "runs" / "default" / "manifest.json").write_text("{}")
    names = {"afile": "afile", "empty": "empty", "missing": "missing", "truncated": "truncated.json", "neither": "neither.json",
             "truncated_witness": "truncated-witness.json", "broken": "broken", "old": "old.html", "old_history": "old-history",
             "full": "full", "full_runs": "runs", "prompts": "prompts.jsonl", "out": "out"}
    return {**{key: str(tmp_path / name) for key, name in names.items()}, "unwritable": str(unwritable),
            "witness": WITNESS, "run": RUN, "dump": DUMP, "closed": CLOSED}


@pytest.fixture
def unwritable(tmp_path: Path):
    """A folder that refuses writing: one made read-only, or for root (whom permissions do not stop) /proc/self, which the kernel
    refuses to anyone."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
    elif Path("/proc/self").is_dir():
        yield Path("/proc/self")
    else:
        pytest.skip("no folder refuses writing to root here")


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder): what a command must leave as it was."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("words, code, said, needle", CASES)
def test_a_fault_is_one_line_with_its_exit_code_and_nothing_is_written(words, code, said, needle, places, tmp_path):
    """docs/cli.md: the fault class's exit code, one line naming it (or click's usage error), no traceback, and every file
    under the test's folder as it was (an output absent, an existing one unchanged, nothing half-written beside it)."""
    args = [word.format(**places) for word in words]
    before = _tree(tmp_path)
    done = bia(*args)
    shown = f"bia {' '.join(args)}: exit {done.returncode}\n{done.stderr}"
    assert "Traceback" not in done.stderr + done.stdout, shown
    assert done.returncode == code, shown
    lines = done.stderr.strip().splitlines()
    if said == USAGE:  # click's own words for a value of the wrong type
        assert done.stderr.startswith("Usage: ") and f"Error: Invalid value for {needle}" in done.stderr, shown
    else:
        assert len(lines) == 1 and lines[0].startswith(f"{said}: ") and needle in lines[0], shown
    assert _tree(tmp_path) == before, f"{shown}\nit wrote: {sorted(set(_tree(tmp_path).items()) - set(before.items()))}"


CUT = '{"id": "x", "choices": [{"logprobs": '  # a dump cut short, no format to be told from it
CUT_SAID = "not valid JSON at line 1 column 38 (Expecting value at the end of the text: cut short?)"


@pytest.mark.parametrize("command", ["witness", "report", "assemble", "history", "trend"])
def test_a_file_cut_short_is_said_alike_by_every_command(command, tmp_path):
    """Issue 32 item 10: bia report said a truncated file was "neither JSON, JSON lines, SSE nor a torch file" where bia witness
    said where the JSON broke off; every command now says it in the words of one function (_strictjson.not_json)."""
    cut = tmp_path / "cut.json"
    cut.write_text(CUT)
    done = bia(command, str(cut), *([] if command == "witness" else ["-o", str(tmp_path / "out")]))
    assert (done.returncode, done.stderr) == (4, f"error: {cut}: $: {CUT_SAID}\n")


@pytest.mark.parametrize("command", [["report"], ["certify"], ["history"], ["trend"], ["experiment", "--trainer", "--recompute"],
                                     ["probe", CLOSED, "--resume"]], ids=lambda words: words[0])
def test_a_manifest_cut_short_is_said_alike_by_every_command(command, tmp_path):
    run = tmp_path / "run"
    (run / "captures").mkdir(parents=True)
    (run / "manifest.json").write_text('{"run_version": ')
    done = bia(*command, *(["-o", str(run)] if command[0] == "probe" else [str(run), "-o", str(tmp_path / "out")]))
    said = f"{run / 'manifest.json'}: not valid JSON at line 1 column 17 (Expecting value at the end of the text: cut short?)"
    assert done.returncode == 4 and said in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
