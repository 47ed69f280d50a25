"""The parity figures: where batched requests part from m=1 (a run's requests or a witness's bands), the margins there and
along the reference, the drift before the fork, P(flip | margin), how many answers one prompt got, and the fork itself."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import polars as pl

from ...run import Run, band_table, drift_table, flip_table, reference_margins, slot_table
from ...studies import History
from ...witness import WitnessSet
from ._drawing import (
    LEGEND_LIMIT,
    _axes,
    _empty,
    _label_points,
    _legend,
    _merge_identical,
    _set_c_axis,
    as_frame,
    drawn,
)
from .witness import witness_label

_RESULT_MARKERS = {"PASS": "o", "FAIL": "X", "UNMEASURABLE": "s"}


def _drifts(run: Run) -> pl.DataFrame:
    """:func:`analysis.drift_table` with each request's ``c``, which its label names ("p0 c=4 slot 2")."""
    return drift_table(run).with_columns(c=pl.col("label").str.extract(r"c=(\d+) slot \d+$", 1).cast(pl.Int64))


def _partings(run: Run) -> dict[str, list[int]]:
    """Per prompt, the steps where its batched requests part from the reference."""
    return {
        prompt: group["divergence_at"].drop_nulls().to_list()
        for (prompt,), group in slot_table(run).group_by(["prompt_id"])
    }


def plot_divergence(parity: Any, *, witnesses: Any = None, declared_min: int | None = None, ax=None):
    """Where batched requests part from the m=1 reference, against c, on an axis from 0; when nothing parted the plot says so.

    Given a run (or its :func:`analysis.slot_table`): each batched request where it parts from ref #1 (o), or at its length
    when it never parts (^), one series per outcome whatever the number of prompts, the earliest partings named.

    Given a witness set (or its bands): divergence_at per witness, its marker the band's recorded result (o PASS, X FAIL,
    s UNMEASURABLE), declared_min marked. A point that one drawn before it would hide (the same c and divergence_at) is nudged
    right of it and its line dashed; a witness whose every point repeats an earlier one's says whose in the legend. Given the
    ``witnesses`` frame (a WitnessSet brings its own), a band whose divergence_at reaches its reference's length never parted.

    Parameters
    ----------
    parity : Run, WitnessSet or DataFrame
        A run, a witness set, or the frame of one (polars or pandas): a frame with ``diverged`` is drawn as a run's requests,
        any other as witness bands. The concurrency column is ``c``.
    witnesses : DataFrame, optional
        The witnesses of the bands, for their reference lengths.
    declared_min : int, optional
        A run's line at this many tokens; given a run, the run's own ``declared_min`` when not given.
    ax : matplotlib Axes, optional
        Where to draw; a new figure otherwise.

    Returns
    -------
    matplotlib Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_divergence(analysis.read_run("data/experiment-cpu/default"))  # assigned: a cell ends without the Axes' repr
    >>> [t.get_text() for t in ax.get_legend().get_texts()]  # in bits they part, in tokens none does
    ['never parted (58; drawn at their length)', 'declared_min = 64']
    >>> ax = plot_divergence(analysis.read_witnesses("data/aprender-lambda", progress=False))
    >>> len(ax.get_lines()) >= 3
    True
    """
    ax = _axes(ax)
    if isinstance(parity, History):
        raise TypeError(
            "plot_divergence draws a Run, a WitnessSet or their frames; a History's earliest divergence over time is "
            "plot_trend(history, key, 'earliest_divergence')"
        )
    if isinstance(parity, WitnessSet) and witnesses is None:
        witnesses = parity.to_backend("polars").witnesses
    if isinstance(parity, Run) and declared_min is None:
        declared_min = parity.declared_min
    frame = drawn(
        parity,
        "plot_divergence",
        run=slot_table,
        witnesses=_bands,
        frame="analysis.slot_table(run) or WitnessSet.bands",
    )
    if "diverged" in frame.columns:  # a run's requests; witness bands have no per-request column
        return _requests_parting(frame, declared_min, ax)
    return _witnesses_parting(frame, witnesses, ax)


def _bands(ws: WitnessSet) -> pl.DataFrame:
    return ws.to_backend("polars").bands


def _requests_parting(slots: pl.DataFrame, declared_min: int | None, ax):
    """A run's figure: each batched request where it parts from ref #1 (o), or at its length when it never parts (^)."""
    c = "c"
    if slots.is_empty():
        return _empty(ax, "No batched requests in the run.")
    # where each request parts, or its length (the shorter of it and the reference's) when it never does
    slots = slots.with_columns(agreed=pl.coalesce("divergence_at", pl.min_horizontal("reference_length", "length")))
    parted = slots.filter(pl.col("diverged"))
    held = slots.filter(~pl.col("diverged"))
    if parted.height:
        ax.plot(parted[c], parted["agreed"], "o", color="tab:red", alpha=0.6, label=f"parted ({parted.height})")
    ax.plot(
        held[c],
        held["agreed"],
        "^",
        color="tab:blue",
        alpha=0.6,
        label=f"never parted ({held.height}; drawn at their length)",
    )
    earliest = parted.sort("agreed", c).unique(["prompt_id"], keep="first", maintain_order=True)
    _label_points(
        ax, [(c, at, f"{p} slot {s}") for p, c, at, s in earliest.select("prompt_id", c, "agreed", "slot").rows()]
    )
    if declared_min is not None:
        ax.axhline(declared_min, color="black", linestyle="--", linewidth=1, label=f"declared_min = {declared_min}")
    _set_c_axis(ax, slots[c].to_list())
    if not parted.height:
        top = max([*held["agreed"].drop_nulls().to_list(), declared_min or 0, 1])
        ax.set_ylim(0, top * 1.25)
        ax.text(
            0.5,
            0.4,
            f"Nothing parted: all {held.height} batched requests\nagree with the m=1 reference to their end.",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    ax.set_ylabel("tokens agreeing with m=1 (0-based divergence)")
    ax.set_title("Divergence from the m=1 reference, per request")
    _legend(ax)
    return ax


def _witnesses_parting(bands: pl.DataFrame, witnesses: Any, ax):
    """A witness set's figure: divergence_at against c, one line per witness, each band's result as its marker."""
    c = "c"
    measured = bands.filter(pl.col("divergence_at").is_not_null())
    if measured.is_empty():
        return _empty(ax, "No band recorded a divergence_at.")
    series: dict[tuple, str] = {}  # each witness's points, for the legend of one that repeats them
    drawn: dict[tuple, int] = {}  # how many witnesses drew each (c, divergence_at) so far
    for (source, version), group in measured.sort(c).group_by(["source", "witness_version"], maintain_order=True):
        label, points = witness_label(source, version), tuple(group.select(c, "divergence_at").rows())
        nudges = [
            2 ** (0.08 * drawn.get(point, 0)) for point in points
        ]  # on the log2 c axis: beside the point it would hide
        for point in points:
            drawn[point] = drawn.get(point, 0) + 1
        if points in series:
            label += f" (= {series[points]}, nudged right)"
        series.setdefault(points, witness_label(source, version))
        group = group.with_columns(x=pl.col(c) * pl.Series(nudges))
        line = ax.plot(group["x"], group["divergence_at"], "--" if max(nudges) > 1 else "-", alpha=0.7, label=label)[0]
        for result, marker in _RESULT_MARKERS.items():
            part = group.filter(pl.col("result") == result)
            if part.height:
                ax.plot(
                    part["x"], part["divergence_at"], marker, color=line.get_color(), markersize=8, linestyle="none"
                )
    declared_mins = sorted(set(measured["declared_min"].drop_nulls().to_list()))
    for declared in declared_mins:
        ax.axhline(declared, color="black", linestyle="--", linewidth=1, label=f"declared_min = {declared}")
    _set_c_axis(ax, measured[c].to_list())
    # from 0, so that where the bands sit shows against the whole stream (not 60.5 to 67.5 around declared_min = 64)
    ax.set_ylim(0, max([*measured["divergence_at"].to_list(), *declared_mins, 1]) * 1.25)
    lengths = _never_parted_lengths(measured, witnesses)
    if lengths:
        ax.text(
            0.5,
            0.4,
            f"Nothing parted: in every band ({measured.height}), slot 0 agrees\nwith the m=1 reference to its end "
            f"({', '.join(map(str, lengths))} tokens).",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    ax.set_ylabel("divergence_at (tokens agreeing with m=1)")
    ax.set_title("Where each batch size parts from the m=1 reference")
    _legend(ax)
    return ax


def _never_parted_lengths(measured: pl.DataFrame, witnesses: Any) -> list[int]:
    """The reference lengths when every measured band's divergence_at reaches its witness's (none parted), else []."""
    if witnesses is None:
        return []
    tokens = cast(pl.DataFrame, as_frame(witnesses)).select("source", "reference_tokens").unique("source")  # a frame
    joined = measured.join(tokens, on="source", how="left")
    if joined["reference_tokens"].null_count() or (joined["divergence_at"] < joined["reference_tokens"]).any():
        return []
    return sorted(set(joined["reference_tokens"].to_list()))


def plot_margin_at_divergence(slots: Any, *, epsilon: float = 0.05, ax=None):
    """The reference's top-1/top-2 margin where each request parted, with the near-tie epsilon.

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
    'No request parted where the reference had two candidates.'
    """
    ax = _axes(ax)
    parted = drawn(slots, "plot_margin_at_divergence", run=slot_table).filter(
        pl.col("diverged") & pl.col("reference_margin").is_not_null()
    )
    c = "c"
    if parted.is_empty():
        return _empty(ax, "No request parted where the reference had two candidates.")
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
        margins, divergences = reference_margins(run), divergences or _partings(run)
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
    """Many references: grey lines, the partings as red dots on them, the earliest named."""
    for k, trace in enumerate(traces.values()):
        ax.plot(
            [i for i, _ in trace],
            [m for _, m in trace],
            "-",
            color="gray",
            alpha=0.35,
            linewidth=0.7,
            label=f"reference top-1 minus top-2, one line per prompt ({len(traces)})" if k == 0 else None,
        )
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


def plot_delta_before_fork(deltas: Any, *, ax=None):
    """Per-step ``|delta logprob|`` of batched requests against the reference, up to their fork.

    ``deltas``: a run (its :func:`analysis.drift_table`, with each request's c), or rows of (label, step, abs_delta),
    and ``c`` when known. Past ``LEGEND_LIMIT - 1`` requests with ``c``, one line per c (the largest drift
    over its requests at each step) and the request that drifts furthest named; else one line per request.

    Parameters
    ----------
    deltas : Run or DataFrame
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
    >>> ax = plot_delta_before_fork(analysis.read_run("data/experiment-cpu/default"))
    >>> [line.get_label() for line in ax.get_lines()]
    ['c=1 (largest of 2)', 'c=4, 8, 16 identical (largest of 8, 16, 32)']
    """
    ax = _axes(ax)
    deltas = drawn(deltas, "plot_delta_before_fork", run=_drifts)
    if deltas.is_empty():
        return _empty(ax, "No agreeing step to compare.")
    if deltas["abs_delta"].max() == 0:
        return _empty(
            ax, f"No drift: every one of the {deltas.height} agreeing steps has the reference's logprob, bit for bit."
        )
    if "c" in deltas.columns and deltas["label"].n_unique() > LEGEND_LIMIT - 1:
        _drift_by_c(ax, deltas)
    else:
        series = deltas.group_by(["label"], maintain_order=True)
        for label, group in _merge_identical(
            (str(label), tuple(g.select("step", "abs_delta").rows()), g) for (label,), g in series
        ):
            ax.plot(
                group["step"],
                group["abs_delta"].clip(lower_bound=1e-12),
                ".-",
                linewidth=0.8,
                markersize=3,
                label=label,
            )
    ax.set_yscale("log")
    ax.set_xlabel("step (0-based)")
    ax.set_ylabel("|delta logprob| (zeros drawn at 1e-12)")
    ax.set_title("Logprob drift before the fork")
    _legend(ax, fontsize="x-small", ncol=2)
    return ax


def _drift_by_c(ax, deltas: pl.DataFrame) -> None:
    """One line per c: the largest |delta| over that c's requests at each step; the furthest request named."""
    by = "c"
    colours = _c_colours(deltas[by].to_list())
    envelope = (
        deltas.group_by(by, "step").agg(pl.col("abs_delta").max(), requests=pl.col("label").n_unique()).sort(by, "step")
    )
    series = (
        ((c, g["requests"].max()), tuple(g.select("step", "abs_delta").rows()), (c, g))
        for (c,), g in envelope.group_by([by], maintain_order=True)
    )
    for label, (c, group) in _merge_identical(
        series, _same_drift
    ):  # c's that drift alike share one line, named after each
        ax.plot(
            group["step"],
            group["abs_delta"].clip(lower_bound=1e-12),
            ".-",
            linewidth=0.9,
            markersize=3,
            color=colours[c],
            label=label,
        )
    worst = deltas.sort("abs_delta", descending=True).row(0, named=True)
    _label_points(ax, [(worst["step"], worst["abs_delta"], str(worst["label"]))])


def _same_drift(labels: Sequence[tuple[int, int]]) -> str:
    """The legend entry of one or more c's with the same drift, from their (c, requests).

    Examples
    --------
    >>> _same_drift([(4, 8)]), _same_drift([(4, 8), (16, 32)])
    ('c=4 (largest of 8)', 'c=4, 16 identical (largest of 8, 32)')
    """
    cs, requests = (", ".join(str(v) for v in values) for values in zip(*labels))
    return f"c={cs}{' identical' if len(labels) > 1 else ''} (largest of {requests})"


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
    'No step flipped: P(flip) is 0 in every m'
    """
    ax = _axes(ax)
    curve = drawn(curve, "plot_flip_curve", run=flip_table).filter(pl.col("steps") > 0)
    if curve.is_empty():
        return _empty(ax, "No step at risk with a reference margin.")
    if curve["flips"].sum() == 0:
        return _empty(
            ax, f"No step flipped: P(flip) is 0 in every margin bin ({curve['steps'].sum():,} steps at risk)."
        )
    labels = [f"[{lo:g}, {hi:g})" for lo, hi in curve.select("margin_low", "margin_high").iter_rows()]
    ax.bar(range(curve.height), curve["p_flip"], color="tab:purple")
    for k, (p, flips, n) in enumerate(curve.select("p_flip", "flips", "steps").iter_rows()):
        ax.text(k, p, f"{flips:,} of {n:,}", ha="center", va="bottom", fontsize="x-small")
    ax.set_xticks(range(curve.height))
    ax.set_xticklabels(labels, rotation=30, ha="right")
    top = curve["p_flip"].max()
    ax.set_ylim(0, 1.1 if top > 0.5 else top * 1.4)  # rare flips stay visible
    ax.set_xlabel("reference margin bin")
    ax.set_ylabel("P(flip)")
    ax.set_title("How often a step flips, by how close the reference's call was")
    return ax


def plot_unique_completions(bands: Any, *, ax=None):
    """Unique completions per band against c: every band a dot, the most in any band per c a line, the bands
    with the most named.

    ``bands``: a run, or its :func:`analysis.band_table`.

    Parameters
    ----------
    bands : Run or DataFrame
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
    >>> ax = plot_unique_completions(analysis.read_run("data/experiment-cpu/default"))
    >>> [int(n) for n in ax.get_lines()[1].get_ydata()]  # the most in one band, per c
    [1, 1, 1, 1]
    """
    ax = _axes(ax)
    bands = drawn(bands, "plot_unique_completions", run=band_table)
    if bands.is_empty():
        return _empty(ax, "No bands in the run.")
    c = "c"
    bands = bands.sort(c)
    ax.plot(bands[c], bands["unique_completions"], "o", alpha=0.5, color="tab:blue", label=f"one band ({bands.height})")
    most = bands.group_by(c, maintain_order=True).agg(pl.col("unique_completions").max())
    ax.plot(most[c], most["unique_completions"], "-", color="black", linewidth=1, label="the most in one band")
    spread = bands.filter(pl.col("unique_completions") > 1).sort("unique_completions", descending=True)
    _label_points(ax, [(x, n, str(p)) for p, x, n in spread.select("prompt_id", c, "unique_completions").rows()])
    _set_c_axis(ax, bands[c].to_list())
    ax.set_ylim(bottom=0)
    ax.set_ylabel("unique completions in the band")
    ax.set_title("How many different answers one prompt got")
    _legend(ax)
    return ax


def plot_fork_tree(branches: Sequence[tuple[str, int]], *, at: int, ax=None):
    """The fork: each token taken at position ``at`` and how many streams took it (as text).

    Parameters
    ----------
    branches : sequence of tuple of (str, int)
        Each token taken and how many streams took it, as :func:`analysis.parity.fork_table` gives them.
    at : int
        The position of the fork.
    ax : matplotlib.axes.Axes, optional
        The axes to draw on; by default a new figure's.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> ax = plot_fork_tree([(" yes", 3), (" no", 1)], at=7)
    >>> [t.get_text() for t in ax.texts]
    ['step 7', "' yes': 3 of 4", "' no': 1 of 4"]
    """
    ax = _axes(ax)
    if not branches:
        return _empty(ax, "The streams never part.")
    total = sum(n for _, n in branches)
    ax.text(0.02, 0.5, f"step {at}", va="center", fontsize="large")
    for k, (token, n) in enumerate(branches):
        y = 1 - (k + 1) / (len(branches) + 1)
        ax.annotate(
            f"{token!r}: {n} of {total}", xy=(0.2, 0.5), xytext=(0.35, y), va="center", arrowprops={"arrowstyle": "<-"}
        )
    ax.set_axis_off()
    ax.set_title("The fork")
    return ax


def _c_colours(cs: Sequence[int]) -> dict[int, Any]:
    """One colour per batch size c, the same in every run figure."""
    import matplotlib

    palette = matplotlib.colormaps["viridis"]
    ordered = sorted(set(cs))
    return {c: palette(k / max(1, len(ordered) - 1) * 0.9) for k, c in enumerate(ordered)}
