"""One figure, one definition (issue 41, part 4): a c's per-request decode rate over one c=1 baseline, the median of the
arm's c=1 requests timed one way, worked out by hand and then found, the same, on every surface that shows it."""

from __future__ import annotations

import html
import re
import statistics

import polars as pl
import pytest
from conftest import ROOT

from analysis import read_history, read_run, read_witnesses
from analysis.metrics import cost_by_c, decode_cost
from analysis.views.html import answer_section_html, engines_html, judge_report, mode_comparison_html, reviews_html
from analysis.studies import mode_comparison

DATA = ROOT / "data"
STREAM, SERVER = "stream", "server: t_sum / t_count, band mean"


def test_the_ratio_by_hand_one_baseline_per_arm_of_one_timing():
    requests = pl.DataFrame(
        {
            "arm": ["a"] * 9 + ["b"] * 3,
            "c": [1, 1, 1, 1, 4, 4, 4, 4, 4, 1, 4, 4],
            # arm a: c=1 streams 40, 60, 50 (and a server-timed 200, left out): baseline 50; c=4 streams 20, 30, 25 and an
            # untimed 0 (left out), median 25: 25 / 50 = 0.5. Its server-timed 90 at c=4 is another timing: left out too.
            "decode_tok_s": [40.0, 60.0, 50.0, 200.0, 20.0, 30.0, 25.0, 0.0, 90.0, 80.0, 20.0, 60.0],
            # arm b: only the server timed it: baseline 80, c=4 median (20 + 60) / 2 = 40: 0.5, no interval (one c=1 rate)
            "decode_rate_origin": [STREAM] * 3 + [SERVER] + [STREAM] * 4 + [SERVER] * 4,
        }
    )
    cost = decode_cost(requests, by=["arm"])
    assert cost.select("arm", "c", "origin", "rates", "median", "base_rates", "base_median", "ratio").rows() == [
        ("a", 1, "streams", 3, 50.0, 3, 50.0, 1.0),
        ("a", 4, "streams", 3, 25.0, 3, 50.0, 0.5),
        ("b", 1, "server", 1, 80.0, 1, 80.0, 1.0),
        ("b", 4, "server", 2, 40.0, 1, 80.0, 0.5),
    ]
    a4 = cost.row(1, named=True)  # three rates a side: a bootstrap interval around the ratio, within the resamples' range
    assert 20.0 / 60.0 <= a4["low"] <= 0.5 <= a4["high"] <= 30.0 / 40.0
    assert cost.filter(pl.col("arm") == "b")["low"].is_null().all()
    # a group whose c=1 is untimed has no baseline, and so no ratio at any c
    untimed = requests.with_columns(decode_tok_s=pl.when(pl.col("c") == 1).then(None).otherwise("decode_tok_s"))
    assert decode_cost(untimed, by=["arm"]).is_empty() and cost_by_c(untimed.filter(pl.col("arm") == "a")) == []


@pytest.fixture(scope="module")
def vllm_and_torch():
    runs = [read_run(DATA / "experiment-cpu" / "default"), read_run(DATA / "vllm-cpu" / "no-prefix-cache")]
    ws = read_witnesses([], progress=False)  # runs alone
    return runs, ws, judge_report(ws, runs)


def test_every_surface_shows_the_vllm_runs_ratio_from_one_baseline(vllm_and_torch):
    runs, ws, judgement = vllm_and_torch
    vllm = runs[1]
    # by hand, from the requests: c=1 has one stream-timed request (30.8 tok/s) and one the server timed (92.7): the
    # baseline is the stream's, and c=4's eight stream-timed rates have median (100.3 + 103.0) / 2 = 101.6: 3.30x. The
    # old side-by-side median over both timings (61.7 at c=1) gave 1.65x.
    rows = vllm.requests.filter((pl.col("arm") == "copies") & (pl.col("decode_rate_origin") == STREAM))
    base = [r for c, r in rows.select("c", "decode_tok_s").rows() if c == 1]
    at4 = [r for c, r in rows.select("c", "decode_tok_s").rows() if c == 4]
    assert len(base) == 1 and round(base[0], 1) == 30.8 and len(at4) == 8
    ratio = statistics.median(at4) / statistics.median(base)
    assert f"{ratio:.2f}" == "3.30"

    row = judgement.frame.filter(pl.col("run") == vllm.label).row(0, named=True)
    assert row["cost_by_c"][0]["c"] == 4 and row["cost_by_c"][0]["ratio"] == pytest.approx(ratio)
    # the answer: the column says per request, the cell the ratio, its tooltip the baseline; the definition above it
    answer = answer_section_html(judgement)
    assert "<th>per-request decode rate vs c=1</th>" in answer
    assert "median per-request decode rate of the same arm's c=1" in html.unescape(answer)
    tr = re.search(rf'<tr data-run="{re.escape(vllm.label)}".*?</tr>', answer).group(0)
    assert re.search(r'<td title="baseline 30.8 tok/s: the median of 1 c=1 request, streams’ timings">3\.30× / ', tr)
    # the card
    cards = reviews_html(ws, runs, epsilon=0.05, judgement=judgement)
    card = cards.split(f'data-run="{vllm.label}"')[1].split("</article>")[0]
    assert "c=4 3.30×" in card and "baseline 30.8 tok/s: the median of 1 c=1 request" in card
    # runs side by side: the frame and its table, c=1's median the baseline's
    frame = mode_comparison(runs).filter(pl.col("run") == vllm.label).sort("c")
    assert frame["median_decode_tok_s"][0] == pytest.approx(base[0]) and frame["decode_vs_c1"][1] == pytest.approx(ratio)
    side = mode_comparison_html(runs, judgement=judgement)
    side_row = side.split(vllm.label)[-1].split("</tr>")[0]
    assert "baseline / 3.30× / " in side_row and "1.65×" not in side
    assert re.search(r"<td[^>]*>31 / 102 / ", side_row)
    # engines side by side
    engines = engines_html(runs, judgement=judgement)
    assert "baseline / 3.30× / " in engines.split(vllm.label)[-1].split("</tr>")[0]
    # the trend's bands
    bands = read_history([vllm.path]).bands.sort("c")
    assert bands.filter(pl.col("c") == 4)["decode_ratio"].item() == pytest.approx(ratio)
    assert bands.filter(pl.col("c") == 1)["decode_tok_s"].item() == pytest.approx(base[0])


def test_requests_without_an_origin_column_read_as_timed_by_their_streams():
    """The parameter's rule: no ``decode_rate_origin`` column reads as "stream". Worked by hand: c=1 rates 100 and 80
    (median 90), c=4 rates 45 and 54 (median 49.5): 49.5 / 90 = 0.55, timed by the streams."""
    import polars as pl

    from analysis.metrics import decode_cost

    bare = pl.DataFrame({"c": [1, 1, 4, 4], "decode_tok_s": [100.0, 80.0, 45.0, 54.0]})
    cost = decode_cost(bare).sort("c")
    assert cost["origin"].to_list() == ["streams", "streams"]
    assert cost.filter(pl.col("c") == 4)["ratio"].item() == pytest.approx(0.55)
    named = decode_cost(bare.with_columns(decode_rate_origin=pl.lit("stream"))).sort("c")
    assert named.equals(cost)


def test_the_baseline_timing_is_c1s_streams_first_and_intervals_start_at_c2():
    """Worked by hand. (1) c=1 timed both ways, a server-timed row first: the streams win, so the baseline is the median
    of 100, 80, 90 = 90 and c=2's streams 50, 40, 45 give 45 / 90 = 0.5; the server-timed rows (500, 999) are left out on
    both sides. Three rates a side: c=2 gets an interval, c=1 (the baseline over itself) none. (2) c=1 timed only by the
    server: the baseline is the server's (90), whatever timed c=4, so c=4's server rate 45 gives 0.5."""
    import polars as pl

    from analysis.metrics import decode_cost

    mixed = pl.DataFrame({"c": [1, 1, 1, 1, 2, 2, 2, 2], "decode_tok_s": [500.0, 100.0, 80.0, 90.0, 50.0, 40.0, 45.0, 999.0],
                          "decode_rate_origin": ["vllm:x", "stream", "stream", "stream", "stream", "stream", "stream", "vllm:x"]})
    cost = decode_cost(mixed).sort("c")
    assert cost["origin"].to_list() == ["streams", "streams"] and cost["rates"].to_list() == [3, 3]
    one, two = cost.row(0, named=True), cost.row(1, named=True)
    assert two["ratio"] == pytest.approx(0.5) and two["base_median"] == pytest.approx(90.0)
    assert one["low"] is None and one["high"] is None and two["low"] is not None and two["low"] <= 0.5 <= two["high"]
    served = pl.DataFrame({"c": [1, 1, 1, 4, 4], "decode_tok_s": [100.0, 80.0, 90.0, 50.0, 45.0],
                           "decode_rate_origin": ["vllm:x", "vllm:x", "vllm:x", "stream", "vllm:x"]})
    four = decode_cost(served).filter(pl.col("c") == 4)
    assert four["origin"].to_list() == ["server"] and four["ratio"].item() == pytest.approx(0.5)
