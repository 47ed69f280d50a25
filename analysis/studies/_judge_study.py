"""``analysis.judge`` of a study: each run's rows from its partitions' tables, merged in a fixed order, so that a study
(or a run too large for memory, written as one) is judged by the same rules and code as a run read whole
(:func:`judge_tables`), one prompt's streams in memory at a time, in this process or on Ray."""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from ..dumps import Dump
from ..run import Run
from ._judgement import Subject, _batched_cause, _with_measured_fix, cache_served_in, judge_tables
from ._judgement_evidence import missing_frame
from ._judgement_frame import SCHEMA, Judgement
from ._study import PARTITION, Study, scan_study, study_tables

_WIDEST = ("float64", "float32", "none")  # a precision merged over partitions: the widest any of them recorded


def judge_study(
    study: Study | str, *, target_rate: float, confidence: float, needed: int, engine: str = "polars"
) -> Judgement:
    """One row per run of the study and arm, as :func:`analysis.judge` gives for each run read whole.

    Parameters
    ----------
    study : Study or str
        The study (:func:`scan_study`) or its path.
    target_rate, confidence : float
        The bound's target and confidence.
    needed : int
        The bit-identical distinct contexts the bound needs.
    engine : {"polars", "ray"}
        Where the partitions' tables are computed (:func:`study_tables`).

    Returns
    -------
    Judgement

    Examples
    --------
    >>> import tempfile
    >>> from analysis.studies import write_dataset
    >>> study = write_dataset("data/experiment-cpu/default", tempfile.mkdtemp())
    >>> judge_study(study, target_rate=0.01, confidence=0.95, needed=299).frame.select("verdict", "cause").row(0)
    ('RED', 'co-batching')
    """
    study = study if isinstance(study, Study) else scan_study(study)
    tables = study_tables(study.path, engine=engine)
    frames = [
        _judge_one(study, name, json.loads(manifest), path, tables, target_rate, confidence, needed)
        for name, manifest, path in study.runs.select("run", "manifest", "path").rows()
    ]
    return Judgement(_with_measured_fix(pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=SCHEMA)))


def _judge_one(
    study: Study,
    name: str,
    manifest: dict[str, Any],
    path: str | None,
    tables: dict[str, pl.DataFrame],
    target_rate: float,
    confidence: float,
    needed: int,
) -> pl.DataFrame:
    mine = {key: _of_run(frame, name) for key, frame in tables.items()}
    requests = study.requests.filter(pl.col("run") == name).drop("run").collect(engine="streaming")
    plan = Run(manifest, Dump(_empty(study.tokens), _empty(study.candidates), requests))  # what Run.missing reads
    precisions = set(mine["precision"]["precision"].to_list()) if mine["precision"].height else {"none"}
    subject = Subject(
        str(manifest.get("label") or path or name),
        manifest,
        [int(c) for c in plan.ladder],
        lambda first, arm: _batched_cause(study.run(name, first["prompt_id"]), first, arm),  # the cause's own prompt
        lambda: cache_served_in(mine["bands"]),
    )
    return judge_tables(
        subject,
        slots=mine["slots"],
        refs=mine["refs"],
        bands=mine["bands"],
        missing=missing_frame(plan.missing()),
        precision=next(p for p in _WIDEST if p in precisions),
        target_rate=target_rate,
        confidence=confidence,
        needed=needed,
    )


def _of_run(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    return frame.filter(pl.col("run") == name).drop("run") if "run" in frame.columns else frame


def _empty(lazy: pl.LazyFrame) -> pl.DataFrame:
    return lazy.head(0).drop(PARTITION).collect()
