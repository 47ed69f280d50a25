"""The report's figure panels: the witness set's and each run's figures, two panels a figure, each with its alt text."""

from __future__ import annotations

from typing import Any

import polars as pl

from ...run import band_table, flip_table, reference_margins, slot_table, width_table
from ...studies import judge
from ._drawing import panel_grid
from .drift import drift_drawn, plot_delta_before_fork
from .margins import partings, plot_flip_curve, plot_margin_at_divergence, plot_margin_trace
from .parity import DRAWN_COLUMNS, plot_divergence, plot_unique_completions
from .rates import plot_band_widths, plot_decode_rate
from .witness import plot_env_knobs


def witness_figures(ws) -> list[tuple[Any, str]]:
    """The witness set's figures with their alt text: divergence and decode rate against c, and the env knobs that differ.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.

    Returns
    -------
    list of tuple of (matplotlib.figure.Figure, str)
    """
    fig, axes = panel_grid(2)
    plot_divergence(ws, ax=axes[0])
    plot_decode_rate(ws, ax=axes[1])
    out = [
        (
            fig,
            "divergence_at against batch size c for each witness, with declared_min marked; "
            "per-request decode rate against c, with the 50%-of-c=1 line",
        )
    ]
    witnesses = ws.to_backend("polars").witnesses
    knobs = plot_env_knobs(witnesses)  # its own figure, as wide as the knobs it shows
    return [*out, (knobs.figure, "kernel env knobs that differ between witnesses")]


# What the run's figures read of each batched request: what the divergence figure draws, and the margin where it parted.
_FIGURE_COLUMNS = (*DRAWN_COLUMNS, "reference_margin")


def run_figures(run, *, epsilon: float, reference: Any = "ref1", judgement: Any = None) -> list[tuple[Any, str]]:
    """A run's four figures of two panels each, for :func:`analysis.views.html.show_figure`.

    Where requests parted and the margin there; the margin along each reference and the drift
    before the fork (one colour per c); P(flip | margin) and the widths formed; decode rate and
    unique completions against c.

    Parameters
    ----------
    run : Run
        The run.
    epsilon : float
        The near-tie epsilon drawn on the margin plots.
    reference : str or Run
        What batched requests are compared with.
    judgement : Judgement, optional
        The run's judgement, whose verdict and counts the divergence panel restates; ``analysis.judge(run)`` when not
        given and the reference is ref #1 (what the judgement compares with), none otherwise.

    Returns
    -------
    list of (Figure, str)
        Each figure with its alt text, which names the run.
    """

    slots, bands = (
        slot_table(run, epsilon=epsilon, reference=reference, columns=_FIGURE_COLUMNS, lazy=True),  # a scan
        band_table(run, epsilon=epsilon, reference=reference),
    )
    if judgement is None and isinstance(reference, str) and reference == "ref1":
        judgement = judge(run)
    margins, flips, deltas = run_curves(run, reference)
    parted = partings(slots)
    pairs = [
        (
            lambda ax: plot_divergence(slots, declared_min=run.declared_min, judgement=judgement, ax=ax),
            lambda ax: plot_margin_at_divergence(slots, epsilon=epsilon, ax=ax),
            "where each batched request parted from ref #1, and the reference margin there",
        ),
        (
            lambda ax: plot_margin_trace(margins, parted, epsilon=epsilon, ax=ax),
            lambda ax: plot_delta_before_fork(deltas, ax=ax),
            "the reference margin at every step with the divergences marked, and the logprob drift before the fork",
        ),
        (
            lambda ax: plot_flip_curve(flips, ax=ax),
            lambda ax: plot_band_widths(width_table(run), ax=ax),
            "P(flip | margin), and the batch widths the server formed in each band",
        ),
        (
            lambda ax: plot_decode_rate(bands, ax=ax),
            lambda ax: plot_unique_completions(bands, ax=ax),
            "decode rate against c, unique completions against c",
        ),
    ]
    out = []
    for left, right, alt in pairs:
        fig, axes = panel_grid(2)
        left(axes[0])
        right(axes[1])
        out.append((fig, f"{run.label}: {alt}"))
    return out


def run_curves(run, reference: Any = "ref1") -> tuple[dict[str, list[float | None]], pl.DataFrame, pl.DataFrame]:
    """For the report's plots: each prompt's reference margin per step, P(flip | margin) over the run's
    batched requests, and the drift before each fork as its figure draws it (:func:`analysis.plots.drift_drawn`: each request's
    ``|delta logprob|`` per step, or past a few requests each c's largest, :func:`analysis.run.drift_envelope`).

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with.

    Returns
    -------
    tuple of (dict, polars.DataFrame, polars.DataFrame)
    """
    return (
        reference_margins(run, reference=reference),
        flip_table(run, reference=reference),
        drift_drawn(run, reference),
    )
