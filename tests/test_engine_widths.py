"""Widths and decode rates from an engine's own counters (vLLM's), on manifests worked out by hand: which evidence a
band's width comes from, how it is said, the witness naming it, bad records named, and the server's rate for a
stream without one of its own. tests/test_vllm.py checks the same against the real server."""

from __future__ import annotations

import polars as pl
import pytest

from analysis import Run, read_dumps
from analysis.probe._widths import engine_growth, server_decode
from analysis.run import RunError, band_widths, width_table
from analysis.run._band_tables import _band_widths_text
from analysis.run._layout import _checked_manifest, engine_steps, width_evidence


def _engine(generated: tuple[float, float], steps: tuple[float, float]) -> dict:
    return {"generated": {"metric": "vllm:generation_tokens_total", "before": generated[0], "after": generated[1]},
            "steps": {"metric": "vllm:iteration_tokens_total_count", "before": steps[0], "after": steps[1]}}


def _band(c: int, **entry) -> dict:
    return {"prompt_id": "p0", "c": c, "repeat": 0, "widths": [], **entry}


@pytest.mark.parametrize("entry, widths, origin", [
    # 4 requests x 32 tokens = 128 tokens in 33 steps: 3.88 a step, so some step held 4; the gauge caught only 2
    (_band(4, running=[0, 2, 0], engine=_engine((1000, 1128), (500, 533))), [4], "engine"),
    # a tie goes to the gauge: its samples are direct counts
    (_band(4, running=[4, 4], engine=_engine((0, 128), (0, 32))), [4, 4], "metrics"),
    # the gauge caught 8 where the counters show at least ceil(128 / 20) = 7
    (_band(8, running=[0, 8, 6], engine=_engine((0, 128), (0, 20))), [8, 6], "metrics"),
    # one request, 32 tokens in 32 steps: width 1, and the gauge read only 0
    (_band(1, running=[0], engine=_engine((64, 96), (64, 96))), [1], "engine"),
    # the server log's per-step widths beat both
    (_band(4, widths=[3, 4], running=[4], engine=_engine((0, 128), (0, 32))), [3, 4], "log"),
    # no step counted (a restarted server's counters fell): the streams, then nothing
    (_band(4, running=[0], engine=_engine((500, 20), (300, 10)), streams={"co_resident": 3}), [3], "streams"),
    (_band(4, running=[0], engine=_engine((0, 0), (0, 0))), [], None),
])
def test_the_width_comes_from_the_widest_engine_side_evidence(entry, widths, origin):
    assert band_widths({"m_formed": [entry]}, "p0", entry["c"], 0) == (widths, origin)


def test_every_kind_of_evidence_is_kept_and_said():
    entry = _band(16, running=[0, 9], engine=_engine((0, 512), (0, 36)), streams={"co_resident": 16})
    manifest = {"m_formed": [entry]}
    # 512 / 36 = 14.2 tokens a step: at least 15 in some step
    assert width_evidence(manifest, "p0", 16, 0) == {"metrics": [9], "engine": [15], "streams": [16]}
    run = Run(manifest, read_dumps([]))
    (text,) = _band_widths_text(run, pl.DataFrame({"prompt_id": ["p0"], "arm": ["copies"], "c": [16], "repeat": [0], "all_live": [True]}))
    assert text == {"m_formed": 15, "widths_seen": "m>=15 (512 tokens in 36 engine steps, 14.22 a step)",
                    "width_evidence": "engine; metrics 9; streams 16", "prefix_cache": None}  # no cache metrics around this band
    assert width_table(run).select("width", "steps", "share", "origin").rows() == [(15, 1, 1.0, "engine")]


def test_engine_steps_needs_both_counters_and_a_step():
    assert engine_steps({"engine": _engine((0, 96), (0, 32))}) == (96, 32)
    assert engine_steps({"engine": {"generated": _engine((0, 96), (0, 32))["generated"]}}) is None
    assert engine_steps({"engine": _engine((0, 96), (None, 32))}) is None
    assert engine_steps({}) is None


def test_a_bad_engine_record_is_named():
    with pytest.raises(RunError, match=r"m_formed\[0\]\.engine.*metric, before, after"):
        _checked_manifest({"m_formed": [_band(4, engine={"generated": {"metric": 7, "before": 0, "after": 1}})]}, "run/manifest.json")
    with pytest.raises(RunError, match=r"run/manifest.json: .*m_formed\[0\]\.engine"):
        _checked_manifest({"m_formed": [_band(4, engine={"steps": {"metric": "s", "before": "0", "after": 1}})]}, "run/manifest.json")


def test_the_servers_decode_rate_from_its_histogram():
    roles = {"tpot_sum": "t_sum", "tpot_count": "t_count", "generated": "g"}
    engine = engine_growth(roles, {"t_sum": 2.0, "t_count": 10.0, "g": 5.0}, {"t_sum": 2.5, "t_count": 14.0})
    assert engine == {"tpot_sum": {"metric": "t_sum", "before": 2.0, "after": 2.5}, "tpot_count": {"metric": "t_count", "before": 10.0, "after": 14.0},
                      "generated": {"metric": "g", "before": 5.0, "after": None}}
    # 4 requests finished, their mean times per token summing to 0.5 s: 0.125 s each, 8 tokens/s
    assert server_decode(engine, "band") == {"tok_s": 8.0, "tpot_s": 0.125, "requests": 4, "over": "band", "metric": "t_sum / t_count"}
    assert server_decode({**engine, "tpot_count": {"metric": "t_count", "before": 14.0, "after": 14.0}}, "band") is None  # none finished
    assert server_decode({"tpot_sum": engine["tpot_sum"]}, "band") is None
    assert engine_growth(roles, None, {"t_sum": 1.0}) is None and engine_growth(roles, {}, {}) is None


def test_a_stream_with_its_own_rate_keeps_it_and_the_others_take_the_servers():
    from analysis.metrics.parity._rates import request_decode_rates

    server = '{"server_decode": {"tok_s": 80.0, "over": "band", "metric": "m"}}'
    requests = pl.DataFrame({"completion_tokens": [33, 33, 33, 33], "ttft_s": [0.5, 1.0, 1.0, None], "t_last_content": [0.82, 1.00003, 1.00003, None],
                             "n_content_chunks": [33, 33, 33, 1], "stream_live": [True, False, False, None], "extra": [server, server, None, server]})
    rates = request_decode_rates(requests)
    # live: 32 tokens in 0.32 s = 100 tok/s of its own, though the server's is there; a rush takes the server's 80; a rush
    # without one has none; an untimed stream takes the server's
    own, rush, bare, untimed = rates["decode_tok_s"].to_list()
    assert own == pytest.approx(100.0) and (rush, bare, untimed) == (80.0, None, 80.0)
    assert rates["decode_rate_origin"].to_list() == ["stream", "server: m, band mean", None, "server: m, band mean"]


def test_a_stream_faster_than_its_engine_takes_the_engines_rate():
    """A client cannot receive tokens faster than the engine made them: 32 tokens in 0.32 s is 100 tok/s, more than
    3 x 30 = 90 from the engine's own histogram, so that stream's times show a buffer, not the decode; at 34 (102)
    it stands."""
    from analysis.metrics.parity._rates import FASTER_THAN_ENGINE, request_decode_rates

    assert FASTER_THAN_ENGINE == 3.0
    extra = [f'{{"server_decode": {{"tok_s": {rate}, "over": "band", "metric": "m"}}}}' for rate in (30.0, 34.0)]
    requests = pl.DataFrame({"completion_tokens": [33, 33], "ttft_s": [0.5, 0.5], "t_last_content": [0.82, 0.82], "n_content_chunks": [33, 33],
                             "stream_live": [True, True], "extra": extra})
    rates = request_decode_rates(requests)
    assert rates["decode_tok_s"][0] == 30.0 and rates["decode_tok_s"][1] == pytest.approx(100.0)
    assert rates["decode_rate_origin"].to_list() == ["server: m, band mean", "stream"]
