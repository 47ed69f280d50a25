"""A study's runs as streamed runs (one piece per prompt partition), and :func:`open_runs`, which opens run directories
and studies alike for the report."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import polars as pl

from ..dumps import REQUEST_SCHEMA, conform
from ..run import Run, RunError, plan_run, prepare_pieces, read_run
from ._sources import is_study
from ._study import Study, scan_study


def streamed_study_run(study: Study, name: str) -> Run:
    """One run of a study as a streamed run (as ``read_run(path, stream=True)`` opens a run directory): every request
    and no token; its tables are computed a prompt partition at a time, by the code that computes a run directory's.

    Parameters
    ----------
    study : Study
        The study.
    name : str
        The run's name in it.

    Returns
    -------
    Run

    Examples
    --------
    >>> import tempfile
    >>> from analysis.run import read_run, slot_table
    >>> from analysis.studies import write_dataset
    >>> study = scan_study(write_dataset("data/experiment-cpu/default", tempfile.mkdtemp()))
    >>> slot_table(streamed_study_run(study, "default")).equals(slot_table(read_run("data/experiment-cpu/default")))
    True
    """
    manifests = study.runs.filter(pl.col("run") == name)
    if manifests.height == 0:
        raise RunError(f"{study.path}: no run {name!r}; it holds {sorted(study.runs['run'].to_list())}")
    manifest, path = json.loads(manifests["manifest"][0]), manifests["path"][0]
    requests = conform(
        study.requests.filter(pl.col("run") == name).drop("run").collect(engine="streaming"), REQUEST_SCHEMA
    )
    plan = plan_run(manifest, requests, {}, [], Path(path) if path else None)
    return dataclasses.replace(plan, pieces=_StudyPieces(study, name, manifest, requests))


class _StudyPieces:
    """A study run's pieces: one per prompt partition, in the manifest's plan order (as a run directory's pieces)."""

    def __init__(self, study: Study, name: str, manifest: dict[str, Any], requests: pl.DataFrame) -> None:
        self.study, self.name = study, name
        planned = [
            str(p["prompt_id"]) for p in manifest.get("prompts") or [] if isinstance(p, dict) and "prompt_id" in p
        ]
        present = requests["prompt_id"].unique().to_list()
        known = [p for p in dict.fromkeys(planned) if p in present]
        self.prompts = known + sorted(p for p in present if p is not None and p not in known)
        self.unprompted = None in present
        self.path = None

    def __iter__(self) -> Iterator[Run]:
        for prompt in self.prompts:
            yield self._run(pl.col("prompt_id") == prompt)
        if self.unprompted:
            yield self._run(pl.col("prompt_id").is_null())

    def _run(self, where: pl.Expr) -> Run:
        run = self.study._read(self.name, (pl.col("run") == self.name) & where)
        path = self.study.runs.filter(pl.col("run") == self.name)["path"][0]
        return dataclasses.replace(run, path=Path(path) if path else None)

    def restricted(self, prompts: set[str]) -> Run:
        return self._run(pl.col("prompt_id").is_in(sorted(prompts)))

    def collected(self, run: Run) -> Run:
        return self._run(pl.lit(True))

    def captures_dir(self) -> str:
        return ""  # nothing is kept on disk for a study, so nothing is renamed

    def tables_folder(self, key: str) -> Path | None:
        return None  # a study may live in object storage: its merged tables are kept in memory only


def open_runs(paths: Iterable[str | os.PathLike[str]]) -> list[Run]:
    """Run directories and studies as streamed runs, in the order given (a study's runs in its order): what the report
    reads, a piece at a time.

    Parameters
    ----------
    paths : iterable of str or os.PathLike
        Run directories (``read_run(path, stream=True)``) and datasets written by :func:`write_dataset`.

    Returns
    -------
    list of Run

    Examples
    --------
    >>> [run.label for run in open_runs(["data/experiment-cpu/default"])]
    ['data/experiment-cpu/default']
    """
    out: list[Run] = []
    for path in paths:
        if is_study(path):
            study = scan_study(path)
            out.extend(streamed_study_run(study, name) for name in study.runs["run"].to_list())
        else:
            out.append(read_run(path, stream=True))
    return out


def prepare_runs(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Check run directories and studies as :func:`open_runs` opens them, and parse each run's captures into its pieces
    unless they are there, without holding any run's requests: what ``bia report`` does before its kernel opens them.

    Parameters
    ----------
    paths : iterable of str or os.PathLike
        Run directories and datasets written by :func:`write_dataset`.

    Raises
    ------
    RunError
        A run directory that cannot be read.

    Examples
    --------
    >>> prepare_runs(["data/experiment-cpu/default"])
    """
    for path in paths:
        if is_study(path):
            scan_study(path)
        else:
            prepare_pieces(path)
