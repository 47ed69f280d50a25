"""Parity of a band of streams: what a batch of identical requests agreed on (unique completions, the fork, frozen
runs, tie density, the band's summary against its reference, the flip curve, top-1 probabilities).

The pairwise measures these stand on (:class:`Stream`, :func:`compare`, margins) are ``_parity``'s.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import polars as pl

from . import _columnar
from ._parity import NEAR_TIE_EPSILON, Stream, _cands, agreement, compare, top2_margin
from ._rates import wilson_interval


def longest_constant_run(identities: Sequence) -> int:
    """The longest run of one repeated token (a frozen slot repeats one token).

    Parameters
    ----------
    identities : sequence
        A stream's token identities.

    Returns
    -------
    int

    Examples
    --------
    >>> longest_constant_run([5, 5, 1, 7, 7, 7, 2]), longest_constant_run([])
    (3, 0)
    """
    best = run = 0
    previous = object()
    for token in identities:
        run = run + 1 if token == previous else 1
        best, previous = max(best, run), token
    return best


@dataclass(frozen=True)
class Completions:
    """How many different completions a set of identical requests produced."""

    n: int
    unique: int
    modal_count: int
    modal_share: float
    modal_interval: tuple[float, float]


def unique_completions(streams_: Iterable[Stream]) -> Completions:
    """Unique completions and the modal share, with its Wilson interval.

    Parameters
    ----------
    streams_ : iterable of Stream
        The streams, at least one.

    Returns
    -------
    Completions

    Examples
    --------
    >>> c = unique_completions([Stream(("a",), (1, 2)), Stream(("b",), (1, 2)), Stream(("c",), (1, 3))])
    >>> c.unique, c.modal_count, round(c.modal_share, 3)
    (2, 2, 0.667)
    """
    counts = Counter(s.identities for s in streams_)
    n = sum(counts.values())
    modal = max(counts.values())
    return Completions(n, len(counts), modal, modal / n, wilson_interval(modal, n))


def fork_table(streams_: Sequence[Stream], at: int | None = None) -> list[tuple[Any, int]]:
    """At the first position where the streams disagree (or ``at``), each token taken and by how many.

    Parameters
    ----------
    streams_ : sequence of Stream
        The streams.
    at : int, optional
        The position to count at; by default the first where any stream parts from the first one.

    Returns
    -------
    list of tuple of (object, int)
        (token identity, streams), most taken first.

    Examples
    --------
    >>> fork_table([Stream(("a",), (1, 2, 3)), Stream(("b",), (1, 2, 4)), Stream(("c",), (1, 2, 4))])
    [(4, 2), (3, 1)]
    """
    if at is None:
        at = min((agreement(streams_[0].identities, s.identities) for s in streams_[1:]), default=0)
    counts = Counter(s.identities[at] for s in streams_ if at < len(s))
    return counts.most_common()


def tie_density(
    margins: Iterable[float | None], thresholds: Sequence[float] = (1e-3, 1e-2, 1e-1)
) -> dict[float, float]:
    """The fraction of steps (with a margin) whose top-1/top-2 margin is below each threshold.

    Parameters
    ----------
    margins : iterable of float or None
        Per-step margins (None: unknown, left out).
    thresholds : sequence of float, default (1e-3, 1e-2, 1e-1)
        The thresholds, in logprob units.

    Returns
    -------
    dict of float to float
        Per threshold, the fraction (NaN for every one when no margin is known).

    Examples
    --------
    >>> tie_density([0.0005, 0.02, 0.5, None])
    {0.001: 0.3333333333333333, 0.01: 0.3333333333333333, 0.1: 0.6666666666666666}
    """
    known = [m for m in margins if m is not None]
    if not known:
        return dict.fromkeys(thresholds, math.nan)
    return {t: sum(m < t for m in known) / len(known) for t in thresholds}


def step_margins(stream: Stream) -> list[float | None]:
    """The top-1 minus top-2 margin at every step of a stream.

    Parameters
    ----------
    stream : Stream
        The stream.

    Returns
    -------
    list of float or None
        None where a step has fewer than two finite candidates.
    """
    return [top2_margin(c) for c in stream.candidates]


def band_summary(reference: Stream, slots: Sequence[Stream], *, epsilon: float = NEAR_TIE_EPSILON) -> dict[str, Any]:
    """Divergence from the reference over a band's slots, intra-batch agreement, frozen runs, completions.

    Parameters
    ----------
    reference : Stream
        The m=1 reference.
    slots : sequence of Stream
        The band's slots, at least one.
    epsilon : float, default 0.05
        The near-tie epsilon (``NEAR_TIE_EPSILON``).

    Returns
    -------
    dict

    Examples
    --------
    >>> ref = Stream(("r",), (1, 2, 3, 4))
    >>> band = [Stream(("s0",), (1, 2, 3, 4)), Stream(("s1",), (1, 2, 9, 9))]
    >>> s = band_summary(ref, band)
    >>> s["divergence_min"], s["divergence_median"], s["divergence_max"], s["intra_agree_to"]
    (2, 3.0, 4, 2)
    """
    comparisons = [compare(reference, s, epsilon=epsilon) for s in slots]
    agree = [c.agree_to for c in comparisons]
    completions = unique_completions(slots)
    return {
        "n_slots": len(slots),
        "divergence_min": min(agree),
        "divergence_median": statistics.median(agree),
        "divergence_max": max(agree),
        "diverged_slots": sum(c.diverged for c in comparisons),
        "near_tie_slots": sum(c.near_tie for c in comparisons),
        "intra_agree_to": min(agreement(slots[0].identities, s.identities) for s in slots),
        "max_constant_run": max(longest_constant_run(s.identities) for s in slots),
        "unique_completions": completions.unique,
        "modal_share": completions.modal_share,
        "modal_share_low": completions.modal_interval[0],
        "modal_share_high": completions.modal_interval[1],
        "comparisons": comparisons,
    }


# --- P(flip | margin) ------------------------------------------------------------------------------


FLIP_EDGES = (0.0, 1e-3, 1e-2, 0.05, 0.1, 0.5, 1.0, math.inf)


def flip_curve(pairs: Iterable[tuple[Stream, Stream]], edges: Sequence[float] = FLIP_EDGES) -> pl.DataFrame:
    """Empirical P(flip | reference margin) over every step at risk.

    A step is at risk while the two streams still agree before it: steps 0 .. divergence_at of
    each (reference, other) pair, the last one a flip. Steps without a reference margin are left
    out. Bins are ``[edges[i], edges[i + 1])``. :func:`analysis.run.flip_table` gives the same
    for a whole run without building streams.

    Parameters
    ----------
    pairs : iterable of tuple of (Stream, Stream)
        (reference, other) pairs.
    edges : sequence of float, default ``FLIP_EDGES``
        The margin bins' edges, increasing.

    Returns
    -------
    polars.DataFrame
        ``margin_low``, ``margin_high``, ``steps``, ``flips``, ``p_flip`` (null for an empty bin).

    Examples
    --------
    >>> ref = Stream(("r",), (1, 2), (), (((1, -0.1), (3, -0.1005)), ((2, -0.1), (4, -2.0))))
    >>> flip_curve([(ref, Stream(("b",), (3, 2)))]).filter(pl.col("steps") > 0).rows()
    [(0.0, 0.001, 1, 1, 1.0)]
    """
    margins, flips = [], []
    for reference, other in pairs:
        c = compare(reference, other)
        last = cast(int, c.divergence_at) if c.diverged else min(len(reference), len(other)) - 1  # diverged: it is set
        for step in range(last + 1):
            margin = top2_margin(_cands(reference, step))
            if margin is not None:
                margins.append(margin)
                flips.append(c.diverged and step == c.divergence_at)
    return _columnar.flip_bins(
        pl.DataFrame({"margin": margins, "flip": flips}, schema={"margin": pl.Float64, "flip": pl.Boolean}), edges
    )


# --- decode rates -----------------------------------------------------------------------------------


# --- across configurations (Yuan et al.) --------------------------------------------------------------


def div_index(streams_: Sequence[Stream]) -> int:
    """Yuan et al.'s Div_Index: the first position (0-based) where any two of the streams differ.

    Streams that never part give their shortest length.

    Parameters
    ----------
    streams_ : sequence of Stream
        The streams, at least one.

    Returns
    -------
    int

    Examples
    --------
    >>> div_index([Stream(("a",), (1, 2, 3)), Stream(("b",), (1, 2, 4)), Stream(("c",), (1, 5, 3))])
    1
    """
    if not streams_:
        raise ValueError("Div_Index needs at least one stream")
    return min((agreement(streams_[0].identities, s.identities) for s in streams_[1:]), default=len(streams_[0]))


def top1_prob(stream: Stream, position: int) -> float | None:
    """The top-1 probability at a step: the best finite candidate, else the sampled token's (greedy).

    Parameters
    ----------
    stream : Stream
        The stream.
    position : int
        The step (0-based).

    Returns
    -------
    float or None
    """
    values = [v for _, v in _cands(stream, position) if v is not None and math.isfinite(v)]
    if values:
        return math.exp(max(values))
    own = stream.logprobs[position] if position < len(stream.logprobs) else None
    return None if own is None else math.exp(own)


def avg_std_top1_prob(streams_: Sequence[Stream], upto: int | None = None) -> float | None:
    """Yuan et al.'s Avg_Std@top1_prob: the standard deviation of the top-1 probability across the
    streams (configurations), averaged over positions 0..Div_Index (population std, ddof 0).

    Parameters
    ----------
    streams_ : sequence of Stream
        One stream per configuration, of the same prompt.
    upto : int, optional
        The last position averaged over; by default :func:`div_index` of the streams.

    Returns
    -------
    float or None
        None when no position has a top-1 probability in every stream.

    Examples
    --------
    >>> a = Stream(("a",), (1, 2), (math.log(0.9), math.log(0.5)))
    >>> b = Stream(("b",), (1, 2), (math.log(0.7), math.log(0.5)))
    >>> round(avg_std_top1_prob([a, b]), 6)  # std 0.1 at step 0, 0 at step 1
    0.05
    """
    last = div_index(streams_) if upto is None else upto
    stds = []
    for position in range(min(last + 1, min(len(s) for s in streams_))):
        probs = [top1_prob(s, position) for s in streams_]
        if all(p is not None for p in probs):
            stds.append(float(np.std(cast(list[float], probs))))  # no None: checked above
    return sum(stds) / len(stds) if stds else None


def std_at_acc(accuracies: Sequence[float]) -> float | None:
    """Yuan et al.'s Std@Acc: the standard deviation of accuracy across configurations (population std, ddof 0).

    Parameters
    ----------
    accuracies : sequence of float
        One accuracy per configuration.

    Returns
    -------
    float or None
        None without any.

    Examples
    --------
    >>> round(std_at_acc([0.5, 0.75, 1.0]), 6)  # mean 0.75; deviations -0.25, 0, 0.25
    0.204124
    >>> std_at_acc([]) is None
    True
    """
    return float(np.std(accuracies)) if accuracies else None
