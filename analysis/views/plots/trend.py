"""The trend figure: one metric of one series of a :class:`~analysis.History` over time, with its release markers and
regressions; the series' keys and names, and each figure's alt text."""

from __future__ import annotations

import datetime as dt
from typing import cast

import polars as pl

from ...core import cell
from ...studies import SERIES, History
from ._drawing import SMALLEST_FONT

# What each trend figure draws: metric, axis label, what a reader should look for.
METRICS = (
    (
        "earliest_divergence",
        "earliest divergence from m=1 (token)",
        "where each band first parts from m=1; a drop means earlier forks",
    ),
    ("bit_identical_share", "share of requests bit-identical to m=1", "1.0 is bit parity at that c"),
    ("token_identical_share", "share of requests token-identical to m=1", "1.0 is token parity at that c"),
    (
        "decode_ratio",
        "decode rate at c / at c=1",
        "the cost of batching per request, with its bootstrap interval; S7's bar is 0.5 at c=4",
    ),
)


def series_keys(history: History) -> list[tuple[str | None, ...]]:
    """Every series (host, engine, model, series_settings) the history holds, in time order of their first entry.

    Parameters
    ----------
    history : History
        The history.

    Returns
    -------
    list of tuple
    """
    return [tuple(row) for row in history.entries.sort("time").select(SERIES).unique(maintain_order=True).iter_rows()]


def series_name(key: tuple) -> str:
    """A series as people read it: host / engine / model, then its settings in brackets.

    Parameters
    ----------
    key : tuple
        The series' (host, engine, model, settings).

    Returns
    -------
    str

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

    Parameters
    ----------
    history : History
        The history.
    key : tuple
        The series, as :func:`analysis.plots.series_keys` gives it.
    metric : str
        One of the metrics ``METRICS`` names.
    ax : matplotlib.axes.Axes, optional
        The axes to draw on; by default a new figure's.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> from analysis import read_history
    >>> history = read_history("data/aprender-lambda")
    >>> ax = plot_trend(history, series_keys(history)[0], "earliest_divergence")
    >>> sorted(line.get_label() for line in ax.get_lines() if line.get_label().startswith("c="))
    ['c=1', 'c=16', 'c=4', 'c=8']
    """
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.5))
    bands = _series(history.bands, key).filter(pl.col(metric).is_not_null()).sort("time")
    colours = plt.get_cmap("viridis")
    ladder = sorted(set(bands["c"].to_list()))
    for i, c in enumerate(ladder):
        points = (
            bands.filter(c=c)
            .group_by("time", maintain_order=True)
            .agg(pl.col(metric).min(), pl.col("decode_ratio_low").min(), pl.col("decode_ratio_high").max())
        )
        colour = colours(i / max(1, len(ladder) - 1))
        ax.plot(points["time"].to_list(), points[metric].to_list(), marker="o", color=colour, label=f"c={c}")
        if metric == "decode_ratio" and points["decode_ratio_low"].drop_nulls().len():
            ax.fill_between(
                points["time"].to_list(),
                points["decode_ratio_low"].fill_null(points[metric]).to_list(),
                points["decode_ratio_high"].fill_null(points[metric]).to_list(),
                color=colour,
                alpha=0.15,
            )
    span = _span(
        _series(history.bands, key)["time"], history.markers.filter(pl.col("host").eq_missing(key[0])).sort("time")
    )
    if span is not None:
        ax.set_xlim(*span)
        ax.xaxis.set_major_locator(locator := mdates.AutoDateLocator(minticks=3, maxticks=8))
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    markers = (
        history.markers.filter(pl.col("host").eq_missing(key[0]) & pl.col("time").is_between(*span))
        if span
        else history.markers.clear()
    )
    for when in markers["time"].to_list():
        ax.axvline(when, color="grey", linestyle=":", linewidth=1)
    _label_markers(ax, markers.sort("time").select("time", "commit").rows())
    flagged = _series(history.regressions(), key)
    for rule, c, when in flagged.select("rule", "c", "first_bad_time").iter_rows():
        row = bands.filter((pl.col("c") == c) & (pl.col("time") == when))
        if row.height and _rule_metric(rule) == metric:
            ax.plot(
                [when],
                [row[metric][0]],
                marker="o",
                markersize=14,
                markerfacecolor="none",
                markeredgecolor="red",
                linestyle="none",
            )
    if metric == "decode_ratio":
        ax.axhline(0.5, color="black", linestyle="--", linewidth=0.8)
    if metric.endswith("_share"):
        ax.set_ylim(-0.05, 1.05)  # a share on its whole range: one value alone is not drawn as a band around itself
    ax.set_ylabel(next(label for m, label, _ in METRICS if m == metric), fontsize=SMALLEST_FONT)
    if ladder:
        ax.legend(fontsize=SMALLEST_FONT, loc="best", ncols=min(4, len(ladder)))
    return ax


def _span(times: pl.Series, markers: pl.DataFrame) -> tuple[dt.datetime, dt.datetime] | None:
    """The x-axis of a series: its entries, and the releases around them (the last at or before the first
    entry, the first after the last), padded by a twentieth of that span each side, or by half a day
    when it is one moment. None when the series has no dated entry.

    Examples
    --------
    >>> day = lambda d, h=0: dt.datetime(2026, 9, d, h, tzinfo=dt.UTC)
    >>> releases = pl.DataFrame({"time": [day(1), day(2), day(9), day(20)]})
    >>> [t.isoformat() for t in _span(pl.Series([day(2, 12), day(4)]), releases)]  # releases of day 2 and day 9 around them
    ['2026-09-01T15:36:00+00:00', '2026-09-09T08:24:00+00:00']
    >>> [t.isoformat() for t in _span(pl.Series([day(4)]), releases.clear())]
    ['2026-09-03T12:00:00+00:00', '2026-09-04T12:00:00+00:00']
    """
    times = times.drop_nulls()
    if not times.len():
        return None
    first, last = cast(dt.datetime, times.min()), cast(dt.datetime, times.max())  # a Datetime series, nulls dropped
    before = cast("dt.datetime | None", markers.filter(pl.col("time") <= first)["time"].max())
    after = cast("dt.datetime | None", markers.filter(pl.col("time") > last)["time"].min())
    low, high = before or first, after or last
    pad = (high - low) / 20 if high > low else dt.timedelta(hours=12)
    return low - pad, high + pad


def _label_markers(ax, markers: list[tuple[dt.datetime, str | None]]) -> None:
    """Each release's commit above the plot, at its line; a label that would touch the one before it
    goes a row higher, so labels of releases close together never overlap."""
    if not markers:
        return
    from matplotlib.font_manager import FontProperties

    renderer = ax.figure.canvas.get_renderer()
    step = FontProperties(size=SMALLEST_FONT).get_size_in_points() + 2  # a row of labels, in points
    rows: list[float] = []  # the right edge, in pixels, of the last label in each row
    for when, commit in markers:
        label = ax.annotate(
            (commit or "?")[:7],
            (when, 1),
            xycoords=("data", "axes fraction"),
            xytext=(0, 2),
            textcoords="offset points",
            fontsize=SMALLEST_FONT,
            ha="center",
            va="bottom",
            color="grey",
            annotation_clip=False,
        )
        box = label.get_window_extent(renderer)
        row = next((k for k, right in enumerate(rows) if box.x0 > right + 4), len(rows))
        rows[row : row + 1] = [box.x1]
        label.set_position((0, 2 + row * step))


def _rule_metric(rule_name: str) -> str | None:
    from ...studies import REGRESSION_RULES

    return next((r.metric for r in REGRESSION_RULES if r.name == rule_name), None)


def figure_alt(key: tuple, metric: str) -> str:
    """The alt text of one series' figure of one metric.

    Parameters
    ----------
    key : tuple
        The series' (host, engine, model, settings).
    metric : str
        One of the metrics ``METRICS`` names.

    Returns
    -------
    str
    """
    what = next(words for m, _, words in METRICS if m == metric)
    return f"{series_name(key)}: {metric.replace('_', ' ')} over time per batch size c ({what})"
