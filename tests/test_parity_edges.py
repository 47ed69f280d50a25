"""Edges of analysis.parity that mutation testing found unpinned (issue 16).

Every expected value here was worked out by hand (the arithmetic is in the comments); floats that are
computed are compared with ``pytest.approx(rel=1e-12)``, everything else with ``==``.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

import numpy as np
import polars as pl
import pytest
from analysis.parity import (
    NEAR_TIE_EPSILON,
    Comparison,
    Completions,
    Stream,
    agreement,
    avg_std_top1_prob,
    band_decode_rate,
    band_summary,
    compare,
    decode_rate,
    div_index,
    flip_curve,
    fork_table,
    is_near_tie,
    k3,
    longest_constant_run,
    ratio_interval,
    request_decode_rates,
    same_float32,
    std_at_acc,
    step_margins,
    streams,
    tie_density,
    top1_prob,
    top2_margin,
    topk_kl,
    ulp_distance,
    unique_completions,
    wilson_interval,
)

ln = math.log
INF = math.inf
Z95 = 1.959963984540054  # wilson_interval's default z
F32_ONE_UP = float(np.nextafter(np.float32(1.0), np.float32(2.0)))  # 1 + 2**-23
F32_TINY = float(np.float32(1e-45))  # the smallest float32 subnormal, 2**-149


def S(name, ids, lps=None, cands=None):
    return Stream((name,), tuple(ids), tuple(lps or ()), tuple(cands or ()))


def approx(x):
    return pytest.approx(x, rel=1e-12)


def raises_exactly(message):
    """A ValueError whose whole text is ``message`` (anchored: a longer text does not match)."""
    return pytest.raises(ValueError, match=f"^{re.escape(message)}$")


# --- Stream ---------------------------------------------------------------------------------------


def test_stream_without_logprobs_gets_one_none_per_token():
    assert S("r", [1, 2]).logprobs == (None, None)
    assert S("r", []).logprobs == () and len(S("r", [])) == 0
    assert S("r", [1, 2], [-0.5, -0.25]).logprobs == (-0.5, -0.25) and len(S("r", [1, 2])) == 2


def test_stream_with_a_logprob_count_that_does_not_match_says_so():
    with raises_exactly("('r',): 1 logprobs for 2 tokens"):
        S("r", [1, 2], [-0.5])
    with raises_exactly("('r',): 3 logprobs for 2 tokens"):
        S("r", [1, 2], [-0.5, -0.5, -0.5])


# --- streams() --------------------------------------------------------------------------------------

TOKEN_SCHEMA = {"source": pl.String, "record": pl.Int64, "choice_index": pl.Int64, "segment": pl.String, "position": pl.Int64,
                "token_id": pl.Int64, "token_text": pl.String, "token_bytes": pl.Binary, "logprob": pl.Float64}
CAND_SCHEMA = {"source": pl.String, "record": pl.Int64, "choice_index": pl.Int64, "segment": pl.String, "position": pl.Int64,
               "list_kind": pl.String, "list_index": pl.Int64, "cand_token_id": pl.Int64, "cand_token_text": pl.String,
               "cand_token_bytes": pl.Binary, "cand_logprob": pl.Float64}


def frames(token_rows, cand_rows):
    return (pl.DataFrame(token_rows, schema=TOKEN_SCHEMA, orient="row"), pl.DataFrame(cand_rows, schema=CAND_SCHEMA, orient="row"))


def dump_with_ids():
    """Rows shuffled, two sources, two choices, a null choice_index, prompt rows and a second list kind."""
    tokens = [
        ("b", 0, 0, "completion", 1, 21, "y", b"y", -0.2),
        ("a", 1, 1, "completion", 0, 30, "z", b"z", -0.3),
        ("a", 1, 0, "completion", 1, 11, "q", b"q", -0.11),
        ("a", 1, 0, "prompt", 0, 99, "p", b"p", -9.0),
        ("a", 1, 0, "completion", 0, 10, "w", b"w", -0.1),
        ("b", 0, 0, "completion", 0, 0, "x", b"x", -0.5),  # token id 0 is an id, not a missing one
        ("a", 0, None, "completion", 0, 5, "v", b"v", -0.5),
        ("a", 1, 0, "prompt", 1, 98, "o", b"o", -9.5),
    ]
    cands = [
        ("a", 1, 0, "completion", 0, "top_logprobs", 1, 12, "t", b"t", -1.0),  # delivered second, listed first
        ("a", 1, 0, "completion", 0, "top_logprobs", 0, 10, "w", b"w", -0.1),
        ("a", 1, 0, "completion", 0, "sampling_support", 0, 77, "s", b"s", -0.01),  # another list kind: left out
        ("a", 1, 0, "prompt", 0, "top_logprobs", 0, 88, "u", b"u", -0.2),  # the prompt's position 0: left out
        ("a", 1, 0, "completion", 1, "top_logprobs", 0, 11, "q", b"q", None),  # a missing value is kept as None
        ("a", 1, 0, "completion", 1, "top_logprobs", 1, 11, "q", b"q", -0.11),  # a duplicate is kept
        ("a", 1, 0, "completion", 5, "top_logprobs", 0, 1, "n", b"n", -1.0),  # no token at position 5: dropped
        ("a", 0, None, "completion", 0, "top_logprobs", 0, 5, "v", b"v", -0.5),  # a null key still joins
        ("b", 0, 0, "completion", 0, "top_logprobs", 0, 0, "x", b"x", -0.5),
    ]
    return frames(tokens, cands)


def test_streams_sorts_rows_and_keeps_candidates_in_list_order():
    tokens, cands = dump_with_ids()
    got = streams(tokens, cands)
    # keys in (source, record, choice_index) order, a null choice_index first
    assert list(got) == [("a", 0, None), ("a", 1, 0), ("a", 1, 1), ("b", 0, 0)]
    assert got == {
        ("a", 0, None): Stream(("a", 0, None), (5,), (-0.5,), (((5, -0.5),),)),
        ("a", 1, 0): Stream(("a", 1, 0), (10, 11), (-0.1, -0.11), (((10, -0.1), (12, -1.0)), ((11, None), (11, -0.11)))),
        ("a", 1, 1): Stream(("a", 1, 1), (30,), (-0.3,), ((),)),  # a token without candidates has an empty step
        ("b", 0, 0): Stream(("b", 0, 0), (0, 21), (-0.5, -0.2), (((0, -0.5),), ())),
    }


def test_streams_of_another_segment_and_without_candidates():
    tokens, cands = dump_with_ids()
    assert streams(tokens, cands, segment="prompt") == {("a", 1, 0): Stream(("a", 1, 0), (99, 98), (-9.0, -9.5), (((88, -0.2),), ()))}
    plain = streams(tokens)
    assert plain[("a", 1, 0)] == Stream(("a", 1, 0), (10, 11), (-0.1, -0.11), ((), ()))
    assert [s.candidates for s in plain.values()] == [((),), ((), ()), ((),), ((), ())]


def test_streams_without_token_ids_use_text_and_bytes():
    tokens, cands = frames(
        [("s", 0, 0, "completion", 1, None, "\ufffd", b"\xa9", -0.75),
         ("s", 0, 0, "completion", 0, None, "\ufffd", b"\xc3", -0.5)],  # same text, different bytes: different tokens
        [("s", 0, 0, "completion", 0, "top_logprobs", 0, None, "\ufffd", b"\xc3", -0.5),
         ("s", 0, 0, "completion", 0, "top_logprobs", 1, None, "a", b"a", -1.5)])
    assert streams(tokens, cands) == {("s", 0, 0): Stream(("s", 0, 0), (("\ufffd", b"\xc3"), ("\ufffd", b"\xa9")), (-0.5, -0.75),
                                                          (((("\ufffd", b"\xc3"), -0.5), (("a", b"a"), -1.5)), ()))}


# --- one step -------------------------------------------------------------------------------------------


def test_top2_margin_takes_the_two_best_finite_values():
    assert top2_margin([("a", -2.0), ("b", -0.5), ("c", -1.0)]) == 0.5  # -0.5 - (-1.0); -2.0 does not count
    assert top2_margin([("a", INF), ("b", -0.5), ("c", math.nan), ("d", -1.0)]) == 0.5  # +inf and nan are not finite
    assert top2_margin([("a", -0.5), ("b", -1.0)]) == 0.5  # exactly two is enough
    assert top2_margin([("a", -0.5), ("b", None)]) is None


def test_is_near_tie_is_half_open_at_epsilon():
    assert NEAR_TIE_EPSILON == 0.05
    assert is_near_tie(0.05) is False  # the default epsilon itself is not a near-tie
    assert is_near_tie(float(np.nextafter(0.05, 0.0))) is True  # the float just below is
    assert is_near_tie(0.0) is True and is_near_tie(-0.0) is True
    assert is_near_tie(-5e-324) is False and is_near_tie(-0.01) is False  # a negative margin never
    assert is_near_tie(None) is False
    assert is_near_tie(0.1) is False and is_near_tie(0.1, 0.2) is True and is_near_tie(0.2, 0.2) is False
    assert is_near_tie(0.01, epsilon=0.01) is False and is_near_tie(0.0, epsilon=0.0) is False


def test_ulp_distance_by_hand():
    assert ulp_distance(1.0, F32_ONE_UP) == 1 and ulp_distance(F32_ONE_UP, 1.0) == 1
    assert ulp_distance(-1.0, float(np.nextafter(np.float32(-1.0), np.float32(-2.0)))) == 1  # below zero too
    assert ulp_distance(1.0, 2.0) == 2**23  # one binade
    assert ulp_distance(-0.25, -0.375) == 2**22  # -1.0 * 2**-2 against -1.5 * 2**-2: half the mantissa
    assert ulp_distance(-0.0, 0.0) == 0 and ulp_distance(0.0, -0.0) == 0
    assert ulp_distance(-F32_TINY, F32_TINY) == 2  # across zero: -tiny, 0, +tiny
    assert ulp_distance(0.0, F32_TINY) == 1
    assert ulp_distance(-1.0, 1.0) == 2 * 0x3F800000  # 1.0f is 0x3F800000 steps from zero on each side
    assert ulp_distance(1.0, 1.0 + 1e-12) == 0  # the same once cast to float32


def test_same_float32_with_missing_values_and_signed_zero():
    assert same_float32(None, None) is True
    assert same_float32(None, 0.0) is False and same_float32(0.0, None) is False
    assert same_float32(None, math.nan) is False
    assert not same_float32(-0.0, 0.0)  # equal as numbers, different bits
    assert same_float32(math.nan, math.nan)  # the same bits
    assert same_float32(1.0, 1.0 + 1e-12) and not same_float32(1.0, F32_ONE_UP)


def test_agreement_counts_only_the_leading_run():
    assert agreement([], []) == 0
    assert agreement([1, 2, 3], [1, 2, 3]) == 3
    assert agreement([1, 2, 9, 4], [1, 2, 3, 4]) == 2  # stops at the first difference, 4 later does not count
    assert agreement([9, 2], [1, 2]) == 0
    assert agreement([1, 2], [1, 2, 3]) == 2 and agreement([1, 2, 3], [1, 2]) == 2


def test_k3_by_hand():
    assert k3(None, -0.5) is None and k3(-0.5, None) is None and k3(None, None) is None
    assert k3(-1.0, -0.5) == approx(math.exp(0.5) - 1.5)  # d = +0.5: e^0.5 - 1 - 0.5 = 0.1487212707
    assert k3(-0.5, -1.0) == approx(math.exp(-0.5) - 0.5)  # d = -0.5: e^-0.5 - 1 + 0.5 = 0.1065306597
    assert k3(-800.0, -0.1) == INF  # d = 799.9 overflows exp
    assert k3(-0.1, -800.0) == approx(798.9)  # d = -799.9: e^d - 1 - d = 0 - 1 + 799.9


# --- topk_kl ---------------------------------------------------------------------------------------------


def test_topk_kl_is_infinite_when_a_probability_underflows():
    # p = {A: 0.5, rest 0.5}; q = {A: exp(-800) = 0.0, rest 1.0}: 0.5 ln(0.5 / 0) is infinite
    assert topk_kl([("A", ln(0.5))], [("A", -800.0)]) == INF


def test_topk_kl_drops_missing_and_minus_infinite_values():
    # reference B and C carry no probability; p = {A: 0.5, rest 0.5}, q = {A: 0.25, rest 0.75}:
    # 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln(4/3) = 0.1438410362
    expected = 0.5 * ln(4 / 3)
    assert topk_kl([("A", ln(0.5)), ("B", None), ("C", -INF)], [("A", ln(0.25))]) == approx(expected)
    # the other's C at 0.5 is not one of the reference's tokens: it belongs to the other's rest (0.75, not 0.25)
    assert topk_kl([("A", ln(0.5))], [("A", ln(0.25)), ("C", ln(0.5))]) == approx(expected)
    # a reference token whose other value is missing or -inf is unknown: None
    assert topk_kl([("A", ln(0.5))], [("A", None)]) is None
    assert topk_kl([("A", ln(0.5))], [("A", -INF)]) is None


def test_topk_kl_counts_the_first_entry_of_a_duplicate():
    expected = 0.5 * ln(4 / 3)  # as above: the later 0.1 and 0.5 are ignored
    assert topk_kl([("A", ln(0.5)), ("A", ln(0.1))], [("A", ln(0.25)), ("A", ln(0.5))]) == approx(expected)
    # a first entry without a value does not count as the first: the next one does
    assert topk_kl([("A", None), ("A", ln(0.5))], [("A", ln(0.25))]) == approx(expected)


def test_topk_kl_rest_floor():
    # p = {A: 1}: its rest 1 - 1 = 0 is floored to 1e-12 and a bucket at the floor counts nothing: exactly ln(1/0.5)
    assert topk_kl([("A", 0.0)], [("A", ln(0.5))]) == math.log(2.0)
    # q = {A: 1}: its rest is floored to 1e-12; p = {A: 0.5, rest 0.5}:
    # 0.5 ln(0.5/1) + 0.5 ln(0.5/1e-12) = ln 0.5 + 6 ln 10 = 13.1223633774
    assert topk_kl([("A", ln(0.5))], [("A", 0.0)]) == approx(ln(0.5) + 6 * ln(10))


def test_topk_kl_is_zero_for_the_same_lists_and_never_negative():
    ref = [("A", ln(0.5)), ("B", ln(0.3))]
    assert topk_kl(ref, ref) == 0.0
    # inconsistent lists (probabilities over 1) give a negative sum, 1.2 ln(2/3), which is clipped to 0
    assert topk_kl([("A", ln(0.6)), ("B", ln(0.6))], [("A", ln(0.9)), ("B", ln(0.9))]) == 0.0


def test_topk_kl_of_empty_lists_is_none():
    assert topk_kl([], []) is None
    assert topk_kl([], [("A", ln(0.5))]) is None  # not 0.0: nothing was compared
    assert topk_kl([("A", ln(0.5))], []) is None
    assert topk_kl([("A", None), ("B", -INF)], [("A", ln(0.5))]) is None  # no usable reference value


# --- compare ---------------------------------------------------------------------------------------------

# Two steps agree, step 2 parts (3 against 5).
REF = S("r", [1, 2, 3, 4], [-0.5, -0.25, -1.0, -2.0],
        [((1, ln(0.6)), (7, ln(0.3))), ((2, ln(0.5)), (8, ln(0.25))), ((3, ln(0.5)), (5, ln(0.46))), ()])
OTHER = S("o", [1, 2, 5], [-0.5, -0.375, -1.5],
          [((7, ln(0.4)), (1, ln(0.5))), ((2, ln(0.3)), (9, ln(0.35)), (8, ln(0.3))), ((5, ln(0.5)), (3, ln(0.45)))])
K3_STEP1 = math.exp(-0.125) - 1 + 0.125  # d = -0.375 - (-0.25) = -0.125: 0.0074969...
KL_STEP0 = 0.6 * ln(0.6 / 0.5) + 0.3 * ln(0.3 / 0.4)  # rests 0.1 and 0.1: 0.0230883
KL_STEP1 = 0.5 * ln(0.5 / 0.3) + 0.25 * ln(0.25 / 0.3) + 0.25 * ln(0.25 / 0.4)  # rests 0.25 and 1 - 0.6: 0.0923320


def test_every_field_of_a_hand_built_comparison():
    c = compare(REF, OTHER)
    assert c == Comparison(
        agree_to=2, diverged=True, divergence_at=2,
        bitwise_prefix=1,  # -0.5 is the same; -0.25 against -0.375 is not
        max_abs_delta=0.125, max_ulp=2**22,
        topk_order_changes=2,  # [1, 7] / [7, 1] and [2, 8] / [2, 9, 8]
        topk_set_changes=1,  # only step 1: 9 is new
        reference_margin=c.reference_margin, own_margin=c.own_margin, kl_topk_mean=c.kl_topk_mean, kl_topk_max=c.kl_topk_max,
        in_reference_topk=True,  # 5 is among the reference's {3, 5}
        near_tie=False,  # ln(0.5/0.46) = 0.0834 is not below 0.05
        length=3, reference_length=4,
        k3_mean=c.k3_mean, k3_max=c.k3_max,
        epsilon=0.05,
    )
    assert c.reference_margin == approx(ln(0.5 / 0.46)) and c.own_margin == approx(ln(0.5 / 0.45))
    assert c.kl_topk_max == approx(KL_STEP1) and c.kl_topk_mean == approx((KL_STEP0 + KL_STEP1) / 2)
    assert c.k3_max == approx(K3_STEP1) and c.k3_mean == approx(K3_STEP1 / 2)  # step 0 has k3 = 0
    assert "epsilon" not in repr(c)


def test_a_non_default_epsilon_is_kept_and_changes_near_tie():
    c = compare(REF, OTHER, epsilon=0.1)
    assert (c.near_tie, c.epsilon) == (True, 0.1)  # 0.0834 < 0.1
    assert compare(REF, OTHER, epsilon=ln(0.5 / 0.46)).near_tie is False  # at epsilon itself: not below


def test_bitwise_prefix_with_missing_logprobs():
    ref = S("r", [1, 2, 3], [None, -0.5, -0.5])
    both_missing = compare(ref, S("b", [1, 2, 3], [None, -0.5, -0.75]))
    assert (both_missing.bitwise_prefix, both_missing.max_abs_delta, both_missing.max_ulp) == (2, 0.25, 2**22)  # -0.5 vs -0.75
    one_missing = compare(ref, S("c", [1, 2, 3], [-0.5, -0.5, -0.75]))
    assert (one_missing.bitwise_prefix, one_missing.max_abs_delta, one_missing.max_ulp) == (0, 0.25, 2**22)
    none_at_all = compare(S("r", [1, 2]), S("b", [1, 2]))
    n = none_at_all
    assert (n.bitwise_prefix, n.max_abs_delta, n.max_ulp, n.k3_mean, n.k3_max) == (2, None, None, None, None)


def test_bitwise_prefix_stops_at_the_divergence():
    c = compare(S("r", [1, 2], [-0.5, -0.5]), S("b", [1, 3], [-0.5, -0.5]))  # the same logprob at the parting token
    assert (c.agree_to, c.bitwise_prefix, c.max_abs_delta) == (1, 1, 0.0)


def test_in_reference_topk_is_none_without_reference_candidates():
    own = (((1, -0.1),), ((3, -0.1), (2, -0.3)))
    no_lists = compare(S("r", [1, 2], [-0.1, -0.2]), S("b", [1, 3], [-0.1, -0.1], own))
    assert no_lists.in_reference_topk is None and no_lists.reference_margin is None and no_lists.near_tie is False
    assert no_lists.own_margin == approx(0.2)  # -0.1 - (-0.3)
    not_at_the_fork = compare(S("r", [1, 2], [-0.1, -0.2], [((1, -0.1), (2, -0.5)), ()]), S("b", [1, 3], [-0.1, -0.1], own))
    assert not_at_the_fork.in_reference_topk is None
    never_parts = compare(REF, REF)
    assert (never_parts.in_reference_topk, never_parts.reference_margin, never_parts.own_margin) == (None, None, None)


def test_topk_changes_are_counted_over_every_agreeing_step():
    # step 0: the same set in another order; step 1: a new token; step 2: the same lists
    ref = S("r", [1, 2, 3], None, [((1, -0.1), (4, -0.2)), ((2, -0.1), (5, -0.2)), ((3, -0.1), (6, -0.2))])
    other = S("b", [1, 2, 3], None, [((4, -0.1), (1, -0.2)), ((2, -0.1), (7, -0.2)), ((3, -0.1), (6, -0.2))])
    c = compare(ref, other)
    assert (c.topk_order_changes, c.topk_set_changes) == (2, 1)


def test_topk_changes_need_lists_on_both_sides():
    ref = S("r", [1, 2], [-0.1, -0.2], [((1, -0.1), (2, -0.2)), ((2, -0.2), (1, -0.3))])
    c = compare(ref, S("b", [1, 2], [-0.1, -0.2]))
    assert (c.topk_order_changes, c.topk_set_changes, c.kl_topk_mean, c.kl_topk_max) == (0, 0, None, None)


def test_parting_at_step_0_has_no_prefix_measures():
    c = compare(S("r", [1, 2], [-0.5, -0.5]), S("b", [2, 2], [-0.5, -0.5]))
    assert (c.agree_to, c.divergence_at, c.k3_mean, c.k3_max, c.kl_topk_mean, c.kl_topk_max) == (0, 0, None, None, None, None)


def test_equal_streams_never_diverge():
    c = compare(S("r", [1, 2]), S("b", [1, 2]))
    assert (c.diverged, c.divergence_at, c.near_tie, c.length, c.reference_length) == (False, None, False, 2, 2)


# --- a band -----------------------------------------------------------------------------------------------


def test_band_summary_by_hand_and_its_epsilon():
    ref = S("r", [1, 2, 3, 4], None, [(), (), ((3, -0.1), (9, -0.14)), ()])  # margin 0.04 at step 2
    slots = [S("s0", [1, 2, 3, 4]), S("s1", [1, 2, 9, 9]), S("s2", [1, 2, 3, 7])]  # agree 4, 2, 3
    s = band_summary(ref, slots)
    low, high = wilson_interval(1, 3)
    assert {k: v for k, v in s.items() if k != "comparisons"} == {
        "n_slots": 3, "divergence_min": 2, "divergence_median": 3, "divergence_max": 4,
        "diverged_slots": 2,  # s1 and s2
        "near_tie_slots": 1,  # s1 parts at step 2 (margin 0.04 < 0.05); s2 parts at step 3, where there is no margin
        "intra_agree_to": 2, "max_constant_run": 2, "unique_completions": 3,
        "modal_share": 1 / 3, "modal_share_low": low, "modal_share_high": high,
    }
    assert [c.agree_to for c in s["comparisons"]] == [4, 2, 3]
    tight = band_summary(ref, slots, epsilon=0.03)
    assert tight["near_tie_slots"] == 0 and [c.epsilon for c in tight["comparisons"]] == [0.03] * 3


def test_band_summary_of_one_slot():
    s = band_summary(S("r", [1, 2]), [S("s0", [1, 3])])
    keys = ("n_slots", "divergence_min", "divergence_median", "intra_agree_to", "unique_completions", "modal_share")
    assert tuple(s[k] for k in keys) == (1, 1, 1, 2, 1, 1.0)  # intra-band agreement of one slot: its own length


def test_longest_constant_run_by_hand():
    assert longest_constant_run([]) == 0
    assert longest_constant_run([7]) == 1
    assert longest_constant_run([1, 2, 3]) == 1
    assert longest_constant_run([4, 4, 1]) == 2 and longest_constant_run([1, 4, 4]) == 2
    assert longest_constant_run([5, 5, 1, 7, 7, 7, 2]) == 3
    assert longest_constant_run([None, None]) == 2


def test_wilson_interval_by_hand():
    # 8 of 10 at z = 1.96: centre (0.8 + z^2/20) / (1 + z^2/10), half z sqrt(0.016 + z^2/400) / (1 + z^2/10)
    z2 = Z95 * Z95
    centre = (0.8 + z2 / 20) / (1 + z2 / 10)
    half = Z95 * math.sqrt(0.8 * 0.2 / 10 + z2 / 400) / (1 + z2 / 10)
    low, high = wilson_interval(8, 10)
    assert (low, high) == (approx(centre - half), approx(centre + half))
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    # none: centre = half, so (0, z^2 / (n + z^2)); all: (n / (n + z^2), 1)
    assert wilson_interval(0, 5) == (0.0, approx(z2 / (5 + z2)))
    assert wilson_interval(5, 5) == (approx(5 / (5 + z2)), 1.0)
    assert wilson_interval(1, 1, z=1.0) == (approx(0.5), 1.0)  # 1 / (1 + 1)
    # 16 of 16: centre + half rounds to 1.0000000000000002, and the bound is clipped to 1
    assert wilson_interval(16, 16) == (approx(16 / (16 + z2)), 1.0)


def test_wilson_interval_needs_a_trial():
    for trials in (0, -1):
        with raises_exactly("the Wilson interval needs at least one trial"):
            wilson_interval(0, trials)


def test_unique_completions_every_field():
    c = unique_completions([S("a", [1, 2]), S("b", [1, 3]), S("c", [1, 2])])
    assert c == Completions(n=3, unique=2, modal_count=2, modal_share=2 / 3, modal_interval=wilson_interval(2, 3))


def test_fork_table_edges():
    a, b, c = S("a", [1, 2, 3]), S("b", [1, 7, 3]), S("c", [1, 2, 3])
    assert fork_table([a, b, c]) == [(2, 2), (7, 1)]  # only the second parts, at step 1
    assert fork_table([a, c, b]) == [(2, 2), (7, 1)]  # only the last parts
    assert fork_table([S("x", [4, 5])]) == [(4, 1)]  # one stream: step 0
    assert fork_table([S("x", [1, 9]), S("y", [1, 2, 3])]) == [(9, 1), (2, 1)]  # the fork is where the others part from the first
    # the fork is at step 2; a stream that ends there does not vote
    assert fork_table([S("a", [1, 2, 3]), S("b", [1, 2, 4]), S("c", [1, 2])]) == [(3, 1), (4, 1)]
    assert fork_table([a, b, c], at=0) == [(1, 3)]  # at given, even 0, is taken as given
    assert fork_table([a, b, c], at=3) == []  # past every stream


def test_tie_density_is_strictly_below_each_threshold():
    # known margins 0.0, 0.001, 0.01, 0.1: below 0.001 only 0.0; below 0.01 also 0.001; below 0.1 also 0.01
    assert tie_density([0.0, 0.001, 0.01, 0.1, None]) == {0.001: 0.25, 0.01: 0.5, 0.1: 0.75}
    assert tie_density([0.5, 0.0], thresholds=(0.0, 0.5, 1.0)) == {0.0: 0.0, 0.5: 0.5, 1.0: 1.0}
    empty = tie_density([])
    assert list(empty) == [0.001, 0.01, 0.1] and all(math.isnan(v) for v in empty.values())
    assert list(tie_density([None], thresholds=(0.5,))) == [0.5]


def test_step_margins_one_per_step():
    stream = S("r", [1, 2, 3], None, [((1, -2.0), (2, -0.5), (3, -1.0)), (), ((1, -1.0), (2, -1.0))])
    assert step_margins(stream) == [0.5, None, 0.0]
    assert step_margins(S("r", [1, 2])) == []  # no candidates at all: no steps


# --- flip_curve ---------------------------------------------------------------------------------------------


def test_flip_curve_bins_edges_and_columns():
    # reference margins per step: 1.0, 0.05, 0.0, none, 0.001 (each exactly on an edge)
    ref = S("r", [1, 2, 3, 4, 5], None,
            [((1, 0.0), (9, -1.0)), ((2, 0.0), (9, -0.05)), ((3, -1.0), (9, -1.0)), (), ((5, 0.0), (9, -0.001))])
    pairs = [(ref, S("a", [1, 2, 3, 4, 5])),  # never parts: steps 0-4 at risk, step 3 has no margin
             (ref, S("b", [1, 2, 9, 9, 9])),  # flips at step 2 (margin 0.0); steps 3 and 4 are no longer at risk
             (ref, S("c", [1, 2])),  # only shorter: steps 0 and 1
             (ref, S("d", [1, 2, 3, 4, 9]))]  # flips at step 4 (margin 0.001)
    curve = flip_curve(pairs)
    assert curve.columns == ["margin_low", "margin_high", "steps", "flips", "p_flip"]
    assert curve.rows() == [
        (0.0, 0.001, 3, 1, 1 / 3),  # 0.0 from a, b (flip), d
        (0.001, 0.01, 2, 1, 0.5),  # 0.001 from a, d (flip)
        (0.01, 0.05, 0, 0, None),
        (0.05, 0.1, 4, 0, 0.0),  # 0.05 from all four
        (0.1, 0.5, 0, 0, None),
        (0.5, 1.0, 0, 0, None),
        (1.0, INF, 4, 0, 0.0),  # 1.0 from all four
    ]
    assert flip_curve(pairs, edges=(0.0, 0.05, INF)).rows() == [(0.0, 0.05, 5, 2, 0.4), (0.05, INF, 8, 0, 0.0)]


def test_flip_curve_with_integer_logprobs():
    # step 0's margin is the int 0 - (-1) = 1, step 1's the float 0.5: both are binned as floats
    ref = S("r", [1, 2], None, [((1, 0), (9, -1)), ((2, -0.5), (9, -1.0))])
    assert flip_curve([(ref, S("a", [1, 9]))], edges=(0.0, 1.0, INF)).rows() == [(0.0, 1.0, 1, 1, 1.0), (1.0, INF, 1, 0, 0.0)]


def test_flip_curve_of_nothing_has_every_bin_empty():
    edges = (0.0, 1e-3, 1e-2, 0.05, 0.1, 0.5, 1.0, INF)
    assert flip_curve([]).rows() == [(lo, hi, 0, 0, None) for lo, hi in zip(edges[:-1], edges[1:])]


# --- decode rates -----------------------------------------------------------------------------------------------


def test_decode_rate_boundaries():
    assert decode_rate(2, 0.25, 0.75, 2, True) == 2.0  # the least that counts: (2 - 1) / 0.5
    assert decode_rate(3, 0.25, 0.75, 3, True) == 4.0  # (3 - 1) / 0.5
    assert decode_rate(1, 0.25, 0.75, 2, True) is None  # one token
    assert decode_rate(2, 0.25, 0.75, 1, True) is None  # one chunk
    assert decode_rate(None, 0.25, 0.75, 2, True) is None and decode_rate(2, 0.25, 0.75, None, True) is None
    assert decode_rate(2, None, 0.75, 2, True) is None and decode_rate(2, 0.25, None, 2, True) is None
    assert decode_rate(2, 0.75, 0.75, 2, True) is None and decode_rate(2, 0.75, 0.25, 2, True) is None  # zero, negative span
    assert decode_rate(2, 0.25, 0.75, 2, False) is None and decode_rate(2, 0.25, 0.75, 2, None) is None


def test_request_decode_rates_per_row():
    rows = [(3, 0.25, 0.75, 3, True), (2, 0.25, 0.75, 2, True), (1, 0.25, 0.75, 2, True), (3, 0.25, 0.75, 1, True),
            (3, 0.75, 0.75, 3, True), (3, 0.75, 0.25, 3, True), (3, 0.25, 0.75, 3, False), (3, 0.25, 0.75, 3, None),
            (3, None, 0.75, 3, True), (None, 0.25, 0.75, 3, True)]
    names = ["completion_tokens", "ttft_s", "t_last_content", "n_content_chunks", "stream_live"]
    requests = pl.DataFrame(rows, schema=dict(zip(names, (pl.Int64, pl.Float64, pl.Float64, pl.Int64, pl.Boolean))), orient="row")
    out = request_decode_rates(requests)
    assert out.columns == [*names, "decode_tok_s", "decode_rate_origin"]
    assert out["decode_tok_s"].to_list() == [4.0, 2.0, None, None, None, None, None, None, None, None]
    assert out["decode_rate_origin"].to_list() == ["stream", "stream", *[None] * 8]  # no extra: no server rate to fall back on
    assert out["decode_tok_s"].to_list() == [decode_rate(*row) for row in rows]  # the same rule as decode_rate


def test_band_decode_rate_edges():
    assert band_decode_rate([]) is None and band_decode_rate([None]) is None and band_decode_rate([1.0, None]) is None
    assert band_decode_rate([10.0]) == 10.0
    assert band_decode_rate([30.0, 35.0, 31.0]) == 31.0 and band_decode_rate([30.0, 32.0, 31.0, 35.0]) == 31.5


BASE = [38.0, 40.0, 42.0, 41.0, 39.0]
BATCHED = [18.0, 22.0, 20.0, 21.0, 19.0, 23.0]


def bootstrap(base, batched, n_boot, seed, level):
    """An independent percentile bootstrap with numpy's generator, drawn in the same order."""
    rng = np.random.default_rng(seed)
    b = np.median(rng.choice(np.array(base), size=(n_boot, len(base))), axis=1)
    t = np.median(rng.choice(np.array(batched), size=(n_boot, len(batched))), axis=1)
    tail = 100 * (1 - level) / 2
    return float(np.percentile(t / b, tail)), float(np.percentile(t / b, 100 - tail))


def test_ratio_interval_for_a_fixed_seed():
    ratio, low, high = ratio_interval(BASE, BATCHED)
    assert ratio == 20.5 / 40.0  # median 20.5 (of 6) over median 40.0 (of 5)
    assert (low, high) == (0.4625, approx(0.5641025641025641))  # computed once with seed 0, n_boot 2000
    assert (low, high) == bootstrap(BASE, BATCHED, 2000, 0, 0.95)
    assert low < ratio < high
    assert ratio_interval(BASE, BATCHED, seed=1)[1:] == bootstrap(BASE, BATCHED, 2000, 1, 0.95) != (low, high)
    assert ratio_interval(BASE, BATCHED, n_boot=1999)[1:] == bootstrap(BASE, BATCHED, 1999, 0, 0.95) != (low, high)
    narrow = ratio_interval(BASE, BATCHED, level=0.5)
    assert narrow[1:] == bootstrap(BASE, BATCHED, 2000, 0, 0.5) and low < narrow[1] < narrow[2] < high


def test_ratio_interval_draws_its_resamples_a_block_at_a_time_with_the_same_result(monkeypatch):
    # a block of 7 rates holds one resample of BATCHED (6) and one of BASE (5): 2,000 blocks each side, the same draws
    from analysis.metrics.parity import _rates

    whole = ratio_interval(BASE, BATCHED)
    monkeypatch.setattr(_rates, "BOOTSTRAP_BLOCK", 7)
    assert ratio_interval(BASE, BATCHED) == whole == (20.5 / 40.0, *bootstrap(BASE, BATCHED, 2000, 0, 0.95))
    monkeypatch.setattr(_rates, "BOOTSTRAP_BLOCK", 4096)  # 819 and 682 resamples a block, the last block shorter
    assert ratio_interval(BASE, BATCHED, n_boot=1999) == (20.5 / 40.0, *bootstrap(BASE, BATCHED, 1999, 0, 0.95))


def test_a_resample_larger_than_the_block_is_drawn_alone(monkeypatch):
    # the block bounds memory: a resample of more rates than the block holds is one draw, never two at once
    from analysis.metrics.parity import _rates

    class Recording:
        def __init__(self):
            self.rng, self.sizes = np.random.default_rng(0), []

        def choice(self, rates, size):
            self.sizes.append(size)
            return self.rng.choice(rates, size=size)

    monkeypatch.setattr(_rates, "BOOTSTRAP_BLOCK", 3)
    recording = Recording()
    medians = _rates._resampled_medians(recording, np.array(BASE), 4)
    assert recording.sizes == [(1, 5)] * 4 and len(medians) == 4


def test_ratio_interval_takes_rates_that_are_not_floats():
    # Decimal rates (json.loads(parse_float=Decimal)) are converted to floats, on either side
    as_decimal = [Decimal(str(r)) for r in BASE], [Decimal(str(r)) for r in BATCHED]
    assert ratio_interval(*as_decimal) == ratio_interval(BASE, BATCHED)
    assert ratio_interval([40, 40], [20, 20]) == (0.5, 0.5, 0.5)  # and ints


def test_ratio_interval_with_single_rates_and_empty_bands():
    assert ratio_interval([40.0], [20.0]) == (0.5, 0.5, 0.5)
    for base, batched in (([], [20.0]), ([40.0], []), ([], [])):
        with raises_exactly("both bands need at least one rate"):
            ratio_interval(base, batched)


# --- across configurations ----------------------------------------------------------------------------------------


def test_div_index_edges():
    a = S("a", [1, 2, 3])
    assert div_index([a]) == 3  # one stream: its length
    assert div_index([a, S("b", [1, 2])]) == 2  # never part: the shortest
    assert div_index([a, S("b", [1, 2, 3]), S("c", [1, 5])]) == 1  # a later stream parts
    with raises_exactly("Div_Index needs at least one stream"):
        div_index([])


def test_top1_prob_edges():
    assert top1_prob(S("r", [1], [ln(0.1)], [(("a", None), ("b", -INF), ("c", ln(0.2)), ("d", ln(0.3)))]), 0) == approx(0.3)
    assert top1_prob(S("r", [1], [ln(0.25)], [(("a", None), ("b", -INF))]), 0) == approx(0.25)  # no usable candidate: the token's own
    assert top1_prob(S("r", [1], [None]), 0) is None
    assert top1_prob(S("r", [1], [ln(0.5)]), 1) is None  # past the end


def test_avg_std_top1_prob_with_upto_and_missing_values():
    # top-1 per step: a (0.8, 0.6, 0.5), b (0.4, 0.5, 0.45): population stds 0.2, 0.05, 0.025; Div_Index 1
    a = S("a", [1, 2, 3], [ln(0.8), ln(0.6), ln(0.5)])
    b = S("b", [1, 9, 3], [ln(0.4), ln(0.5), ln(0.45)])
    assert avg_std_top1_prob([a, b]) == approx((0.2 + 0.05) / 2)  # steps 0..1
    assert avg_std_top1_prob([a, b], upto=0) == approx(0.2)
    assert avg_std_top1_prob([a, b], upto=2) == approx((0.2 + 0.05 + 0.025) / 3)
    assert avg_std_top1_prob([a, b], upto=9) == approx((0.2 + 0.05 + 0.025) / 3)  # no further than the streams go
    assert avg_std_top1_prob([a, S("c", [1, 9], [ln(0.4), ln(0.5)])], upto=9) == approx((0.2 + 0.05) / 2)  # the shortest
    d = S("d", [1, 9, 3], [ln(0.4), None, ln(0.45)])
    assert avg_std_top1_prob([a, d], upto=2) == approx((0.2 + 0.025) / 2)  # step 1 has no value for d: left out
    assert avg_std_top1_prob([S("x", [1], [None]), S("y", [1], [None])]) is None


def test_std_at_acc_is_the_population_std():
    assert std_at_acc([]) is None
    assert std_at_acc([0.5]) == 0.0
    assert std_at_acc([0.0, 1.0]) == 0.5  # ddof 0; ddof 1 would give 0.7071
    assert std_at_acc([0.5, 0.75, 1.0]) == approx(math.sqrt(0.125 / 3))  # (0.0625 + 0 + 0.0625) / 3


def test_a_requests_state_is_decided_from_exactly_the_state_columns():
    """The divergence figure narrows the slot table to STATE_COLUMNS before request_states: every one of them is read,
    and they are enough."""
    from conftest import ROOT

    from analysis.run import read_run, slot_table
    from analysis.studies import STATE_COLUMNS, request_states

    slots = slot_table(read_run(ROOT / "data" / "experiment-cpu" / "default"))
    narrow = slots.select(*STATE_COLUMNS)
    assert request_states(narrow)["state"].equals(request_states(slots)["state"])
    for name in STATE_COLUMNS:
        with pytest.raises(pl.exceptions.ColumnNotFoundError):
            request_states(narrow.drop(name))
