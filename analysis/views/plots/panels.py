"""The report's figures: each shown as a PNG with alt text, for the witnesses and for each run."""

from __future__ import annotations

from typing import Any

import polars as pl

from ..core._html import render



def show_figure(ax_or_figure, alt: str) -> None:
    """Display a figure as a PNG whose alt text describes it, then close it.

    Parameters
    ----------
    ax_or_figure : matplotlib Axes or Figure
        What to show; a panel the plot functions left empty (``ax.bia_empty``) is removed and its
        reason said in words below, and a figure with nothing left is not drawn at all.
    alt : str
        The image's alt text in the exported HTML, for screen readers and tests.
    """
    from IPython.display import HTML, Image, display

    png, notes = _png(ax_or_figure)
    if png is not None:
        display(Image(data=png, format="png", metadata={"alt": alt}))
    if notes:
        display(HTML(render("notes.html.j2", notes=notes)))


def _png(ax_or_figure) -> tuple[bytes | None, list[str]]:
    """A figure as PNG bytes (None when nothing is left to draw) and the reasons of the empty panels it lost; closed after."""
    from io import BytesIO

    import matplotlib.pyplot as plt

    figure = getattr(ax_or_figure, "figure", ax_or_figure)
    notes = [ax.bia_empty for ax in figure.axes if getattr(ax, "bia_empty", None)]
    for ax in [ax for ax in figure.axes if getattr(ax, "bia_empty", None)]:
        figure.delaxes(ax)
    png = None
    if figure.axes:
        buffer = BytesIO()
        figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        png = buffer.getvalue()
    plt.close(figure)
    return png, notes


def figures_html(figures: list[tuple[Any, str]], summary: str, *, open_: bool = False) -> str:
    """Figures as one collapsed ``<details>`` of PNGs with their alt text (escaped), so a long report reads to its end.

    Each figure is drawn as :func:`show_figure` draws it (empty panels removed, their reasons said below) and closed.

    Parameters
    ----------
    figures : list of (Axes or Figure, str)
        The figures and their alt texts.
    summary : str
        What the collapsed line says (escaped).
    open_ : bool
        Start expanded.

    Returns
    -------
    str
        HTML; empty when there is no figure.
    """
    import base64
    from html import escape

    parts = []
    for ax_or_figure, alt in figures:
        png, notes = _png(ax_or_figure)
        if png is not None:
            parts.append(f'<img class="bia-figure" alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">')
        if notes:
            parts.append(render("notes.html.j2", notes=notes))
    if not parts:
        return ""
    return f'<details class="bia-figures"{" open" if open_ else ""}><summary>{escape(summary)}</summary>{"".join(parts)}</details>'


def witness_figures(ws) -> list[tuple[Any, str]]:
    """The witness set's figures with their alt text: divergence and decode rate against c, and the env knobs that differ."""
    import matplotlib.pyplot as plt

    from ..views import plots

    bands = ws.to_backend("polars").bands
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    plots.plot_divergence(bands, witnesses=ws.to_backend("polars").witnesses, ax=axes[0])
    plots.plot_decode_rate(bands, ax=axes[1])
    out = [(fig, "divergence_at against batch size c for each witness, with declared_min marked; "
                 "per-request decode rate against c, with the 50%-of-c=1 line")]
    witnesses = ws.to_backend("polars").witnesses
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * max(1, min(witnesses.height, 20))))
    plots.plot_env_knobs(witnesses, ax=ax)
    return [*out, (fig, "kernel env knobs that differ between witnesses")]


def run_figures(run, *, epsilon: float, reference: Any = "ref1") -> list[tuple[Any, str]]:
    """A run's four figures of two panels each, for :func:`show_figure`.

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

    Returns
    -------
    list of (Figure, str)
        Each figure with its alt text, which names the run.
    """
    import matplotlib.pyplot as plt

    from ..views import plots
    from ..run import band_table, slot_table, width_table

    slots, bands = slot_table(run, epsilon=epsilon, reference=reference), band_table(run, epsilon=epsilon, reference=reference)
    margins, flips, deltas = run_curves(run, reference)
    deltas = deltas.with_columns(band_c=pl.col("label").str.extract(r"c=(\d+) slot \d+$", 1).cast(pl.Int64))  # drift_table's label names c
    parted = {p: g["divergence_at"].drop_nulls().to_list() for (p,), g in slots.group_by(["prompt_id"])}
    panels = [
        (lambda ax: plots.plot_run_divergence(slots, declared_min=run.declared_min, ax=ax),
         lambda ax: plots.plot_margin_at_divergence(slots, epsilon=epsilon, ax=ax),
         "where each batched request parted from ref #1, and the reference margin there"),
        (lambda ax: plots.plot_margin_trace(margins, parted, epsilon=epsilon, ax=ax), lambda ax: plots.plot_delta_before_fork(deltas, ax=ax),
         "the reference margin at every step with the divergences marked, and the logprob drift before the fork"),
        (lambda ax: plots.plot_flip_curve(flips, ax=ax), lambda ax: plots.plot_band_widths(width_table(run), ax=ax),
         "P(flip | margin), and the batch widths the server formed in each band"),
        (lambda ax: plots.plot_run_decode_rate(bands, ax=ax), lambda ax: plots.plot_unique_completions(bands, ax=ax),
         "decode rate against c, unique completions against c"),
    ]
    out = []
    for left, right, alt in panels:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        left(axes[0])
        right(axes[1])
        out.append((fig, f"{run.label}: {alt}"))
    return out


def run_curves(run, reference: Any = "ref1") -> tuple[dict[str, list[float | None]], pl.DataFrame, pl.DataFrame]:
    """For the report's plots: each prompt's reference margin per step, P(flip | margin) over the run's
    batched requests, and per-step ``|delta logprob|`` before each fork (see :mod:`analysis.run`)."""
    from ..run import drift_table, flip_table, reference_margins

    return reference_margins(run, reference=reference), flip_table(run, reference=reference), drift_table(run, reference=reference)
