"""The run plots: per-request parity, margins, drift, widths and rates of one run (:mod:`analysis.plots` names them)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from ..run import Run, band_table, drift_table, flip_table, reference_margins, slot_table, width_table
from ._drawing import LEGEND_LIMIT, _axes, _empty, _label_points, _legend, _merge_identical, _set_c_axis


def _table(value: Any, table: Any, plot: str) -> pl.DataFrame:
    """What a run plot draws: ``table(run)`` of a :class:`~analysis.Run`, or that table as given (polars or pandas).

    Anything else is a TypeError naming both inputs the plot takes: a path, say, is not read for the caller.

    Examples
    --------
    >>> _table("data/experiment-cpu/default", slot_table, "plot_run_divergence")
    Traceback (most recent call last):
    ...
    TypeError: plot_run_divergence draws a Run or the frame of analysis.slot_table(run), not a str: read the run first, plot_run_divergence(analysis.read_run('data/experiment-cpu/default'))
    """
    if isinstance(value, Run):
        return table(value)
    if isinstance(value, pl.DataFrame):
        return value
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(value, pandas.DataFrame):
        return pl.from_pandas(value)
    hint = f": read the run first, {plot}(analysis.read_run({value!r}))" if isinstance(value, (str, os.PathLike)) else ""
    raise TypeError(f"{plot} draws a Run or the frame of analysis.{table.__name__}(run), not a {type(value).__name__}{hint}")


def _drifts(run: Run) -> pl.DataFrame:
    """:func:`analysis.drift_table` with each request's ``band_c``, which its label names ("p0 c=4 slot 2")."""
    return drift_table(run).with_columns(band_c=pl.col("label").str.extract(r"c=(\d+) slot \d+$", 1).cast(pl.Int64))


def _partings(run: Run) -> dict[str, list[int]]:
    """Per prompt, the steps where its batched requests part from the reference."""
    return {prompt: group["divergence_at"].drop_nulls().to_list() for (prompt,), group in slot_table(run).group_by(["prompt_id"])}


def plot_run_divergence(slots: Any, *, declared_min: int | None = None, ax=None):
    """Where each batched request parts from ref #1, against c: o parted, ^ never parted (plotted at its length).

    One series per outcome whatever the number of prompts; the earliest partings are named on the plot.
    When nothing parted the plot says so, and its axis runs from 0 so that the requests' full length shows.

    Parameters
    ----------
    slots : Run or DataFrame
        A run (its :func:`analysis.slot_table` is drawn), or that table (polars or pandas).
    declared_min : int, optional
        A line at this many tokens; given a run, the run's own ``declared_min`` when not given.
    ax : matplotlib Axes, optional
        Where to draw; a new figure otherwise.

    Returns
    -------
    matplotlib Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_run_divergence(analysis.read_run("data/experiment-cpu/default"))  # assigned: a cell ends without the Axes' repr
    >>> [t.get_text() for t in ax.get_legend().get_texts()]  # in bits they part, in tokens none does
    ['never parted (58; drawn at their length)', 'declared_min = 64']
    """
    ax = _axes(ax)
    if isinstance(slots, Run) and declared_min is None:
        declared_min = slots.declared_min
    slots = _table(slots, slot_table, "plot_run_divergence")
    if slots.is_empty():
        return _empty(ax, "No batched requests in the run.")
    parted = slots.filter(pl.col("diverged"))
    held = slots.filter(~pl.col("diverged"))
    if parted.height:
        ax.plot(parted["band_c"], parted["agree_to"], "o", color="tab:red", alpha=0.6, label=f"parted ({parted.height})")
    ax.plot(held["band_c"], held["agree_to"], "^", color="tab:blue", alpha=0.6, label=f"never parted ({held.height}; drawn at their length)")
    earliest = parted.sort("agree_to", "band_c").unique(["prompt_id"], keep="first", maintain_order=True)
    _label_points(ax, [(c, at, f"{p} slot {s}") for p, c, at, s in earliest.select("prompt_id", "band_c", "agree_to", "slot").rows()])
    if declared_min is not None:
        ax.axhline(declared_min, color="black", linestyle="--", linewidth=1, label=f"declared_min = {declared_min}")
    _set_c_axis(ax, slots["band_c"].to_list())
    if not parted.height:
        top = max([*held["agree_to"].drop_nulls().to_list(), declared_min or 0, 1])
        ax.set_ylim(0, top * 1.25)
        ax.text(0.5, 0.4, f"Nothing parted: all {held.height} batched requests\nagree with the m=1 reference to their end.",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("tokens agreeing with m=1 (0-based divergence)")
    ax.set_title("Divergence from the m=1 reference, per request")
    _legend(ax)
    return ax


def plot_margin_at_divergence(slots: Any, *, epsilon: float = 0.05, ax=None):
    """The reference's top-1/top-2 margin where each request parted, with the near-tie epsilon.

    ``slots``: a run, or its :func:`analysis.slot_table`.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_margin_at_divergence(analysis.read_run("data/experiment-cpu/default"))
    >>> ax.bia_empty  # its requests part in bits only: no token parts
    'No request parted where the reference had two candidates.'
    """
    ax = _axes(ax)
    parted = _table(slots, slot_table, "plot_margin_at_divergence").filter(pl.col("diverged") & pl.col("reference_margin").is_not_null())
    if parted.is_empty():
        return _empty(ax, "No request parted where the reference had two candidates.")
    # clip_on=False: an exact tie sits on the axis at 0 and is drawn whole
    ax.plot(parted["band_c"], parted["reference_margin"], "o", alpha=0.7, clip_on=False, label="reference margin at the divergence")
    ax.axhline(epsilon, color="red", linestyle="--", label=f"epsilon = {epsilon:g}")
    _set_c_axis(ax, parted["band_c"].to_list())
    _margin_axis(ax)
    ax.set_ylabel("top-1 minus top-2 logprob\n(linear below 1e-3, log above)")
    ax.set_title("Was the call close where the streams parted?")
    _legend(ax)
    return ax


def plot_margin_trace(margins: Run | Sequence[float | None] | Mapping[str, Sequence[float | None]],
                      divergences: Sequence[int] | Mapping[str, Sequence[int]] = (), *, epsilon: float = 0.05, ax=None):
    """The reference's margin at every step, with the steps where batched requests parted marked.

    ``margins`` is one reference's per-step margins, or a mapping of prompt to margins (one line
    each); ``divergences`` then maps each prompt to its parting steps. Given a run, its
    :func:`analysis.reference_margins` and, unless given, where its batched requests part. Past
    ``LEGEND_LIMIT - 2`` prompts the lines are grey, the partings red dots on them, and the earliest named.

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
        margins, divergences = reference_margins(margins), divergences or _partings(margins)
    elif isinstance(margins, (str, os.PathLike, pl.DataFrame)) or not isinstance(margins, Iterable):
        hint = f": read the run first, plot_margin_trace(analysis.read_run({margins!r}))" if isinstance(margins, (str, os.PathLike)) else ""
        raise TypeError(f"plot_margin_trace draws a Run, or margins per step (a list, or a mapping of prompt to lists: "
                        f"analysis.reference_margins(run)), not a {type(margins).__name__}{hint}")
    traces = dict(margins) if isinstance(margins, Mapping) else {"": margins}
    parted = dict(divergences) if isinstance(divergences, Mapping) else {"": divergences}
    traces = {p: [(i, m) for i, m in enumerate(t) if m is not None] for p, t in traces.items()}
    traces = {p: t for p, t in traces.items() if t}
    if not traces:
        return _empty(ax, "The reference has no step with two candidates.")
    if len(traces) > LEGEND_LIMIT - 2:
        _grey_traces(ax, traces, parted)
    else:
        _coloured_traces(ax, traces, parted)
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
            ax.axvline(step, color=line.get_color() if prompt else "orange", alpha=0.6, linestyle=":" if prompt else "-",
                       label=None if marked else "a request parted here")
            marked = True


def _grey_traces(ax, traces: Mapping[str, list[tuple[int, float]]], parted: Mapping[str, Sequence[int]]) -> None:
    """Many references: grey lines, the partings as red dots on them, the earliest named."""
    for k, trace in enumerate(traces.values()):
        ax.plot([i for i, _ in trace], [m for _, m in trace], "-", color="gray", alpha=0.35, linewidth=0.7,
                label=f"reference top-1 minus top-2, one line per prompt ({len(traces)})" if k == 0 else None)
    dots = []
    for prompt, trace in traces.items():
        at = dict(trace)
        dots += [(step, at[step], prompt) for step in sorted(set(parted.get(prompt, ()))) if step in at]
    if dots:
        ax.plot([d[0] for d in dots], [d[1] for d in dots], "o", color="tab:red", markersize=4, label=f"a request parted here ({len(dots)})")
        _label_points(ax, sorted(dots))


_WIDTH_ORIGINS = {"log": ("server log (per step)", "o"), "metrics": ("running-requests gauge (samples)", "s"),
                  "engine": ("engine counters (tokens / steps, at least)", "^"), "streams": ("streams decoding at once", "D")}


def plot_band_widths(widths: Any, *, ax=None):
    """Which batch widths the server formed in each band: one dot per (c, width), its area the share of
    the band's steps (or gauge samples) at that width, with the m = c line the band asked for.

    ``widths``: a run, or the rows of its :func:`analysis.width_table` (band_c, width, share).

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_band_widths(analysis.read_run("data/vllm-cpu/prefix-cache"))
    >>> ax.get_lines()[0].get_label()
    'm = c (the shape asked for)'
    """
    ax = _axes(ax)
    widths = _table(widths, width_table, "plot_band_widths")
    if widths.is_empty():
        return _empty(ax, "The run recorded no batch widths (no server log, no gauge).")
    cs = sorted(set(widths["band_c"].to_list()))
    for (origin,), group in widths.group_by(["origin"], maintain_order=True):
        label, marker = _WIDTH_ORIGINS.get(origin, (str(origin), "x"))
        ax.scatter(group["band_c"], group["width"], s=[20 + 400 * share for share in group["share"]], alpha=0.5, marker=marker, label=label)
    ax.plot(cs, cs, color="black", linestyle="--", linewidth=1, label="m = c (the shape asked for)")
    _set_c_axis(ax, cs)
    ax.set_ylabel("batch width m formed")
    ax.set_title("Was the batch shape really served?")
    _legend(ax)
    return ax


def plot_delta_before_fork(deltas: Any, *, ax=None):
    """Per-step ``|delta logprob|`` of batched requests against the reference, up to their fork.

    ``deltas``: a run (its :func:`analysis.drift_table`, with each request's c), or rows of (label, step, abs_delta),
    and ``band_c`` when known. Past ``LEGEND_LIMIT - 1`` requests with ``band_c``, one line per c (the largest drift
    over its requests at each step) and the request that drifts furthest named; else one line per request.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_delta_before_fork(analysis.read_run("data/experiment-cpu/default"))
    >>> [line.get_label() for line in ax.get_lines()]
    ['c=1 (largest of 2)', 'c=4, 8, 16 identical (largest of 8, 16, 32)']
    """
    ax = _axes(ax)
    deltas = _table(deltas, _drifts, "plot_delta_before_fork")
    if deltas.is_empty():
        return _empty(ax, "No agreeing step to compare.")
    if deltas["abs_delta"].max() == 0:
        return _empty(ax, f"No drift: every one of the {deltas.height} agreeing steps has the reference's logprob, bit for bit.")
    if "band_c" in deltas.columns and deltas["label"].n_unique() > LEGEND_LIMIT - 1:
        _drift_by_c(ax, deltas)
    else:
        series = deltas.group_by(["label"], maintain_order=True)
        for label, group in _merge_identical((str(label), tuple(g.select("step", "abs_delta").rows()), g) for (label,), g in series):
            ax.plot(group["step"], group["abs_delta"].clip(lower_bound=1e-12), ".-", linewidth=0.8, markersize=3, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("step (0-based)")
    ax.set_ylabel("|delta logprob| (zeros drawn at 1e-12)")
    ax.set_title("Logprob drift before the fork")
    _legend(ax, fontsize="x-small", ncol=2)
    return ax


def _drift_by_c(ax, deltas: pl.DataFrame) -> None:
    """One line per c: the largest |delta| over that c's requests at each step; the furthest request named."""
    colours = _c_colours(deltas["band_c"].to_list())
    envelope = deltas.group_by("band_c", "step").agg(pl.col("abs_delta").max(), requests=pl.col("label").n_unique()).sort("band_c", "step")
    series = (((c, g["requests"].max()), tuple(g.select("step", "abs_delta").rows()), (c, g))
              for (c,), g in envelope.group_by(["band_c"], maintain_order=True))
    for label, (c, group) in _merge_identical(series, _same_drift):  # c's that drift alike share one line, named after each
        ax.plot(group["step"], group["abs_delta"].clip(lower_bound=1e-12), ".-", linewidth=0.9, markersize=3, color=colours[c], label=label)
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

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_flip_curve(analysis.read_run("data/experiment-cpu/default"))
    >>> ax.bia_empty[:40]
    'No step flipped: P(flip) is 0 in every m'
    """
    ax = _axes(ax)
    curve = _table(curve, flip_table, "plot_flip_curve").filter(pl.col("steps") > 0)
    if curve.is_empty():
        return _empty(ax, "No step at risk with a reference margin.")
    if curve["flips"].sum() == 0:
        return _empty(ax, f"No step flipped: P(flip) is 0 in every margin bin ({curve['steps'].sum():,} steps at risk).")
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

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_unique_completions(analysis.read_run("data/experiment-cpu/default"))
    >>> [int(n) for n in ax.get_lines()[1].get_ydata()]  # the most in one band, per c
    [1, 1, 1, 1]
    """
    ax = _axes(ax)
    bands = _table(bands, band_table, "plot_unique_completions")
    if bands.is_empty():
        return _empty(ax, "No bands in the run.")
    bands = bands.sort("band_c")
    ax.plot(bands["band_c"], bands["unique_completions"], "o", alpha=0.5, color="tab:blue", label=f"one band ({bands.height})")
    most = bands.group_by("band_c", maintain_order=True).agg(pl.col("unique_completions").max())
    ax.plot(most["band_c"], most["unique_completions"], "-", color="black", linewidth=1, label="the most in one band")
    spread = bands.filter(pl.col("unique_completions") > 1).sort("unique_completions", descending=True)
    _label_points(ax, [(c, n, str(p)) for p, c, n in spread.select("prompt_id", "band_c", "unique_completions").rows()])
    _set_c_axis(ax, bands["band_c"].to_list())
    ax.set_ylim(bottom=0)
    ax.set_ylabel("unique completions in the band")
    ax.set_title("How many different answers one prompt got")
    _legend(ax)
    return ax


def plot_fork_tree(branches: Sequence[tuple[str, int]], *, at: int, ax=None):
    """The fork: each token taken at position ``at`` and how many streams took it (as text).

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
        ax.annotate(f"{token!r}: {n} of {total}", xy=(0.2, 0.5), xytext=(0.35, y), va="center", arrowprops={"arrowstyle": "<-"})
    ax.set_axis_off()
    ax.set_title("The fork")
    return ax


def _outliers(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """Rows beyond 1.5 IQR of their c's values (Tukey's fences), furthest first; none for a c with fewer than four rows.

    Examples
    --------
    >>> frame = pl.DataFrame({"band_c": [4] * 5, "rate": [100.0, 101.0, 99.0, 100.5, 20.0]})
    >>> _outliers(frame, "rate")["rate"].to_list()
    [20.0]
    """
    value = pl.col(column)
    q1, q3 = value.quantile(0.25).over("band_c"), value.quantile(0.75).over("band_c")
    spread = 1.5 * (q3 - q1)
    far = (value < q1 - spread) | (value > q3 + spread)
    distance = pl.max_horizontal(q1 - spread - value, value - q3 - spread)
    return frame.filter(far & (pl.len().over("band_c") >= 4)).sort(distance, descending=True)


def plot_run_decode_rate(bands: Any, *, ax=None):
    """Each band's median decode rate against c as a dot, the median over bands per c as a line, with
    the 50%-of-c=1 line; outlying bands (beyond 1.5 IQR of their c's rates, four bands or more) are
    named. Untimed bands are said, not drawn.

    Parameters
    ----------
    bands : Run or DataFrame
        A run (its :func:`analysis.band_table` is drawn), or that table (polars or pandas).
    ax : matplotlib Axes, optional
        Where to draw; a new figure otherwise.

    Returns
    -------
    matplotlib Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_run_decode_rate(analysis.read_run("data/experiment-cpu/default"))  # assigned: a cell ends without the Axes' repr
    >>> ax.get_lines()[1].get_label()
    'median over bands'
    """
    ax = _axes(ax)
    bands = _table(bands, band_table, "plot_run_decode_rate")
    rated = bands.filter(pl.col("decode_tok_s").is_not_null()) if "decode_tok_s" in bands.columns else bands.clear()
    if rated.is_empty():
        return _empty(ax, "No band has a decode rate: the captures carry no live arrival times.")
    rated = rated.sort("band_c").with_columns(median=pl.col("decode_tok_s").median().over("band_c"))
    ax.plot(rated["band_c"], rated["decode_tok_s"], "o", alpha=0.5, color="tab:blue", label=f"one band ({rated.height})")
    medians = rated.group_by("band_c", maintain_order=True).agg(pl.col("median").first())
    ax.plot(medians["band_c"], medians["median"], "-", color="black", linewidth=1.2, label="median over bands")
    base = medians.filter(pl.col("band_c") == 1)["median"]
    if base.len():
        ax.axhline(0.5 * base[0], color="black", linestyle=":", label=f"50% of c=1 ({0.5 * base[0]:,.0f} tok/s)")
    _label_points(ax, [(c, r, str(p)) for p, c, r in _outliers(rated, "decode_tok_s").select("prompt_id", "band_c", "decode_tok_s").rows()])
    _set_c_axis(ax, rated["band_c"].to_list())
    ax.set_ylim(bottom=0)
    ax.set_ylabel("median decode rate per request (tok/s)")
    ax.set_title("Decode rate while batched")
    _legend(ax)
    return ax


def _c_colours(cs: Sequence[int]) -> dict[int, Any]:
    """One colour per batch size c, the same in every run figure."""
    import matplotlib

    palette = matplotlib.colormaps["viridis"]
    ordered = sorted(set(cs))
    return {c: palette(k / max(1, len(ordered) - 1) * 0.9) for k, c in enumerate(ordered)}

