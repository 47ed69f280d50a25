"""What batching costs in decode rate: each c's per-request decode rate over one c=1 baseline, the one definition every
surface of bia shows (the judgement's cost, the answer, the cards, runs and engines side by side, the trend).

The **c=1 baseline** of a group of requests (a run's arm, a witness) is the median per-request decode rate of its c=1
requests, each a prompt sent alone. Both sides of a ratio are timed one way: by the streams' own arrival times where any
c=1 request of the group was timed so, else by the server's own timings (a witness: the rates it recorded); requests
timed the other way are left out on both sides, so one baseline holds for every c. A c's ratio is the median rate of its
requests over the baseline, with a 95% bootstrap interval where each side has ``MIN_RATE_SAMPLES`` rates.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from ._rates import ratio_interval

MIN_RATE_SAMPLES = 3  # rates a side needs before a ratio of medians gets an interval

TIMING_WORDS = {
    "streams": "streams’ timings",
    "server": "the server’s timings",
    "witness": "the witness’s recorded rates",
}  # a baseline's timing, in the words the cost line ends with

SCHEMA = {
    "c": pl.Int64,
    "origin": pl.String,
    "rates": pl.Int64,
    "median": pl.Float64,
    "base_rates": pl.Int64,
    "base_median": pl.Float64,
    "ratio": pl.Float64,
    "low": pl.Float64,
    "high": pl.Float64,
}


def _timing(origin: pl.Expr) -> pl.Expr:
    """A request's ``decode_rate_origin`` as the timing its rate shares with others: streams, the server's, a witness's."""
    return (
        pl.when(origin == "stream")
        .then(pl.lit("streams"))
        .when(origin == "witness")
        .then(pl.lit("witness"))
        .when(origin.is_not_null())
        .then(pl.lit("server"))
    )


def decode_cost(requests: pl.DataFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """Each c's median per-request decode rate over the c=1 baseline of its group, both timed one way.

    Parameters
    ----------
    requests : polars.DataFrame
        One row per request: ``c``, ``decode_tok_s`` (tokens per second, null or 0 where untimed),
        ``decode_rate_origin`` (``"stream"``, ``"witness"`` or the server's metric; absent reads as ``"stream"``) and
        the columns of ``by``.
    by : sequence of str, default ()
        The groups that each have a baseline of their own (``("arm",)``: each arm's c=1 requests).

    Returns
    -------
    polars.DataFrame
        One row per group and c timed like its baseline, c=1 included (ratio 1), sorted: the columns of ``by``, ``c``,
        ``origin`` (the timing: ``streams``, ``server`` or ``witness``), ``rates`` and ``median`` (the c's requests and
        their median rate), ``base_rates`` and ``base_median`` (the baseline's), ``ratio`` and its interval ``low`` and
        ``high`` (null with fewer than ``MIN_RATE_SAMPLES`` rates a side). A group with no timed c=1 request has no row.

    Examples
    --------
    Two c=1 requests, one timed by its stream (30 tok/s) and one only by the server (90): the baseline is the stream's
    30, and c=4's streams (median 60) run at 2× it per request; the server-timed request at c=4 is left out.

    >>> requests = pl.DataFrame({"c": [1, 1, 4, 4, 4, 4], "decode_tok_s": [30.0, 90.0, 50.0, 60.0, 70.0, 10.0],
    ...                          "decode_rate_origin": ["stream", "server: vllm", "stream", "stream", "stream", "server: vllm"]})
    >>> decode_cost(requests).select("c", "origin", "rates", "median", "base_median", "ratio").rows()
    [(1, 'streams', 1, 30.0, 30.0, 1.0), (4, 'streams', 3, 60.0, 30.0, 2.0)]
    """
    keys = [*by, "_group"]
    origin = pl.col("decode_rate_origin") if "decode_rate_origin" in requests.columns else pl.lit("stream")
    timed = requests.filter(pl.col("decode_tok_s") > 0).with_columns(_group=pl.lit(0), origin=_timing(origin))
    base_timing = (
        timed.filter((pl.col("c") == 1) & pl.col("origin").is_not_null())
        .group_by(keys)
        .agg(
            origin=pl.when((pl.col("origin") == "streams").any()).then(pl.lit("streams")).otherwise(pl.first("origin"))
        )
    )
    per_c = (
        timed.join(base_timing, on=[*keys, "origin"], how="semi")
        .group_by([*keys, "c", "origin"])
        .agg(rate_list=pl.col("decode_tok_s"), rates=pl.len().cast(pl.Int64), median=pl.col("decode_tok_s").median())
    )
    base = per_c.filter(pl.col("c") == 1).select(*keys, base_list="rate_list", base_rates="rates", base_median="median")
    joined = per_c.join(base, on=keys).sort(*keys, "c")
    ratios = [
        (median / base_median, *ratio_interval(b, r)[1:])
        if c > 1 and min(len(b), len(r)) >= MIN_RATE_SAMPLES
        else (median / base_median, None, None)
        for c, median, base_median, b, r in joined.select(
            "c", "median", "base_median", "base_list", "rate_list"
        ).iter_rows()
    ]  # per c, not per request: a bootstrap each, and Python's division (polars may multiply by the reciprocal)
    bounds = pl.DataFrame(ratios, schema={"ratio": pl.Float64, "low": pl.Float64, "high": pl.Float64}, orient="row")
    return pl.concat(
        [joined.select(*by, *[pl.col(k).cast(t) for k, t in SCHEMA.items() if k not in bounds.columns]), bounds],
        how="horizontal",
    )


def cost_by_c(requests: pl.DataFrame) -> list[dict]:
    """:func:`decode_cost` of one group's requests as the judgement row's ``cost_by_c``: one dict per c > 1.

    Parameters
    ----------
    requests : polars.DataFrame
        One group's requests, as :func:`decode_cost` takes them.

    Returns
    -------
    list of dict
        The keys of ``SCHEMA``.
    """
    return decode_cost(requests).filter(pl.col("c") > 1).to_dicts()
