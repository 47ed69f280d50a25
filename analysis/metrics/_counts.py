"""Per c, how many requests matched m=1 in bits and in tokens, and where the first one parted: what every verdict card counts."""

from __future__ import annotations

import polars as pl


_COUNTS = {"c": pl.Int64, "requests": pl.Int64, "bitwise": pl.Int64, "bits_known": pl.Int64, "same": pl.Int64, "parted": pl.Int64,
           "near_tie": pl.Int64, "no_margin": pl.Int64, "first": pl.Int64, "first_where": pl.String}


def per_c_counts(slots: pl.DataFrame) -> pl.DataFrame:
    """Per c from per-request rows (``c``, ``bitwise`` (bool or null), ``diverged``, ``divergence_at``, ``near_tie``,
    ``margin_known``, ``where``): how many requests matched m=1 in bits and in tokens, and where the first one parted."""
    parted = pl.col("diverged")
    return (slots.group_by("c").agg(
        requests=pl.len(), bitwise=pl.col("bitwise").sum(), bits_known=pl.col("bitwise").count(), same=(~parted).sum(), parted=parted.sum(),
        near_tie=(parted & pl.col("near_tie")).sum(), no_margin=(parted & ~pl.col("margin_known")).sum(),
        first=pl.col("divergence_at").filter(parted).min(),
        first_where=pl.col("where").filter(parted).sort_by(pl.col("divergence_at").filter(parted)).first())
        .sort("c").select([pl.col(n).cast(t) for n, t in _COUNTS.items()]))


def run_counts(slots: pl.DataFrame) -> pl.DataFrame:
    """:func:`per_c_counts` of a run's :func:`~analysis.run.slot_table`: per c, the requests that match m=1 in bits and in tokens."""
    return per_c_counts(slots.select(
        c="band_c", bitwise=pl.when(pl.col("bitwise_prefix").is_not_null()).then(pl.col("bitwise_prefix") == pl.col("length")),
        diverged="diverged", divergence_at="divergence_at", near_tie="near_tie", margin_known=pl.col("reference_margin").is_not_null(),
        where=pl.format("{} slot {}", "prompt_id", "slot")))
