"""The rate figures: what batching costs in decode rate (a run's bands, a witness's, a history's entries) and which batch
widths the server really formed."""

from __future__ import annotations

from typing import Any

import polars as pl

from ...run import Run, band_table, width_table
from ...studies import History, baseline_words, run_decode_cost
from ...witness import WitnessSet
from ._drawing import _axes, _empty, _label_points, _legend, _merge_identical, _set_c_axis, drawn
from .witness import witness_label


def plot_decode_rate(rates: Any, *, ax=None):
    """Per-request decode rate against c, with the 50%-of-c=1 line.

    Given a run (or its :func:`analysis.band_table`): each band's median decode rate as a dot, the median over bands per c as
    a line, and half the c=1 baseline its judgement's cost is over (``analysis.metrics.decode_cost``; given a band table,
    half the median c=1 band); outlying bands (beyond 1.5 IQR of their c's rates, four bands or more) are named, untimed bands said, not drawn.
    Given a witness set (or its bands, which carry ``witness_version``): one line per witness with its own 50%-of-c=1 line;
    witnesses without rates (versions 1 and 2 never time requests) are named, not drawn. Given a :class:`~analysis.History`:
    one line per entry. Series with the same rates are drawn once.

    Parameters
    ----------
    rates : Run, WitnessSet, History or DataFrame
        What to draw; a frame (polars or pandas) with ``c``.
    ax : matplotlib Axes, optional
        Where to draw; a new figure otherwise.

    Returns
    -------
    matplotlib Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_decode_rate(analysis.read_run("data/experiment-cpu/default"))  # assigned: a cell ends without the Axes' repr
    >>> ax.get_lines()[1].get_label()
    'median over bands'
    >>> ax.get_lines()[2].get_label()
    '50% of the c=1 baseline (1,180 tok/s: the median of 2 c=1 requests, streams’ timings)'
    >>> ax = plot_decode_rate(analysis.read_witnesses("data/aprender-lambda", progress=False))
    >>> ax.bia_empty
    'No decode rates recorded in 3 witness(es) (witness_version 1 and 2 do not time requests).'
    """
    ax = _axes(ax)
    frame = drawn(
        rates,
        "plot_decode_rate",
        run=band_table,
        witnesses=_bands,
        history=_entries,
        frame="analysis.band_table(run), WitnessSet.bands or History.bands",
    )
    if "witness_version" in frame.columns:
        return _witness_rates(frame, ax)
    if "entry" in frame.columns:
        return _history_rates(frame, ax)
    baseline = run_decode_cost(rates).filter(pl.col("c") == 1).to_dicts() if isinstance(rates, Run) else []
    return _band_rates(frame, ax, baseline[0] if baseline else None)


def _bands(ws: WitnessSet) -> pl.DataFrame:
    return ws.to_backend("polars").bands


def _entries(history: History) -> pl.DataFrame:
    """A history's bands, each named by its entry's source."""
    return history.bands.join(history.entries.select("entry", "source"), on="entry", how="left")


def _witness_rates(bands: pl.DataFrame, ax):
    c = "c"
    rated = bands.filter(pl.col("decode_tok_s").is_not_null() & (pl.col("decode_tok_s") > 0))
    if rated.is_empty():
        untimed = bands["source"].unique(maintain_order=True).to_list()
        return _empty(
            ax,
            "No decode rates recorded"
            + (f" in {len(untimed)} witness(es)" if untimed else "")
            + "\n(witness_version 1 and 2 do not time requests).",
        )
    groups = (
        (witness_label(s, v), g)
        for (s, v), g in rated.sort(c).group_by(["source", "witness_version"], maintain_order=True)
    )
    _rate_lines(ax, groups)
    ax.set_ylabel("decode rate per request (tok/s)")
    ax.set_title("Per-request decode rate while batched")
    return ax


def _history_rates(bands: pl.DataFrame, ax):
    c = "c"
    rated = bands.filter(pl.col("decode_tok_s").is_not_null() & (pl.col("decode_tok_s") > 0))
    if rated.is_empty():
        return _empty(ax, f"No decode rates recorded in the history's {bands['entry'].n_unique()} entries.")
    groups = (
        (witness_label(source or entry[:16], None), g)
        for (entry, source), g in rated.sort(c).group_by(["entry", "source"], maintain_order=True)
    )
    _rate_lines(ax, groups)
    ax.set_ylabel("decode rate per request (tok/s)")
    ax.set_title("Per-request decode rate while batched, per entry")
    return ax


def _rate_lines(ax, groups) -> None:
    """One rate line per group against c, each with its 50%-of-c=1 line (S7's bar).

    The bar is drawn only where c=1 has exactly one rate (a witness has one band per c). Groups with the
    same rates are drawn once.
    """
    cs = []
    for label, group in _merge_identical(
        (label, tuple(group.select("c", "decode_tok_s").rows()), group) for label, group in groups
    ):
        line = ax.plot(group["c"], group["decode_tok_s"], "o-", label=label)[0]
        base = group.filter(pl.col("c") == 1)["decode_tok_s"]
        if base.len() == 1:
            ax.axhline(
                0.5 * base[0], color=line.get_color(), linestyle=":", label=f"50% of c=1 ({0.5 * base[0]:.4g} tok/s)"
            )
        cs += group["c"].to_list()
    _set_c_axis(ax, cs)
    ax.set_ylim(bottom=0)
    _legend(ax)


def _band_rates(bands: pl.DataFrame, ax, baseline: dict | None = None):
    c = "c"
    rated = bands.filter(pl.col("decode_tok_s").is_not_null()) if "decode_tok_s" in bands.columns else bands.clear()
    if rated.is_empty():
        return _empty(ax, "No band has a decode rate: the captures carry no live arrival times.")
    rated = rated.sort(c).with_columns(median=pl.col("decode_tok_s").median().over(c))
    ax.plot(rated[c], rated["decode_tok_s"], "o", alpha=0.5, color="tab:blue", label=f"one band ({rated.height})")
    medians = rated.group_by(c, maintain_order=True).agg(pl.col("median").first())
    ax.plot(medians[c], medians["median"], "-", color="black", linewidth=1.2, label="median over bands")
    if baseline is not None:  # the judgement's one baseline (analysis.metrics.decode_cost), named as its cost names it
        words = baseline_words(baseline).removeprefix("baseline ")
        ax.axhline(
            0.5 * baseline["base_median"], color="black", linestyle=":", label=f"50% of the c=1 baseline ({words})"
        )
    else:
        base = medians.filter(pl.col(c) == 1)["median"]
        if base.len():
            ax.axhline(
                0.5 * base[0],
                color="black",
                linestyle=":",
                label=f"50% of c=1's median band ({0.5 * base[0]:,.0f} tok/s)",
            )
    _label_points(
        ax,
        [(x, r, str(p)) for p, x, r in _outliers(rated, "decode_tok_s").select("prompt_id", c, "decode_tok_s").rows()],
    )
    _set_c_axis(ax, rated[c].to_list())
    ax.set_ylim(bottom=0)
    ax.set_ylabel("median decode rate per request (tok/s)")
    ax.set_title("Decode rate while batched")
    _legend(ax)
    return ax


def _outliers(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """Rows beyond 1.5 IQR of their c's values (Tukey's fences), furthest first; none for a c with fewer than four rows.

    Examples
    --------
    >>> frame = pl.DataFrame({"c": [4] * 5, "rate": [100.0, 101.0, 99.0, 100.5, 20.0]})
    >>> _outliers(frame, "rate")["rate"].to_list()
    [20.0]
    """
    value, c = pl.col(column), "c"
    q1, q3 = value.quantile(0.25).over(c), value.quantile(0.75).over(c)
    spread = 1.5 * (q3 - q1)
    far = (value < q1 - spread) | (value > q3 + spread)
    distance = pl.max_horizontal(q1 - spread - value, value - q3 - spread)
    return frame.filter(far & (pl.len().over(c) >= 4)).sort(distance, descending=True)


_WIDTH_ORIGINS = {
    "log": ("server log (per step)", "o"),
    "metrics": ("running-requests gauge (samples)", "s"),
    "engine": ("engine counters (tokens / steps, at least)", "^"),
    "streams": ("streams decoding at once", "D"),
}


def plot_band_widths(widths: Any, *, ax=None):
    """Which batch widths the server formed in each band: one dot per (c, width), its area the share of
    the band's steps (or gauge samples) at that width, with the m = c line the band asked for.

    ``widths``: a run, or the rows of its :func:`analysis.width_table` (c, width, share).

    Parameters
    ----------
    widths : Run or DataFrame
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
    >>> ax = plot_band_widths(analysis.read_run("data/vllm-cpu/prefix-cache"))
    >>> ax.get_lines()[0].get_label()
    'm = c (the shape asked for)'
    """
    ax = _axes(ax)
    widths = drawn(widths, "plot_band_widths", run=width_table)
    if widths.is_empty():
        return _empty(ax, "The run recorded no batch widths (no server log, no gauge).")
    c = "c"
    cs = sorted(set(widths[c].to_list()))
    for (origin,), group in widths.group_by(["origin"], maintain_order=True):
        label, marker = _WIDTH_ORIGINS.get(origin, (str(origin), "x"))
        ax.scatter(
            group[c],
            group["width"],
            s=[20 + 400 * share for share in group["share"]],
            alpha=0.5,
            marker=marker,
            label=label,
        )
    ax.plot(cs, cs, color="black", linestyle="--", linewidth=1, label="m = c (the shape asked for)")
    _set_c_axis(ax, cs)
    ax.set_ylabel("batch width m formed")
    ax.set_title("Was the batch shape really served?")
    _legend(ax)
    return ax
