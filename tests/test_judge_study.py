"""``analysis.judge`` of a study (issue 42): a run written as a Parquet dataset and judged partition by partition, one
prompt's streams in memory at a time, gives exactly the rows of the run read whole; on Ray too."""

from __future__ import annotations

import shutil

import polars as pl
import pytest
from conftest import ROOT
from polars.testing import assert_frame_equal

import analysis
from analysis.report import run_directories
from analysis.run import CapturesCutShort, run_pieces
from analysis.run import _pieces as pieces_module
from analysis.studies import scan_study, write_dataset

BUNDLED = run_directories(ROOT / "data")


def test_every_bundled_run_is_in_the_comparison():
    assert len(BUNDLED) == 10 and {p.parent.name for p in BUNDLED} == {"experiment-cpu", "llamacpp-cpu", "transformers-cpu",
                                                                        "vllm-cpu"}


@pytest.mark.parametrize("run", BUNDLED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_run_judged_as_a_study_gives_the_rows_of_the_run_read_whole(run, tmp_path):
    whole = analysis.judge(run).frame
    study = write_dataset(run, tmp_path / "study")
    assert_frame_equal(analysis.judge(study).frame, whole)  # the folder's path
    assert_frame_equal(analysis.judge(scan_study(study)).frame, whole)  # the study open
    assert whole.height >= 1 and whole["verdict"].is_in(["GREEN", "AMBER", "RED", "UNVERIFIED"]).all()


def test_runs_judged_together_and_as_one_study_agree_row_for_row(tmp_path):
    """Four runs of one experiment: judged together (so that a fix measured beside a run is named) and as one dataset."""
    folder = ROOT / "data" / "experiment-cpu"
    together = analysis.judge(run_directories(folder)).frame
    assert_frame_equal(analysis.judge(write_dataset(folder, tmp_path / "study")).frame, together)
    assert together["verdict"].to_list() == ["AMBER", "RED", "AMBER", "AMBER"]


def test_a_study_without_top_k_alternatives_scans_as_empty_candidates(tmp_path):
    """transformers' continuous batching was recorded without top-k alternatives: a table no run wrote a row of is an empty
    frame of its schema, not a failed scan (it failed before, in study_tables too)."""
    run = ROOT / "data" / "transformers-cpu" / "continuous"
    assert analysis.read_run(run).candidates.height == 0
    study = scan_study(write_dataset(run, tmp_path / "study"))
    assert study.candidates.collect().height == 0 and "cand_logprob" in study.candidates.collect_schema()
    assert analysis.study_tables(study.path)["slots"].height == analysis.slot_table(analysis.read_run(run)).height


def test_judge_refuses_an_engine_it_does_not_know():
    with pytest.raises(ValueError, match="engine must be 'polars' or 'ray', got 'spark'"):
        analysis.judge(ROOT / "data" / "experiment-cpu" / "default", engine="spark")


@pytest.mark.slow
def test_judge_of_a_study_on_ray_gives_the_same_rows(tmp_path):
    ray = pytest.importorskip("ray")
    folder = ROOT / "data" / "llamacpp-cpu"
    study = write_dataset(folder, tmp_path / "study")
    local = analysis.judge(study).frame
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # started here and shut down: the next test's own
    try:
        on_ray = analysis.judge(study, engine="ray").frame
    finally:
        ray.shutdown()
    assert_frame_equal(on_ray, local)
    assert_frame_equal(local, analysis.judge(run_directories(folder)).frame)
    assert local.filter(pl.col("verdict") == "RED").height >= 1


# --- a run directory judged in pieces ------------------------------------------------------------------------------


def _copy(run, tmp_path):
    """The run's manifest and captures in a folder of its own (its pieces are written there, not in the checkout)."""
    folder = tmp_path / run.name
    shutil.copytree(run, folder, ignore=shutil.ignore_patterns("derived"))
    return folder


@pytest.mark.parametrize("run", BUNDLED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_run_directory_judged_prompt_by_prompt_gives_the_rows_of_the_run_read_whole(run, tmp_path, monkeypatch):
    """judge of a run directory reads it a piece at a time (derived/pieces/); with pieces of one prompt each, the merged
    tables give the rows of the run read into memory, column for column, and a second read gives them again."""
    monkeypatch.setattr(pieces_module, "PIECE_BYTES", 1)  # every prompt a piece of its own
    folder = _copy(run, tmp_path)
    whole = analysis.judge(analysis.read_run(folder)).frame
    plan, pieces = run_pieces(folder)
    assert [sorted(set(p.requests["prompt_id"])) for p in pieces] == [[prompt] for prompt in plan.prompts]
    assert_frame_equal(analysis.judge(folder).frame, whole)
    assert_frame_equal(analysis.judge(folder).frame, whole)  # from the pieces written by the first


def test_pieces_are_read_again_while_the_captures_are_unchanged_and_written_again_when_they_change(tmp_path):
    folder = _copy(ROOT / "data" / "experiment-cpu" / "default", tmp_path)
    run_pieces(folder)
    record = folder / "derived" / "pieces" / "manifest.json"
    written = record.stat().st_mtime_ns
    run_pieces(folder)
    assert record.stat().st_mtime_ns == written
    captures = folder / "captures" / "requests.jsonl"
    lines = captures.read_text().splitlines(keepends=True)
    captures.write_text("".join(lines[:-1]))  # the last request gone: the pieces are stale
    plan, pieces = run_pieces(folder)
    assert record.stat().st_mtime_ns != written and plan.requests.height == len(lines) - 1
    assert sum(p.requests.height for p in pieces) == len(lines) - 1


def test_a_capture_cut_short_is_said_when_judged_in_pieces_as_when_read_whole(tmp_path):
    folder = _copy(ROOT / "data" / "experiment-cpu" / "default", tmp_path)
    captures = folder / "captures" / "requests.jsonl"
    text = captures.read_text()
    captures.write_text(text[: len(text) - 200])  # the last line cut mid-record
    with pytest.warns(CapturesCutShort, match="requests.jsonl: line 62 is cut short"):
        piecewise = analysis.judge(folder).frame
    with pytest.warns(CapturesCutShort):
        whole = analysis.judge(analysis.read_run(folder)).frame
    assert_frame_equal(piecewise, whole)
    assert piecewise["verdict"][0] == "RED" and piecewise["missing"][0] == 1  # the cut request is missing, and counted so


def test_the_bundled_runs_ship_their_pieces_current(tmp_path):
    """The bundled runs' derived/pieces/ are committed with them: judging them writes nothing into the checkout."""
    for run in BUNDLED:
        record = run / "derived" / "pieces" / "manifest.json"
        before = record.read_bytes()
        run_pieces(run)
        assert record.read_bytes() == before, f"{run}: its pieces were stale and written again"


def test_runs_are_prepared_for_a_kernel_without_their_requests_and_say_a_cut_capture_each_time(tmp_path, monkeypatch):
    # bia report checks its runs and writes their pieces before its kernel reads them; holding every request there
    # doubled the report's memory for the kernel's first seconds
    from analysis.studies import prepare_runs

    folder = _copy(ROOT / "data" / "experiment-cpu" / "default", tmp_path)
    captures = folder / "captures" / "requests.jsonl"
    text = captures.read_text()
    captures.write_text(text[: len(text) - 200])
    monkeypatch.setattr(pieces_module, "_read_pieces", None)  # the requests are not read: called, it fails
    for _ in range(2):  # written, then current: said both times, as read_run says it
        with pytest.warns(CapturesCutShort, match=f"{captures}: line 62 is cut short"):
            prepare_runs([folder])
    monkeypatch.undo()
    with pytest.warns(CapturesCutShort):
        plan, _ = run_pieces(folder)
    assert plan.requests.height == 61
    (folder / "captures").rename(folder / "elsewhere")
    with pytest.raises(analysis.RunError, match="no captures/ folder"):
        prepare_runs([folder])


def test_a_piece_whose_requests_file_is_gone_is_named_not_left_out(tmp_path):
    folder = _copy(ROOT / "data" / "experiment-cpu" / "default", tmp_path)
    run_pieces(folder)
    (folder / "derived" / "pieces" / "requests" / "piece=0.parquet").unlink()
    _, pieces = run_pieces(folder)
    with pytest.raises(analysis.RunError, match=r"requests/piece=0\.parquet: piece 0's requests cannot be read"):
        list(pieces)
