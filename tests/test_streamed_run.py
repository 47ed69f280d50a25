"""A run read a piece at a time (``read_run(path, stream=True)``) gives the tables, the verdict and the report sections
of the run held whole: every bundled run, split into one piece per prompt so that every merge is exercised."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

import analysis
from analysis.run import _piecewise, _pieces, read_run

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = sorted(
    str(m.parent.relative_to(ROOT)) for m in (ROOT / "data").rglob("manifest.json") if (m.parent / "captures").is_dir()
)


@pytest.fixture
def one_prompt_a_piece(monkeypatch):
    monkeypatch.setattr(_pieces, "PIECE_BYTES", 1)  # every planned prompt its own piece


def _copy(run: str, tmp_path: Path) -> Path:
    target = tmp_path / Path(run).name
    shutil.copytree(ROOT / run, target, ignore=shutil.ignore_patterns("derived"))
    return target


@pytest.mark.parametrize("run", BUNDLED)
def test_every_table_of_a_streamed_run_is_the_whole_runs(run, tmp_path, one_prompt_a_piece):
    path = _copy(run, tmp_path)
    whole, streamed = read_run(path), read_run(path, stream=True)
    assert streamed.dump.tokens.height == 0
    assert streamed.pieces.count == len({p["prompt_id"] for p in whole.manifest.get("prompts", [])}) + 1
    for name, table in _piecewise._REGISTRY.items():
        for context in ({}, {"reference": "ref2"}, {"epsilon": 0.5}):
            given = {k: v for k, v in context.items() if k in table.takes}
            expected = table.compute(whole, **given)
            got = _piecewise.table_of(streamed, name, **context)
            assert got.equals(expected), f"{run}: {name} {context}\n{got}\n{expected}"


@pytest.mark.parametrize("run", BUNDLED)
def test_a_streamed_runs_plan_is_every_request_without_what_only_its_piece_reads(run, tmp_path):
    # its arms and decode rates are worked out from the envelopes before they are left with the pieces (the llama.cpp
    # runs' rates are the server's own timings, read from the envelope)
    path = _copy(run, tmp_path)
    whole, streamed = read_run(path), read_run(path, stream=True)
    assert streamed.requests.equals(whole.requests.drop(_pieces.PIECE_COLUMNS))
    with pytest.raises(pl.exceptions.ColumnNotFoundError):  # read from the plan, a text fails loudly, not as a null
        streamed.requests["completion_text"]
    pieces = pl.concat([piece.requests for piece in streamed.pieces])
    assert pieces.sort("source", "record", "choice_index").equals(whole.requests.sort("source", "record", "choice_index"))


@pytest.mark.parametrize("run", BUNDLED)
def test_a_streamed_run_holds_neither_its_plan_nor_its_bands_entries_as_objects_and_reads_them_as_the_whole_run(run, tmp_path):
    # issue 42: an open streamed run holds no row of its plan (read from its kept file by each reader) and its m_formed
    # entries as bytes; each reads as the whole run's, a new dict each time, and the manifest writes back as JSON
    import json

    from analysis.run import jsonable, width_table
    from analysis.run._formed import FormedEntries
    from analysis.run._kept_dump import KeptDump

    path = _copy(run, tmp_path)
    whole, streamed = read_run(path), read_run(path, stream=True)
    assert isinstance(streamed.dump, KeptDump) and streamed.dump._held is None
    assert isinstance(streamed.manifest.get("m_formed", FormedEntries([])), FormedEntries)
    assert streamed.manifest == whole.manifest and streamed.prompts == whole.prompts
    assert streamed.request_columns("prompt_id", "c", "no such column").equals(whole.requests.select("prompt_id", "c"))
    formed = streamed.manifest.get("m_formed", [])
    if formed:
        formed[0]["c"] = -1  # a reader's copy
        assert formed[0] == whole.manifest["m_formed"][0] and formed[-1:] == whole.manifest["m_formed"][-1:]
    assert width_table(streamed).equals(width_table(whole))
    assert json.loads(json.dumps(streamed.manifest, default=jsonable)) == json.loads(json.dumps(whole.manifest))
    assert repr(streamed) == repr(whole)


@pytest.mark.parametrize("run", BUNDLED)
def test_a_streamed_run_is_judged_as_the_whole_run(run, tmp_path, one_prompt_a_piece):
    path = _copy(run, tmp_path)
    whole = analysis.judge(read_run(path)).frame
    assert analysis.judge(read_run(path, stream=True)).frame.equals(whole)
    assert analysis.judge(str(path)).frame.equals(whole)


def test_a_report_of_a_streamed_run_computes_no_table_that_grows_with_its_steps(tmp_path, one_prompt_a_piece, monkeypatch):
    # the drift and the flips are drawn from tables a row per c and step and a row per margin bin; the tables a row per
    # step of every request are computed only when asked for by name
    path = _copy("data/experiment-cpu/default", tmp_path)
    lazy = {name for name, table in _piecewise._REGISTRY.items() if not table.eager}
    assert lazy == {"drift", "flip_steps"}
    one_pass = _piecewise._one_pass
    passes = []
    monkeypatch.setattr(_piecewise, "_one_pass", lambda run, names, context: passes.append(names) or one_pass(run, names, context))
    analysis.report.figures([read_run(path, stream=True)])
    assert passes and not lazy & {name for names in passes for name in names}
    streamed = read_run(path, stream=True)
    assert analysis.run.drift_table(streamed).equals(analysis.run.drift_table(read_run(path)))
    assert passes[-1] == ["drift"]


def test_a_pass_keeps_the_rows_of_earlier_pieces_on_disk_and_removes_them_after(tmp_path, one_prompt_a_piece, monkeypatch):
    # the pass holds one piece's working set, not beside it every earlier piece's rows; its scratch files do not outlive it
    path = _copy("data/experiment-cpu/default", tmp_path)
    spill, spilled = _piecewise._spilled, []
    monkeypatch.setattr(_piecewise, "_spilled", lambda frame, file: spilled.append(file) or spill(frame, file))
    run = read_run(path, stream=True)
    slots = analysis.run.slot_table(run)
    pieces = len(list(run.pieces))
    eager = [name for name, table in _piecewise._REGISTRY.items() if table.eager]
    assert pieces == 2 and len(spilled) == (pieces - 1) * len(eager)  # its two prompts
    assert not spilled[0].parent.exists()
    assert slots.equals(analysis.run.slot_table(read_run(path)))


def test_the_merged_tables_are_read_back_and_not_computed_again(tmp_path, one_prompt_a_piece, monkeypatch):
    path = _copy("data/experiment-cpu/default", tmp_path)
    first = analysis.run.slot_table(read_run(path, stream=True))
    kept = list((path / "derived" / "pieces" / "tables").glob("*/slots.parquet"))
    assert len(kept) == 1
    monkeypatch.setattr(_piecewise, "_one_pass", lambda *a: pytest.fail("computed again"))
    assert analysis.run.slot_table(read_run(path, stream=True)).equals(first)


def test_a_table_asked_for_some_columns_gives_those_of_the_whole_table_in_that_order(tmp_path):
    path = _copy("data/experiment-cpu/default", tmp_path)
    whole = read_run(path)
    columns = ["max_ulp", "c", "prompt_id", "source"]  # not the table's order
    expected = analysis.run.slot_table(whole).select(columns)
    assert analysis.run.slot_table(whole, columns=columns).equals(expected)
    assert analysis.run.slot_table(read_run(path, stream=True), columns=columns).equals(expected)  # computed
    streamed = read_run(path, stream=True)
    assert analysis.run.slot_table(streamed, columns=columns).equals(expected)  # read back from where it is kept
    assert analysis.run.band_table(streamed, columns=["c"]).equals(analysis.run.band_table(whole).select("c"))
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        analysis.run.slot_table(streamed, columns=["no such column"])


def test_every_registered_table_says_that_it_takes_columns():
    for function in (analysis.run.slot_table, analysis.run.band_table, analysis.run.reference_table):
        assert "columns : sequence of str, optional" in function.__doc__
        assert "lazy : bool, default False" in function.__doc__
        assert function.__doc__.index("columns : sequence") < function.__doc__.index("Returns\n")


def test_a_kept_table_is_read_when_asked_for_and_only_the_columns_asked_for(tmp_path, monkeypatch):
    # a report holds a merged table only while a reader reads it: at 516,000 requests the slot table alone is 144 MB
    path = _copy("data/experiment-cpu/default", tmp_path)
    streamed = read_run(path, stream=True)
    analysis.run.slot_table(streamed)
    held = [table for key, tables in streamed._cache.items() if key[0] == "piecewise" for table in tables.values()]
    assert held and not any(isinstance(table, pl.DataFrame) for table in held)
    read, real = [], pl.read_parquet
    monkeypatch.setattr(pl, "read_parquet", lambda file, **kw: read.append((Path(file).name, kw)) or real(file, **kw))
    assert analysis.run.slot_table(streamed, columns=["c", "arm"]).columns == ["c", "arm"]
    assert read == [("slots.parquet", {"columns": ["c", "arm"]})]


def test_a_table_asked_for_lazily_is_a_scan_of_its_kept_file_with_the_whole_tables_rows(tmp_path):
    path = _copy("data/experiment-cpu/default", tmp_path)
    columns = ["max_ulp", "c", "prompt_id", "source"]
    expected = analysis.run.slot_table(read_run(path)).select(columns)
    whole = analysis.run.slot_table(read_run(path), columns=columns, lazy=True)
    assert isinstance(whole, pl.LazyFrame) and whole.collect().equals(expected)
    streamed = read_run(path, stream=True)
    scan = analysis.run.slot_table(streamed, columns=columns, lazy=True)
    (kept,) = (path / "derived" / "pieces" / "tables").glob("*/slots.parquet")
    assert isinstance(scan, pl.LazyFrame) and str(kept) in scan.explain()  # a scan of the kept file, not a held frame
    assert scan.collect().equals(expected)
    assert analysis.run.slot_table(streamed, lazy=True).collect().equals(analysis.run.slot_table(read_run(path)))
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        analysis.run.slot_table(streamed, columns=["no such column"], lazy=True)
    kept.write_bytes(b"not a parquet file")  # spoiled after the run was opened: computed and kept again, then scanned
    assert analysis.run.slot_table(streamed, columns=columns, lazy=True).collect().equals(expected)


def test_the_judgement_of_a_streamed_run_scans_its_slot_table_and_never_reads_it_whole(tmp_path, monkeypatch):
    path = _copy("data/experiment-cpu/default", tmp_path)
    expected = analysis.judge(read_run(path)).frame
    streamed = read_run(path, stream=True)
    analysis.run.slot_table(streamed, columns=["c"])  # kept under derived/pieces/tables/
    read, real = [], pl.read_parquet
    monkeypatch.setattr(pl, "read_parquet", lambda file, **kw: read.append(Path(file).name) or real(file, **kw))
    assert analysis.judge(streamed).frame.equals(expected)
    assert "slots.parquet" not in read


def test_a_kept_table_spoiled_after_the_run_was_opened_is_computed_again(tmp_path):
    path = _copy("data/experiment-cpu/default", tmp_path)
    expected = analysis.run.slot_table(read_run(path))
    streamed = read_run(path, stream=True)
    analysis.run.slot_table(streamed)  # kept under derived/pieces/tables/
    (kept,) = (path / "derived" / "pieces" / "tables").glob("*/slots.parquet")
    kept.write_bytes(b"not a parquet file")
    assert analysis.run.slot_table(streamed).equals(expected)
    assert pl.read_parquet(kept).equals(expected)  # and kept again


def test_a_kept_table_that_cannot_be_read_even_when_kept_again_is_an_error_not_a_loop(tmp_path, monkeypatch):
    path = _copy("data/experiment-cpu/default", tmp_path)
    streamed = read_run(path, stream=True)
    analysis.run.slot_table(streamed)  # kept
    passes, one_pass = [], _piecewise._one_pass
    monkeypatch.setattr(_piecewise, "_one_pass", lambda *a: passes.append(1) or one_pass(*a))

    def unreadable(self, columns):
        raise pl.exceptions.ComputeError(f"{self.file}: spoiled")

    monkeypatch.setattr(_piecewise._Kept, "read", unreadable)
    with pytest.raises(pl.exceptions.ComputeError, match="slots.parquet: spoiled"):
        analysis.run.slot_table(streamed)
    assert passes == [1]  # computed and kept again once, then the second failure is raised


def test_the_plan_is_kept_and_read_back_for_the_same_manifest_and_worked_out_again_for_another(tmp_path, monkeypatch):
    # opening a streamed run reads its plan's columns alone, not every request's envelope and text
    path = _copy("data/llamacpp-cpu/cache-prompt", tmp_path)  # its decode rates are the server's, from the envelopes
    whole = read_run(path).requests.drop(_pieces.PIECE_COLUMNS)
    assert read_run(path, stream=True).requests.equals(whole)
    assert _kept_plans(path) == 1
    plan_run = _pieces.plan_run
    monkeypatch.setattr(_pieces, "plan_run", lambda *a: pytest.fail("worked out again"))
    assert read_run(path, stream=True).requests.equals(whole)
    manifest = path / "manifest.json"
    manifest.write_text(manifest.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    worked = []
    monkeypatch.setattr(_pieces, "plan_run", lambda *a: worked.append(1) or plan_run(*a))
    assert read_run(path, stream=True).requests.equals(whole) and worked
    assert _kept_plans(path) == 1  # the last manifest's alone


def _kept_plans(path: Path) -> int:
    """How many plans are kept beside a run's pieces, each with which pieces hold each prompt."""
    plans = {f.name.split(".")[0] for f in (path / "derived" / "pieces" / "plans").glob("*.where.parquet")}
    assert plans == {f.name.split(".")[0] for f in (path / "derived" / "pieces" / "plans").glob("*.parquet")}
    return len(plans)


def test_a_plan_kept_by_a_run_read_from_elsewhere_names_its_captures_where_they_are_now(tmp_path, monkeypatch):
    path = _copy("data/experiment-cpu/default", tmp_path / "first")
    read_run(path, stream=True)  # keeps the plan, its sources under first/
    moved = tmp_path / "second" / "default"
    shutil.move(path, moved)
    monkeypatch.setattr(_pieces, "plan_run", lambda *a: pytest.fail("worked out again"))
    assert read_run(moved, stream=True).requests.equals(read_run(moved).requests.drop(_pieces.PIECE_COLUMNS))


def test_a_run_as_the_reference_is_computed_on_the_run_collected(tmp_path, one_prompt_a_piece):
    path = _copy("data/experiment-cpu/default", tmp_path)
    other = read_run(ROOT / "data/experiment-cpu/row-invariant")
    whole = analysis.run.slot_table(read_run(path), reference=other)
    assert analysis.run.slot_table(read_run(path, stream=True), reference=other).equals(whole)
    some = ["divergence_at", "c"]
    assert analysis.run.slot_table(read_run(path, stream=True), reference=other, columns=some).equals(whole.select(some))


def test_a_streamed_run_collected_holds_every_token(tmp_path, one_prompt_a_piece):
    path = _copy("data/llamacpp-cpu/cache-prompt", tmp_path)
    streamed = read_run(path, stream=True)
    assert streamed.tokens.height == read_run(path).tokens.height > 0
    assert streamed.prompt_run("p0").requests["prompt_id"].unique().to_list() == ["p0"]


@pytest.mark.parametrize("run", BUNDLED)
def test_a_prompts_run_read_from_its_piece_is_the_whole_runs(run, tmp_path):
    # a piece of every prompt: each prompt's rows are picked out of the piece's files as they stream past
    path = _copy(run, tmp_path)
    whole, streamed = read_run(path), read_run(path, stream=True)
    for prompt in whole.prompts:
        got, expected = streamed.prompt_run(prompt).dump, whole.prompt_run(prompt).dump
        assert got.requests.equals(expected.requests), f"{run} {prompt}"
        assert got.tokens.equals(expected.tokens), f"{run} {prompt}"
        assert got.candidates.equals(expected.candidates), f"{run} {prompt}"


def test_a_line_written_twice_is_left_out_of_the_pieces_and_a_prompts_run_as_the_whole_run_leaves_it(tmp_path):
    path = _copy("data/experiment-cpu/default", tmp_path)
    captures = path / "captures" / "requests.jsonl"
    lines = captures.read_bytes().splitlines(keepends=True)
    captures.write_bytes(b"".join([*lines, lines[0]]))  # the first line appended again, byte for byte
    whole, streamed = read_run(path), read_run(path, stream=True)
    assert streamed.pieces.dropped.height == 1
    copy = len(lines) + 1  # the copy's line number (records count from 1)
    prompt = whole.requests.filter(pl.col("record") == 1)["prompt_id"][0]
    got, expected = streamed.prompt_run(prompt).dump, whole.prompt_run(prompt).dump
    assert got.tokens.equals(expected.tokens) and got.candidates.equals(expected.candidates)
    assert got.tokens.filter(pl.col("record") == 1).height > 0
    assert got.tokens.filter(pl.col("record") == copy).height == 0  # its piece holds the copy's tokens; they are left out
    every = pl.concat([piece.dump.tokens for piece in streamed.pieces])
    assert every.height == whole.tokens.height and every.filter(pl.col("record") == copy).height == 0


def test_stream_takes_no_read_dumps_option():
    with pytest.raises(TypeError, match="stream=True"):
        read_run("data/experiment-cpu/default", stream=True, lenient=True)
    assert pl  # the module's frames come from polars


def _sections(runs: list) -> dict[str, str]:
    """Every report section of these runs (the figures' PNG bytes left out: matplotlib's are not byte-stable)."""
    import re

    from analysis import report

    ws = analysis.read_witnesses([], progress=False)
    judgement = analysis.judge(runs)
    out = {
        "header": re.sub(
            r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "WHEN", report.header("t", runs, ws, default=False, admission=False).html
        ),
        "answer": report.answer(runs, ws, judgement=judgement).html,
        "runs": report.runs(runs, ws, epsilon=0.05, reference="ref1", judgement=judgement).html,
        "figures": re.sub(
            r"base64,[A-Za-z0-9+/=]+", "PNG", report.figures(runs, ws, epsilon=0.05, reference="ref1").html
        ),
        "detail": report.detail(runs, ws, epsilon=0.05, reference="ref1").html,
    }
    return out


def _never_collected(monkeypatch):
    monkeypatch.setattr(_pieces._Pieces, "collected", lambda self, run: pytest.fail("a streamed run was read whole"))


@pytest.mark.parametrize(
    "runs",
    [[run] for run in BUNDLED]
    + [["data/vllm-cpu/no-prefix-cache", "data/vllm-cpu/prefix-cache", "data/llamacpp-cpu/cache-prompt"]],
    ids=lambda runs: "+".join(Path(r).name for r in runs),
)
def test_every_report_section_of_a_streamed_run_is_the_whole_runs_and_reads_no_run_whole(
    runs, tmp_path, one_prompt_a_piece, monkeypatch
):
    paths = [_copy(run, tmp_path / str(k)) for k, run in enumerate(runs)]
    whole = _sections([read_run(p) for p in paths])
    _never_collected(monkeypatch)
    streamed = _sections([read_run(p, stream=True) for p in paths])
    assert streamed.keys() == whole.keys()
    for name, html in whole.items():
        assert streamed[name] == html, f"{runs}: {name}"


@pytest.mark.parametrize("run", BUNDLED)
def test_a_run_written_as_a_study_reports_as_the_run_itself(run, tmp_path, monkeypatch):
    from analysis.studies import open_runs, write_dataset

    path = _copy(run, tmp_path / "run")
    study = write_dataset(path, tmp_path / "study")
    whole = _sections([read_run(path)])
    [streamed] = open_runs([study])
    assert streamed.label == str(path)
    monkeypatch.setattr(
        type(streamed.pieces), "collected", lambda self, run: pytest.fail("a study's run was read whole")
    )
    assert _sections([streamed]) == whole
    assert analysis.judge(streamed).frame.equals(analysis.judge(read_run(path)).frame)


def test_bia_report_of_a_study_is_the_page_of_its_run(tmp_path):
    """``bia report STUDY`` and ``bia report RUN`` give the same page, apart from papermill's cell ids and the minute
    it was written (the figures' PNG bytes aside, which matplotlib does not keep stable)."""
    import re
    import subprocess
    import sys

    from analysis.studies import write_dataset

    path = _copy("data/experiment-cpu/default", tmp_path / "runs")
    study = write_dataset(path, tmp_path / "study")
    pages = []
    for given, out in ((path, tmp_path / "run.html"), (study, tmp_path / "study.html")):
        done = subprocess.run(
            [sys.executable, "-m", "analysis", "report", str(given), "-o", str(out)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        page = out.read_text(encoding="utf-8")
        for pattern, word in (
            (r"base64,[A-Za-z0-9+/=]+", "PNG"),
            (r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "WHEN"),
            (r'id="cell-id=[0-9a-f]+"', "CELL"),
        ):
            page = re.sub(pattern, word, page)
        pages.append(page)
    assert "Run detail" in pages[0]
    assert pages[1] == pages[0]


def test_merged_tables_kept_by_a_run_read_from_elsewhere_name_its_captures_where_they_are_now(tmp_path, monkeypatch):
    path = _copy("data/experiment-cpu/default", tmp_path / "first")
    analysis.run.slot_table(read_run(path, stream=True))  # keeps the merged tables, their sources under first/
    moved = tmp_path / "second" / "default"
    shutil.move(path, moved)
    monkeypatch.setattr(_piecewise, "_one_pass", lambda *a: pytest.fail("computed again"))
    streamed = analysis.run.slot_table(read_run(moved, stream=True))
    assert streamed.equals(analysis.run.slot_table(read_run(moved)))
    assert streamed["source"].str.starts_with(str(moved / "captures")).all()


@pytest.mark.parametrize(
    ("pieces", "widest"),
    [
        (["float32", "float64", "none"], "float64"),  # one piece recorded float64: the run compares float64
        (["none", "float32"], "float32"),
        (["none"], "none"),
        ([], "none"),  # no piece at all: nothing recorded
    ],
)
def test_a_runs_precision_is_the_widest_its_pieces_recorded(pieces, widest):
    from analysis.studies._judgement_evidence import widest_precision

    assert widest_precision(pl.DataFrame({"precision": pieces}, schema={"precision": pl.String})) == widest


@pytest.mark.parametrize("run", ["data/experiment-cpu/default", "data/llamacpp-cpu/cache-prompt"])
def test_the_parting_token_of_a_streamed_run_is_read_from_its_piece(run, tmp_path, one_prompt_a_piece):
    from analysis.reproduce._report import parting_token

    path = _copy(run, tmp_path)
    first = analysis.judge(read_run(path)).frame["first_request"][0]
    whole = parting_token(read_run(path), first)
    assert whole is not None and whole["alone"]["logprob"] is not None
    assert parting_token(read_run(path, stream=True), first) == whole
