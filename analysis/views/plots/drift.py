"""The parity figure of drift: per-step |delta logprob| of batched requests against the reference, up to their fork,
one line per request or, past the legend's limit, one per batch size c."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from ...run import Run, drift_table
from ._drawing import (
    LEGEND_LIMIT,
    _axes,
    _empty,
    _label_points,
    _legend,
    _merge_identical,
    drawn,
)


def _drifts(run: Run) -> pl.DataFrame:
    """:func:`analysis.drift_table` with each request's ``c``, which its label names ("p0 c=4 slot 2")."""
    return drift_table(run).with_columns(c=pl.col("label").str.extract(r"c=(\d+) slot \d+$", 1).cast(pl.Int64))


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
    _legend(ax, ncol=2)
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


def _c_colours(cs: Sequence[int]) -> dict[int, Any]:
    """One colour per batch size c, the same in every run figure."""
    import matplotlib

    palette = matplotlib.colormaps["viridis"]
    ordered = sorted(set(cs))
    return {c: palette(k / max(1, len(ordered) - 1) * 0.9) for k, c in enumerate(ordered)}
