"""The one line ``bia probe`` ends with: what the run it just wrote found, per c."""

from __future__ import annotations

import os

from ..metrics.parity import NEAR_TIE_EPSILON
from ..run import read_run
from ..views.html import run_review


def result_line(folder: str | os.PathLike[str]) -> str:
    """The run's verdict and reason (its :func:`analysis.judge` row, as the report's card heads it), its next step, and per c
    the share of requests bit-identical and token-identical to m=1 (from :func:`analysis.run.slot_table`, as the card counts them).

    Parameters
    ----------
    folder : path
        The run directory.

    Returns
    -------
    str

    Examples
    --------
    >>> result_line("data/experiment-cpu/batch-invariant")  # doctest: +ELLIPSIS
    'AMBER: 0 of 56 batched requests part from m=1, ... Next: 243 more batched requests: bia experiment --prompts FILE of 11 prompts. c=1: bits 100% (2 of 2), ...'
    """
    review = run_review(read_run(folder), epsilon=NEAR_TIE_EPSILON)
    step = next((answer for question, answer, _ in review.lines if question.startswith("next step")), None)
    per_c = "; ".join(
        f"c={r['c']}: bits {r['bit-identical to m=1']}, tokens {r['token-identical']}"
        for r in review.per_c.iter_rows(named=True)
    )
    return " ".join(part for part in (review.headline, f"Next: {step}." if step else "", per_c) if part)
