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
    band_summary,
    compare,
    fork_table,
    is_near_tie,
    longest_constant_run,
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
