"""The columnar kit over one stream and a band of streams: constant runs, whole sequences, Wilson intervals, decode rates
and a band's rate, P(flip | margin) bins, each the expression or query of its ``parity`` counterpart."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from ._columnar_steps import Steps


def constant_runs(steps: Steps) -> pl.DataFrame:
    """``parity.longest_constant_run`` of every request: ``req``, ``max_constant_run`` (0 without tokens).

    Parameters
    ----------
    steps : Steps
        The requests' steps.

    Returns
    -------
    polars.DataFrame
    """
    runs = (
        steps.steps.select("req", run=pl.col("ident").rle_id().over("req"))
        .group_by("req", "run")
        .len()
        .group_by("req")
        .agg(max_constant_run=pl.col("len").max().cast(pl.Int64))
    )
    return (
        steps.requests.select("req")
        .join(runs, on="req", how="left")
        .with_columns(pl.col("max_constant_run").fill_null(0))
    )


def sequences(steps: Steps) -> pl.DataFrame:
    """Every request's whole completion as one list of identities: ``req``, ``sequence``.

    Parameters
    ----------
    steps : Steps
        The requests' steps.

    Returns
    -------
    polars.DataFrame
    """
    lists = steps.steps.group_by("req").agg(sequence=pl.col("ident").sort_by("idx"))
    out = steps.requests.select("req").join(lists, on="req", how="left")
    return out.with_columns(pl.col("sequence").fill_null(pl.lit([], dtype=out.schema["sequence"])))


def wilson(successes: pl.Expr, trials: pl.Expr, z: float = 1.959963984540054) -> tuple[pl.Expr, pl.Expr]:
    """``parity.wilson_interval`` as expressions: (low, high).

    Parameters
    ----------
    successes, trials : polars.Expr
        The counts.
    z : float, default 1.959963984540054
        The normal quantile (95%).

    Returns
    -------
    tuple of polars.Expr
    """
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * (p * (1 - p) / trials + z * z / (4 * trials * trials)).sqrt() / (1 + z * z / trials)
    return pl.max_horizontal(pl.lit(0.0), centre - half), pl.min_horizontal(pl.lit(1.0), centre + half)


def decode_rate(completion_tokens: pl.Expr, first: pl.Expr, last: pl.Expr, chunks: pl.Expr, live: pl.Expr) -> pl.Expr:
    """``parity.decode_rate`` as an expression: null where a rate cannot be measured.

    Parameters
    ----------
    completion_tokens : polars.Expr
        The request's completion tokens.
    first, last : polars.Expr
        The first and last content chunk's arrival, in seconds.
    chunks : polars.Expr
        How many content chunks came.
    live : polars.Expr
        Whether the stream is live (null: unknown, no rate).

    Returns
    -------
    polars.Expr
        Tokens per second.
    """
    measurable = (live.fill_null(False) & (completion_tokens >= 2) & (chunks >= 2) & (last > first)).fill_null(False)
    return pl.when(measurable).then((completion_tokens - 1) / (last - first)).cast(pl.Float64)


def band_rate(rates: pl.Expr) -> pl.Expr:
    """``parity.band_decode_rate`` as an aggregation: the median, null if any slot is untimed.

    Parameters
    ----------
    rates : polars.Expr
        The slots' decode rates.

    Returns
    -------
    polars.Expr
    """
    return pl.when((rates.null_count() == 0) & (rates.len() > 0)).then(rates.median())


def flip_bins(at_risk: pl.DataFrame, edges: Sequence[float]) -> pl.DataFrame:
    """P(flip | margin) per bin ``[edges[i], edges[i + 1])`` from steps at risk (``margin``, ``flip``).

    Parameters
    ----------
    at_risk : polars.DataFrame
        One row per step at risk: ``margin`` and ``flip``.
    edges : sequence of float
        The bins' edges, increasing.

    Returns
    -------
    polars.DataFrame
    """
    bins = pl.DataFrame(
        {"margin_low": [float(e) for e in edges[:-1]], "margin_high": [float(e) for e in edges[1:]]}
    ).with_row_index("bin")
    found = np.searchsorted(np.asarray(edges, dtype=float), at_risk["margin"].to_numpy(), side="right") - 1
    counted = (
        at_risk.with_columns(bin=pl.Series(found, dtype=pl.Int64))
        .filter((pl.col("bin") >= 0) & (pl.col("bin") < len(edges) - 1))
        .group_by("bin")
        .agg(steps=pl.len().cast(pl.Int64), flips=pl.col("flip").sum().cast(pl.Int64))
    )
    out = (
        bins.with_columns(pl.col("bin").cast(pl.Int64))
        .join(counted, on="bin", how="left", maintain_order="left")
        .with_columns(pl.col("steps", "flips").fill_null(0))
    )
    return out.select(
        "margin_low",
        "margin_high",
        "steps",
        "flips",
        p_flip=pl.when(pl.col("steps") > 0).then(pl.col("flips") / pl.col("steps")),
    )
