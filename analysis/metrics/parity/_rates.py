"""Decode rates and their intervals: per request, per band, the ratio of two samples' medians, and Wilson's interval for a share."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import polars as pl

from ...core import as_polars
from . import _columnar


def wilson_interval(successes: int, trials: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a proportion (95% by default).

    Parameters
    ----------
    successes : int
        Successes.
    trials : int
        Trials, at least one.
    z : float, default 1.959963984540054
        The normal quantile.

    Returns
    -------
    tuple of (float, float)

    Examples
    --------
    >>> tuple(round(x, 4) for x in wilson_interval(8, 10))
    (0.4902, 0.9433)
    """
    if trials <= 0:
        raise ValueError("the Wilson interval needs at least one trial")
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def decode_rate(
    completion_tokens: int | None,
    first_arrival: float | None,
    last_arrival: float | None,
    content_chunks: int | None,
    live: bool | None,
) -> float | None:
    """A request's decode rate, ``(completion_tokens - 1) / (last - first arrival)`` of content chunks.

    Only for a live stream (``stream_live``: declared live by the server, or observed live from its
    arrival times, see ``analysis.dumps._liveness.liveness``); None with fewer than two content chunks or two
    tokens, or a zero span: a rate is measured, never invented.

    Parameters
    ----------
    completion_tokens : int or None
        The request's completion tokens.
    first_arrival, last_arrival : float or None
        The first and last content chunk's arrival, in seconds.
    content_chunks : int or None
        How many content chunks came.
    live : bool or None
        Whether the stream is live (None: unknown).

    Returns
    -------
    float or None
        Tokens per second.

    Examples
    --------
    >>> decode_rate(128, 0.25, 3.425, 120, True)
    40.0
    >>> decode_rate(128, 0.25, 3.425, 120, None) is None  # liveness unknown
    True
    """
    if not live or completion_tokens is None or completion_tokens < 2 or content_chunks is None or content_chunks < 2:
        return None
    if first_arrival is None or last_arrival is None or last_arrival <= first_arrival:
        return None
    return (completion_tokens - 1) / (last_arrival - first_arrival)


FASTER_THAN_ENGINE = 3.0  # a band's requests share its steps: one decoding 3x faster than their mean is not decoding


def request_decode_rates(requests: Any) -> pl.DataFrame:
    """The dump's ``requests`` with a ``decode_tok_s`` column (null where it cannot be measured) and its
    ``decode_rate_origin``, the first of:

    1. the server's own timing of the request, where it sent one (``extra``'s ``timings.predicted_per_second``, as
       llama.cpp's server and ``bia serve`` do): ``"server: timings, request"``;
    2. the stream's, ``"stream"``, where :func:`decode_rate` measures it from a live stream (and, where the engine's
       band rate is known, no more than ``FASTER_THAN_ENGINE`` times it);
    3. the engine's rate over the request's band where the probe recorded one (``extra``'s ``server_decode``: 1 / the
       engine's mean time per output token, see ``analysis.probe._widths.server_decode``), named by its metric.

    Null where none is known: a stream read in a burst or a rush, from a server that does not time its requests, has no rate.

    Parameters
    ----------
    requests : DataFrame
        A dump's requests (polars or pandas).

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> requests = pl.DataFrame({"completion_tokens": [33, 33, 33, 33], "ttft_s": [0.25, 1.0, 1.0, 1.0],
    ...                          "t_last_content": [0.5, 1.00003, 1.00003, 1.00003], "n_content_chunks": [33, 33, 33, 33],
    ...                          "stream_live": [True, False, False, False],
    ...                          "extra": [None, '{"server_decode": {"tok_s": 250.0, "over": "band", "metric": "t_sum / t_count"}}',
    ...                                    '{"timings": {"predicted_n": 33, "predicted_ms": 110.0, "predicted_per_second": 300.0}}', None]})
    >>> request_decode_rates(requests).select("decode_tok_s", "decode_rate_origin").rows()  # 32 tokens in 0.25 s; rushes; nothing
    [(128.0, 'stream'), (250.0, 'server: t_sum / t_count, band mean'), (300.0, 'server: timings, request'), (None, None)]
    """
    requests = as_polars(requests)
    stream = _columnar.decode_rate(
        pl.col("completion_tokens"),
        pl.col("ttft_s"),
        pl.col("t_last_content"),
        pl.col("n_content_chunks"),
        pl.col("stream_live"),
    )
    if "extra" in requests.columns:
        timed = pl.col("extra").str.json_path_match("$.timings.predicted_per_second").cast(pl.Float64)
        timed = pl.when(timed > 0).then(timed)
        band = pl.col("extra").str.json_path_match("$.server_decode.tok_s").cast(pl.Float64)
        named = pl.concat_str(
            pl.lit("server: "),
            pl.col("extra").str.json_path_match("$.server_decode.metric"),
            pl.lit(", "),
            pl.col("extra").str.json_path_match("$.server_decode.over"),
            pl.lit(" mean"),
        )
    else:
        timed = band = pl.lit(None, dtype=pl.Float64)
        named = pl.lit(None, dtype=pl.String)
    # a client cannot receive tokens faster than the engine made them: a stream FASTER_THAN_ENGINE times quicker than the
    # engine's own rate came from a buffer (a rush slower than the liveness rule's bar), and takes the engine's
    own = stream.is_not_null() & (band.is_null() | (stream <= FASTER_THAN_ENGINE * band)).fill_null(True)
    return requests.with_columns(
        decode_tok_s=pl.when(timed.is_not_null()).then(timed).when(own).then(stream).otherwise(band),
        decode_rate_origin=pl.when(timed.is_not_null())
        .then(pl.lit("server: timings, request"))
        .when(own)
        .then(pl.lit("stream"))
        .when(band.is_not_null())
        .then(named),
    )


def band_decode_rate(rates: Sequence[float | None]) -> float | None:
    """A band's rate: the median of its slots' rates (linear interpolation); None if any slot is untimed.

    Parameters
    ----------
    rates : sequence of float or None
        The slots' decode rates, in tokens per second.

    Returns
    -------
    float or None

    Examples
    --------
    >>> band_decode_rate([30.0, 32.0, 31.0, 35.0]), band_decode_rate([30.0, None])
    (31.5, None)
    """
    if not rates or any(r is None for r in rates):
        return None
    return statistics.median(cast(Sequence[float], rates))  # no None: checked above


BOOTSTRAP_BLOCK = (
    1 << 22
)  # resampled rates drawn at once (32 MB): a c of 256,000 requests is not 2,000 x 256,000 floats


def _resampled_medians(rng: np.random.Generator, rates: np.ndarray, n_boot: int) -> np.ndarray:
    """The medians of ``n_boot`` resamples of ``rates``, drawn a block of resamples at a time so that memory does not
    grow with the rates: the generator gives the same draws split into consecutive blocks as in one call."""
    rows = max(1, BOOTSTRAP_BLOCK // rates.size)
    return np.concatenate(
        [
            np.median(rng.choice(rates, size=(min(rows, n_boot - start), rates.size)), axis=1)
            for start in range(0, n_boot, rows)
        ]
    )


def ratio_interval(
    base: Sequence[float], batched: Sequence[float], *, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """The ratio of median rates (batched / base) with a percentile bootstrap interval.

    Resamples the repeats of each band independently, as S7 compares c=4 with c=1 when bands
    were repeated. Returns (ratio, low, high).

    Parameters
    ----------
    base, batched : sequence of float
        The repeats' rates of the base band and of the batched one, each at least one.
    n_boot : int, default 2000
        Bootstrap resamples.
    seed : int, default 0
        Seeds the resampling.
    level : float, default 0.95
        The interval's coverage.

    Returns
    -------
    tuple of (float, float, float)

    Examples
    --------
    >>> ratio, low, high = ratio_interval([40.0, 41.0, 39.0], [30.0, 29.0, 31.0])
    >>> round(ratio, 4), low <= ratio <= high
    (0.75, True)
    """
    base_rates, batched_rates = np.asarray(base, dtype=float), np.asarray(batched, dtype=float)
    if base_rates.size == 0 or batched_rates.size == 0:
        raise ValueError("both bands need at least one rate")
    rng = np.random.default_rng(seed)
    boot_base = _resampled_medians(rng, base_rates, n_boot)
    boot_batched = _resampled_medians(rng, batched_rates, n_boot)
    ratios = boot_batched / boot_base
    tail = (1 - level) / 2 * 100
    return (
        float(np.median(batched_rates) / np.median(base_rates)),
        float(np.percentile(ratios, tail)),
        float(np.percentile(ratios, 100 - tail)),
    )
