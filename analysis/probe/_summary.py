"""The one line ``bia probe`` ends with: what the run it just wrote found, per c."""

from __future__ import annotations

import os

from ..metrics.parity import NEAR_TIE_EPSILON
from ..run import read_run
from ..views._review import run_review


def result_line(folder: str | os.PathLike[str]) -> str:
    """The run's verdict, as the report's card words it, and per c the share of requests bit-identical and token-identical to m=1
    (from :func:`analysis.run.slot_table`, as the report's verdict card counts them).

    Examples
    --------
    >>> result_line("data/experiment-cpu/batch-invariant")  # doctest: +ELLIPSIS
    'Batch invariant: every request is bit-identical to m=1. c=1: bits 100% (2 of 2), tokens 100% (2 of 2); c=4: bits 100% (8 of 8), ...'
    """
    review = run_review(read_run(folder), epsilon=NEAR_TIE_EPSILON)
    per_c = "; ".join(f"c={r['c']}: bits {r['bit-identical to m=1']}, tokens {r['token-identical']}" for r in review.per_c.iter_rows(named=True))
    return f"{review.headline} {per_c}".rstrip()
