"""The certificate: the judgement (:func:`analysis.judge`) of runs, as ``bia certify`` writes it to ``certificate.json``.

Nothing here judges: the verdict, its bound and its reason are :func:`analysis.judge`'s rows, so the certificate, the
report's answer table and its cards, the probe's closing line and the trend cannot disagree.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ..metrics import requests_needed
from ._judgement import judge_runs
from ._judgement_frame import EXIT_CODES, VERDICTS, Judgement, worst

__all__ = ["CERTIFICATE_VERSION", "EXIT_CODES", "VERDICTS", "certificate", "certificate_document", "worst"]

CERTIFICATE_VERSION = 3  # 3: concurrency is c and a first request's token is position everywhere; 2: the judgement's rows (only batched requests, c > 1, count toward the bound; run-to-run first)


def certificate(run: Any, *, target_rate: float = 0.01, confidence: float = 0.95) -> Judgement:
    """The certificate of one run: its judgement, a verdict per arm, GREEN, AMBER, RED or UNVERIFIED (:func:`analysis.judge`).

    Parameters
    ----------
    run : Run or path
        The run (a run directory is read).
    target_rate : float
        The divergence rate the run must bound itself below to be GREEN, in (0, 1].
    confidence : float
        The confidence of the one-sided upper bound on the divergence rate.

    Returns
    -------
    Judgement
        :func:`analysis.judge`'s rows for the run: it shows in Jupyter as the verdict card, and ``.frame`` is the polars frame
        (a frame's methods, ``.row`` and ``.select`` among them, work on the judgement too).

    Examples
    --------
    >>> certificate("data/llamacpp-cpu/no-cache-prompt").select("arm", "verdict", "requests", "divergent", "tokens_parted").row(0)
    ('copies', 'RED', 56, 56, 0)
    """
    return judge_runs(run, target_rate=target_rate, confidence=confidence)


def certificate_document(
    judgement: Judgement | list[pl.DataFrame], *, target_rate: float, confidence: float
) -> dict[str, Any]:
    """``certificate.json``: the worst verdict over every run and arm, its exit code, and each row of the judgement.

    Parameters
    ----------
    judgement : Judgement or list of polars.DataFrame
        The judgement, or its frames (one per run) to be joined; an empty list judges nothing (GREEN).
    target_rate : float
        The divergence rate the batched requests must bound themselves below to be GREEN, in (0, 1].
    confidence : float
        The confidence of the one-sided upper bound on the divergence rate, in (0, 1).

    Returns
    -------
    dict
        The document, ready for ``json.dumps``: ``certificate_version``, ``verdict``, ``exit_code``, ``target_rate``,
        ``confidence``, ``bound``, ``requests_needed`` and ``arms``.

    Examples
    --------
    >>> doc = certificate_document(judge_runs("data/llamacpp-cpu/cache-prompt"), target_rate=0.01, confidence=0.95)
    >>> doc["verdict"], doc["exit_code"], doc["requests_needed"], doc["arms"][0]["cause"]
    ('RED', 5, 299, 'prompt cache')
    """
    frames = (
        judgement.frame
        if isinstance(judgement, Judgement)
        else pl.concat(judgement, how="vertical")
        if judgement
        else None
    )
    arms = frames.to_dicts() if frames is not None else []
    verdict = worst([arm["verdict"] for arm in arms])
    return {
        "certificate_version": CERTIFICATE_VERSION,
        "verdict": verdict,
        "exit_code": EXIT_CODES[verdict],
        "target_rate": target_rate,
        "confidence": confidence,
        "bound": "one-sided exact Clopper-Pearson upper bound on the divergence rate of batched requests (c > 1)",
        "requests_needed": requests_needed(target_rate, confidence),
        "arms": arms,
    }
