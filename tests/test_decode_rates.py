"""request_decode_rates' order of origins (issue 32 item 9), each on requests worked out by hand: the server's own timing of a
request first, then a live stream's own (unless three times faster than the engine's band mean), then that band mean."""

from __future__ import annotations

import json

import polars as pl

from analysis.metrics.parity import request_decode_rates


def _requests(*rows):
    """Requests of 33 tokens: a live stream of them spans 0.25 s (128 tok/s) unless ``last`` says otherwise."""
    base = {"completion_tokens": 33, "ttft_s": 0.25, "t_last_content": 0.5, "n_content_chunks": 33, "stream_live": True, "extra": None}
    return pl.DataFrame([{**base, **row} for row in rows])


def _extra(**parts):
    return json.dumps(parts)


BAND = {"tok_s": 100.0, "over": "band", "metric": "t_sum / t_count"}


def test_each_origin_in_its_order():
    rates = request_decode_rates(_requests(
        {},  # a live stream alone: (33 - 1) / 0.25
        {"extra": _extra(timings={"predicted_n": 33, "predicted_ms": 110.0, "predicted_per_second": 300.0})},  # the server's, first
        {"extra": _extra(server_decode=BAND)},  # 128 <= 3 x 100: the stream's own
        {"extra": _extra(server_decode=BAND), "t_last_content": 0.3},  # 32 / 0.05 = 640 > 300: buffered, the band's
        {"extra": _extra(server_decode=BAND), "stream_live": False},  # no stream rate: the band's
        {"extra": _extra(timings={"predicted_per_second": 0.0}, server_decode=BAND), "stream_live": False},  # 0 is no timing
        {"stream_live": False},  # nothing: no rate
    )).select("decode_tok_s", "decode_rate_origin").rows()
    band = "server: t_sum / t_count, band mean"
    assert rates == [(128.0, "stream"), (300.0, "server: timings, request"), (128.0, "stream"), (100.0, band), (100.0, band),
                     (100.0, band), (None, None)]


def test_the_stream_at_three_times_the_band_is_still_its_own():
    rates = request_decode_rates(_requests({"extra": _extra(server_decode=BAND), "t_last_content": 0.25 + 32 / 300}))
    assert rates.select("decode_rate_origin").item() == "stream"  # exactly 300 tok/s: FASTER_THAN_ENGINE is "more than 3x"


def test_a_dump_without_extra_has_stream_rates_only():
    rates = request_decode_rates(_requests({}, {"stream_live": False}).drop("extra"))
    assert rates.select("decode_tok_s", "decode_rate_origin").rows() == [(128.0, "stream"), (None, None)]
