"""One plot per function: ``ax=`` in (a new figure when None), the Axes out, never ``show()``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

import polars as pl

from ._frames import as_polars

_RESULT_MARKERS = {"PASS": "o", "FAIL": "X", "UNMEASURABLE": "s"}


def _axes(ax):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(7, 4))
    return ax



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
    bands = as_polars(bands)
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
    bands = as_polars(bands)
    rated = bands.filter(pl.col("decode_tok_s").is_not_null() & (pl.col("decode_tok_s") > 0))
    if rated.is_empty():
        untimed = bands["source"].unique(maintain_order=True).to_list()
        return _empty(ax, "No decode rates recorded" + (f" in {len(untimed)} witness(es)" if untimed else "") + "\n(witness_version 1 and 2 do not time requests).")
    groups = ((witness_label(s, v), g) for (s, v), g in rated.sort("c").group_by(["source", "witness_version"], maintain_order=True))
    _rate_lines(ax, groups, "c", single_base=True)
    ax.set_ylabel("decode rate per request (tok/s)")
    ax.set_title("Per-request decode rate while batched")
    return ax


def _rate_lines(ax, groups, c_column: str, *, single_base: bool) -> None:
    """One rate line per group against c, each with its 50%-of-c=1 line (S7's bar).

    ``single_base`` draws the bar only where c=1 has exactly one rate (a witness has one band per c).
    """
    cs = []
    for label, group in groups:
        line = ax.plot(group[c_column], group["decode_tok_s"], "o-", label=label)[0]
        base = group.filter(pl.col(c_column) == 1)["decode_tok_s"]
        if base.len() == 1 or (base.len() and not single_base):
            ax.axhline(0.5 * base[0], color=line.get_color(), linestyle=":", label=f"50% of c=1 ({0.5 * base[0]:.4g} tok/s)")
        cs += group[c_column].to_list()
    _set_c_axis(ax, cs)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small", loc="best")


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
    """A grid of the env knobs that differ between witnesses: one row per witness, value in each cell."""
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


# --- runs: per-request parity and rates --------------------------------------------------------------


def plot_run_divergence(slots: Any, *, declared_min: int | None = None, ax=None):
    """Where each batched request parts from ref #1, against c: o parted, ^ never parted (plotted at its length)."""
    ax = _axes(ax)
    slots = as_polars(slots)
    if slots.is_empty():
        return _empty(ax, "No batched requests in the run.")
    for (prompt,), group in slots.group_by(["prompt_id"], maintain_order=True):
        parted = group.filter(pl.col("diverged"))
        held = group.filter(~pl.col("diverged"))
        line = ax.plot(parted["band_c"], parted["agree_to"], "o", alpha=0.7, label=f"{prompt}: parted")[0]
        ax.plot(held["band_c"], held["agree_to"], "^", color=line.get_color(), alpha=0.7, label=f"{prompt}: never parted")
    if declared_min is not None:
        ax.axhline(declared_min, color="black", linestyle="--", linewidth=1, label=f"declared_min = {declared_min}")
    _set_c_axis(ax, slots["band_c"].to_list())
    ax.set_ylabel("tokens agreeing with m=1 (0-based divergence)")
    ax.set_title("Divergence from the m=1 reference, per request")
    ax.legend(fontsize="small", loc="best")
    return ax


def plot_margin_at_divergence(slots: Any, *, epsilon: float = 0.05, ax=None):
    """The reference's top-1/top-2 margin where each request parted, with the near-tie epsilon."""
    ax = _axes(ax)
    parted = as_polars(slots).filter(pl.col("diverged") & pl.col("reference_margin").is_not_null())
    if parted.is_empty():
        return _empty(ax, "No request parted where the reference had two candidates.")
    ax.plot(parted["band_c"], parted["reference_margin"], "o", alpha=0.7, label="reference margin at the divergence")
    ax.axhline(epsilon, color="red", linestyle="--", label=f"epsilon = {epsilon:g}")
    _set_c_axis(ax, parted["band_c"].to_list())
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylabel("top-1 minus top-2 logprob")
    ax.set_title("Was the call close where the streams parted?")
    ax.legend(fontsize="small", loc="best")
    return ax


def plot_margin_trace(margins: Sequence[float | None] | Mapping[str, Sequence[float | None]], divergences: Sequence[int] | Mapping[str, Sequence[int]] = (),
                      *, epsilon: float = 0.05, ax=None):
    """The reference's margin at every step, with the steps where batched requests parted marked.

    ``margins`` is one reference's per-step margins, or a mapping of prompt to margins (one line
    each); ``divergences`` then maps each prompt to its parting steps.
    """
    ax = _axes(ax)
    traces = dict(margins) if isinstance(margins, Mapping) else {"": margins}
    parted = dict(divergences) if isinstance(divergences, Mapping) else {"": divergences}
    drawn = marked = False
    for prompt, trace in traces.items():
        steps = [i for i, m in enumerate(trace) if m is not None]
        if not steps:
            continue
        label = f"{prompt}: reference top-1 minus top-2" if prompt else "reference top-1 minus top-2"
        line = ax.plot(steps, [trace[i] for i in steps], "-", linewidth=1, label=label)[0]
        for step in sorted(set(parted.get(prompt, ()))):
            ax.axvline(step, color=line.get_color() if prompt else "orange", alpha=0.6, linestyle=":" if prompt else "-",
                       label=None if marked else "a request parted here")
            marked = True
        drawn = True
    if not drawn:
        return _empty(ax, "The reference has no step with two candidates.")
    ax.axhline(epsilon, color="red", linestyle="--", linewidth=1, label=f"epsilon = {epsilon:g}")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("step (0-based)")
    ax.set_ylabel("margin (logprob)")
    ax.set_title("Near-ties along the reference")
    ax.legend(fontsize="small", loc="best")
    return ax


def plot_band_widths(widths: Any, *, ax=None):
    """Which batch widths the server formed in each band: one dot per (c, width), its area the share of
    the band's steps (or gauge samples) at that width, with the m = c line the band asked for.

    ``widths``: rows of :func:`analysis.run.width_table` (band_c, width, share).
    """
    ax = _axes(ax)
    widths = as_polars(widths)
    if widths.is_empty():
        return _empty(ax, "The run recorded no batch widths (no server log, no gauge).")
    cs = sorted(set(widths["band_c"].to_list()))
    for (origin,), group in widths.group_by(["origin"], maintain_order=True):
        label = "server log (per step)" if origin == "log" else "running-requests gauge (samples)"
        ax.scatter(group["band_c"], group["width"], s=[20 + 400 * share for share in group["share"]], alpha=0.5,
                   marker="o" if origin == "log" else "s", label=label)
    ax.plot(cs, cs, color="black", linestyle="--", linewidth=1, label="m = c (the shape asked for)")
    _set_c_axis(ax, cs)
    ax.set_ylabel("batch width m formed")
    ax.set_title("Was the batch shape really served?")
    ax.legend(fontsize="small", loc="best")
    return ax


def plot_delta_before_fork(deltas: Any, *, ax=None):
    """Per-step |delta logprob| of batched requests against the reference, up to their fork.

    ``deltas``: rows of (label, step, abs_delta).
    """
    ax = _axes(ax)
    deltas = as_polars(deltas)
    if deltas.is_empty():
        return _empty(ax, "No agreeing step to compare.")
    for (label,), group in deltas.group_by(["label"], maintain_order=True):
        ax.plot(group["step"], group["abs_delta"].clip(lower_bound=1e-12), ".-", linewidth=0.8, markersize=3, label=str(label))
    ax.set_yscale("log")
    ax.set_xlabel("step (0-based)")
    ax.set_ylabel("|delta logprob| (zeros drawn at 1e-12)")
    ax.set_title("Logprob drift before the fork")
    ax.legend(fontsize="x-small", loc="best", ncol=2)
    return ax


def plot_flip_curve(curve: Any, *, ax=None):
    """Empirical P(flip | reference margin) per margin bin, with the steps behind each point."""
    ax = _axes(ax)
    curve = as_polars(curve).filter(pl.col("steps") > 0)
    if curve.is_empty():
        return _empty(ax, "No step at risk with a reference margin.")
    labels = [f"[{lo:g}, {hi:g})" for lo, hi in curve.select("margin_low", "margin_high").iter_rows()]
    ax.bar(range(curve.height), curve["p_flip"], color="tab:purple")
    for k, (p, n) in enumerate(curve.select("p_flip", "steps").iter_rows()):
        ax.text(k, p, f"n={n}", ha="center", va="bottom", fontsize="small")
    ax.set_xticks(range(curve.height))
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("reference margin bin")
    ax.set_ylabel("P(flip)")
    ax.set_title("How often a step flips, by how close the reference's call was")
    return ax


def plot_unique_completions(bands: Any, *, ax=None):
    """Unique completions per band against c."""
    ax = _axes(ax)
    bands = as_polars(bands)
    if bands.is_empty():
        return _empty(ax, "No bands in the run.")
    for (prompt,), group in bands.sort("band_c").group_by(["prompt_id"], maintain_order=True):
        ax.plot(group["band_c"], group["unique_completions"], "o-", label=str(prompt))
    _set_c_axis(ax, bands["band_c"].to_list())
    ax.set_ylim(bottom=0)
    ax.set_ylabel("unique completions in the band")
    ax.set_title("How many different answers one prompt got")
    ax.legend(fontsize="small", loc="best")
    return ax


def plot_fork_tree(branches: Sequence[tuple[str, int]], *, at: int, ax=None):
    """The fork: each token taken at position ``at`` and how many streams took it (as text)."""
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


def plot_run_decode_rate(bands: Any, *, ax=None):
    """Band median decode rate against c per prompt, with the 50%-of-c=1 line; untimed bands are named, not drawn."""
    ax = _axes(ax)
    bands = as_polars(bands)
    rated = bands.filter(pl.col("decode_tok_s").is_not_null()) if "decode_tok_s" in bands.columns else bands.clear()
    if rated.is_empty():
        return _empty(ax, "No band has a decode rate: the captures carry no live arrival times.")
    groups = ((str(p), g) for (p,), g in rated.sort("band_c").group_by(["prompt_id"], maintain_order=True))
    _rate_lines(ax, groups, "band_c", single_base=False)
    ax.set_ylabel("median decode rate per request (tok/s)")
    ax.set_title("Decode rate while batched")
    return ax
