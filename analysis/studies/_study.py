"""Studies larger than memory: many runs as one Parquet dataset, analysed one (run, prompt) at a time.

Every metric of :mod:`analysis.run` compares a request with the references of its own prompt, so a
study splits into independent (run, prompt) partitions. :func:`write_dataset` lays runs out as a
hive-partitioned Parquet dataset::

    DATASET/
      runs.parquet                      one row per run: run, manifest (JSON text), path
      tokens/run=NAME/prompt_id=ID/*.parquet
      candidates/run=NAME/prompt_id=ID/*.parquet
      requests/run=NAME/prompt_id=ID/*.parquet

(the tables of :func:`analysis.read_dumps`; ``run`` and ``prompt_id`` are the partition keys, and a
request without a prompt lands in ``prompt_id=__HIVE_DEFAULT_PARTITION__``). :func:`scan_study`
opens it as lazy frames. :func:`study_tables` computes the slot, band and prompt tables partition
by partition, each read with a partition filter and collected by polars' streaming engine, so
memory holds one prompt's streams at a time; ``engine="ray"`` runs the partitions as Ray tasks,
on this machine or on a cluster (``ray.init(address=...)`` before the call). The dataset may live
on any path polars reads (a folder, ``s3://...``, ``gs://...``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ..core import OutputExists
from ..core import progress as show_progress
from ..dumps import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA, Dump, conform
from ..metrics import parity
from ..run import (
    Run,
    RunError,
    band_table,
    jsonable,
    prompt_table,
    read_run,
    reference_table,
    slot_table,
)
from ._judgement_evidence import precision_table
from ._sources import in_repro

PARTITION = ["run", "prompt_id"]
_HIVE = {"run": pl.String, "prompt_id": pl.String}
TABLES = ("tokens", "candidates", "requests")
PARTITION_TABLES = ("slots", "bands", "prompts", "refs", "precision")  # what partition_tables gives of each partition


def _run_dirs(runs: Iterable[Any] | str | os.PathLike[str]) -> list[Run | Path]:
    """Runs given as Run objects, run directories, or folders holding run directories (every ``manifest.json`` below)."""
    items = [runs] if isinstance(runs, (str, os.PathLike)) else list(runs)
    out: list[Run | Path] = []
    for item in items:
        if isinstance(item, Run):
            out.append(item)
            continue
        folder = Path(item)
        if (folder / "manifest.json").exists():
            out.append(folder)
        else:
            found = sorted(
                m.parent
                for m in folder.rglob("manifest.json")
                if (m.parent / "captures").is_dir() and not in_repro(m.parent, folder)
            )
            if not found:
                raise RunError(f"{folder}: neither a run directory nor a folder holding any")
            out.extend(found)
    return out


def write_dataset(
    runs: Iterable[Any] | str | os.PathLike[str], folder: str | os.PathLike[str], *, force: bool = False
) -> Path:
    """Write runs as one hive-partitioned Parquet dataset (see the module docstring for its layout).

    Runs are read one at a time, so writing takes the memory of the largest run. A run is named by
    its directory; a study grows by writing more runs into it, and a run whose name the study
    already holds is refused (:class:`~analysis.OutputExists`) unless ``force``, which
    replaces its partitions.

    Parameters
    ----------
    runs : str, os.PathLike or iterable of Run, str or os.PathLike
        The runs to write: Run objects and run directories; a folder that holds run directories stands for
        each of them.
    folder : str or os.PathLike
        The dataset's folder, made when missing.
    force : bool, default False
        Replace the partitions of a run the dataset already holds.

    Returns
    -------
    Path
        ``folder``.

    Raises
    ------
    RunError
        Two runs of the same name, or a folder that holds no run.
    OutputExists
        A run of that name is in the dataset already and ``force`` is not given.

    Examples
    --------
    >>> import tempfile
    >>> folder = write_dataset("data/experiment-cpu", tempfile.mkdtemp())
    >>> sorted(scan_study(folder).runs["run"].to_list())
    ['batch-invariant', 'default', 'fixed-tiles', 'row-invariant']
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    index = folder / "runs.parquet"
    known = (
        pl.read_parquet(index)
        if index.exists()
        else pl.DataFrame(schema={"run": pl.String, "manifest": pl.String, "path": pl.String})
    )
    items = _run_dirs(runs)
    names = [_run_name(item, i) for i, item in enumerate(items)]
    for i, name in enumerate(names):  # checked before anything is written
        if name in names[:i]:
            raise RunError(f"{items[i]}: two runs named {name!r}; a dataset names each run by its directory")
        if not force and name in known["run"].to_list():
            raise OutputExists(f"{folder}: the study already holds a run named {name!r}", "replace it")
    for item, name in show_progress(list(zip(items, names)), None, "writing runs", unit="run"):
        run = item if isinstance(item, Run) else read_run(item)
        _write_run(run, name, folder)
        row = pl.DataFrame(
            {"run": [name], "manifest": [json.dumps(run.manifest, default=jsonable)], "path": [str(run.path)]}
        )
        known = pl.concat([known.filter(pl.col("run") != name), row])
    known.sort("run").write_parquet(index)
    return folder


def _run_name(item: Run | Path, index: int) -> str:
    """A run's name in a study: its directory's name (``run<index>`` for a run assembled in memory)."""
    path = item.path if isinstance(item, Run) else item
    return path.name if path is not None else f"run{index}"


def _write_run(run: Run, name: str, folder: Path) -> None:
    requests = run.dump.requests.with_columns(run=pl.lit(name))
    prompts = requests.select("source", "record", "choice_index", "prompt_id")
    for table in TABLES:
        shutil.rmtree(folder / table / f"run={name}", ignore_errors=True)
        frame = (
            requests
            if table == "requests"
            else getattr(run.dump, table)
            .join(prompts, on=["source", "record", "choice_index"], how="left", nulls_equal=True, maintain_order="left")
            .with_columns(run=pl.lit(name))
        )
        if frame.height:
            frame.write_parquet(folder / table, partition_by=PARTITION)


@dataclass(frozen=True)
class Study:
    """A dataset written by :func:`write_dataset`, as lazy frames: nothing is read until collected."""

    tokens: pl.LazyFrame
    candidates: pl.LazyFrame
    requests: pl.LazyFrame
    runs: pl.DataFrame
    path: str

    def __repr__(self) -> str:  # one line, as every bia object's: the frames are lazy and the manifests long
        return f"Study({self.runs.height} run(s) at {self.path!r})"

    def partitions(self) -> list[tuple[str, str | None]]:
        """Every (run, prompt_id) the dataset holds, sorted."""
        keys = self.requests.select(PARTITION).unique().collect()
        return sorted(keys.rows(), key=lambda k: (k[0], k[1] is not None, k[1] or ""))

    def run(self, name: str, prompt_id: str | None = None) -> Run:
        """One run of the study read into memory: all of it, or only the requests of ``prompt_id``.

        Parameters
        ----------
        name : str
            The run's name in the dataset (its directory's).
        prompt_id : str, optional
            Read only this prompt's requests; all of them when None.

        Returns
        -------
        Run
        """
        where = pl.col("run") == name
        return self._read(name, where if prompt_id is None else where & (pl.col("prompt_id") == prompt_id))

    def _read(self, name: str, where: pl.Expr) -> Run:
        manifests = self.runs.filter(pl.col("run") == name)
        if manifests.height == 0:
            raise RunError(f"{self.path}: no run {name!r}; it holds {sorted(self.runs['run'].to_list())}")
        tokens, candidates = (
            getattr(self, t).filter(where).drop(PARTITION).collect(engine="streaming") for t in ("tokens", "candidates")
        )
        # prompt_id comes back as the partition key; a dataset written before a schema column existed lacks it: null
        requests = conform(self.requests.filter(where).drop("run").collect(engine="streaming"), REQUEST_SCHEMA)
        return Run(json.loads(manifests["manifest"][0]), Dump(tokens, candidates, requests))


def _folder(path: str | os.PathLike[str], table: str) -> str:
    text = os.fspath(path)
    return f"{text.rstrip('/')}/{table}/**/*.parquet"


def scan_study(path: str | os.PathLike[str]) -> Study:
    """Open a dataset written by :func:`write_dataset` lazily (a folder, or any URL polars reads).

    Parameters
    ----------
    path : str or os.PathLike
        The dataset's folder or URL.

    Returns
    -------
    Study

    Raises
    ------
    RunError
        No readable ``runs.parquet`` there.

    Examples
    --------
    >>> import tempfile
    >>> study = scan_study(write_dataset("data/experiment-cpu/default", tempfile.mkdtemp()))
    >>> study.partitions()[:2]
    [('default', 'p0'), ('default', 'p1')]
    >>> study.candidates.select(pl.len()).collect().item() > 0
    True
    """
    text = os.fspath(path)
    try:
        runs = pl.read_parquet(f"{text.rstrip('/')}/runs.parquet")
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise RunError(
            f"{text}: not a study dataset (no readable runs.parquet; write one with write_dataset): {exc}"
        ) from None
    tokens, candidates, requests = [_scan_table(text, table) for table in TABLES]
    return Study(tokens, candidates, requests, runs=runs, path=text)


_EMPTY = {"tokens": TOKEN_SCHEMA, "candidates": CANDIDATE_SCHEMA, "requests": REQUEST_SCHEMA}


def _scan_table(path: str, table: str) -> pl.LazyFrame:
    """One table of the dataset, lazily; an empty frame of its schema when no run wrote any row of it (runs recorded without
    top-k alternatives leave ``candidates/`` without a file)."""
    lazy = pl.scan_parquet(_folder(path, table), hive_partitioning=True, hive_schema=_HIVE)
    try:
        lazy.collect_schema()
    except pl.exceptions.ComputeError as exc:
        if "expanded paths were empty" not in str(exc):
            raise
        return pl.LazyFrame(schema={**_EMPTY[table], **_HIVE})
    return lazy


def partition_tables(
    path: str | Study,
    run: str,
    prompt_id: str | None,
    *,
    epsilon: float = parity.NEAR_TIE_EPSILON,
    reference: str = "ref1",
) -> dict[str, pl.DataFrame]:
    """The slot, band and prompt tables of one (run, prompt) partition, each with a leading ``run`` column
    (``path`` a dataset's path, as a Ray task gets it, or the :class:`Study` already open).

    Parameters
    ----------
    path : str or Study
        The dataset's path, or the study open.
    run : str
        The run's name in the dataset.
    prompt_id : str or None
        The prompt; None for the requests without one.
    epsilon : float, default 0.05
        The near-tie epsilon (``analysis.parity.NEAR_TIE_EPSILON``).
    reference : {"ref1", "ref2"}, default "ref1"
        Which reference of each prompt the requests are compared with.

    Returns
    -------
    dict of str to polars.DataFrame
        ``slots``, ``bands`` and ``prompts``, the reference table (``refs``) and the precision its logprobs were recorded
        at (``precision``, one row), which :func:`analysis.judge` of a study merges.
    """
    study = path if isinstance(path, Study) else scan_study(path)
    prompt = pl.col("prompt_id").is_null() if prompt_id is None else pl.col("prompt_id") == prompt_id
    one = study._read(run, (pl.col("run") == run) & prompt)
    tables = {
        **piece_tables(one, epsilon=epsilon, reference=reference),
        "prompts": prompt_table(one, reference=reference),
    }
    return {name: table.select(pl.lit(run).alias("run"), pl.all()) for name, table in tables.items()}


def piece_tables(
    one: Run, *, epsilon: float = parity.NEAR_TIE_EPSILON, reference: str = "ref1"
) -> dict[str, pl.DataFrame]:
    """What the verdict needs of a part of a run (a study's partition, a run directory's piece): its slot, band and
    reference tables, and the precision its logprobs were recorded at (one row; merged by judge, the widest wins).

    Parameters
    ----------
    one : Run
        The part, as a run of its prompts' requests.
    epsilon : float, default 0.05
        The near-tie epsilon.
    reference : {"ref1", "ref2"}, default "ref1"
        Which reference of each prompt the requests are compared with.

    Returns
    -------
    dict of str to polars.DataFrame
        ``slots``, ``bands``, ``refs`` and ``precision``.
    """
    return {
        "slots": slot_table(one, epsilon=epsilon, reference=reference),
        "bands": band_table(one, epsilon=epsilon, reference=reference),
        "refs": reference_table(one),
        "precision": precision_table(one),
    }


def study_tables(
    path: str | os.PathLike[str],
    *,
    engine: str = "polars",
    epsilon: float = parity.NEAR_TIE_EPSILON,
    reference: str = "ref1",
) -> dict[str, pl.DataFrame]:
    """The ``slots``, ``bands``, ``prompts`` and ``refs`` tables of every run in a dataset (and each partition's ``precision``),
    partition by partition.

    Parameters
    ----------
    path : folder or URL of a dataset written by :func:`write_dataset`
    engine : {"polars", "ray"}
        "polars" runs the partitions one after another in this process; "ray" runs them as Ray
        tasks on the cluster ``ray.init`` connected to (a local one is started when none is).
    epsilon, reference
        As for :func:`analysis.run.slot_table` (``reference`` "ref1" or "ref2").

    Examples
    --------
    >>> import tempfile
    >>> tables = study_tables(write_dataset("data/experiment-cpu", tempfile.mkdtemp()))
    >>> tables["slots"].group_by("run").len().sort("run").rows()
    [('batch-invariant', 58), ('default', 58), ('fixed-tiles', 58), ('row-invariant', 58)]
    """
    path = os.fspath(path)
    if engine not in ("polars", "ray"):
        raise ValueError(f"engine must be 'polars' or 'ray', got {engine!r}")
    study = scan_study(path)
    partitions = study.partitions()
    if engine == "ray":
        parts = _on_ray(path, partitions, epsilon, reference)
    else:
        parts = [
            partition_tables(study, run, prompt, epsilon=epsilon, reference=reference) for run, prompt in partitions
        ]
    return {name: _concat([p[name] for p in parts]) for name in PARTITION_TABLES}


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    kept = [f for f in frames if f.height] or frames[:1]
    return pl.concat(kept, how="vertical_relaxed") if kept else pl.DataFrame()


def _on_ray(
    path: str, partitions: list[tuple[str, str | None]], epsilon: float, reference: str
) -> list[dict[str, pl.DataFrame]]:
    try:
        import ray
    except ImportError:
        raise RunError("engine='ray' needs Ray: pip install 'bia[ray]'") from None
    if not ray.is_initialized():
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    task: Any = ray.remote(partition_tables)  # Any: ray's typed .remote() takes no keyword arguments
    return ray.get([task.remote(path, run, prompt, epsilon=epsilon, reference=reference) for run, prompt in partitions])


__all__ = ["Study", "partition_tables", "scan_study", "study_tables", "write_dataset"]
