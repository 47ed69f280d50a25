"""Parity metrics on small streams whose answers were worked out by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from analysis import read_dumps
from analysis.parity import (
    Stream,
    agreement,
    band_decode_rate,
    band_summary,
    compare,
    decode_rate,
    flip_curve,
    fork_table,
    is_near_tie,
    longest_constant_run,
    ratio_interval,
    request_decode_rates,
    step_margins,
    streams,
    tie_density,
    top2_margin,
    ulp_distance,
    unique_completions,
    wilson_interval,
)

F32_NEXT = float(np.nextafter(np.float32(-0.5), np.float32(0.0)))  # the float32 just above -0.5


def S(name, ids, lps=None, cands=None):
    return Stream((name,), tuple(ids), tuple(lps or ()), tuple(cands or ()))


def test_streams_that_never_part():
    ref = S("r", [1, 2, 3], [-0.1, -0.2, -0.3])
    c = compare(ref, S("b", [1, 2, 3], [-0.1, -0.2, -0.3]))
    assert (c.agree_to, c.diverged, c.divergence_at, c.bitwise_prefix, c.max_abs_delta, c.max_ulp) == (3, False, None, 3, 0.0, 0)
    assert c.reference_margin is None and c.near_tie is False and c.in_reference_topk is None


def test_streams_that_part_at_step_0():
    ref = S("r", [7, 2], [-0.69, -0.1], [((7, -0.69), (8, -0.70)), ()])
    c = compare(ref, S("b", [8, 2], [-0.70, -0.1], [((8, -0.70), (7, -0.71)), ()]))
    assert (c.agree_to, c.diverged, c.divergence_at, c.bitwise_prefix) == (0, True, 0, 0)
    assert c.max_abs_delta is None and c.max_ulp is None  # no agreeing position to measure
    assert c.reference_margin == pytest.approx(0.01) and c.own_margin == pytest.approx(0.01)
    assert c.near_tie and c.in_reference_topk


def test_streams_that_differ_only_in_logprob_bits():
    ref = S("r", [1, 2, 3, 4], [-0.25, -0.5, -0.5, -1.0])
    other = S("b", [1, 2, 3, 4], [-0.25, -0.5, F32_NEXT, -1.0])
    c = compare(ref, other)
    assert (c.agree_to, c.diverged, c.bitwise_prefix) == (4, False, 2)  # tokens all agree; the bits part at step 2
    assert c.max_ulp == 1 and c.max_abs_delta == pytest.approx(abs(F32_NEXT + 0.5))
    # a value that differs only beyond float32's precision is the same float32
    same = compare(ref, S("c", [1, 2, 3, 4], [-0.25, -0.5, -0.5 + 1e-12, -1.0]))
    assert same.bitwise_prefix == 4 and same.max_ulp == 0


def test_streams_cut_short():
    ref = S("r", [1, 2, 3, 4, 5])
    short = compare(ref, S("b", [1, 2, 3]))
    assert (short.agree_to, short.diverged, short.divergence_at, short.length, short.reference_length) == (3, False, None, 3, 5)
    cut_then_part = compare(ref, S("c", [1, 9]))
    assert (cut_then_part.agree_to, cut_then_part.divergence_at) == (1, 1)


def test_margin_rules():
    assert top2_margin([]) is None and top2_margin([("a", -0.1)]) is None
    assert top2_margin([("a", -0.1), ("b", None), ("c", float("-inf")), ("d", float("nan"))]) is None
    assert top2_margin([("a", -1.0), ("b", -0.25)]) == 0.75  # order as delivered does not matter
    assert top2_margin([("a", -0.3), ("b", -0.3)]) == 0.0  # an exact tie is a margin of 0, not None
    assert is_near_tie(0.0) and is_near_tie(0.0499) and not is_near_tie(0.05) and not is_near_tie(-0.01) and not is_near_tie(None)


def test_not_in_reference_topk_and_margin_without_a_near_tie():
    ref = S("r", [5, 6], [-0.1, -0.2], [(), ((6, -0.2), (7, -2.2))])
    c = compare(ref, S("b", [5, 9], [-0.1, -5.0]), epsilon=0.05)
    assert c.divergence_at == 1 and c.in_reference_topk is False
    assert c.reference_margin == pytest.approx(2.0) and not c.near_tie and c.own_margin is None


def test_topk_order_and_set_changes():
    ref = S("r", [1, 2, 3], [-0.1] * 3, [((1, -0.1), (4, -0.2)), ((2, -0.1), (5, -0.2)), ((3, -0.1), (6, -0.2))])
    other = S("b", [1, 2, 3], [-0.1] * 3, [((4, -0.1), (1, -0.2)), ((2, -0.1), (5, -0.2)), ((3, -0.1), (7, -0.2))])
    c = compare(ref, other)
    assert (c.topk_order_changes, c.topk_set_changes) == (2, 1)


def test_ulp_distance_by_hand():
    one = np.float32(1.0)
    assert ulp_distance(1.0, float(np.nextafter(np.nextafter(one, np.float32(2)), np.float32(2)))) == 2
    assert ulp_distance(-1.0, 1.0) == 2 * int(np.float32(1.0).view(np.int32))
    assert ulp_distance(float(np.float32(-1e-45)), 0.0) == 1  # the smallest subnormal is one step from zero


def test_band_level_measures():
    assert agreement([], [1]) == 0
    assert longest_constant_run([3, 3, 3, 3]) == 4
    ref = S("r", [1, 2, 3, 4])
    slots = [S("s0", [1, 2, 3, 4]), S("s1", [1, 2, 3, 4]), S("s2", [1, 5, 5, 5]), S("s3", [1, 2, 3, 8])]
    s = band_summary(ref, slots)
    assert (s["divergence_min"], s["divergence_median"], s["divergence_max"]) == (1, 3.5, 4)
    assert (s["diverged_slots"], s["intra_agree_to"], s["max_constant_run"], s["unique_completions"]) == (2, 1, 3, 3)
    assert s["modal_share"] == 0.5
    assert fork_table(slots) == [(2, 3), (5, 1)]
    assert fork_table(slots, at=3) == [(4, 2), (5, 1), (8, 1)]


def test_wilson_interval_by_hand():
    # p = 0.5, n = 4, z = 1.96: centre 0.5, half-width = 1.96 * sqrt(0.0625 + 0.0600) / 1.9604
    low, high = wilson_interval(2, 4, z=1.96)
    half = 1.96 * math.sqrt(0.25 / 4 + 1.96**2 / 64) / (1 + 1.96**2 / 4)
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half))
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0
    with pytest.raises(ValueError):
        wilson_interval(0, 0)
    c = unique_completions([S("a", [1]), S("b", [1]), S("c", [1])])
    assert (c.unique, c.modal_share) == (1, 1.0)


def test_tie_density_and_step_margins():
    stream = S("r", [1, 2, 3], [-0.1] * 3, [((1, -0.1), (2, -0.1005)), ((2, -0.1), (3, -0.15)), ((3, -0.1),)])
    margins = step_margins(stream)
    assert margins[0] == pytest.approx(0.0005) and margins[1] == pytest.approx(0.05) and margins[2] is None
    assert tie_density(margins) == {0.001: 0.5, 0.01: 0.5, 0.1: 1.0}
    assert all(math.isnan(v) for v in tie_density([None]).values())


def test_streams_from_real_dump_files(tmp_path):
    """Two chat responses for the same prompt: one parts at token 2 on a near-tie."""

    def response(tokens):
        content = [{"token": f"token_id:{t}", "logprob": lp, "top_logprobs": [{"token": f"token_id:{i}", "logprob": v} for i, v in top]}
                   for t, lp, top in tokens]
        return {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": ""}, "logprobs": {"content": content}}]}

    ref = response([(10, -0.1, [(10, -0.1), (11, -2.0)]), (20, -0.2, [(20, -0.2), (21, -3.0)]), (30, -0.70, [(30, -0.70), (31, -0.72)])])
    alt = response([(10, -0.1, [(10, -0.1), (11, -2.0)]), (20, -0.2000001, [(20, -0.2000001), (21, -3.0)]), (31, -0.69, [(31, -0.69), (30, -0.71)])])
    path = tmp_path / "two.jsonl"
    path.write_text(json.dumps(ref) + "\n" + json.dumps(alt) + "\n")
    d = read_dumps(path)
    by_record = {key[1]: s for key, s in streams(d.tokens, d.candidates).items()}
    c = compare(by_record[1], by_record[2])
    assert (c.agree_to, c.divergence_at, c.bitwise_prefix) == (2, 2, 1)
    assert c.reference_margin == pytest.approx(0.02) and c.own_margin == pytest.approx(0.02)
    assert c.near_tie and c.in_reference_topk
    assert c.max_ulp == ulp_distance(-0.2, -0.2000001) > 0


def test_flip_curve_by_hand():
    # reference margins per step: 0.0005, 0.02, 0.3
    ref = S("r", [1, 2, 3], [-0.1] * 3, [((1, -0.1), (9, -0.1005)), ((2, -0.1), (9, -0.12)), ((3, -0.1), (9, -0.4))])
    pairs = [(ref, S("a", [1, 2, 3])),  # never flips: 3 steps at risk, none flips
             (ref, S("b", [9, 2, 3])),  # flips at step 0
             (ref, S("c", [1, 9, 3]))]  # flips at step 1 (step 0 was at risk too)
    curve = {(row["margin_low"], row["margin_high"]): (row["steps"], row["flips"]) for row in flip_curve(pairs).iter_rows(named=True)}
    assert curve[(0.0, 0.001)] == (3, 1)
    assert curve[(0.01, 0.05)] == (2, 1)
    assert curve[(0.1, 0.5)] == (1, 0)
    assert sum(steps for steps, _ in curve.values()) == 6


def test_decode_rates_from_a_live_capture(tmp_path):
    def chunk(content=None, **extra):
        return json.dumps({"id": "x", "object": "chat.completion.chunk", **extra,
                           "choices": [{"index": 0, "delta": {} if content is None else {"content": content}, "logprobs": None, "finish_reason": None}]})

    events = [chunk(stream_mode="live"), chunk("a"), chunk("b"), chunk("c"), json.dumps({"choices": [], "usage": {"completion_tokens": 3}}), "[DONE]"]
    sse = "".join(f"data: {e}\n\n" for e in events)
    undeclared = sse.replace('"stream_mode": "live", ', "")
    lines = [{"sse": sse, "arrival_times": [0.1, 0.2, 0.35, 0.5, 0.51, 0.52], "c": 4, "slot": 0},
             {"sse": undeclared, "arrival_times": [0.1, 0.2, 0.35, 0.5, 0.51, 0.52], "c": 4, "slot": 1},
             {"sse": undeclared, "arrival_times": [0.1, 0.5, 0.5, 0.5, 0.51, 0.52], "c": 4, "slot": 2}]
    path = tmp_path / "capture.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    rates = request_decode_rates(read_dumps(path).requests)
    assert rates["decode_tok_s"][0] == pytest.approx(2 / 0.3)  # (3 - 1) tokens over 0.5 - 0.2 s
    assert rates["decode_tok_s"][1] == pytest.approx(2 / 0.3)  # not declared, but its chunks came 0.15 s apart: observed live
    assert rates["decode_tok_s"][2] is None  # all three at 0.5 s: one burst, no rate
    assert rates["liveness"].to_list() == ["declared live", "observed live", "observed burst"]
    assert rates["n_content_chunks"].to_list() == [3, 3, 3]
    assert band_decode_rate(rates["decode_tok_s"].to_list()) is None


def test_decode_rate_edges_and_bootstrap():
    assert decode_rate(1, 0.0, 1.0, 2, True) is None  # one token
    assert decode_rate(5, 0.5, 0.5, 5, True) is None  # no span
    assert decode_rate(5, 0.1, 0.9, 1, True) is None  # one arrival
    assert band_decode_rate([10.0, 20.0]) == 15.0 and band_decode_rate([]) is None
    ratio, low, high = ratio_interval([40.0] * 5, [20.0] * 5)
    assert (ratio, low, high) == (0.5, 0.5, 0.5)  # no spread, no interval
    ratio, low, high = ratio_interval([38.0, 40.0, 42.0, 41.0], [18.0, 22.0, 20.0, 21.0], seed=1)
    assert ratio == pytest.approx(20.5 / 40.5) and low < ratio < high


def test_div_index_and_avg_std_top1_prob_by_hand():
    from analysis.parity import avg_std_top1_prob, div_index, top1_prob

    a = S("a", [1, 2, 3], [math.log(0.8), math.log(0.6), math.log(0.5)])
    b = S("b", [1, 2, 4], [math.log(0.6), math.log(0.6), math.log(0.4)])
    assert div_index([a, b]) == 2 and div_index([a]) == 3
    # top-1 probabilities per step: (0.8, 0.6), (0.6, 0.6), (0.5, 0.4): population stds 0.1, 0, 0.05 over steps 0..2
    assert avg_std_top1_prob([a, b]) == pytest.approx((0.1 + 0.0 + 0.05) / 3)
    with_cands = S("c", [1], [math.log(0.3)], [((9, math.log(0.6)), (1, math.log(0.3)))])
    assert top1_prob(with_cands, 0) == pytest.approx(0.6)  # the best candidate, not the sampled token
    with pytest.raises(ValueError):
        div_index([])


def test_k3_and_topk_kl_over_the_agreeing_prefix_by_hand():
    """Two steps agree, the third parts; k3 and the top-k KL are taken over the first two only.

    Step 0: the same logprob and the same candidates: k3 = 0, KL = 0.
    Step 1: sampled 0.5 against 0.4: k3 = 0.8 - 1 - ln 0.8 = 0.0231436; the reference's top-2
    {A: 0.5, B: 0.3, rest 0.2} against {A: 0.4, B: 0.4, rest 0.2}:
    KL = 0.5 ln(5/4) + 0.3 ln(3/4) = 0.1115718 - 0.0863046 = 0.0252672.
    """
    ln = math.log
    top0 = (("A", ln(0.6)), ("B", ln(0.1)))
    ref = S("r", ["A", "A", "A"], [ln(0.6), ln(0.5), ln(0.9)], [top0, (("A", ln(0.5)), ("B", ln(0.3))), (("A", ln(0.9)),)])
    other = S("b", ["A", "A", "C"], [ln(0.6), ln(0.4), ln(0.2)], [top0, (("B", ln(0.4)), ("A", ln(0.4))), (("C", ln(0.2)),)])
    c = compare(ref, other)
    assert c.agree_to == 2
    assert c.k3_max == pytest.approx(0.8 - 1 - ln(0.8)) and c.k3_mean == pytest.approx((0.8 - 1 - ln(0.8)) / 2)
    assert c.kl_topk_max == pytest.approx(0.5 * ln(5 / 4) + 0.3 * ln(3 / 4)) and c.kl_topk_mean == pytest.approx(c.kl_topk_max / 2)
    assert round(c.kl_topk_max, 7) == 0.0252672
    # a candidate of the reference that the other did not list leaves the KL unknown at that step
    partial = compare(ref, S("p", ["A", "A", "A"], [ln(0.6), ln(0.5), ln(0.9)], [top0, (("A", ln(0.5)),), ()]))
    assert partial.kl_topk_max == 0.0 and partial.k3_max == 0.0
    # identical streams: both measures are exactly zero, not merely small
    same = compare(ref, ref)
    assert (same.k3_max, same.kl_topk_max) == (0.0, 0.0)
