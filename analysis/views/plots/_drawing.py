"""What every plot draws with: its input read alike (a Run, a WitnessSet, a History or a frame), the concurrency column,
a new figure when no Axes is given, the log2 c axis, the panel that says why it is empty, the legend kept inside its axes,
outliers named on the plot, and series that would hide each other merged."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, Literal, overload

import polars as pl

from ...run import Run
from ...studies import History
from ...witness import WitnessSet


def as_frame(value: Any) -> pl.DataFrame | None:
    """A polars frame as is, a pandas frame as polars (a legacy ``band_c`` column read as ``c``); None for anything else.

    Parameters
    ----------
    value : object
        Anything.

    Returns
    -------
    polars.DataFrame or None
    """
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(value, pandas.DataFrame):
        value = pl.from_pandas(value)
    if not isinstance(value, pl.DataFrame):
        return None
    if "band_c" in value.columns and "c" not in value.columns:  # legacy: run tables bia wrote before run_version 2
        value = value.rename({"band_c": "c"})  # legacy column name
    return value


@overload
def drawn(
    value: Any,
    plot: str,
    *,
    run: Callable[..., Any] | None = None,
    witnesses: Callable[[WitnessSet], pl.DataFrame] | None = None,
    history: Callable[[History], pl.DataFrame] | None = None,
    frame: str = "",
    lazy: Literal[False] = False,
) -> pl.DataFrame: ...


@overload
def drawn(
    value: Any,
    plot: str,
    *,
    run: Callable[..., Any] | None = None,
    witnesses: Callable[[WitnessSet], pl.DataFrame] | None = None,
    history: Callable[[History], pl.DataFrame] | None = None,
    frame: str = "",
    lazy: Literal[True],
) -> pl.DataFrame | pl.LazyFrame: ...


def drawn(
    value: Any,
    plot: str,
    *,
    run: Callable[..., Any] | None = None,
    witnesses: Callable[[WitnessSet], pl.DataFrame] | None = None,
    history: Callable[[History], pl.DataFrame] | None = None,
    frame: str = "",
    lazy: bool = False,
) -> pl.DataFrame | pl.LazyFrame:
    """What a plot draws from its input: a :class:`~analysis.Run`'s table (``run(value)``), a
    :class:`~analysis.WitnessSet`'s (``witnesses(value)``), a :class:`~analysis.History`'s (``history(value)``), or a frame as
    given (polars or pandas). Anything else is a TypeError naming what the plot takes: a path, say, is not read for the caller.

    Parameters
    ----------
    value : object
        What the plot was given.
    plot : str
        The plot's name, for the error.
    run : callable, optional
        The run's table the plot draws (``slot_table``, say); None: the plot takes no run.
    witnesses : callable, optional
        The witness set's table the plot draws; None: it takes no witness set.
    history : callable, optional
        The history's table the plot draws; None: it takes no history.
    frame : str, default ""
        The frame's name in the error; by default the run's table's.
    lazy : bool, default False
        The plot reads a scan: a ``polars.LazyFrame`` given is given back as it is (else collected), and a run's table
        is asked for as a scan (``run(value, lazy=True)``).

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> from analysis.run import slot_table
    >>> drawn("data/experiment-cpu/default", "plot_margin_at_divergence", run=slot_table)
    Traceback (most recent call last):
    ...
    TypeError: plot_margin_at_divergence draws a Run or the frame of analysis.slot_table(run), not a str: read the run first, plot_margin_at_divergence(analysis.read_run('data/experiment-cpu/default'))
    """
    if run is not None and isinstance(value, Run):
        return run(value, lazy=True) if lazy else run(value)
    if isinstance(value, pl.LazyFrame):
        return value if lazy else value.collect()
    if witnesses is not None and isinstance(value, WitnessSet):
        return witnesses(value)
    if history is not None and isinstance(value, History):
        return history(value)
    as_polars = as_frame(value)
    if as_polars is not None:
        return as_polars
    kinds = [
        kind for kind, given in (("Run", run), ("WitnessSet", witnesses), ("History", history)) if given is not None
    ]
    tables = frame or (f"analysis.{run.__name__}(run)" if run is not None else "its bands")
    said = ", a ".join(kinds)
    hint = (
        f": read the run first, {plot}(analysis.read_run({value!r}))" if isinstance(value, (str, os.PathLike)) else ""
    )
    raise TypeError(f"{plot} draws a {said} or the frame of {tables}, not a {type(value).__name__}{hint}")


def _axes(ax):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(7, 4))
    return ax


NOTEBOOK_WIDTH = (
    9.6  # inches: 960 px at the inline backend's 100 dpi, within the 968 px JupyterLab 4 gives an output at
)
# 1400 px wide with its file browser open, so a figure is shown at its own size, not shrunk (issue 44)
SMALLEST_FONT = "small"  # 8.3 pt: 11.6 px at 100 dpi; no text bia draws is smaller


def panel_grid(n: int, *, height: float = 4.0, width: float = NOTEBOOK_WIDTH):
    """A figure of ``n`` panels that fits a notebook's width: two a row, wrapped onto more rows rather than shrunk, so
    that every panel's text stays as large as a single plot's.

    Parameters
    ----------
    n : int
        How many panels.
    height : float, default 4.0
        Inches a row.
    width : float, default ``NOTEBOOK_WIDTH``
        The figure's width in inches (a single panel takes two thirds of it).

    Returns
    -------
    tuple of (matplotlib.figure.Figure, list of matplotlib.axes.Axes)
        The figure and its ``n`` axes, row by row; a row's unused place is left blank.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> fig, axes = panel_grid(3)
    >>> len(axes), [round(float(v), 1) for v in fig.get_size_inches()]
    (3, [9.6, 8.0])
    """
    import matplotlib.pyplot as plt

    columns = min(n, 2)
    rows = -(-n // columns)
    fig, grid = plt.subplots(
        rows, columns, figsize=(width if n > 1 else width * 2 / 3, height * rows), squeeze=False, layout="constrained"
    )
    axes = list(grid.flat)
    for spare in axes[n:]:
        spare.set_visible(False)
    return fig, axes[:n]


def width_for(bars: int, *, each: float = 1.6, frame: float = 1.0, least: float = 2.5, most: float = 12.0) -> float:
    """A figure's width in inches from the bars (or columns) it draws: ``frame`` and ``each`` a bar, within ``least`` and
    ``most``, so that one bar is not drawn as wide as the page and many stay legible (labels outside the axes add to it).

    Parameters
    ----------
    bars : int
        The bars or columns drawn side by side.
    each, frame, least, most : float
        Inches a bar, inches besides, and the bounds.

    Returns
    -------
    float

    Examples
    --------
    >>> width_for(1), width_for(4), width_for(40)
    (2.6, 7.4, 12.0)
    """
    return min(most, max(least, frame + each * bars))


def _set_c_axis(ax, cs: list[int]) -> None:
    if not cs:
        return
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(cs)))
    ax.set_xticklabels([str(c) for c in sorted(set(cs))])
    ax.minorticks_off()
    ax.set_xlabel("batch size c (concurrent identical requests)")


def _empty(ax, message: str):
    """Say on the axes why nothing is drawn; ``ax.bia_empty`` keeps the reason, so a report can leave the panel out."""
    ax.text(0.5, 0.5, _fill(ax, message), ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.bia_empty = message.replace("\n", " ")
    return ax


LEGEND_LIMIT = 10  # a legend longer than this hides the plot: the rest are counted in one entry


def _legend(ax, limit: int = LEGEND_LIMIT, **options) -> None:
    """A legend of at most ``limit`` entries, the last saying how many more were left out, inside the axes.

    Never placed outside the axes' box (no ``bbox_to_anchor``): a legend beside or below the plot is cut off by a notebook's
    inline figure and pushes the figure's neighbours apart. Labels too long for the panel wrap instead (:func:`_wrap_width`).
    """
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) > limit:
        from matplotlib.lines import Line2D

        rest = len(handles) - (limit - 1)
        handles, labels = (
            [*handles[: limit - 1], Line2D([], [], linestyle="none")],
            [*labels[: limit - 1], f"... and {rest} more"],
        )
    if handles:
        fontsize = options.pop("fontsize", "small")
        width = _wrap_width(ax, fontsize, options.get("ncol", 1))
        labels = [textwrap.fill(label, width, break_on_hyphens=False) for label in labels]
        legend = ax.legend(handles, labels, fontsize=fontsize, loc=options.pop("loc", "best"), **options)
        _clear_of_data(ax, legend)


def _covered(ax, box) -> bool:
    """Whether anything drawn (a line's vertices and the segments between them, a scatter's dots) lies inside ``box``, in
    display coordinates. Lines across the whole axes (``axhline``) are guides, not data."""
    import numpy as np
    from matplotlib.collections import LineCollection

    def sampled(shown):  # a line's vertices and the segments between them
        steps = np.linspace(0, 1, 24)[None, :, None]
        return (shown[:-1, None, :] + (shown[1:] - shown[:-1])[:, None, :] * steps).reshape(-1, 2)

    shapes = []
    for line in ax.get_lines():
        xy = np.asarray(line.get_xydata(), dtype=float)
        if not line.get_visible() or len(xy) == 0 or line.get_transform() is not ax.transData:
            continue
        shown = ax.transData.transform(xy)
        shapes.append(sampled(shown) if line.get_linestyle() not in ("None", "") and len(shown) > 1 else shown)
    for collection in ax.collections:
        if isinstance(collection, LineCollection):  # many lines drawn as one (the grey reference traces)
            shapes += [
                sampled(ax.transData.transform(np.asarray(segment, dtype=float)))
                for segment in collection.get_segments()
                if len(segment) > 1
            ]
        elif len(collection.get_offsets()):
            shapes.append(ax.transData.transform(np.asarray(collection.get_offsets(), dtype=float)))
    for shown in shapes:
        shown = shown[np.isfinite(shown).all(axis=1)]
        inside = (shown[:, 0] >= box.x0) & (shown[:, 0] <= box.x1) & (shown[:, 1] >= box.y0) & (shown[:, 1] <= box.y1)
        if inside.any():
            return True
    return False


def _clear_of_data(ax, legend) -> None:
    """A legend that would sit on drawn points gets a band of its own above them: the y-axis grows by the legend's height
    (on its own scale: linear, log or symlog) and the legend moves to its top, so no point hides under it."""
    renderer = ax.figure.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    if not _covered(ax, box):
        return
    height = box.height / ax.get_window_extent(renderer).height + 0.06
    scale = ax.yaxis.get_transform()
    low, high = scale.transform(ax.get_ylim())
    top = low + (high - low) / max(0.3, 1 - height)
    ax.set_ylim(top=float(scale.inverted().transform(top)))
    legend.set_loc("upper right")


def _fill(ax, text: str, fontsize: Any = "medium") -> str:
    """``text`` wrapped to the width of ``ax`` (matplotlib's own wrapping wraps at the figure's edge, past a panel's)."""
    width = _wrap_width(ax, fontsize) + 6  # no legend handle to leave room for
    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False) for line in text.split("\n"))


def _wrap_width(ax, fontsize: Any, columns: int = 1) -> int:
    """How many characters of a legend label fit on one line of a legend inside ``ax``: nine tenths of the axes' width, less
    each column's handle (about three font sizes), at about 0.55 of the font size a character; never under 20.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))  # a panel of the report's figures
    >>> _wrap_width(axes[0], "small"), _wrap_width(plt.subplots(figsize=(7, 4))[1], "small")
    (54, 71)
    """
    from matplotlib.font_manager import FontProperties

    size = FontProperties(size=fontsize).get_size_in_points()
    points = ax.get_position().width * ax.figure.get_figwidth() * 72 * 0.9 / columns
    return max(20, int((points - 3 * size) / (0.55 * size)))


def _label_points(ax, points: Sequence[tuple[float, float, str]], limit: int = 3) -> None:
    """Name a few outlying points on the plot itself rather than in the legend; points that coincide share one label.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> _, ax = plt.subplots()
    >>> _label_points(ax, [(8, 3, "q05"), (8, 3, "q21"), (8, 3, "q37"), (4, 9, "q02")])
    >>> [t.get_text() for t in ax.texts]
    ['q05, q21 and 1 more', 'q02']
    """
    spots: dict[tuple[float, float], list[str]] = {}
    for x, y, text in points:
        spots.setdefault((x, y), []).append(text)
    for (x, y), names in list(spots.items())[:limit]:
        text = ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")
        ax.annotate(
            text,
            (x, y),
            xytext=(6, -10),
            textcoords="offset points",
            fontsize=SMALLEST_FONT,
            color="dimgray",
            arrowprops={"arrowstyle": "-", "color": "lightgray"},
        )


def _merge_identical(items: Iterable[tuple[Any, Hashable, Any]], joined=None) -> list[tuple[str, Any]]:
    """Series that would draw the same points, merged into one labelled with all their names: a line drawn over
    its twin hides it, and leaves a legend entry that points at nothing visible.

    ``items`` are (label, key, payload), the key what the series draws; out come (label, payload), one per key,
    with the first payload of each key. ``joined`` makes the legend entry of a key's labels (by default: the one
    label, or the names and a count).

    Examples
    --------
    >>> _merge_identical([("a", (1, 9), "A"), ("b", (1, 2), "B"), ("c", (1, 9), "C")])
    [('a = c (2 identical series)', 'A'), ('b', 'B')]
    >>> _merge_identical([(f"w{k}", (), k) for k in range(4)])
    [('w0 = w1 = w2 and 1 more (4 identical series)', 0)]
    """
    merged: dict[Hashable, tuple[list[str], Any]] = {}
    for label, key, payload in items:
        merged.setdefault(key, ([], payload))[0].append(label)
    return [((joined or _identical)(labels), payload) for labels, payload in merged.values()]


def _identical(labels: Sequence[str]) -> str:
    if len(labels) == 1:
        return labels[0]
    names = " = ".join(labels[:3]) + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
    return f"{names} ({len(labels)} identical series)"
