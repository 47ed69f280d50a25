"""Figures as the report shows them: PNGs with alt text, the panels the plots left empty said in words below."""

from __future__ import annotations

import base64
from typing import Any

from .blocks import render


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
    from html import escape

    parts = []
    for ax_or_figure, alt in figures:
        png, notes = _png(ax_or_figure)
        if png is not None:
            parts.append(
                f'<img class="bia-figure" alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
            )
        if notes:
            parts.append(render("notes.html.j2", notes=notes))
    if not parts:
        return ""
    return f'<details class="bia-figures"{" open" if open_ else ""}><summary>{escape(summary)}</summary>{"".join(parts)}</details>'


def png_base64(ax_or_figure) -> str:
    """A figure as base64 PNG (empty when nothing is left to draw), for an ``<img>`` of a self-contained page; closed after.

    Parameters
    ----------
    ax_or_figure : matplotlib.axes.Axes or matplotlib.figure.Figure
        What to render.

    Returns
    -------
    str
    """
    png, _ = _png(ax_or_figure)
    return base64.b64encode(png).decode("ascii") if png is not None else ""
