"""The regression rules of a history (``analysis.verdicts._regressions``) on band frames built by hand (issue 16).

tests/test_trend.py plants a regression in real nightly runs; these pin each rule's edge, the series
and c a band is compared within, and the commits named between the last good and the first bad entry."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from analysis import REGRESSION_RULES, Rule
from analysis.studies._history_frames import BAND_SCHEMA, MARKER_SCHEMA
from analysis.verdicts._regressions import regressions


def day(n: int) -> dt.datetime:
    return dt.datetime(2026, 11, n, tzinfo=dt.UTC)


def bands(*rows: dict) -> pl.DataFrame:
    """Band rows over defaults: host h, engine e, model m, settings s, c=4, every share 1.0, decode ratio 0.9 in [0.8, 1.0]."""
    base = {"host": "h", "engine": "e", "model": "m", "series_settings": "s", "c": 4, "bit_identical_share": 1.0, "token_identical_share": 1.0,
            "decode_ratio": 0.9, "decode_ratio_low": 0.8, "decode_ratio_high": 1.0}
    full = [{**base, "entry": f"n{i}", "commit": f"c{i}", **row} for i, row in enumerate(rows)]
    schema = {**BAND_SCHEMA, "series_settings": pl.String}  # a History's bands carry their entry's series_settings
    return pl.DataFrame(full, schema=schema, orient="row") if full else pl.DataFrame(schema=schema)


def markers(*rows: tuple) -> pl.DataFrame:
    return pl.DataFrame([{"host": host, "time": time, "commit": commit} for host, time, commit in rows],
                        schema={"host": pl.String, "time": MARKER_SCHEMA["time"], "commit": pl.String})


NO_MARKERS = markers()


def flagged(frame: pl.DataFrame, marks: pl.DataFrame = NO_MARKERS) -> list[tuple]:
    """(rule, c, before, after, last good entry, first bad entry, commits between) of each regression."""
    found = regressions(frame, marks)
    return [(r["rule"], r["c"], r["before"], r["after"], r["last_good_entry"], r["first_bad_entry"], r["commits_between"])
            for r in found.iter_rows(named=True)]


def test_the_rules_as_data():
    assert [(r.name, r.metric, r.at_least, r.past_interval, r.batched_only, r.needs_interval) for r in REGRESSION_RULES] == [
        ("tokens part", "token_identical_share", 1.0, False, False, False),
        ("bits differ", "bit_identical_share", 1.0, False, False, False),
        ("decode below the bar", "decode_ratio", 0.5, False, True, True),
        ("decode fell", "decode_ratio", None, True, True, True),
    ]
    assert [r.words for r in REGRESSION_RULES] == [
        "a band that held to its end now parts from m=1", "requests that were bit-identical to m=1 are not",
        "the decode ratio to c=1 fell below the bar of 0.5", "the decode ratio to c=1 fell by more than its interval"]


def test_a_steady_history_has_no_regressions_and_the_empty_frame_has_the_schema():
    found = regressions(bands({"time": day(1)}, {"time": day(2)}), NO_MARKERS)
    assert found.height == 0 and list(found.columns) == [
        "rule", "words", "host", "engine", "model", "series_settings", "c", "before", "after", "last_good_time", "last_good_commit", "last_good_entry",
        "first_bad_time", "first_bad_commit", "first_bad_entry", "commits_between"]
    assert found.schema["commits_between"] == pl.List(pl.String) and found.schema["c"] == pl.Int64
    assert regressions(bands(), NO_MARKERS).height == 0
    assert regressions(bands({"time": day(1)}, {"time": day(2), "bit_identical_share": 0.0}), NO_MARKERS, rules=[]).height == 0


def test_shares_that_held_and_now_do_not():
    frame = bands({"time": day(1)}, {"time": day(2), "token_identical_share": 0.75, "bit_identical_share": 0.5})
    assert flagged(frame) == [("bits differ", 4, 1.0, 0.5, "n0", "n1", ["c0", "c1"]),
                              ("tokens part", 4, 1.0, 0.75, "n0", "n1", ["c0", "c1"])]  # same first bad time: by rule name
    row = regressions(frame, NO_MARKERS).row(0, named=True)
    assert (row["words"], row["host"], row["engine"], row["model"], row["series_settings"]) == (
        "requests that were bit-identical to m=1 are not", "h", "e", "m", "s")
    assert (row["last_good_time"], row["first_bad_time"], row["last_good_commit"], row["first_bad_commit"]) == (day(1), day(2), "c0", "c1")


def test_a_share_that_never_held_is_no_regression():
    # 0.5 then 0.25 is worse, but the band was never good; and good again after bad is a recovery
    assert flagged(bands({"time": day(1), "bit_identical_share": 0.5}, {"time": day(2), "bit_identical_share": 0.25},
                         {"time": day(3)})) == []


def test_the_decode_bar_at_its_edge_and_for_batched_bands_only():
    at_bar = bands({"time": day(1), "decode_ratio_low": 0.4}, {"time": day(2), "decode_ratio": 0.5, "decode_ratio_low": 0.4})
    assert flagged(at_bar) == []  # 0.5 is at the bar, not below it
    below = bands({"time": day(1), "decode_ratio": 0.5, "decode_ratio_low": 0.4},
                  {"time": day(2), "decode_ratio": 0.49, "decode_ratio_low": 0.4, "decode_ratio_high": 0.6})
    assert flagged(below) == [("decode below the bar", 4, 0.5, 0.49, "n0", "n1", ["c0", "c1"])]
    alone = bands({"time": day(1), "c": 1, "decode_ratio": 0.9}, {"time": day(2), "c": 1, "decode_ratio": 0.1, "decode_ratio_high": 0.2})
    assert flagged(alone) == []  # c=1 is the base of the ratio, never judged by it


def test_decode_fell_past_its_interval():
    # now [0.5, 0.79]: its top is below the previous bottom 0.8
    fell = bands({"time": day(1)}, {"time": day(2), "decode_ratio": 0.6, "decode_ratio_low": 0.5, "decode_ratio_high": 0.79})
    assert flagged(fell) == [("decode fell", 4, 0.9, 0.6, "n0", "n1", ["c0", "c1"])]
    touching = bands({"time": day(1)}, {"time": day(2), "decode_ratio": 0.6, "decode_ratio_low": 0.5, "decode_ratio_high": 0.8})
    assert flagged(touching) == []  # intervals that touch overlap


def test_bands_are_compared_within_their_series_and_c_in_time_order():
    frame = bands({"time": day(3), "bit_identical_share": 0.0},  # listed first, but latest
                  {"time": day(1)},
                  {"time": day(2), "c": 8, "bit_identical_share": 0.0},  # another c: no previous entry of its own
                  {"time": day(2), "host": "other", "bit_identical_share": 0.0})  # another host: likewise
    assert flagged(frame) == [("bits differ", 4, 1.0, 0.0, "n1", "n0", ["c1", "c0"])]
    for column in ("engine", "model", "series_settings"):
        other = bands({"time": day(1)}, {"time": day(2), column: "x", "bit_identical_share": 0.0})
        assert flagged(other) == []


def test_a_change_of_settings_starts_another_series_and_is_never_a_regression():
    # issue 22: default mode (bits differ at c=4), fixed-tiles twice (bit-identical), default again: nothing regressed
    modes = bands({"time": day(1), "series_settings": "kernel_mode=default", "bit_identical_share": 0.0},
                  {"time": day(2), "series_settings": "kernel_mode=fixed-tiles"}, {"time": day(3), "series_settings": "kernel_mode=fixed-tiles"},
                  {"time": day(4), "series_settings": "kernel_mode=default", "bit_identical_share": 0.0})
    assert flagged(modes) == []
    # fixed-tiles losing its bits on day 5 is one, against its own last good night (day 3), whatever ran in between
    worse = pl.concat([modes, bands({"time": day(5), "series_settings": "kernel_mode=fixed-tiles", "bit_identical_share": 0.5})
                       .with_columns(entry=pl.lit("n4"), commit=pl.lit("c4"))])
    found = regressions(worse, NO_MARKERS)
    assert found.select("rule", "series_settings", "c", "before", "after", "last_good_entry", "first_bad_entry").rows() == [
        ("bits differ", "kernel_mode=fixed-tiles", 4, 1.0, 0.5, "n2", "n4")]
    assert found["commits_between"].to_list() == [["c2", "c4"]]


def test_entries_without_settings_are_a_series_of_their_own():
    # no settings recorded (None) is compared with no settings recorded, never with a known setting
    unknown = bands({"time": day(1), "series_settings": None}, {"time": day(2), "series_settings": None, "bit_identical_share": 0.0})
    assert flagged(unknown) == [("bits differ", 4, 1.0, 0.0, "n0", "n1", ["c0", "c1"])]
    assert regressions(bands({"time": day(1), "series_settings": None}, {"time": day(2), "series_settings": None, "bit_identical_share": 0.0}),
                       NO_MARKERS)["series_settings"].to_list() == [None]
    mixed = bands({"time": day(1), "series_settings": None}, {"time": day(2), "bit_identical_share": 0.0})
    assert flagged(mixed) == []


def test_a_decode_ratio_without_an_interval_is_not_judged():
    # n1 and n2 have a ratio but no whole interval (too few requests to time): far below the bar and far below n0's interval,
    # they are not judged, and n3, which has one, is compared with n0, the last band that had one too.
    frame = bands({"time": day(1)},
                  {"time": day(2), "decode_ratio": 0.1, "decode_ratio_low": None, "decode_ratio_high": 0.2},
                  {"time": day(3), "decode_ratio": 0.1, "decode_ratio_low": 0.05, "decode_ratio_high": None},
                  {"time": day(4), "decode_ratio": 0.45, "decode_ratio_low": 0.4, "decode_ratio_high": 0.49})
    assert flagged(frame) == [("decode below the bar", 4, 0.9, 0.45, "n0", "n3", ["c0", "c3"]),
                              ("decode fell", 4, 0.9, 0.45, "n0", "n3", ["c0", "c3"])]
    shares = bands({"time": day(1), "decode_ratio_low": None}, {"time": day(2), "bit_identical_share": 0.5, "decode_ratio_low": None})
    assert flagged(shares) == [("bits differ", 4, 1.0, 0.5, "n0", "n1", ["c0", "c1"])]  # the share rules need no interval


def test_entries_of_one_moment_and_unknown_values():
    same_time = bands({"time": day(1)}, {"time": day(1), "bit_identical_share": 0.0})
    assert flagged(same_time) == []
    # a band without a value or a time is skipped: the next one is compared with the one before it
    gap = bands({"time": day(1)}, {"time": day(2), "bit_identical_share": None}, {"time": None, "bit_identical_share": 1.0},
                {"time": day(3), "bit_identical_share": 0.0})
    assert flagged(gap) == [("bits differ", 4, 1.0, 0.0, "n0", "n3", ["c0", "c3"])]


def test_the_commits_between_name_the_releases_on_the_host_in_the_span():
    frame = bands({"time": day(2), "commit": "good"}, {"time": day(6), "commit": "bad", "bit_identical_share": 0.0})
    marks = markers(("h", day(4), "m4"), ("h", day(3), "m3"), ("h", day(2), "at-good"), ("h", day(6), "bad"),
                    ("h", day(7), "after"), ("other", day(4), "elsewhere"))
    # after the last good (not at it), up to and with the first bad, oldest first, each once
    assert regressions(frame, marks)["commits_between"].to_list() == [["good", "m3", "m4", "bad"]]
    unknown = bands({"time": day(2), "commit": None}, {"time": day(6), "commit": "", "bit_identical_share": 0.0})
    assert regressions(unknown, marks)["commits_between"].to_list() == [["m3", "m4", "bad"]]


def test_several_regressions_are_ordered_by_first_bad_time_then_rule_then_c():
    frame = bands({"time": day(1), "c": 8}, {"time": day(1), "c": 4}, {"time": day(3), "c": 8, "bit_identical_share": 0.0},
                  {"time": day(2), "c": 4, "token_identical_share": 0.5, "bit_identical_share": 0.0},
                  {"time": day(3), "c": 4, "token_identical_share": 0.5, "bit_identical_share": 0.0})
    assert [(r[0], r[1], r[5]) for r in flagged(frame)] == [
        ("bits differ", 4, "n3"), ("tokens part", 4, "n3"), ("bits differ", 8, "n2")]


def test_a_rule_of_ones_own():
    fast = Rule("fast", "decode_ratio", "decode ratio under 0.95", at_least=0.95)
    found = regressions(bands({"time": day(1), "c": 1, "decode_ratio": 1.0}, {"time": day(2), "c": 1}), NO_MARKERS, rules=[fast])
    assert found.select("rule", "words", "c", "before", "after").rows() == [("fast", "decode ratio under 0.95", 1, 1.0, 0.9)]


def test_ties_in_time_and_rule_are_ordered_by_c_across_hosts():
    # host a's c=8 and host b's c=4 go bad at the same moment: c orders them, whatever the host
    frame = bands({"time": day(1), "host": "a", "c": 8}, {"time": day(2), "host": "a", "c": 8, "bit_identical_share": 0.0},
                  {"time": day(1), "host": "b", "c": 4}, {"time": day(2), "host": "b", "c": 4, "bit_identical_share": 0.0})
    assert regressions(frame, NO_MARKERS).select("host", "c").rows() == [("b", 4), ("a", 8)]


def test_commits_between_stay_a_list_of_strings_when_none_are_known():
    frame = bands({"time": day(1), "commit": None}, {"time": day(2), "commit": None, "bit_identical_share": 0.0})
    found = regressions(frame, NO_MARKERS)
    assert found["commits_between"].to_list() == [[]] and found.schema["commits_between"] == pl.List(pl.String)


def test_a_batch_of_two_is_batched():
    frame = bands({"time": day(1), "c": 2}, {"time": day(2), "c": 2, "decode_ratio": 0.4, "decode_ratio_low": 0.3,
                                              "decode_ratio_high": 0.45})
    assert [r[:2] for r in flagged(frame)] == [("decode below the bar", 2), ("decode fell", 2)]
