"""The parity figures of near-ties: the reference's top-1/top-2 margin where each request parted and along the
reference, and P(flip | margin)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from ...run import Run, flip_table, reference_margins, slot_table
from ._drawing import (
    LEGEND_LIMIT,
    SMALLEST_FONT,
    _axes,
    _empty,
    _label_points,
    _legend,
    _merge_identical,
    _set_c_axis,
    drawn,
)


def partings(slots: pl.DataFrame | pl.LazyFrame) -> dict[str, list[int]]:
    """Per prompt, the distinct steps where its batched requests part from the reference, from a slot table: in one
    query over two of its columns (a scan is read a morsel at a time; the steps of every request, not only the distinct,
    were a list the size of the run).

    Parameters
    ----------
    slots : polars.DataFrame or polars.LazyFrame
        A slot table (:func:`analysis.run.slot_table`), or any frame with ``prompt_id`` and ``divergence_at``.

    Returns
    -------
    dict of str to list of int
        Each prompt's parting steps, sorted, each once; an empty list for a prompt none of whose requests part. The
        prompts in the table's order.

    Examples
    --------
    >>> partings(pl.DataFrame({"prompt_id": ["p", "q", "p", "p"], "divergence_at": [3, None, 1, 3]}))
    {'p': [1, 3], 'q': []}
    """
    # each distinct (prompt, step) once, with where it first shows: a streaming group-by holds the pairs, not the rows
    pairs = (
        slots.lazy()
        .select("prompt_id", "divergence_at")
        .with_row_index("order")
        .group_by("prompt_id", "divergence_at")
        .agg(pl.col("order").min())
        .collect(engine="streaming")
    )
    rows = (
        pairs.group_by("prompt_id")
        .agg(pl.col("order").min(), pl.col("divergence_at").drop_nulls().sort())
        .sort("order")
    )
    return dict(zip(rows["prompt_id"].to_list(), rows["divergence_at"].to_list(), strict=True))


def plot_margin_at_divergence(slots: Any, *, epsilon: float = 0.05, ax=None):
    """The reference's top-1/top-2 margin where each request parted (a mark per c and margin), with the near-tie epsilon.

    ``slots``: a run, or its :func:`analysis.slot_table`.

    Parameters
    ----------
    slots : Run or DataFrame
        See above.
    epsilon : float, default 0.05
        The near-tie epsilon, drawn as a line.
    ax : matplotlib.axes.Axes, optional
        The axes to draw on; by default a new figure's.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_margin_at_divergence(analysis.read_run("data/experiment-cpu/default"))
    >>> ax.bia_empty  # its requests part in bits only: no token parts
    'No request parted in tokens where the reference had two candidates.'
    """
    ax = _axes(ax)
    c = "c"
    parted = (  # one mark a (c, margin): what is drawn, read a morsel at a time from a scan
        drawn(slots, "plot_margin_at_divergence", run=slot_table, lazy=True)
        .lazy()
        .filter(pl.col("diverged") & pl.col("reference_margin").is_not_null())
        .group_by(c, "reference_margin")
        .agg()
        .sort(c, "reference_margin")
        .collect(engine="streaming")
    )
    if parted.is_empty():
        return _empty(ax, "No request parted in tokens where the reference had two candidates.")
    # clip_on=False: an exact tie sits on the axis at 0 and is drawn whole
    ax.plot(
        parted[c], parted["reference_margin"], "o", alpha=0.7, clip_on=False, label="reference margin at the divergence"
    )
    ax.axhline(epsilon, color="red", linestyle="--", label=f"epsilon = {epsilon:g}")
    _set_c_axis(ax, parted[c].to_list())
    _margin_axis(ax)
    ax.set_ylabel("top-1 minus top-2 logprob\n(linear below 1e-3, log above)")
    ax.set_title("Was the call close where the streams parted?")
    _legend(ax)
    return ax


def plot_margin_trace(
    margins: Run | Sequence[float | None] | Mapping[str, Sequence[float | None]],
    divergences: Sequence[int] | Mapping[str, Sequence[int]] = (),
    *,
    epsilon: float = 0.05,
    ax=None,
):
    """The reference's margin at every step, with the steps where batched requests parted marked.

    ``margins`` is one reference's per-step margins, or a mapping of prompt to margins (one line
    each); ``divergences`` then maps each prompt to its parting steps. Given a run, its
    :func:`analysis.reference_margins` and, unless given, where its batched requests part. Past
    ``LEGEND_LIMIT - 2`` prompts the lines are grey, the partings red dots on them, and the earliest named.

    Parameters
    ----------
    margins : Run, sequence of float or None, or mapping of str to them
        See above.
    divergences : sequence of int, or mapping of str to them, default ()
        The steps where batched requests parted.
    epsilon : float, default 0.05
        The near-tie epsilon, drawn as a line.
    ax : matplotlib.axes.Axes, optional
        The axes to draw on; by default a new figure's.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_margin_trace(analysis.read_run("data/experiment-cpu/default"))
    >>> [line.get_label() for line in ax.get_lines()][:2]
    ['p0: reference top-1 minus top-2', 'p1: reference top-1 minus top-2']
    """
    ax = _axes(ax)
    if isinstance(margins, Run):
        run = margins
        margins, divergences = reference_margins(run), divergences or partings(slot_table(run))
    elif isinstance(margins, (str, os.PathLike, pl.DataFrame)) or not isinstance(margins, Iterable):
        hint = (
            f": read the run first, plot_margin_trace(analysis.read_run({margins!r}))"
            if isinstance(margins, (str, os.PathLike))
            else ""
        )
        raise TypeError(
            f"plot_margin_trace draws a Run, or margins per step (a list, or a mapping of prompt to lists: "
            f"analysis.reference_margins(run)), not a {type(margins).__name__}{hint}"
        )
    traces = dict(margins) if isinstance(margins, Mapping) else {"": margins}
    parted = dict(divergences) if isinstance(divergences, Mapping) else {"": divergences}
    points = {p: [(i, m) for i, m in enumerate(t) if m is not None] for p, t in traces.items()}
    points = {p: t for p, t in points.items() if t}
    if not points:
        return _empty(ax, "The reference has no step with two candidates.")
    if len(points) > LEGEND_LIMIT - 2:
        _grey_traces(ax, points, parted)
    else:
        _coloured_traces(ax, points, parted)
    ax.axhline(epsilon, color="red", linestyle="--", linewidth=1, label=f"epsilon = {epsilon:g}")
    _margin_axis(ax)
    ax.set_xlabel("step (0-based)")
    ax.set_ylabel("margin (logprob; linear below 1e-3, log above)")
    ax.set_title("Near-ties along the reference")
    _legend(ax)
    return ax


def _margin_axis(ax) -> None:
    """A margin (top-1 minus top-2) is never negative: symlog, linear up to 1e-3 so that exact ties show at 0, from 0 up."""
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.margins(y=0.15)
    ax.set_ylim(bottom=0)


def _coloured_traces(ax, traces: Mapping[str, list[tuple[int, float]]], parted: Mapping[str, Sequence[int]]) -> None:
    """A few references: one coloured line each, its partings as lines of its colour."""
    marked = False
    same = _merge_identical((prompt, tuple(trace), prompt) for prompt, trace in traces.items())
    for label, prompt in same:  # prompts whose references have the same margins share a line, named after all of them
        trace = traces[prompt]
        label = f"{label}: reference top-1 minus top-2" if prompt else "reference top-1 minus top-2"
        line = ax.plot([i for i, _ in trace], [m for _, m in trace], "-", linewidth=1, label=label)[0]
        steps = {step for p, t in traces.items() if t == trace for step in parted.get(p, ())}
        for step in sorted(steps):
            ax.axvline(
                step,
                color=line.get_color() if prompt else "orange",
                alpha=0.6,
                linestyle=":" if prompt else "-",
                label=None if marked else "a request parted here",
            )
            marked = True


def _grey_traces(ax, traces: Mapping[str, list[tuple[int, float]]], parted: Mapping[str, Sequence[int]]) -> None:
    """Many references: grey lines, the partings as red dots on them, the earliest named. The lines are one collection:
    a line artist per prompt took most of the figures' time at thousands of prompts."""
    from matplotlib.collections import LineCollection

    lines = LineCollection(
        list(traces.values()),
        colors="gray",
        alpha=0.35,
        linewidths=0.7,
        label=f"reference top-1 minus top-2, one line per prompt ({len(traces)})",
    )
    ax.add_collection(lines)
    ax.autoscale_view()
    dots = []
    for prompt, trace in traces.items():
        at = dict(trace)
        dots += [(step, at[step], prompt) for step in sorted(set(parted.get(prompt, ()))) if step in at]
    if dots:
        ax.plot(
            [d[0] for d in dots],
            [d[1] for d in dots],
            "o",
            color="tab:red",
            markersize=4,
            label=f"a request parted here ({len(dots)})",
        )
        _label_points(ax, sorted(dots))


def plot_flip_curve(curve: Any, *, ax=None):
    """Empirical P(flip | reference margin) per margin bin, with the steps behind each point.

    ``curve``: a run, or its :func:`analysis.flip_table` (or :func:`analysis.parity.flip_curve`).

    Parameters
    ----------
    curve : Run or DataFrame
        See above.
    ax : matplotlib.axes.Axes, optional
        The axes to draw on; by default a new figure's.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_flip_curve(analysis.read_run("data/experiment-cpu/default"))
    >>> ax.bia_empty[:40]
    'No token flipped: P(flip) is 0 in every '
    """
    ax = _axes(ax)
    curve = drawn(curve, "plot_flip_curve", run=flip_table).filter(pl.col("steps") > 0)
    if curve.is_empty():
        return _empty(ax, "No step at risk with a reference margin.")
    if curve["flips"].sum() == 0:
        return _empty(
            ax, f"No token flipped: P(flip) is 0 in every margin bin ({curve['steps'].sum():,} steps at risk)."
        )
    labels = [f"[{lo:g}, {hi:g})" for lo, hi in curve.select("margin_low", "margin_high").iter_rows()]
    ax.bar(range(curve.height), curve["p_flip"], color="tab:purple")
    for k, (p, flips, n) in enumerate(curve.select("p_flip", "flips", "steps").iter_rows()):
        ax.text(k, p, f"{flips:,} of {n:,}", ha="center", va="bottom", fontsize=SMALLEST_FONT)
    ax.set_xticks(range(curve.height))
    ax.set_xticklabels(labels, rotation=30, ha="right")
    top = curve["p_flip"].max()
    ax.set_ylim(0, 1.1 if top > 0.5 else top * 1.4)  # rare flips stay visible
    ax.set_xlabel("reference margin bin")
    ax.set_ylabel("P(flip)")
    ax.set_title("How often a step flips, by how close the reference's call was")
    return ax
