"""Judging runs and studies: :func:`judge_runs` (a run in memory, or a run directory read a piece at a time:
``read_run(path, stream=True)``) and :func:`judge_study`. A run's rows come from tables merged over its parts in a fixed
order (a study's partitions, a run directory's pieces), judged by the code that judges a run read whole
(:func:`judge_tables`), so that a run too large for memory is judged by the same rules, one group of prompts' streams in
memory at a time, in this process or on Ray."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, cast

import polars as pl

from ..dumps import Dump
from ..metrics import requests_needed
from ..run import Run, RunLike, read_run
from ._judgement import Subject, _batched_cause, _judge_run, judge_tables
from ._judgement_cost import _with_measured_fix
from ._judgement_evidence import cache_served_in, missing_frame, widest_precision
from ._judgement_frame import SCHEMA, Judgement
from ._study import PARTITION, Study, scan_study, study_tables


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
    label = str(manifest.get("label") or path or name)
    return judge_parts(
        label,
        plan,
        mine,
        lambda prompt_id: study.run(name, prompt_id),
        target_rate=target_rate,
        confidence=confidence,
        needed=needed,
    )


def judge_parts(
    label: str,
    plan: Run,
    tables: dict[str, pl.DataFrame],
    prompt_run: Callable[[str], Run],
    *,
    target_rate: float,
    confidence: float,
    needed: int,
) -> pl.DataFrame:
    """One run's rows from tables merged over its parts (a study's partitions, a run directory's pieces).

    Parameters
    ----------
    label : str
        What the rows call the run.
    plan : Run
        The run with every request (its tokens not needed): the manifest, the ladder and ``Run.missing``.
    tables : dict of str to polars.DataFrame
        ``slots``, ``refs``, ``bands`` and ``precision`` (one row a part), merged in a fixed order.
    prompt_run : callable
        The run of one prompt's requests with their tokens, for the cause of a request that parts.
    target_rate, confidence : float
        The bound's target and confidence.
    needed : int
        The bit-identical distinct contexts the bound needs.

    Returns
    -------
    polars.DataFrame
        Rows of ``SCHEMA``, one per arm.
    """
    manifest = plan.manifest
    subject = Subject(
        label,
        manifest,
        [int(c) for c in plan.ladder],
        lambda first, arm: _batched_cause(prompt_run(first["prompt_id"]), first, arm),
        lambda: cache_served_in(tables["bands"]),
    )
    return judge_tables(
        subject,
        slots=tables["slots"],
        refs=tables["refs"],
        bands=tables["bands"],
        missing=missing_frame(plan.missing()),
        precision=widest_precision(tables["precision"]),
        target_rate=target_rate,
        confidence=confidence,
        needed=needed,
    )


def _of_run(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    return frame.filter(pl.col("run") == name).drop("run") if "run" in frame.columns else frame


def _empty(lazy: pl.LazyFrame) -> pl.DataFrame:
    return lazy.head(0).drop(PARTITION).collect()


def judge_runs(runs: Any, *, target_rate: float = 0.01, confidence: float = 0.95) -> Judgement:
    """Judge runs batch invariant (:func:`analysis.judge` takes witness sets too): one row per run and arm, GREEN, AMBER, RED or UNVERIFIED, by the module's rules.

    Parameters
    ----------
    runs : Run, path, or an iterable of them
        The runs (run directories are read).
    target_rate : float
        The divergence rate the batched requests must bound themselves below to be GREEN, in (0, 1].
    confidence : float
        The confidence of the one-sided upper bound on the divergence rate, in (0, 1).

    Returns
    -------
    Judgement
        ``verdict``, ``cause``, ``reason`` (one sentence), ``evidence``, ``cost``, ``first``, ``max_ulp`` and ``next_step``
        in words, and the numbers behind them: ``requests`` (batched, c > 1), ``divergent`` (``tokens_parted`` plus
        ``bits_only``), ``bits_unknown``, ``alone`` and ``alone_parted`` (the m=1 references' second copies and the
        requests sent alone, against ref #1), ``bands``, ``bands_unformed``, ``missing`` requests, ``cs_missing``,
        ``upper_bound``, ``requests_needed``, ``first_request``, ``unformed`` and ``cost_by_c``.

    Examples
    --------
    >>> judge_runs("data/llamacpp-cpu/cache-prompt").frame.select("verdict", "cause", "first").row(0)
    ('RED', 'prompt cache', 'p0 ref #2, sent alone: its logprob bits differ from ref #1 from token 0 (up to 26 ULP)')
    >>> print(judge_runs("data/experiment-cpu/batch-invariant").frame["reason"][0])
    0 of 56 batched requests part from m=1, every band seen formed; the 95% upper bound on the divergence rate is 5.21%, not below the 1% target: 299 batched requests would do (243 more)
    """
    needed = requests_needed(target_rate, confidence)  # checks both arguments before any run is read
    if isinstance(runs, (RunLike, str, os.PathLike)):
        runs = [runs]
    frames = [
        _judge_run(
            cast(Run, run) if isinstance(run, RunLike) else read_run(run, stream=True), target_rate, confidence, needed
        )
        for run in runs
    ]
    frame = pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=SCHEMA)
    return Judgement(_with_measured_fix(frame))
