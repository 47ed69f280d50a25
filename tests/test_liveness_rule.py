"""The liveness rule (``analysis.dumps._liveness``) at each of its edges, on arrival times worked out by hand.

tests/test_liveness.py checks the rule end to end against paced and buffering loopback servers; these
pin the thresholds themselves (issue 16: each comparison and constant has a case on each side)."""

from __future__ import annotations

import pytest

from analysis.dumps._liveness import LIVE_SHARE, LIVE_SPAN, RUSH_GAP_S, liveness, timing_columns


def test_the_thresholds():
    assert (LIVE_SHARE, LIVE_SPAN, RUSH_GAP_S) == (0.5, 0.2, 0.0001)


@pytest.mark.parametrize("declared, verdict", [
    ("live", ("declared live", True)),
    ("replay", ("declared replay", False)),
    ("LIVE", ("declared replay", False)),  # only the exact word is live
    ("", ("declared replay", False)),  # a declaration, even an empty one, decides
])
def test_a_declared_mode_decides_unless_the_times_show_a_rush(declared, verdict):
    assert liveness(declared, [0.1, 0.2, 0.3]) == verdict
    assert liveness(declared, []) == verdict
    assert liveness(declared, [0.5]) == verdict  # one known time shows nothing


@pytest.mark.parametrize("times, tokens, verdict", [
    # issue 32 item 9: bia serve said "live", and its 16 tokens reached the client 27 us apart (36,453 tok/s): no engine decodes so
    ([0.05 + 0.000027 * k for k in range(16)], None, ("observed rush", False)),
    ([0.5, 0.5, 0.5, 0.5], None, ("observed rush", False)),  # one read: no span at all
    # 0.12 ms apart: a fast decode, as said
    ([1.0, 1.00012, 1.00024, 1.00036], None, ("declared live", True)),
    # 20 us apart, but over a fifth of the time since the send: streamed from the start, as said
    ([0.00004, 0.00006, 0.00008, 0.0001], None, ("declared live", True)),
    # mostly one time and slow (a burst by the observed rule): the server's word stands, the times show a decode
    ([0.9, 0.9, 1.0, 1.0], None, ("declared live", True)),
    # 2 chunks 0.2 ms apart that carried 8 tokens: 0.2 ms < 7 gaps * 0.1 ms
    ([1.0, 1.0002], 8, ("observed rush", False)),
])
def test_a_stream_said_live_and_read_in_a_rush_is_a_rush(times, tokens, verdict):
    assert liveness("live", times, tokens) == verdict
    assert liveness("replay", times, tokens) == ("declared replay", False)  # a replay never becomes live


@pytest.mark.parametrize("times, verdict", [
    ([], ("untimed", None)),
    ([0.5], ("untimed", None)),
    ([None, 0.5, None], ("untimed", None)),  # one known time is no spread
    ([None, 0.1, None, 0.3], ("observed live", True)),  # unknown times are left out: 0.1 and 0.3 are two of two distinct
    ([0.25, 0.5], ("observed live", True)),
])
def test_at_least_two_known_times_are_needed(times, verdict):
    assert liveness(None, times) == verdict


@pytest.mark.parametrize("times, verdict", [
    # 3 distinct of 4 > 0.5 * 4: live
    ([0.9, 0.95, 1.0, 1.0], ("observed live", True)),
    # 2 distinct of 4 is not more than half; span 0.1 < 0.2 * 1.0: a burst
    ([0.9, 0.9, 1.0, 1.0], ("observed burst", False)),
    # 2 of 4 distinct, span 0.5 == 0.2 * 2.5 exactly: "at least a fifth" holds
    ([2.0, 2.0, 2.0, 2.5], ("observed live", True)),
    # span 0.4 < 0.2 * 2.4 = 0.48
    ([2.0, 2.0, 2.0, 2.4], ("observed burst", False)),
    # span 0.24 < 0.2 * 1.24 = 0.248: the bar is a fifth of the last time, not of any earlier one (0.2 * 1.0)
    ([1.0, 1.0, 1.0, 1.24], ("observed burst", False)),
    # no span at all, even at time 0 where 0 >= 0.2 * 0
    ([0.0, 0.0], ("observed burst", False)),
    ([1.0, 1.0, 1.0], ("observed burst", False)),
    # the span runs from the first to the last time as they arrived: a last time before the first is no span
    ([0.5, 0.25], ("observed burst", False)),
])
def test_observed_live_or_burst(times, verdict):
    assert liveness(None, times) == verdict


RUSH, LIVE = ("observed rush", False), ("observed live", True)


@pytest.mark.parametrize("times, verdict", [
    # 4 chunks 20 us apart after a second of silence (vLLM's front end, lagging its engine): span 6e-5 s < 0.2 * 1.00006
    # and < 1e-4 * 3 gaps
    ([1.0, 1.00002, 1.00004, 1.00006], RUSH),
    # 0.08 ms apart on average (span 0.24 ms < 3 gaps * 0.1 ms), late: a rush
    ([1.0, 1.00008, 1.00016, 1.00024], RUSH),
    # 0.12 ms apart (span 0.36 ms >= 0.3 ms): a fast decode, live
    ([1.0, 1.00012, 1.00024, 1.00036], LIVE),
    # llama.cpp decoding bia's tiny model at 0.38 ms a token after a first token the loaded machine delayed: live
    ([1.0, 1.00038, 1.00076, 1.00114], LIVE),
    # 20 us apart from 40 us after the send: span 6e-5 >= 0.2 * 1e-4, a fast engine streaming from the start, live
    ([0.00004, 0.00006, 0.00008, 0.0001], LIVE),
    # 20 us apart but over a fifth of the time to the last: span 6e-5 >= 0.2 * 2.6e-4 = 5.2e-5
    ([0.0002, 0.00022, 0.00024, 0.00026], LIVE),
    # ... and just under a fifth: span 6e-5 < 0.2 * 3.1e-4 = 6.2e-5
    ([0.00025, 0.00027, 0.00029, 0.00031], RUSH),
    # mostly one time: a burst stays a burst (2 distinct of 4, span 6e-5 < 0.2)
    ([1.0, 1.0, 1.0, 1.00006], ("observed burst", False)),
    # a rush over two chunks: span 1e-5 < 1e-3 * 1
    ([0.5, 0.50001], RUSH),
])
def test_a_rush_is_not_live(times, verdict):
    assert liveness(None, times) == verdict


@pytest.mark.parametrize("times, tokens, verdict", [
    # vLLM's front end packed 64 tokens in 2 chunks 2.3 ms apart, 1.65 s after the send: 2.3 ms < 0.1 ms * 63 tokens' gaps
    ([1.6475, 1.6498], 64, RUSH),
    # the same 2 chunks counted as 2 tokens: 2.3 ms >= 0.1 ms * 1, live
    ([1.6475, 1.6498], 2, LIVE),
    ([1.6475, 1.6498], None, LIVE),
    # fewer tokens than chunks (chunks without logprob entries) count the chunks: 6e-5 < 1e-4 * 3
    ([1.0, 1.00002, 1.00004, 1.00006], 1, RUSH),
    # 7 ms for 64 tokens is 0.11 ms a token: live (0.007 >= 1e-4 * 63)
    ([1.0, 1.007], 64, LIVE),
    # 6 ms for 64 tokens is under 0.1 ms a token (0.006 < 0.0063), late: a rush
    ([1.0, 1.006], 64, RUSH),
])
def test_the_rush_counts_the_tokens_the_chunks_carried(times, tokens, verdict):
    assert liveness(None, times, tokens) == verdict


def test_timing_columns():
    assert timing_columns(None, [None, 0.25, 0.5, None]) == {
        "ttft_s": 0.25, "t_last_content": None, "n_content_chunks": 4, "liveness": "observed live", "stream_live": True}
    assert timing_columns("replay", []) == {
        "ttft_s": None, "t_last_content": None, "n_content_chunks": 0, "liveness": "declared replay", "stream_live": False}
    assert timing_columns(None, [0.0, 3.0]) == {
        "ttft_s": 0.0, "t_last_content": 3.0, "n_content_chunks": 2, "liveness": "observed live", "stream_live": True}
