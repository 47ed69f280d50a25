"""read_run parses a run's captures once: derived/ holds the tables with the size and sha256 of each
capture, and is used only while every capture is unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

import polars as pl
from polars.testing import assert_frame_equal

from analysis.run import read_run

RUN = "data/experiment-cpu/default"


def copy_run(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(RUN, folder, ignore=shutil.ignore_patterns("derived"))
    return folder


def assert_same_dump(a, b):
    for name in ("tokens", "candidates", "requests"):
        assert_frame_equal(getattr(a.dump, name), getattr(b.dump, name))
    assert a.dump.formats == b.dump.formats
    assert [str(e) for e in a.dump.skipped] == [str(e) for e in b.dump.skipped]


def test_the_first_read_writes_derived_and_the_second_opens_it(tmp_path, monkeypatch):
    folder = copy_run(tmp_path)
    first = read_run(folder)
    record = json.loads((folder / "derived" / "manifest.json").read_text())
    capture = folder / "captures" / "requests.jsonl"
    assert record["captures"]["files"] == {"requests.jsonl": {"size": capture.stat().st_size, "sha256": hashlib.sha256(capture.read_bytes()).hexdigest()}}
    import analysis.run._read as run_module

    def no_parsing(*args, **kwargs):
        raise AssertionError("the captures were parsed although derived/ is fresh")

    monkeypatch.setattr(run_module, "read_dumps", no_parsing)
    assert_same_dump(read_run(folder), first)


def test_a_changed_added_or_removed_capture_makes_derived_stale(tmp_path):
    folder = copy_run(tmp_path)
    read_run(folder)
    capture = folder / "captures" / "requests.jsonl"
    lines = capture.read_text().splitlines(keepends=True)
    capture.write_text("".join(lines[:-1]))  # one request fewer, same folder
    assert read_run(folder).dump.requests.height == len(lines) - 1
    (folder / "captures" / "more.jsonl").write_text(lines[-1])  # it comes back in another file
    assert read_run(folder).dump.requests.height == len(lines)
    (folder / "captures" / "more.jsonl").unlink()
    assert read_run(folder).dump.requests.height == len(lines) - 1
    # the same size, other bytes: only the hash tells
    text = capture.read_text()
    swapped = text.replace('"p0"', '"q0"', 1)
    assert len(swapped) == len(text) and swapped != text
    capture.write_text(swapped)
    assert "q0" in read_run(folder).dump.requests["prompt_id"].to_list()


def test_a_moved_run_names_its_captures_where_they_are_now(tmp_path):
    folder = copy_run(tmp_path)
    read_run(folder)
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    run = read_run(moved)
    assert set(run.dump.requests["source"].unique().to_list()) == {str(moved / "captures" / "requests.jsonl")}
    assert list(run.dump.formats) == [str(moved / "captures" / "requests.jsonl")]
    assert_same_dump(run, read_run(moved, cache=False))


def test_a_run_that_cannot_take_derived_is_read_all_the_same(tmp_path):
    folder = copy_run(tmp_path)
    (folder / "derived").write_text("not a folder")  # writing derived/ fails (as it would in a read-only run)
    run = read_run(folder)
    assert run.dump.requests.height > 0 and (folder / "derived").read_text() == "not a folder"


def test_options_and_cache_false_always_parse(tmp_path):
    folder = copy_run(tmp_path)
    read_run(folder, cache=False)
    assert not (folder / "derived").exists()
    read_run(folder, lenient=True)
    assert not (folder / "derived").exists()
    read_run(folder)
    (folder / "derived" / "tokens.parquet").write_bytes(b"torn")  # a half-written table: parse again
    assert read_run(folder).dump.tokens.height == pl.read_parquet(folder / "derived" / "tokens.parquet").height


def test_an_old_capture_with_its_recorded_size_and_time_is_not_hashed_again(tmp_path, monkeypatch):
    """As git's index: an unchanged stat of a file that was already old when stamped keeps its hash; a new time means a new hash."""
    import analysis.run._derived as run_module

    folder = copy_run(tmp_path)
    capture = folder / "captures" / "requests.jsonl"
    os.utime(capture, ns=(time.time_ns() - 3_600_000_000_000,) * 2)  # an hour ago: not racy
    read_run(folder)
    hashed = []
    real = hashlib.file_digest
    monkeypatch.setattr(run_module.hashlib, "file_digest", lambda handle, name: hashed.append(handle.name) or real(handle, name))
    read_run(folder)
    assert hashed == []
    text = capture.read_text()
    capture.write_text(text.replace('"p0"', '"q0"', 1))  # same size, new bytes, new time
    assert "q0" in read_run(folder).dump.requests["prompt_id"].to_list()
    assert hashed == [str(capture)]
