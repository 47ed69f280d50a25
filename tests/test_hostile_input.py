"""Bad input at the command line: every mistake a one-line error with a documented exit code, never a
traceback, and nothing a user wrote overwritten or counted twice."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _cli import bia
from conftest import ROOT
from typer.testing import CliRunner

from analysis.cli import app

RUN = ROOT / "data" / "experiment-cpu" / "default"
WITNESS = ROOT / "data" / "aprender-lambda" / "witness@464c168e62.json"
CLOSED = "http://127.0.0.1:9"  # discard port: nothing listens; the options are refused before any connection


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00\x9c\x80 not text")
    empty = tmp_path / "blank.txt"
    empty.write_text("\n  \n")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "x").write_text("x")
    return {"binary": binary, "blank": empty, "folder": folder, "missing": tmp_path / "missing.txt", "tmp": tmp_path}


def _cases(f: dict[str, Path]) -> list[tuple[list[str], int, str]]:
    """(arguments, exit code, words stderr must hold)."""
    probe = ["probe", CLOSED, "-o", str(f["tmp"] / "run")]
    experiment = ["experiment", "-o", str(f["tmp"] / "exp")]
    return [
        (probe + ["--prompts", str(f["missing"])], 2, "--prompts"),
        (probe + ["--prompts", str(f["binary"])], 2, "not UTF-8 text"),
        (probe + ["--prompts", str(f["folder"])], 2, "is a folder"),
        (probe + ["--prompts", str(f["blank"])], 2, "holds no line that is not blank"),
        (probe + ["--ladder", "abc"], 2, "--ladder takes comma-separated integers"),
        (probe + ["--ladder", "0"], 2, "--ladder takes distinct batch sizes >= 1"),
        (probe + ["--ladder", "-4"], 2, "--ladder takes distinct batch sizes >= 1"),
        (probe + ["--log-pattern", "("], 2, "--log-pattern '(': not a regular expression"),
        (probe + ["--server-log", str(f["missing"])], 2, "--server-log"),
        (experiment + ["--prompts", str(f["binary"])], 2, "not UTF-8 text"),
        (experiment + ["--ladder", "1,x"], 2, "--ladder takes comma-separated integers"),
        (experiment + ["--top-k", "100000"], 2, "--top-k 100000: the model has only 256 tokens"),
        (experiment + ["--device", "tpu"], 2, "--device: expected cpu, cuda or cuda:N, got 'tpu'"),
        (experiment + ["--max-tokens", "0"], 2, "--max-tokens: expected an integer >= 1, got 0"),
        (experiment + ["--trainer", "--recompute", str(f["folder"])], 3, "no manifest.json; a run directory starts with its manifest"),
        (experiment + ["--trainer", "--trainer-batch", "0"], 2, "--trainer-batch: expected an integer >= 1, got 0"),
        (experiment + ["--recompute", str(f["folder"])], 2, "--recompute: give --trainer too"),
        (["serve", "--port", "99999"], 2, "Invalid value for '--port'"),
        (["serve", "--mode", "foo"], 2, "--mode takes one of default, one-by-one, fixed-tiles, row-invariant (batch-invariant is one-by-one's old name), got 'foo'"),
        (["serve", "--model", "/nonexistent/m.safetensors"], 2, "--model /nonexistent/m.safetensors: no such file"),
        (["serve", "--log-file", str(f["missing"].parent / "no-such-folder" / "serve.log")], 2, "does not exist"),
        (["serve", "--device", "tpu"], 2, "--device: expected cpu"),
        (["shape-check", str(WITNESS), "--policy", str(f["binary"])], 2, "not UTF-8 text"),
        (["witness", str(WITNESS), "--policy", str(f["binary"])], 2, "not UTF-8 text"),
        (["shape-check", str(WITNESS), "--epsilon", "nan"], 2, "near_tie_epsilon must be a finite number >= 0"),
        (["shape-check", str(WITNESS), "--epsilon", "-1"], 2, "near_tie_epsilon must be a finite number >= 0"),
        (["report", str(WITNESS), "--epsilon", "nan", "-o", str(f["tmp"] / "r.html")], 2, "--epsilon takes a finite number >= 0"),
        (["report", str(WITNESS), "--epsilon", "-1", "-o", str(f["tmp"] / "r.html")], 2, "--epsilon takes a finite number >= 0"),
        (["report", str(WITNESS), "-o", str(f["folder"])], 2, "is a folder; give a file name"),
        (["report", str(WITNESS), "--policy", str(f["binary"])], 2, "not UTF-8 text"),
    ]


@pytest.mark.slow
def test_every_bad_option_is_one_line_with_its_exit_code(files):
    runner = CliRunner()
    for args, code, words in _cases(files):
        result = runner.invoke(app, args)
        shown = f"bia {' '.join(args)}"
        assert result.exception is None or isinstance(result.exception, SystemExit), f"{shown}: {result.exception!r}"
        assert result.exit_code == code, f"{shown}: exit {result.exit_code}, stderr {result.stderr!r}"
        assert "Traceback" not in result.stderr and words in result.stderr, f"{shown}: {result.stderr!r}"
        assert not (files["tmp"] / "run").exists() and not (files["tmp"] / "exp").exists(), shown


@pytest.mark.slow
def test_the_real_command_prints_no_traceback(files):
    """The installed entry point, in a process of its own, on one mistake of each kind."""
    for args in (["probe", CLOSED, "--ladder", "abc"], ["experiment", "--device", "tpu", "-o", str(files["tmp"] / "e")],
                 ["shape-check", str(WITNESS), "--policy", str(files["binary"])]):
        done = bia(*args, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.startswith("error: "), (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def _run_with(tmp_path: Path, **fields) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(RUN, folder, ignore=shutil.ignore_patterns("derived"))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(fields)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize("fields, words", [
    ({"prompts": None}, 'field "prompts": expected a list of objects, got None'),
    ({"ladder": "1,4,8"}, "field \"ladder\": expected a list of distinct integers >= 1, got '1,4,8'"),
    ({"ladder": [1, -4]}, 'field "ladder": expected a list of distinct integers >= 1, got [1, -4]'),
    ({"declared_min": "sixty-four"}, "field \"declared_min\": expected an integer >= 0, got 'sixty-four'"),
    ({"m_formed": "garbage"}, "field \"m_formed\": expected a list of objects, got 'garbage'"),
    ({"m_formed": [{"prompt_id": "p0", "c": -4, "widths": [4]}]}, 'field "m_formed[0].c": expected an integer >= 1, got -4'),
    ({"prompts": [{"prompt_id": "p0", "text": 7}]}, 'field "prompts[0].text": expected a string, got 7'),
    ({"label": ["a", "b"]}, "field \"label\": expected a string, got ['a', 'b']"),
])
def test_a_manifest_of_wrong_types_names_its_field(tmp_path, fields, words):
    folder = _run_with(tmp_path, **fields)
    result = CliRunner().invoke(app, ["report", str(folder), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 4 and "Traceback" not in result.stderr
    assert f"{folder / 'manifest.json'}: {words}" in result.stderr
    assert not (tmp_path / "r.html").exists()


def test_a_report_is_not_written_over_an_existing_file_unless_forced(tmp_path):
    target = tmp_path / "report.html"
    target.write_text("yesterday's report")
    result = CliRunner().invoke(app, ["report", str(WITNESS), "-o", str(target)])
    assert result.exit_code == 2 and "report.html: -o already exists; give --force to overwrite it" in result.stderr
    assert "force=True" not in result.stderr  # the Python spelling is for the Python API
    assert target.read_text() == "yesterday's report"


def test_an_experiment_is_not_written_over_an_existing_run(tmp_path):
    kept = tmp_path / "exp" / "default" / "manifest.json"
    kept.parent.mkdir(parents=True)
    kept.write_text("{}")
    result = CliRunner().invoke(app, ["experiment", "-o", str(tmp_path / "exp"), "--modes", "default", "--ladder", "1", "--max-tokens", "2"])
    assert result.exit_code == 2 and "the default run already exists; give --force to overwrite it" in result.stderr
    assert "force=True" not in result.stderr
    assert kept.read_text() == "{}"


def test_a_capture_line_appended_twice_is_read_once_and_said(tmp_path):
    from analysis.run import band_table, read_run

    folder = _run_with(tmp_path)
    captures = folder / "captures" / "requests.jsonl"
    lines = captures.read_text().splitlines()
    captures.write_text("\n".join([*lines, lines[4]]) + "\n")  # line 5 (p0, c=4, slot 1) again at the end
    run = read_run(folder)
    assert run.dump.requests.height == len(lines)
    assert [str(e) for e in run.dump.skipped] == [f"{captures}: line {len(lines) + 1}: the same capture line as line 5: read once"]
    assert band_table(run).filter(c=4, prompt_id="p0")["n_slots"].item() == 4
    assert [str(e) for e in read_run(folder).dump.skipped] == [str(e) for e in run.dump.skipped]  # the note survives derived/


def test_two_different_lines_for_one_request_are_an_error_naming_both(tmp_path):
    from analysis.run import RunError, read_run

    folder = _run_with(tmp_path)
    captures = folder / "captures" / "requests.jsonl"
    lines = captures.read_text().splitlines()
    other = json.loads(lines[5])
    other.update({"c": 4, "slot": 0})  # line 6 (p0, c=4, slot 2) relabelled as slot 0, which line 4 holds
    captures.write_text("\n".join([*lines, json.dumps(other)]) + "\n")
    with pytest.raises(RunError, match=rf"line {len(lines) + 1}: band slot 0 was already recorded at .* line 4, with different content"):
        read_run(folder, cache=False)


def test_the_same_witness_given_as_a_file_and_its_folder_is_counted_once(lambda_copy):
    import analysis
    from analysis.io._sources import SourceRepeated

    file = lambda_copy / "witness@464c168e62.json"
    alone = analysis.read_witnesses([str(lambda_copy)])
    with pytest.warns(SourceRepeated, match="witness@464c168e62.json is .* given again; it is read once"):
        ws = analysis.read_witnesses([str(file), str(lambda_copy)])
    assert ws.witnesses.height == alone.witnesses.height == 3 and ws.bands.height == alone.bands.height


@pytest.mark.parametrize("fields, words", [
    ({"prompts": None}, 'field "prompts": expected a list of objects, got None; it cannot be resumed'),
    ({"ladder": "1,4,8"}, "field \"ladder\": expected a list of distinct integers >= 1, got '1,4,8'; it cannot be resumed"),
    ({"requested": None}, 'field "requested": expected an object, got None; it cannot be resumed'),
])
def test_resume_of_a_manifest_of_wrong_types_names_its_field(tmp_path, fields, words):
    folder = _run_with(tmp_path, **{"producer": "bia probe", "done": [], "requested": {"engine": "auto"}, **fields})
    result = CliRunner().invoke(app, ["probe", CLOSED, "-o", str(folder), "--resume"])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 4 and "Traceback" not in result.stderr  # a malformed run (docs/cli.md), as bia report says of it
    assert words in result.stderr, result.stderr


@pytest.mark.parametrize("arrivals", [False, "0.1,0.2", [0.1, "late"], [True, 0.2]])
def test_arrival_times_that_are_not_a_list_of_seconds_are_named(tmp_path, arrivals):
    """Found by tests/test_fuzz.py: ``arrival_times: false`` raised a TypeError from inside the reader."""
    import analysis

    line = json.loads((RUN / "captures" / "requests.jsonl").read_text().splitlines()[0])
    line["arrival_times"] = arrivals
    path = tmp_path / "capture.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(analysis.DumpError, match=r"capture.jsonl: .*arrival_times"):
        analysis.read_dumps([path])
