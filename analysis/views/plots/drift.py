"""The parity figure of drift: per-step |delta logprob| of batched requests against the reference, up to their fork,
one line per request or, past the legend's limit, one per batch size c."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from ...run import Run, drift_by_c, drift_envelope, drift_table, drift_with_c
from ._drawing import (
    LEGEND_LIMIT,
    _axes,
    _empty,
    _label_points,
    _legend,
    _merge_identical,
    drawn,
)


def drift_drawn(run: Run, reference: Any = "ref1") -> pl.DataFrame:
    """What the drift figure draws of a run: past ``LEGEND_LIMIT - 1`` drifting requests, one line per c from
    :func:`analysis.run.drift_by_c` (a size set by the steps and the c's, not the requests); else each request's
    :func:`analysis.drift_table` rows with its ``c``, which its label names ("p0 c=4 slot 2").

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with.

    Returns
    -------
    polars.DataFrame
    """
    envelope = drift_by_c(run, reference=reference)
    if envelope.filter(pl.col("step").is_null())["requests"].sum() > LEGEND_LIMIT - 1:
        return envelope
    return drift_with_c(drift_table(run, reference=reference))


def plot_delta_before_fork(deltas: Any, *, ax=None):
    """Per-step ``|delta logprob|`` of batched requests against the reference, up to their fork.

    ``deltas``: a run (what :func:`analysis.plots.drift_drawn` gives of it), rows of (label, step, abs_delta) and ``c`` when known, or
    their :func:`analysis.run.drift_envelope`. Past ``LEGEND_LIMIT - 1`` requests with ``c``, one line per c (the largest
    drift over its requests at each step) and the request that drifts furthest named; else one line per request.

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
    deltas = drawn(deltas, "plot_delta_before_fork", run=drift_drawn)
    many = "c" in deltas.columns and "label" in deltas.columns and deltas["label"].n_unique() > LEGEND_LIMIT - 1
    envelope = drift_envelope(deltas) if many else deltas if "requests" in deltas.columns else None
    steps = deltas.height if envelope is None else int(envelope.filter(pl.col("step").is_not_null())["requests"].sum())
    if not steps:
        return _empty(ax, "No agreeing step to compare.")
    if deltas["abs_delta"].max() == 0:
        return _empty(
            ax, f"No drift: every one of the {steps} agreeing steps has the reference's logprob, bit for bit."
        )
    if envelope is not None:
        _drift_by_c(ax, envelope)
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


def _drift_by_c(ax, envelope: pl.DataFrame) -> None:
    """One line per c (its :func:`analysis.run.drift_envelope`): the largest |delta| over that c's requests at each step;
    the furthest request named."""
    per_c = envelope.filter(pl.col("step").is_null())
    colours = _c_colours(per_c["c"].to_list())
    requests = dict(per_c.select("c", "requests").rows())
    series = (
        ((c, requests[c]), tuple(g.select("step", "abs_delta").rows()), (c, g))
        for (c,), g in envelope.filter(pl.col("step").is_not_null()).group_by(["c"], maintain_order=True)
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
    worst = per_c.sort(["abs_delta", "worst_step", "worst_label"], descending=[True, False, False]).row(0, named=True)
    _label_points(ax, [(worst["worst_step"], worst["abs_delta"], str(worst["worst_label"]))])


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
