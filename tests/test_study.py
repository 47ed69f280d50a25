"""A study as one hive-partitioned Parquet dataset: the tables partition by partition, in this
process and on a local Ray instance, equal the tables of each run read whole."""

from __future__ import annotations

import polars as pl
import pytest

from analysis.core._output import OutputExists
from polars.testing import assert_frame_equal

from analysis.run import RunError, band_table, prompt_table, read_run, slot_table
from analysis import scan_study, study_tables, write_dataset

pytestmark = pytest.mark.slow

RUNS = ["data/experiment-cpu/default", "data/experiment-cpu/batch-invariant"]
KEYS = {"slots": ["run", "prompt_id", "c", "repeat", "slot"], "bands": ["run", "prompt_id", "c", "repeat"], "prompts": ["run", "prompt_id"]}


def whole_run_tables() -> dict[str, pl.DataFrame]:
    tables = {"slots": [], "bands": [], "prompts": []}
    for path in RUNS:
        run = read_run(path)
        name = run.path.name
        for key, table in (("slots", slot_table(run)), ("bands", band_table(run)), ("prompts", prompt_table(run))):
            tables[key].append(table.select(pl.lit(name).alias("run"), pl.all()))
    return {key: pl.concat(frames) for key, frames in tables.items()}


def assert_tables_equal(got: dict, want: dict) -> None:
    for key, columns in KEYS.items():
        # sources name the captures where the dataset's runs were read from: the same files
        assert_frame_equal(got[key].sort(columns), want[key].sort(columns))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(RUNS, tmp_path_factory.mktemp("study"))


def test_the_dataset_layout_and_its_partitions(dataset):
    assert (dataset / "runs.parquet").exists()
    assert sorted(p.name for p in (dataset / "tokens").iterdir()) == ["run=batch-invariant", "run=default"]
    study = scan_study(dataset)
    assert study.partitions() == [("batch-invariant", "p0"), ("batch-invariant", "p1"), ("default", "p0"), ("default", "p1")]
    whole = read_run(RUNS[0])
    back = study.run("default")
    for name in ("tokens", "candidates", "requests"):
        assert_frame_equal(getattr(back.dump, name).sort("source", "record", "choice_index"),
                           getattr(whole.dump, name).sort("source", "record", "choice_index"), check_row_order=False)
    assert back.manifest == whole.manifest


def test_partitioned_tables_equal_the_tables_of_whole_runs(dataset):
    assert_tables_equal(study_tables(dataset), whole_run_tables())


def test_writing_a_run_again_is_refused_unless_forced_then_replaces_its_partitions(dataset, tmp_path):
    folder = write_dataset(RUNS[0], tmp_path / "again")
    with pytest.raises(OutputExists, match="already holds a run named 'default'; give force=True"):
        write_dataset(RUNS, folder)  # refused before batch-invariant, the new one, is written
    assert scan_study(folder).runs["run"].to_list() == ["default"]
    write_dataset(RUNS[0], folder, force=True)
    study = scan_study(folder)
    assert study.runs["run"].to_list() == ["default"]
    assert study.requests.select(pl.len()).collect().item() == read_run(RUNS[0]).dump.requests.height


def test_what_is_not_a_dataset_is_named(tmp_path):
    with pytest.raises(RunError, match="not a study dataset"):
        scan_study(tmp_path)
    with pytest.raises(RunError, match="neither a run directory"):
        write_dataset(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="engine must be"):
        study_tables(tmp_path, engine="dask")


def test_ray_on_a_local_two_cpu_instance_gives_the_same_tables(dataset):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert_tables_equal(study_tables(dataset, engine="ray"), whole_run_tables())
    finally:
        ray.shutdown()


def test_a_dataset_named_by_url_is_read_as_object_storage_would_be(dataset):
    """polars reads the dataset through its object-store layer for a URL (file:// here; s3:// or gs:// the same way)."""
    assert_tables_equal(study_tables(f"file://{dataset}"), whole_run_tables())
