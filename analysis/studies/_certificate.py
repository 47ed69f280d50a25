"""The certificate: the judgement (:func:`analysis.judge`) of runs, as ``bia certify`` writes it to ``certificate.json``.

Nothing here judges: the verdict, its bound and its reason are :func:`analysis.judge`'s rows, so the certificate, the
report's answer table and its cards, the probe's closing line and the trend cannot disagree.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ..metrics import requests_needed
from ._judge_study import judge_runs
from ._judgement_frame import EXIT_CODES, VERDICTS, Judgement, worst

__all__ = ["CERTIFICATE_VERSION", "EXIT_CODES", "VERDICTS", "certificate", "certificate_document", "worst"]

CERTIFICATE_VERSION = 4  # 4: the bound counts distinct batch contexts, and a domain says what the verdict covers; 3: concurrency is c and a first request's token is position everywhere; 2: the judgement's rows (only batched requests, c > 1, count toward the bound; run-to-run first)


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
        ``confidence``, ``bound``, ``requests_needed``, ``domain`` (what the verdict covers, over every row: see
        :func:`merged_domain`) and ``arms``.

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
        "bound": (
            "one-sided exact Clopper-Pearson upper bound on the divergence rate over distinct batch contexts of batched "
            "requests (c > 1): (prompt, c, slot, the prompts it was batched with, arm); a repeat of a context is checked "
            "but counted once"
        ),
        "requests_needed": requests_needed(target_rate, confidence),
        "domain": merged_domain([arm.get("domain") for arm in arms]),
        "arms": arms,
    }


def merged_domain(domains: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """What a certificate's rows cover together: the ladders, widths and arms joined, prompts, contexts and requests
    summed over the rows, the lengths' extremes, and each sampling and precision met.

    Parameters
    ----------
    domains : list of dict or None
        The rows' domains (None for a row without one, a witness's).

    Returns
    -------
    dict or None
        None when no row has a domain.

    Examples
    --------
    >>> one = {"ladder": [1, 4], "widths": [4], "prompts": 2, "contexts": 8, "requests": 8, "prompt_tokens_min": 5,
    ...        "prompt_tokens_max": 9, "completion_tokens_min": 16, "completion_tokens_max": 16, "sampling": "greedy (temperature 0)",
    ...        "precision": "float32", "arms": ["copies"]}
    >>> merged = merged_domain([one, {**one, "ladder": [1, 8], "widths": [7], "precision": "float64", "prompt_tokens_min": 3}])
    >>> merged["ladder"], merged["widths"], merged["contexts"], merged["prompt_tokens_min"], merged["precision"]
    ([1, 4, 8], [4, 7], 16, 3, 'float32, float64')
    """
    given = [d for d in domains if d]
    if not given:
        return None
    if len(given) == 1:
        return dict(given[0])

    def joined(key: str) -> list:
        return sorted({v for d in given for v in d.get(key) or []})

    def extreme(key: str, pick: Any) -> Any:
        values = [d[key] for d in given if d.get(key) is not None]
        return pick(values) if values else None

    return {
        "ladder": joined("ladder"),
        "widths": joined("widths"),
        **{key: sum(d.get(key) or 0 for d in given) for key in ("prompts", "contexts", "requests")},
        **{key: extreme(key, min) for key in ("prompt_tokens_min", "completion_tokens_min")},
        **{key: extreme(key, max) for key in ("prompt_tokens_max", "completion_tokens_max")},
        "sampling": ", ".join(sorted({str(d.get("sampling")) for d in given})),
        "precision": ", ".join(sorted({str(d.get("precision")) for d in given})),
        "arms": joined("arms"),
    }
