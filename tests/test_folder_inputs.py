"""Issue 41, part 2: the user's data or a clear error, never the demo in its place.

Every command that takes folders sorts them one way (analysis.studies.sort_sources): a folder with nothing the command
reads is exit 3 naming what it skipped, with nothing written; a stray file among readable ones is a note; a capture file
cut short is said with the next step that fits the run's kind. Each test runs the real CLI from a temporary folder.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from _cli import ROOT, bia

DATA = ROOT / "data"
STRAY = '{"name": "left-pad", "version": "1.0.0"}\n'  # a package.json: JSON that is no witness, dump or run


@pytest.mark.parametrize(
    ("command", "output"),
    [
        (("report", "one", "-o", "r.html"), "r.html"),
        (("certify", "one", "-o", "c.json"), "c.json"),
        (("witness", "one"), None),
        (("history", "one", "-o", "h"), "h"),
        (("trend", "one", "-o", "t.html"), "t.html"),
        (("assemble", "one", "-o", "a"), "a"),
    ],
)
def test_a_folder_of_one_unrelated_json_file_is_exit_3_naming_it_and_writes_nothing(tmp_path, command, output):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "x.json").write_text(STRAY)
    result = bia(*command, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert f"error: one: nothing bia {command[0]} reads" in result.stderr
    assert "skipped one/x.json (not a witness, marker, dump or run: JSON that matches no dump format)" in result.stderr
    assert "embedded default" not in result.stdout + result.stderr and "wrote" not in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one"]  # no output, not even an empty one
    if output is not None:
        assert not (tmp_path / output).exists()


def test_an_empty_folder_is_exit_3_saying_it_holds_no_file(tmp_path):
    (tmp_path / "empty").mkdir()
    result = bia("report", "empty", "-o", "r.html", cwd=tmp_path)
    assert result.returncode == 3 and "error: empty: nothing bia report reads" in result.stderr
    assert "the folder holds no file" in result.stderr and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", [("witness", "lambda"), ("history", "lambda", "-o", "h")])
def test_a_stray_package_json_among_the_bundled_witnesses_is_a_note_not_a_failure(tmp_path, command):
    shutil.copytree(DATA / "aprender-lambda", tmp_path / "lambda")
    (tmp_path / "lambda" / "package.json").write_text(STRAY)
    result = bia(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: skipped lambda/package.json (not a witness, marker, dump or run: JSON that matches no dump format)"
    ]
    if command[0] == "witness":  # every witness of the folder is read all the same
        assert all(name in result.stdout for name in ("464c168e62", "witness-v3.0-rule"))
    else:
        assert "h: 3 new entries" in result.stdout


def test_certify_skips_a_stray_file_beside_its_runs_with_a_note(tmp_path):
    shutil.copytree(DATA / "experiment-cpu" / "row-invariant", tmp_path / "runs" / "row-invariant")
    (tmp_path / "runs" / "package.json").write_text(STRAY)
    result = bia("certify", "runs", "-o", "c.json", "--target-rate", "0.06", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "note: skipped runs/package.json (not a witness, marker, dump or run" in result.stderr


def test_a_damaged_file_in_a_folder_is_read_and_named_never_skipped(tmp_path):
    shutil.copytree(DATA / "aprender-lambda", tmp_path / "lambda")
    (tmp_path / "lambda" / "broken.json").write_text('{"witness": [1, 2')  # cut short: no kind can be told
    result = bia("witness", "lambda", cwd=tmp_path)
    assert result.returncode == 4 and "lambda/broken.json" in result.stderr and "not valid JSON" in result.stderr


def _cut(run: Path) -> int:
    """Cut the last line of a run's captures in the middle (no newline, not JSON); its line number."""
    captures = run / "captures" / "requests.jsonl"
    data = captures.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    captures.write_bytes(data[: start + (len(data) - start) // 2])
    return data[:start].count(b"\n") + 1


@pytest.mark.parametrize(
    ("bundled", "step"),
    [
        ("experiment-cpu/row-invariant", "run the experiment again: bia experiment -o . --modes row-invariant --force"),
        ("llamacpp-cpu/no-cache-prompt", "bia probe http://127.0.0.1:8080 -o no-cache-prompt --resume"),
    ],
)
def test_a_captures_file_cut_mid_line_is_said_with_the_next_step_of_the_run_s_kind(tmp_path, bundled, step):
    name = bundled.split("/")[1]
    shutil.copytree(DATA / bundled, tmp_path / name, ignore=shutil.ignore_patterns("derived"))
    url = json.loads((tmp_path / name / "manifest.json").read_text()).get("url")
    step = step.replace("http://127.0.0.1:8080", re.sub(r"/v1/.*$", "", str(url)))
    line = _cut(tmp_path / name)
    for attempt in range(2):  # the first read parses and caches, the second opens the cache: both say it
        result = bia("certify", name, "-o", "c.json", "--force", cwd=tmp_path)
        note = f"note: {name}/captures/requests.jsonl: line {line} is cut short ("
        assert note in result.stderr, (attempt, result.stderr)
        said = next(text for text in result.stderr.splitlines() if text.startswith(note))
        assert "its request is left out and the run lacks it; to write it again: " + step in said
        assert ("bia probe" in said) == ("llamacpp" in bundled)  # an experiment is never offered a probe's resume
    assert result.returncode != 0  # the run lacks a request: not GREEN
    if "experiment" in bundled:  # bit-identical but for the request it lacks: the certificate's next step fits it too
        assert result.returncode == 7 and "next: finish the run: run the experiment again: bia experiment" in result.stdout


def test_a_captures_line_cut_mid_file_is_an_error_naming_the_file_and_line(tmp_path):
    shutil.copytree(DATA / "experiment-cpu" / "default", tmp_path / "run", ignore=shutil.ignore_patterns("derived"))
    captures = tmp_path / "run" / "captures" / "requests.jsonl"
    lines = captures.read_text().split("\n")
    lines[4] = lines[4][:100]
    captures.write_text("\n".join(lines))
    result = bia("certify", "run", "-o", "c.json", cwd=tmp_path)
    assert result.returncode == 4 and "error: run/captures/requests.jsonl: line 5: not valid JSON" in result.stderr


@pytest.mark.parametrize(
    "option",
    [
        ("--ladder", "1,4,8"),
        ("--run", "runs/x"),
        ("--prompts", "p.txt"),
        ("--max-tokens", "8"),
        ("--max-requests", "10"),
        ("--max-time", "5"),
        ("--server-log", "s.log"),
        ("--refire", "1"),
    ],
)
def test_certify_refuses_a_url_only_option_given_with_run_directories(tmp_path, option):
    shutil.copytree(DATA / "experiment-cpu" / "row-invariant", tmp_path / "run", ignore=shutil.ignore_patterns("derived"))
    result = bia("certify", "run", *option, "-o", "c.json", cwd=tmp_path)
    assert result.returncode == 2
    assert f"error: {option[0]} applies only with a URL to probe; bia certify was given run directories" in result.stderr
    assert not (tmp_path / "c.json").exists()


def test_the_not_a_dump_hint_points_at_a_section_that_exists():
    from analysis.report import ACCEPTS

    links = re.findall(r"(docs/[\w/-]+\.md)#([\w-]+)", ACCEPTS)
    assert links, ACCEPTS
    for page, anchor in links:
        headings = re.findall(r"^#+ (.+)$", (ROOT / page).read_text(encoding="utf-8"), flags=re.M)
        slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
        assert anchor in slugs, (page, anchor, sorted(slugs))
