"""The witness figures' names and the env knobs: a witness as a legend names it, and the kernel env knobs that differ
between witnesses."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import polars as pl

from ...witness import WitnessSet
from ._drawing import _axes, _empty, drawn, width_for


def witness_label(source: str, version: int | None) -> str:
    """A short legend label: the file name and its witness_version.

    Parameters
    ----------
    source : str
        The witness file's path.
    version : int or None
        Its ``witness_version`` (None: not shown).

    Returns
    -------
    str

    Examples
    --------
    >>> witness_label("data/aprender-lambda/witness@464c168e62.json", 2)
    'witness@464c168e62.json (v2)'
    """
    name = PurePosixPath(source.replace("\\", "/")).name or source
    return f"{name} (v{version})" if version is not None else name


def _witnesses(ws: WitnessSet) -> pl.DataFrame:
    return ws.to_backend("polars").witnesses


def differing_env_knobs(witnesses: Any) -> pl.DataFrame:
    """The env knob columns whose values differ between witnesses (null counts as "unset"); of a witness set, or its
    ``witnesses`` frame.

    Parameters
    ----------
    witnesses : WitnessSet or DataFrame
        A witness set, or its ``witnesses`` frame.

    Returns
    -------
    polars.DataFrame
        ``source``, ``witness_version`` and the differing ``env_`` columns.

    Examples
    --------
    >>> import analysis
    >>> differing_env_knobs(analysis.read_witnesses("data/aprender-lambda").witnesses).columns
    ['source', 'witness_version', 'env_BATCHED_PREFILL']
    """
    witnesses = drawn(witnesses, "differing_env_knobs", witnesses=_witnesses, frame="WitnessSet.witnesses")
    knobs = [c for c in witnesses.columns if c.startswith("env_")]
    differing = [c for c in knobs if witnesses[c].fill_null("unset").n_unique() > 1]
    return witnesses.select("source", "witness_version", *differing)


def plot_env_knobs(witnesses: Any, *, ax=None):
    """A grid of the env knobs that differ between witnesses: one row per witness, value in each cell; a figure drawn here
    is as wide as its columns (``width_for``), not the page.

    ``witnesses``: a witness set, or its ``witnesses`` frame.

    Parameters
    ----------
    witnesses : WitnessSet or DataFrame
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
    >>> ax = plot_env_knobs(analysis.read_witnesses("data/aprender-lambda").witnesses)
    >>> [t.get_text() for t in ax.get_xticklabels()]
    ['BATCHED_PREFILL']
    """
    mine = ax is None
    ax = _axes(ax)
    table = differing_env_knobs(witnesses)
    knobs = [c for c in table.columns if c.startswith("env_")]
    if mine:  # a figure of its own: as wide as its columns, as tall as its rows
        ax.figure.set_size_inches(width_for(len(knobs)), 1.2 + 0.5 * max(1, min(table.height, 20)))
    if not knobs:
        return _empty(
            ax,
            f"All {drawn(witnesses, 'plot_env_knobs', witnesses=_witnesses, frame='WitnessSet.witnesses').height} witness(es) ran with the same env knobs.",
        )
    values = sorted({v if v is not None else "unset" for k in knobs for v in table[k].to_list()})
    colour = {v: i for i, v in enumerate(values)}
    grid = [[colour[v if v is not None else "unset"] for v in row] for row in table.select(knobs).iter_rows()]
    ax.imshow(grid, cmap="Pastel1", aspect="auto", vmin=0, vmax=max(8, len(values)))
    for r, row in enumerate(table.select(knobs).iter_rows()):
        for k, value in enumerate(row):
            ax.text(k, r, "unset" if value is None else value, ha="center", va="center")
    ax.set_xticks(range(len(knobs)))
    names = [k.removeprefix("env_") for k in knobs]
    column = ax.get_position().width * ax.figure.get_figwidth() / len(knobs)  # inches a column
    if max(map(len, names)) * 0.08 > column:  # about 0.08 in a character at 10 pt: slanted, not overlapping
        ax.set_xticklabels(names, rotation=35, ha="right", rotation_mode="anchor")
    else:
        ax.set_xticklabels(names)
    ax.set_yticks(range(table.height))
    ax.set_yticklabels([witness_label(s, v) for s, v in table.select("source", "witness_version").iter_rows()])
    ax.set_title("Kernel env knobs that differ between witnesses", wrap=True)  # wraps over a narrow grid
    return ax
