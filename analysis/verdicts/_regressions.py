"""Regressions in a history: rules, kept as data, that find a band that was good and is not any more."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

# A series: one server (host, engine, model) run with one set of the settings that change results
# (``series_settings``, see analysis.studies._history_frames.RESULT_SETTINGS). Bands are compared only within their
# series and c, so a change of setting starts another series and is never a regression.
SERIES = ("host", "engine", "model", "series_settings")


@dataclass(frozen=True)
class Rule:
    """One regression rule: a band's ``metric`` was good and is not any more.

    ``at_least``: good means ``metric >= at_least``. ``past_interval``: bad means the new interval's
    top is below the previous interval's bottom (``metric_low`` and ``metric_high`` beside it).
    ``needs_interval``: only bands whose metric has an interval are judged (a decode ratio from too
    few requests has none: it is timing noise, not a measurement).
    """

    name: str
    metric: str
    words: str
    at_least: float | None = None
    past_interval: bool = False
    batched_only: bool = False
    needs_interval: bool = False


REGRESSION_RULES: tuple[Rule, ...] = (
    Rule("tokens part", "token_identical_share", "a band that held to its end now parts from m=1", at_least=1.0),
    Rule("bits differ", "bit_identical_share", "requests that were bit-identical to m=1 are not", at_least=1.0),
    Rule(
        "decode below the bar",
        "decode_ratio",
        "the decode ratio to c=1 fell below the bar of 0.5",
        at_least=0.5,
        batched_only=True,
        needs_interval=True,
    ),
    Rule(
        "decode fell",
        "decode_ratio",
        "the decode ratio to c=1 fell by more than its interval",
        past_interval=True,
        batched_only=True,
        needs_interval=True,
    ),
)


def regressions(bands: pl.DataFrame, markers: pl.DataFrame, rules: Iterable[Rule] = REGRESSION_RULES) -> pl.DataFrame:
    """Each place a rule finds a band that was good and is not: the last good and the first bad
    entry of its series (host, engine, model, series_settings) and c, and the server commits between them.

    ``bands`` and ``markers`` are a :class:`~analysis.History`'s frames.

    Parameters
    ----------
    bands : polars.DataFrame
        The history's bands: series columns, ``c``, ``time``, ``commit``, ``entry`` and each rule's metric (with
        ``_low`` and ``_high`` for an interval).
    markers : polars.DataFrame
        The history's markers, which give the commits between the last good and the first bad entry.
    rules : iterable of Rule, default REGRESSION_RULES
        The rules to apply.

    Returns
    -------
    polars.DataFrame
        One row per regression, sorted by when it was first bad: ``rule``, ``words``, the series, ``c``,
        ``before`` and ``after`` (the metric), the last good and first bad entries' ``time``, ``commit`` and
        ``entry``, and ``commits_between``. Empty, with those columns, when none is found.
    """
    frames = [_flag(bands, rule) for rule in rules]
    flagged = pl.concat(frames, how="vertical") if frames else pl.DataFrame()
    if flagged.is_empty():
        return pl.DataFrame(schema=_REGRESSION_SCHEMA)
    between = [_commits_between(markers, row) for row in flagged.iter_rows(named=True)]
    return flagged.with_columns(pl.Series("commits_between", between, dtype=pl.List(pl.String))).sort(
        "first_bad_time", "rule", "c"
    )


_REGRESSION_SCHEMA: dict[str, PolarsDataType] = {
    "rule": pl.String,
    "words": pl.String,
    "host": pl.String,
    "engine": pl.String,
    "model": pl.String,
    "series_settings": pl.String,
    "c": pl.Int64,
    "before": pl.Float64,
    "after": pl.Float64,
    "last_good_time": pl.Datetime("us", "UTC"),
    "last_good_commit": pl.String,
    "last_good_entry": pl.String,
    "first_bad_time": pl.Datetime("us", "UTC"),
    "first_bad_commit": pl.String,
    "first_bad_entry": pl.String,
    "commits_between": pl.List(pl.String),
}


def _flag(bands: pl.DataFrame, rule: Rule) -> pl.DataFrame:
    """The bands where ``rule`` turns from good to bad, each with the entry before it in its series and c."""
    frame = bands.filter(pl.col(rule.metric).is_not_null() & pl.col("time").is_not_null())
    if rule.batched_only:
        frame = frame.filter(pl.col("c") > 1)
    if rule.needs_interval:  # the entry before a judged band is the last one that has an interval too
        frame = frame.filter(pl.col(f"{rule.metric}_low").is_not_null() & pl.col(f"{rule.metric}_high").is_not_null())
    group = [*SERIES, "c"]
    shifted = ("time", "commit", "entry", rule.metric, "decode_ratio_low")
    frame = frame.sort(*group, "time", nulls_last=True).with_columns(
        **{f"_before_{name}": pl.col(name).shift(1).over(group) for name in dict.fromkeys(shifted)}
    )
    if rule.past_interval:
        bad_now = pl.col("decode_ratio_high") < pl.col("_before_decode_ratio_low")
    else:
        bad_now = (pl.col(rule.metric) < rule.at_least) & (pl.col(f"_before_{rule.metric}") >= rule.at_least)
    bad_now = bad_now & (pl.col("_before_time") < pl.col("time"))  # entries of one moment have no order to regress in
    return frame.filter(bad_now.fill_null(False)).select(
        pl.lit(rule.name).alias("rule"),
        pl.lit(rule.words).alias("words"),
        *SERIES,
        "c",
        pl.col(f"_before_{rule.metric}").cast(pl.Float64).alias("before"),
        pl.col(rule.metric).cast(pl.Float64).alias("after"),
        pl.col("_before_time").alias("last_good_time"),
        pl.col("_before_commit").alias("last_good_commit"),
        pl.col("_before_entry").alias("last_good_entry"),
        pl.col("time").alias("first_bad_time"),
        pl.col("commit").alias("first_bad_commit"),
        pl.col("entry").alias("first_bad_entry"),
    )


def _commits_between(markers: pl.DataFrame, row: dict[str, Any]) -> list[str]:
    """The server commits released on the host after the last good entry, up to the first bad one, oldest first."""
    released = (
        markers.filter(
            (pl.col("host") == row["host"])
            & (pl.col("time") > row["last_good_time"])
            & (pl.col("time") <= row["first_bad_time"])
        )
        .sort("time")["commit"]
        .to_list()
    )
    ends = [c for c in (row["last_good_commit"], *released, row["first_bad_commit"]) if c]
    return list(dict.fromkeys(ends))  # in order, each once
