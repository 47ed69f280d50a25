"""The trend report's fragments: its regressions in words and every entry."""

from __future__ import annotations

import polars as pl

from ...core import MISSING, cell
from ...studies import SERIES, History
from ..plots.trend import series_name
from .blocks import frame_html, render


def regressions_html(history: History) -> str:
    """Each regression in words: the rule, the series and c, the last good and first bad entries, the commits between.

    Parameters
    ----------
    history : History
        The history.

    Returns
    -------
    str
        HTML.
    """
    flagged = history.regressions()
    rows = [
        {
            "rule": r["words"],
            "series": series_name(tuple(r[k] for k in SERIES)),
            "c": r["c"],
            "before": cell(r["before"]),
            "after": cell(r["after"]),
            "last_good": f"{cell(r['last_good_time'])} ({(r['last_good_commit'] or MISSING)[:10]})",
            "first_bad": f"{cell(r['first_bad_time'])} ({(r['first_bad_commit'] or MISSING)[:10]})",
            "first_bad_entry": _entry_source(history, r["first_bad_entry"]),
            "commits": ", ".join(c[:10] for c in r["commits_between"]) or MISSING,
        }
        for r in flagged.iter_rows(named=True)
    ]
    return render("regressions.html.j2", rows=rows)


def _entry_source(history: History, entry: str) -> str:
    found = history.entries.filter(pl.col("entry") == entry)["source"]
    return found[0] if found.len() else entry[:16]


def entries_html(history: History) -> str:
    """Every entry, newest first, with the settings that put it in its series.

    Parameters
    ----------
    history : History
        The history.

    Returns
    -------
    str
        HTML.
    """
    shown = history.entries.sort("time", descending=True).select(
        "time",
        "kind",
        "host",
        "engine",
        "model",
        pl.col("series_settings").alias("settings"),
        "commit",
        "verdict",
        "source",
    )
    return frame_html(
        shown, caption="Entries, newest first.", limit=50, shorten={"commit": 10}
    )  # the whole hash in each tooltip
