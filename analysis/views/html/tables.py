"""Tables for people: any frame as an escaped HTML table, a long one cut to its worst rows with a count of the rest, and
each witness set's bands and release markers.

The report shows these inside collapsed ``<details>``; every value goes through
:func:`analysis.core._cells.cell` (rounded, ``—`` for missing, yes/no), and the templates escape it. A run's provenance
is :mod:`analysis.views.html.run_provenance`, its tables :mod:`analysis.views.html.run_tables`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from ...core import as_polars, cell, first_rows
from .blocks import render

WORST_ROWS = 20  # a long table shows this many of its worst rows and counts the rest


def table_html(frame: Any, *, caption: str = "", empty: str = "nothing to show", more: str = "") -> str:
    """Any frame as an escaped HTML table of people-formatted cells, in its own horizontal scroll box.

    Parameters
    ----------
    frame : DataFrame
        Polars or pandas.
    caption : str, default ""
        The table's caption.
    empty : str, default "nothing to show"
        What is shown instead of a table without rows.
    more : str, default ""
        A note after the table (the rows left out, say).

    Returns
    -------
    str
        HTML.
    """
    frame = as_polars(frame)
    rows = [[cell(v) for v in row] for row in frame.iter_rows()]
    return render("table.html.j2", columns=frame.columns, rows=rows, caption=caption, empty=empty, more=more)


def worst_html(
    frame: pl.DataFrame | pl.LazyFrame,
    *,
    by: Sequence[str],
    descending: Sequence[bool],
    caption: str,
    what: str,
    n: int = WORST_ROWS,
    empty: str = "nothing to show",
) -> str:
    """The ``n`` worst rows of ``frame`` by ``by``, with a line counting the rest.

    Parameters
    ----------
    frame : pl.DataFrame or pl.LazyFrame
        The whole table, or a scan of it (read a morsel at a time: only the worst rows are held).
    by, descending : sequence
        The sort that puts the worst rows first (nulls last).
    caption, what : str
        The table's caption, and what its rows are ("requests") for the count of the rest.
    n : int
        How many rows to show.
    empty : str
        What to say when the table has no row.

    Examples
    --------
    >>> frame = pl.DataFrame({"request": list("abc"), "agrees to": [5, 1, 3]})
    >>> page = worst_html(frame, by=["agrees to"], descending=[False], caption="Requests", what="requests", n=2)
    >>> page.index("<td>b</td>") < page.index("<td>c</td>"), "1 more of the 3 requests" in page, "<td>a</td>" in page
    (True, True, False)
    """
    # lazily, the sort keeps only the first n rows (a top-k), not a sorted copy of every row of a run's table
    shown, height = first_rows(frame, by, descending, n)
    rest = height - shown.height
    more = f"{rest} more of the {height} {what} not shown (the first {shown.height} are the worst)." if rest else ""
    return table_html(shown, caption=caption, empty=empty, more=more)


def witness_bands_html(ws) -> str:
    """The bands of every witness: shape served, agreement with m=1, rate, recorded and derived result.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.

    Returns
    -------
    str
        HTML.
    """
    from ..plots.witness import witness_label

    bands = ws.to_backend("polars").bands
    labels = [witness_label(s, v) for s, v in bands.select("source", "witness_version").iter_rows()]
    bands = bands.with_columns(pl.Series("witness", labels, dtype=pl.String)).select(
        "witness",
        "c",
        **{
            "m formed": "m_formed",
            "slots": "n_slots",
            "divergence at": "divergence_at",
            "declared min": "declared_min",
            "margin at divergence": "top2_margin_at_divergence",
            "agree among slots to": "intra_agree_to",
            "longest constant run": "max_constant_run",
            "decode tok/s": "decode_tok_s",
            "result": "result",
            "derived result": "derived_result",
        },
    )
    return worst_html(
        bands,
        by=["witness", "c"],
        descending=[False, False],
        what="bands",
        n=4 * WORST_ROWS,
        caption="Witness bands: the batch width the server formed, where the band parted from the m=1 reference, the "
        "reference's top-2 margin there, the per-request decode rate, and the band result as recorded and as re-derived.",
        empty="No bands: no witness measured any.",
    )


def markers_html(ws) -> str:
    """Release markers, if any were read.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.

    Returns
    -------
    str
        HTML.
    """
    markers = ws.to_backend("polars").markers
    if markers.is_empty():
        return table_html(markers, empty="No release markers among the sources.")
    shown = markers.select(
        "source",
        "status",
        "exit",
        "host",
        commit=pl.col("commit").str.slice(0, 10),
        started="started_utc",
        **{"max m": "max_m", "sha256": pl.col("sha256").str.slice(0, 16), "status agrees": "status_agrees"},
    )
    return table_html(shown, caption="Release markers.")
