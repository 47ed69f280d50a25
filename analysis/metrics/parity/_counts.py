"""Per c, how many requests matched m=1 in bits and in tokens, and where the first one parted: what every verdict card counts."""

from __future__ import annotations

import polars as pl

_COUNTS = {
    "c": pl.Int64,
    "requests": pl.Int64,
    "bitwise": pl.Int64,
    "bits_known": pl.Int64,
    "same": pl.Int64,
    "parted": pl.Int64,
    "near_tie": pl.Int64,
    "no_margin": pl.Int64,
    "first": pl.Int64,
    "first_where": pl.String,
}


def per_c_counts(slots: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Per c from per-request rows (``c``, ``bitwise`` (bool or null), ``diverged``, ``divergence_at``, ``near_tie``,
    ``margin_known``, and ``where``, or ``where_prompt`` and ``where_slot``): how many requests matched m=1 in bits and in
    tokens, and where the first one parted (the earliest, the first in the rows' order among those as early).

    Parameters
    ----------
    slots : polars.DataFrame or polars.LazyFrame
        One row per request, with the columns above; a scan is counted a morsel at a time. Given ``where_prompt`` and
        ``where_slot``, only the first parting request's place is written out ("p0 slot 3"), not every request's.

    Returns
    -------
    polars.DataFrame
        One row per c.

    Examples
    --------
    >>> rows = pl.LazyFrame({"c": [4, 4, 4, 8], "bitwise": [True, None, False, True], "diverged": [False, True, True, False],
    ...                      "divergence_at": [None, 2, 2, None], "near_tie": [False, True, False, False],
    ...                      "margin_known": [True] * 4, "where_prompt": ["p", "q", "r", "s"], "where_slot": [0, 1, 2, 3]})
    >>> per_c_counts(rows).select("c", "requests", "bitwise", "bits_known", "parted", "near_tie", "first", "first_where").rows()
    [(4, 3, 1, 2, 2, 1, 2, 'q slot 1'), (8, 1, 1, 1, 0, 0, None, None)]
    """
    parted = pl.col("diverged")
    named = "where" in slots.collect_schema().names()
    place = pl.col("where") if named else pl.struct(prompt="where_prompt", slot="where_slot")
    at = pl.col("divergence_at").filter(parted)
    counts = (
        slots.lazy()
        .group_by("c")
        .agg(
            requests=pl.len(),
            bitwise=pl.col("bitwise").sum(),
            bits_known=pl.col("bitwise").count(),
            same=(~parted).sum(),
            parted=parted.sum(),
            near_tie=(parted & pl.col("near_tie")).sum(),
            no_margin=(parted & ~pl.col("margin_known")).sum(),
            first=at.min(),
            first_where=place.filter(parted).get(at.arg_min()),  # the first of the earliest (null: none parted)
        )
        .collect(engine="streaming")
    )
    if not named:  # written for the first parting request of each c alone
        first = pl.col("first_where")
        counts = counts.with_columns(
            first_where=pl.format("{} slot {}", first.struct.field("prompt"), first.struct.field("slot"))
        )
    return counts.sort("c").select([pl.col(n).cast(t) for n, t in _COUNTS.items()])


def bits_unrecorded() -> pl.Expr:
    """Over slot rows (``max_ulp``, ``length``): a request whose bits no one can know, no step of it having a logprob on both
    sides (an MLPerf accuracy log, a dump without logprobs). Where its tokens all agree, its bits are unknown, not equal:
    the judgement counts it in ``bits_unknown``, and the cards count it out of ``bits_known``."""
    return pl.col("max_ulp").is_null() & (pl.col("length") > 0)


# What run_counts (and a card counting as it does) reads of a slot table: a reader asks the table for these alone.
COUNTED_COLUMNS = (
    "prompt_id",
    "c",
    "slot",
    "length",
    "bitwise_prefix",
    "max_ulp",
    "diverged",
    "divergence_at",
    "near_tie",
    "reference_margin",
)


def run_counts(slots: pl.DataFrame) -> pl.DataFrame:
    """:func:`per_c_counts` of a run's :func:`~analysis.run.slot_table`: per c, the requests that match m=1 in bits and in tokens.

    A request whose tokens all match ref #1's with no logprob to compare (:func:`bits_unrecorded`) has unknown bits.

    Parameters
    ----------
    slots : polars.DataFrame
        A run's slot table.

    Returns
    -------
    polars.DataFrame
        One row per c.

    Examples
    --------
    >>> slots = pl.DataFrame({"c": [4, 4, 4], "bitwise_prefix": [3, 3, 1], "length": [3, 3, 3], "max_ulp": [0, None, None],
    ...                       "diverged": [False, False, True], "divergence_at": [None, None, 1], "near_tie": [False] * 3,
    ...                       "reference_margin": [0.5] * 3, "prompt_id": ["p"] * 3, "slot": [0, 1, 2]})
    >>> run_counts(slots).select("requests", "bitwise", "bits_known", "same").row(0)
    (3, 1, 2, 2)
    """
    return per_c_counts(
        slots.select(
            c="c",
            bitwise=pl.when(
                pl.col("bitwise_prefix").is_null()
                | ((pl.col("bitwise_prefix") == pl.col("length")) & bits_unrecorded())
            )
            .then(None)
            .otherwise(pl.col("bitwise_prefix") == pl.col("length")),
            diverged="diverged",
            divergence_at="divergence_at",
            near_tie="near_tie",
            margin_known=pl.col("reference_margin").is_not_null(),
            where=pl.format("{} slot {}", "prompt_id", "slot"),
        )
    )
