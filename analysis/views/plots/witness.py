"""One plot per function: ``ax=`` in (a new figure when None), the Axes out, never ``show()``.

The witness plots live here; the run plots in :mod:`analysis.views._run_plots`, exported here under the same names.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import polars as pl

from ..core._frames import as_polars
from ._drawing import LEGEND_LIMIT, _axes, _empty, _legend, _merge_identical, _set_c_axis
from ._run_plots import (plot_band_widths, plot_delta_before_fork, plot_flip_curve, plot_fork_tree, plot_margin_at_divergence, plot_margin_trace,
                         plot_run_decode_rate, plot_run_divergence, plot_unique_completions)

_RESULT_MARKERS = {"PASS": "o", "FAIL": "X", "UNMEASURABLE": "s"}


__all__ = ["LEGEND_LIMIT", "differing_env_knobs", "plot_band_widths", "plot_decode_rate", "plot_delta_before_fork", "plot_divergence", "plot_env_knobs", "plot_flip_curve", "plot_fork_tree", "plot_margin_at_divergence", "plot_margin_trace", "plot_run_decode_rate", "plot_run_divergence", "plot_unique_completions", "witness_label"]


def witness_label(source: str, version: int | None) -> str:
    """A short legend label: the file name and its witness_version.

    Examples
    --------
    >>> witness_label("data/aprender-lambda/witness@464c168e62.json", 2)
    'witness@464c168e62.json (v2)'
    """
    name = PurePosixPath(source.replace("\\", "/")).name or source
    return f"{name} (v{version})" if version is not None else name


def plot_divergence(bands: Any, *, witnesses: Any = None, ax=None):
    """divergence_at against c, one line per witness, declared_min marked, on an axis from 0.

    Marker shape shows the band's recorded result (o PASS, X FAIL, s UNMEASURABLE). A point that one drawn
    before it would hide (the same c and divergence_at; the results may differ) is nudged right of it and its
    line dashed; a witness whose every point repeats an earlier one's says whose in the legend. Given the
    ``witnesses`` frame, a band whose divergence_at reaches its reference's length never parted, and when no
    band parted the plot says so.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_divergence(analysis.read_witnesses("data/aprender-lambda").bands)
    >>> len(ax.get_lines()) >= 3
    True
    """
    ax = _axes(ax)
    bands = as_polars(bands)
    measured = bands.filter(pl.col("divergence_at").is_not_null())
    if measured.is_empty():
        return _empty(ax, "No band recorded a divergence_at.")
    series: dict[tuple, str] = {}  # each witness's points, for the legend of one that repeats them
    drawn: dict[tuple, int] = {}  # how many witnesses drew each (c, divergence_at) so far
    for (source, version), group in measured.sort("c").group_by(["source", "witness_version"], maintain_order=True):
        label, points = witness_label(source, version), tuple(group.select("c", "divergence_at").rows())
        nudges = [2 ** (0.08 * drawn.get(point, 0)) for point in points]  # on the log2 c axis: beside the point it would hide
        for point in points:
            drawn[point] = drawn.get(point, 0) + 1
        if points in series:
            label += f" (= {series[points]}, nudged right)"
        series.setdefault(points, witness_label(source, version))
        group = group.with_columns(x=pl.col("c") * pl.Series(nudges))
        line = ax.plot(group["x"], group["divergence_at"], "--" if max(nudges) > 1 else "-", alpha=0.7, label=label)[0]
        for result, marker in _RESULT_MARKERS.items():
            part = group.filter(pl.col("result") == result)
            if part.height:
                ax.plot(part["x"], part["divergence_at"], marker, color=line.get_color(), markersize=8, linestyle="none")
    declared_mins = sorted(set(measured["declared_min"].drop_nulls().to_list()))
    for declared in declared_mins:
        ax.axhline(declared, color="black", linestyle="--", linewidth=1, label=f"declared_min = {declared}")
    _set_c_axis(ax, measured["c"].to_list())
    # from 0, so that where the bands sit shows against the whole stream (not 60.5 to 67.5 around declared_min = 64)
    ax.set_ylim(0, max([*measured["divergence_at"].to_list(), *declared_mins, 1]) * 1.25)
    lengths = _never_parted_lengths(measured, witnesses)
    if lengths:
        ax.text(0.5, 0.4, f"Nothing parted: in every band ({measured.height}), slot 0 agrees\nwith the m=1 reference to its end "
                          f"({', '.join(map(str, lengths))} tokens).", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("divergence_at (tokens agreeing with m=1)")
    ax.set_title("Where each batch size parts from the m=1 reference")
    _legend(ax)
    return ax


def _never_parted_lengths(measured: pl.DataFrame, witnesses: Any) -> list[int]:
    """The reference lengths when every measured band's divergence_at reaches its witness's (none parted), else []."""
    if witnesses is None:
        return []
    tokens = as_polars(witnesses).select("source", "reference_tokens").unique("source")
    joined = measured.join(tokens, on="source", how="left")
    if joined["reference_tokens"].null_count() or (joined["divergence_at"] < joined["reference_tokens"]).any():
        return []
    return sorted(set(joined["reference_tokens"].to_list()))


def plot_decode_rate(bands: Any, *, ax=None):
    """Per-request decode rate against c per witness, with the 50%-of-c=1 line of each.

    Witnesses without rates (versions 1 and 2 never time requests) are named, not drawn.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_decode_rate(analysis.read_witnesses("data/aprender-lambda").bands)
    >>> ax.bia_empty
    'No decode rates recorded in 3 witness(es) (witness_version 1 and 2 do not time requests).'
    """
    ax = _axes(ax)
    bands = as_polars(bands)
    rated = bands.filter(pl.col("decode_tok_s").is_not_null() & (pl.col("decode_tok_s") > 0))
    if rated.is_empty():
        untimed = bands["source"].unique(maintain_order=True).to_list()
        return _empty(ax, "No decode rates recorded" + (f" in {len(untimed)} witness(es)" if untimed else "") + "\n(witness_version 1 and 2 do not time requests).")
    groups = ((witness_label(s, v), g) for (s, v), g in rated.sort("c").group_by(["source", "witness_version"], maintain_order=True))
    _rate_lines(ax, groups, "c")
    ax.set_ylabel("decode rate per request (tok/s)")
    ax.set_title("Per-request decode rate while batched")
    return ax


def _rate_lines(ax, groups, c_column: str) -> None:
    """One rate line per group against c, each with its 50%-of-c=1 line (S7's bar).

    The bar is drawn only where c=1 has exactly one rate (a witness has one band per c). Groups with the
    same rates are drawn once.
    """
    cs = []
    for label, group in _merge_identical((label, tuple(group.select(c_column, "decode_tok_s").rows()), group) for label, group in groups):
        line = ax.plot(group[c_column], group["decode_tok_s"], "o-", label=label)[0]
        base = group.filter(pl.col(c_column) == 1)["decode_tok_s"]
        if base.len() == 1:
            ax.axhline(0.5 * base[0], color=line.get_color(), linestyle=":", label=f"50% of c=1 ({0.5 * base[0]:.4g} tok/s)")
        cs += group[c_column].to_list()
    _set_c_axis(ax, cs)
    ax.set_ylim(bottom=0)
    _legend(ax)


def differing_env_knobs(witnesses: Any) -> pl.DataFrame:
    """The env knob columns whose values differ between witnesses (null counts as "unset").

    Examples
    --------
    >>> import analysis
    >>> differing_env_knobs(analysis.read_witnesses("data/aprender-lambda").witnesses).columns
    ['source', 'witness_version', 'env_BATCHED_PREFILL']
    """
    witnesses = as_polars(witnesses)
    knobs = [c for c in witnesses.columns if c.startswith("env_")]
    differing = [c for c in knobs if witnesses[c].fill_null("unset").n_unique() > 1]
    return witnesses.select("source", "witness_version", *differing)


def plot_env_knobs(witnesses: Any, *, ax=None):
    """A grid of the env knobs that differ between witnesses: one row per witness, value in each cell.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_env_knobs(analysis.read_witnesses("data/aprender-lambda").witnesses)
    >>> [t.get_text() for t in ax.get_xticklabels()]
    ['BATCHED_PREFILL']
    """
    ax = _axes(ax)
    table = differing_env_knobs(witnesses)
    knobs = [c for c in table.columns if c.startswith("env_")]
    if not knobs:
        return _empty(ax, f"All {as_polars(witnesses).height} witness(es) ran with the same env knobs.")
    values = sorted({v if v is not None else "unset" for k in knobs for v in table[k].to_list()})
    colour = {v: i for i, v in enumerate(values)}
    grid = [[colour[v if v is not None else "unset"] for v in row] for row in table.select(knobs).iter_rows()]
    ax.imshow(grid, cmap="Pastel1", aspect="auto", vmin=0, vmax=max(8, len(values)))
    for r, row in enumerate(table.select(knobs).iter_rows()):
        for k, value in enumerate(row):
            ax.text(k, r, "unset" if value is None else value, ha="center", va="center")
    ax.set_xticks(range(len(knobs)))
    ax.set_xticklabels([k.removeprefix("env_") for k in knobs])
    ax.set_yticks(range(table.height))
    ax.set_yticklabels([witness_label(s, v) for s, v in table.select("source", "witness_version").iter_rows()])
    ax.set_title("Kernel env knobs that differ between witnesses")
    return ax

