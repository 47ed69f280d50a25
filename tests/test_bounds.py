"""Bounds on a divergence rate (analysis.metrics.parity._bounds), each checked on a case worked out by hand."""

from __future__ import annotations

import math

import pytest

from analysis import divergence_bound, requests_needed


def test_zero_in_299_bounds_the_rate_below_one_percent_and_298_does_not():
    # one-sided exact bound with 0 divergences: 1 - 0.05^(1/n), ln(0.05) = -2.99573227, e^-x = 1 - x + x^2/2 - x^3/6
    # n = 299: x = 2.99573227 / 299 = 0.01001917, e^-x = 1 - 0.01001917 + 0.00005019 - 0.00000017 = 0.99003085: 0.00996915 (below 1%)
    # n = 298: x = 2.99573227 / 298 = 0.01005279, e^-x = 1 - 0.01005279 + 0.00005053 - 0.00000017 = 0.98999757: 0.01000243 (not below)
    assert divergence_bound(0, 299) == pytest.approx(0.00996915, abs=2e-8)
    assert divergence_bound(0, 298) == pytest.approx(0.01000243, abs=2e-8)
    assert divergence_bound(0, 299) < 0.01 <= divergence_bound(0, 298)
    assert requests_needed(0.01) == 299


def test_the_rule_of_three_is_three_over_n_and_asks_a_little_more():
    # 3/299 = 0.0100334 is not below 1%, 3/300 = 0.01 exactly is not either, 3/301 = 0.0099668 is
    assert divergence_bound(0, 299, method="rule-of-three") == pytest.approx(3 / 299)
    assert divergence_bound(0, 300, method="rule-of-three") == 0.01
    assert requests_needed(0.01, method="rule-of-three") == 301
    assert divergence_bound(0, 2, method="rule-of-three") == 1.0  # 3/2 capped: a rate is at most 1
    for n in (1, 5, 59, 299, 10_000):  # 3/n lies above the exact bound it approximates, always
        assert divergence_bound(0, n, method="rule-of-three") > divergence_bound(0, n)


def test_small_cases_by_hand():
    # 0 of 1: P(no divergence) = 1 - p = 0.05 at p = 0.95
    assert divergence_bound(0, 1) == pytest.approx(0.95)
    # 1 of 2: P(0 or 1 of 2 part) = 1 - p^2 = 0.05 at p = sqrt(0.95) = 0.9746794
    assert divergence_bound(1, 2) == pytest.approx(math.sqrt(0.95), abs=1e-12)
    # 1 of 3: P(X <= 1) = (1-p)^3 + 3p(1-p)^2 = (1-p)^2 (1+2p); at p = 0.8647 it is 0.018306 * 2.7294 = 0.04997, about 0.05
    assert divergence_bound(1, 3) == pytest.approx(0.8647, abs=1e-4)
    # every request parted: nothing bounds the rate below 1
    assert divergence_bound(4, 4) == 1.0
    # 0 of 59 at 95%: 1 - 0.05^(1/59) = 0.049507 < 5%; 0 of 58: 0.050340, not below
    assert requests_needed(0.05) == 59
    # at 90%: 1 - 0.1^(1/n) < 0.1 first at n = 22 (ln 0.1 / ln 0.9 = 21.85)
    assert requests_needed(0.1, confidence=0.9) == 22
    # a rate of 1 is bounded by one request: 0 of 1 gives 0.95 < 1
    assert requests_needed(1) == 1


def test_the_bound_for_divergences_is_the_beta_quantile():
    # Clopper-Pearson's upper bound for k of n is the confidence quantile of Beta(k + 1, n - k): the regularised incomplete
    # beta function there is the confidence (checked with mpmath, a test-only dependency, and a textbook value: 3 of 100
    # at 95% one-sided is 7.57%)
    mpmath = pytest.importorskip("mpmath")
    assert divergence_bound(3, 100) == pytest.approx(0.0757, abs=5e-5)
    for k, n, confidence in [(1, 2, 0.95), (3, 100, 0.95), (5, 10, 0.99), (50, 1000, 0.95), (1, 299, 0.95), (7, 20, 0.3)]:
        upper = divergence_bound(k, n, confidence)
        assert float(mpmath.betainc(k + 1, n - k, 0, upper, regularized=True)) == pytest.approx(confidence, abs=1e-9), (k, n)


def test_the_bound_is_the_first_float_where_the_tail_is_at_most_alpha():
    # bisection ends on two neighbouring floats: the bound is the upper one, so k or fewer part with probability at most
    # alpha there, and more than alpha one float below it (a conservative bound, never one float too low)
    from analysis.metrics.parity._bounds import _binomial_cdf

    alpha = 1 - 0.95  # 0.050000000000000044 in floats, as the bound computes it
    for k, n in [(1, 2), (3, 100), (50, 1000), (1, 299)]:
        upper = divergence_bound(k, n)
        below = math.nextafter(upper, 0.0)
        assert _binomial_cdf(k, n, upper) <= alpha < _binomial_cdf(k, n, below), (k, n)


def test_requests_needed_is_the_first_count_whose_bound_is_below_the_rate():
    for rate in (0.5, 0.2, 0.1, 0.05, 0.03, 0.01, 0.005, 0.001):
        for method in ("clopper-pearson", "rule-of-three"):
            n = requests_needed(rate, method=method)
            assert divergence_bound(0, n, method=method) < rate, (rate, method)
            assert n == 1 or divergence_bound(0, n - 1, method=method) >= rate, (rate, method)


def test_more_divergences_or_fewer_requests_raise_the_bound():
    assert divergence_bound(0, 100) < divergence_bound(1, 100) < divergence_bound(2, 100) < divergence_bound(2, 50)
    assert divergence_bound(1, 100, 0.99) > divergence_bound(1, 100, 0.95)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: divergence_bound(0, 0), "total must be at least 1 request, got 0"),
    (lambda: divergence_bound(3, 2), r"divergent must be between 0 and total \(2\), got 3"),
    (lambda: divergence_bound(-1, 2), r"divergent must be between 0 and total \(2\), got -1"),
    (lambda: divergence_bound(0.5, 2), "divergent must be a whole number of requests, got 0.5"),
    (lambda: divergence_bound(True, 2), "divergent must be a whole number of requests, got True"),
    (lambda: divergence_bound(0, 2.0), "total must be a whole number of requests, got 2.0"),
    (lambda: divergence_bound(0, 10, 1.0), r"confidence must lie in \(0, 1\), got 1.0"),
    (lambda: divergence_bound(0, 10, 0), r"confidence must lie in \(0, 1\), got 0"),
    (lambda: divergence_bound(0, 10, "0.9"), r"confidence must lie in \(0, 1\), got '0.9'"),
    (lambda: divergence_bound(0, 10, True), r"confidence must lie in \(0, 1\), got True"),
    (lambda: divergence_bound(0, 10, method="wilson"), "method must be one of clopper-pearson, rule-of-three, got 'wilson'"),
    (lambda: divergence_bound(1, 10, method="rule-of-three"), "the rule of three bounds a rate with 0 divergences, got 1 of 10"),
    (lambda: divergence_bound(0, 10, 0.9, method="rule-of-three"), "the rule of three is the 95% bound, got confidence=0.9"),
    (lambda: requests_needed(0), r"max_rate must be a rate in \(0, 1\], got 0"),
    (lambda: requests_needed(1.5), r"max_rate must be a rate in \(0, 1\], got 1.5"),
    (lambda: requests_needed(True), r"max_rate must be a rate in \(0, 1\], got True"),
    (lambda: requests_needed(0.01, confidence=1), r"confidence must lie in \(0, 1\), got 1"),
    (lambda: requests_needed(0.01, method="exact"), "method must be one of clopper-pearson, rule-of-three, got 'exact'"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
