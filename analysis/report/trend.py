"""The trend report: a history's bands over time per series (host, engine, model and the settings that
change results), with regressions flagged.

``bia trend HISTORY -o trend.html`` executes ``notebooks/trend_report.ipynb`` with papermill and
exports it as one offline HTML file, as ``bia report`` does; the helpers here draw its figures and
tables.
"""

from __future__ import annotations

from html import escape

import os
from pathlib import Path
from typing import Iterable

import polars as pl

from ..studies._history import SERIES, History, read_history
from ..core._html import render
from ..core._output import claim_output
from ..io._bundled import bundled, default_sources
from ._notebook import execute_to_html
from ..core._cells import MISSING, cell, frame_html

__all__ = ["DEFAULT_TITLE", "METRICS", "default_history_sources", "entries_html", "figure_alt", "header_html", "plot_trend", "regressions_html", "render_trend", "series_heading_html", "series_keys", "series_name"]

DEFAULT_TITLE = "Batch-invariance trend"

# What each trend figure draws: metric, axis label, what a reader should look for.
METRICS = (
    ("earliest_divergence", "earliest divergence from m=1 (token)", "where each band first parts from m=1; a drop means earlier forks"),
    ("bit_identical_share", "share of requests bit-identical to m=1", "1.0 is bit parity at that c"),
    ("token_identical_share", "share of requests token-identical to m=1", "1.0 is token parity at that c"),
    ("decode_ratio", "decode rate at c / at c=1", "the cost of batching per request, with its bootstrap interval; S7's bar is 0.5 at c=4"),
)


def default_history_sources() -> list[str]:
    """The embedded history: aprender's lambda witnesses and release markers over two server commits.

    Examples
    --------
    >>> default_history_sources()
    ['data/aprender-lambda']
    """
    return default_sources()


def series_keys(history: History) -> list[tuple[str | None, ...]]:
    """Every series (host, engine, model, series_settings) the history holds, in time order of their first entry."""
    return [tuple(row) for row in history.entries.sort("time").select(SERIES).unique(maintain_order=True).iter_rows()]


def series_name(key: tuple) -> str:
    """A series as people read it: host / engine / model, then its settings in brackets.

    Examples
    --------
    >>> series_name(("vm", "bia serve", "tiny_lm", "kernel_mode=fixed-tiles, dtype=float32"))
    'vm / bia serve / tiny_lm (kernel_mode=fixed-tiles, dtype=float32)'
    >>> series_name(("lambda", "aprender perf041", None, None))
    'lambda / aprender perf041 / — (no settings recorded)'
    """
    head = " / ".join(cell(k) for k in key[:3])
    return f"{head} ({key[3] if len(key) > 3 and key[3] else 'no settings recorded'})"


def _series(frame: pl.DataFrame, key: tuple) -> pl.DataFrame:
    return frame.filter(pl.all_horizontal([pl.col(name).eq_missing(value) for name, value in zip(SERIES, key)]))


def plot_trend(history: History, key: tuple, metric: str, *, ax=None):
    """One metric of one series over time: a line per batch size c, release markers as labelled
    vertical lines, each regression's first bad entry circled in red.

    Examples
    --------
    >>> history = read_history("data/aprender-lambda")
    >>> ax = plot_trend(history, series_keys(history)[0], "earliest_divergence")
    >>> sorted(line.get_label() for line in ax.get_lines() if line.get_label().startswith("c="))
    ['c=1', 'c=16', 'c=4', 'c=8']
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    bands = _series(history.bands, key).filter(pl.col(metric).is_not_null()).sort("time")
    colours = plt.get_cmap("viridis")
    ladder = sorted(set(bands["c"].to_list()))
    for i, c in enumerate(ladder):
        points = bands.filter(c=c).group_by("time", maintain_order=True).agg(pl.col(metric).min(), pl.col("decode_ratio_low").min(),
                                                                              pl.col("decode_ratio_high").max())
        colour = colours(i / max(1, len(ladder) - 1))
        ax.plot(points["time"].to_list(), points[metric].to_list(), marker="o", color=colour, label=f"c={c}")
        if metric == "decode_ratio" and points["decode_ratio_low"].drop_nulls().len():
            ax.fill_between(points["time"].to_list(), points["decode_ratio_low"].fill_null(points[metric]).to_list(),
                            points["decode_ratio_high"].fill_null(points[metric]).to_list(), color=colour, alpha=0.15)
    markers = history.markers.filter(pl.col("host").eq_missing(key[0])).sort("time")
    for when, commit in markers.select("time", "commit").iter_rows():
        ax.axvline(when, color="grey", linestyle=":", linewidth=1)
        ax.annotate((commit or "?")[:7], (when, 1), xycoords=("data", "axes fraction"), rotation=90, fontsize=7, va="top", ha="right",
                    color="grey")
    flagged = _series(history.regressions(), key)
    for rule, c, when in flagged.select("rule", "c", "first_bad_time").iter_rows():
        row = bands.filter((pl.col("c") == c) & (pl.col("time") == when))
        if row.height and _rule_metric(rule) == metric:
            ax.plot([when], [row[metric][0]], marker="o", markersize=14, markerfacecolor="none", markeredgecolor="red", linestyle="none")
    if metric == "decode_ratio":
        ax.axhline(0.5, color="black", linestyle="--", linewidth=0.8)
    ax.set_ylabel(next(label for m, label, _ in METRICS if m == metric), fontsize=8)
    if ladder:
        ax.legend(fontsize=7, loc="best", ncols=min(4, len(ladder)))
    ax.figure.autofmt_xdate()
    return ax


def _rule_metric(rule_name: str) -> str | None:
    from ..studies._history import REGRESSION_RULES

    return next((r.metric for r in REGRESSION_RULES if r.name == rule_name), None)


def regressions_html(history: History) -> str:
    """Each regression in words: the rule, the series and c, the last good and first bad entries, the commits between."""
    flagged = history.regressions()
    rows = [{"rule": r["words"], "series": series_name(tuple(r[k] for k in SERIES)), "c": r["c"], "before": cell(r["before"]), "after": cell(r["after"]),
             "last_good": f"{cell(r['last_good_time'])} ({(r['last_good_commit'] or MISSING)[:10]})",
             "first_bad": f"{cell(r['first_bad_time'])} ({(r['first_bad_commit'] or MISSING)[:10]})",
             "first_bad_entry": _entry_source(history, r["first_bad_entry"]),
             "commits": ", ".join(c[:10] for c in r["commits_between"]) or MISSING}
            for r in flagged.iter_rows(named=True)]
    return render("regressions.html.j2", rows=rows)


def _entry_source(history: History, entry: str) -> str:
    found = history.entries.filter(pl.col("entry") == entry)["source"]
    return found[0] if found.len() else entry[:16]


def entries_html(history: History) -> str:
    """Every entry, newest first, with the settings that put it in its series."""
    shown = history.entries.sort("time", descending=True).select("time", "kind", "host", "engine", "model", pl.col("series_settings").alias("settings"),
                                                                  pl.col("commit").str.slice(0, 10), "verdict", "source")
    return frame_html(shown, caption="Entries, newest first.", limit=50)


def render_trend(sources: Iterable[str | os.PathLike[str]] | None = None, output: str | os.PathLike[str] = "trend.html", *,
                 title: str = DEFAULT_TITLE, force: bool = False, timeout_s: int = 600) -> Path:
    """Execute the trend notebook over ``sources`` (the embedded history when empty) and export one HTML file.

    Examples
    --------
    >>> import tempfile
    >>> page = render_trend(output=Path(tempfile.mkdtemp()) / "trend.html")  # doctest: +SKIP
    """
    output = claim_output(output, force=force, what="the trend report")
    parameters = {"history": [os.fspath(s) for s in (sources or [])], "title": title}
    read_history(parameters["history"] or default_history_sources())  # a bad source is named here, not inside a kernel
    return execute_to_html(bundled("notebooks/trend_report.ipynb"), parameters, output, what="trend", timeout_s=timeout_s)


def header_html(title: str, sources: list[str], history: History) -> str:
    """The trend report's title, sources and span."""
    span = history.entries["time"].drop_nulls()
    return render("trend_header.html.j2", title=title, sources=sources or default_history_sources(), given=bool(sources),
                  entries=history.entries.height, series=len(series_keys(history)), markers=history.markers.height,
                  start=cell(span.min()) if span.len() else MISSING, end=cell(span.max()) if span.len() else MISSING,
                  regressions=history.regressions().height)


def series_heading_html(key: tuple) -> str:
    """A series' heading (host / engine / model) and its settings, escaped: these values come from the files read.

    Examples
    --------
    >>> print(series_heading_html(("lambda", "<b>apr</b>", None, "FP8_DECODE=1")))
    <h2>lambda / &lt;b&gt;apr&lt;/b&gt; / —</h2>
    <p>settings: <code>FP8_DECODE=1</code></p>
    """
    settings = key[3] if len(key) > 3 and key[3] else None
    shown = f"<code>{escape(settings)}</code>" if settings else "none recorded"
    return f"<h2>{escape(' / '.join(cell(k) for k in key[:3]))}</h2>\n<p>settings: {shown}</p>"


def figure_alt(key: tuple, metric: str) -> str:
    what = next(words for m, _, words in METRICS if m == metric)
    return f"{series_name(key)}: {metric.replace('_', ' ')} over time per batch size c ({what})"
