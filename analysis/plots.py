"""One plot per function: ``ax=`` in (a new figure when None), the Axes out, never ``show()``."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import polars as pl

_RESULT_MARKERS = {"PASS": "o", "FAIL": "X", "UNMEASURABLE": "s"}


def _axes(ax):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(7, 4))
    return ax


def _polars(frame: Any) -> pl.DataFrame:
    return frame if isinstance(frame, pl.DataFrame) else pl.from_pandas(frame)


def witness_label(source: str, version: int | None) -> str:
    """A short legend label: the file name and its witness_version.

    Examples
    --------
    >>> witness_label("data/aprender-lambda/witness@464c168e62.json", 2)
    'witness@464c168e62.json (v2)'
    """
    name = PurePosixPath(source.replace("\\", "/")).name or source
    return f"{name} (v{version})" if version is not None else name


def _set_c_axis(ax, cs: list[int]) -> None:
    if not cs:
        return
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(cs)))
    ax.set_xticklabels([str(c) for c in sorted(set(cs))])
    ax.minorticks_off()
    ax.set_xlabel("batch size c (concurrent identical requests)")


def _empty(ax, message: str):
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])
    return ax


def plot_divergence(bands: Any, *, ax=None):
    """divergence_at against c, one line per witness, declared_min marked.

    Marker shape shows the band's recorded result (o PASS, X FAIL, s UNMEASURABLE).

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_divergence(analysis.read_witnesses("data/aprender-lambda").bands)
    >>> len(ax.get_lines()) >= 3
    True
    """
    ax = _axes(ax)
    bands = _polars(bands)
    measured = bands.filter(pl.col("divergence_at").is_not_null())
    if measured.is_empty():
        return _empty(ax, "No band recorded a divergence_at.")
    for (source, version), group in measured.sort("c").group_by(["source", "witness_version"], maintain_order=True):
        line = ax.plot(group["c"], group["divergence_at"], "-", alpha=0.7, label=witness_label(source, version))[0]
        for result, marker in _RESULT_MARKERS.items():
            part = group.filter(pl.col("result") == result)
            if part.height:
                ax.plot(part["c"], part["divergence_at"], marker, color=line.get_color(), markersize=8, linestyle="none")
    for declared in sorted(set(measured["declared_min"].drop_nulls().to_list())):
        ax.axhline(declared, color="black", linestyle="--", linewidth=1, label=f"declared_min = {declared}")
    _set_c_axis(ax, measured["c"].to_list())
    ax.set_ylabel("divergence_at (tokens agreeing with m=1)")
    ax.set_title("Where each batch size parts from the m=1 reference")
    ax.legend(fontsize="small", loc="best")
    return ax


def plot_decode_rate(bands: Any, *, ax=None):
    """Per-request decode rate against c per witness, with the 50%-of-c=1 line of each.

    Witnesses without rates (versions 1 and 2 never time requests) are named, not drawn.
    """
    ax = _axes(ax)
    bands = _polars(bands)
    rated = bands.filter(pl.col("decode_tok_s").is_not_null() & (pl.col("decode_tok_s") > 0))
    if rated.is_empty():
        untimed = bands["source"].unique(maintain_order=True).to_list()
        return _empty(ax, "No decode rates recorded" + (f" in {len(untimed)} witness(es)" if untimed else "") + "\n(witness_version 1 and 2 do not time requests).")
    for (source, version), group in rated.sort("c").group_by(["source", "witness_version"], maintain_order=True):
        line = ax.plot(group["c"], group["decode_tok_s"], "o-", label=witness_label(source, version))[0]
        base = group.filter(pl.col("c") == 1)["decode_tok_s"]
        if base.len() == 1:
            ax.axhline(0.5 * base[0], color=line.get_color(), linestyle=":", label=f"50% of c=1 ({0.5 * base[0]:.4g} tok/s)")
    _set_c_axis(ax, rated["c"].to_list())
    ax.set_ylim(bottom=0)
    ax.set_ylabel("decode rate per request (tok/s)")
    ax.set_title("Per-request decode rate while batched")
    ax.legend(fontsize="small", loc="best")
    return ax


def differing_env_knobs(witnesses: Any) -> pl.DataFrame:
    """The env knob columns whose values differ between witnesses (null counts as "unset").

    Examples
    --------
    >>> import analysis
    >>> differing_env_knobs(analysis.read_witnesses("data/aprender-lambda").witnesses).columns
    ['source', 'witness_version', 'env_BATCHED_PREFILL']
    """
    witnesses = _polars(witnesses)
    knobs = [c for c in witnesses.columns if c.startswith("env_")]
    differing = [c for c in knobs if witnesses[c].fill_null("unset").n_unique() > 1]
    return witnesses.select("source", "witness_version", *differing)


def plot_env_knobs(witnesses: Any, *, ax=None):
    """A grid of the env knobs that differ between witnesses: one row per witness, value in each cell."""
    ax = _axes(ax)
    table = differing_env_knobs(witnesses)
    knobs = [c for c in table.columns if c.startswith("env_")]
    if not knobs:
        return _empty(ax, f"All {_polars(witnesses).height} witness(es) ran with the same env knobs.")
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
