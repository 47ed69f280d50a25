"""``analysis.judge``: the one judgement of runs and witness sets, which every surface of bia renders."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..metrics import requests_needed
from ..run import RunLike
from ..witness import WitnessSet
from ._judge_study import judge_runs, judge_study
from ._judgement_frame import Judgement
from ._study import Study, scan_study
from ._witness_judgement import judge_witnesses


def judge(subjects: Any, *, target_rate: float = 0.01, confidence: float = 0.95, engine: str = "polars") -> Judgement:
    """Is it batch invariant? One row per run and arm (and per witness of a witness set): GREEN, AMBER, RED or UNVERIFIED,
    with its cause, reason, evidence, cost, first request that parts, max ULP and next step.

    The rules (``docs/verdicts.md``): a server that differs from itself alone is RED for run-to-run drift, and batching is
    not judged; else a batched request (c > 1) that parts from m=1 makes it RED; else GREEN or AMBER need every c > 1 of
    the ladder complete and seen formed, with bits recorded (otherwise UNVERIFIED); GREEN when the one-sided upper bound on
    the divergence rate over the batched requests is below ``target_rate``.

    Parameters
    ----------
    subjects : Run, WitnessSet, Study, path, or an iterable of them
        What to judge: runs (run directories are read), witness sets, and studies (:func:`analysis.scan_study`, or a
        dataset's folder): a study's runs are judged partition by partition, one prompt's streams in memory at a time,
        with the same rows as each run read whole.
    target_rate : float
        The divergence rate to bound below for GREEN, in (0, 1].
    confidence : float
        The confidence of that one-sided bound, in (0, 1).
    engine : {"polars", "ray"}
        Where a study's partitions are computed: in this process, or as Ray tasks (the same rows either way).

    Returns
    -------
    Judgement
        Its ``.frame`` (polars) and ``.to_dicts()``; it shows in Jupyter as the verdict card.

    Examples
    --------
    >>> from analysis import read_witnesses
    >>> j = judge(["data/experiment-cpu/default", read_witnesses("data/aprender-lambda/witness@464c168e62.json")])
    >>> j.frame.select("arm", "verdict", "cause").rows()
    [('copies', 'RED', 'co-batching'), ('witness', 'RED', 'run-to-run')]
    """
    if engine not in ("polars", "ray"):
        raise ValueError(f"engine must be 'polars' or 'ray', got {engine!r}")
    if isinstance(subjects, (RunLike, WitnessSet, Study, str, os.PathLike)):
        subjects = [subjects]
    needed = requests_needed(target_rate, confidence)  # checks both arguments before anything is read
    judgement = Judgement(judge_runs([], target_rate=target_rate, confidence=confidence).frame)
    runs: list[Any] = []
    for subject in [
        *subjects,
        None,
    ]:  # runs are judged together (a fix measured beside a run), witness sets and studies where they stand
        if isinstance(subject, (str, os.PathLike)) and _is_study(subject):
            subject = scan_study(subject)
        if subject is not None and not isinstance(subject, (WitnessSet, Study)):
            runs.append(subject)
            continue
        if runs:
            judgement = judgement + judge_runs(runs, target_rate=target_rate, confidence=confidence)
            runs = []
        if isinstance(subject, Study):
            judgement = judgement + judge_study(
                subject, target_rate=target_rate, confidence=confidence, needed=needed, engine=engine
            )
        elif subject is not None:
            judgement = judgement + judge_witnesses(subject, target_rate=target_rate, confidence=confidence)
    return judgement


def _is_study(path: str | os.PathLike[str]) -> bool:
    """A study dataset's folder (``runs.parquet``, written by :func:`analysis.write_dataset`), not a run directory."""
    folder = Path(path)
    return (folder / "runs.parquet").is_file() and not (folder / "manifest.json").exists()
