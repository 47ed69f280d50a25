"""Upper bounds on a divergence rate from a count of divergent requests, and how many requests a study needs.

A certificate asks one question, "is the rate below the target?", so its bound is one-sided: the
exact Clopper-Pearson upper bound at ``confidence`` puts all of ``1 - confidence`` on one side. (A
two-sided 95% interval's upper end is a one-sided 97.5% bound: 0 divergences in 299 requests would
then bound the rate at 1.23%, not below 1%, and a study would need 368 requests for what 299 show.)

With 0 divergences in n requests the bound has a closed form, ``1 - (1 - confidence)^(1/n)``; with
k > 0 it is the ``confidence`` quantile of Beta(k + 1, n - k), which this module finds as the rate
whose binomial probability of k or fewer divergences is ``1 - confidence`` (the same number: the
binomial tail and the regularised incomplete beta function are one identity), by bisection over
exact binomial terms. bia has no scipy among its dependencies, and this needs none.

The rule of three (3/n) approximates the 95% bound for 0 divergences from above: 3/n is larger than
``1 - 0.05^(1/n)`` for every n, so it asks one or two more requests (301 for 1% instead of 299).
"""

from __future__ import annotations

import math

import numpy as np

METHODS = ("clopper-pearson", "rule-of-three")
_RULE_OF_THREE_CONFIDENCE = 0.95  # 3 is -ln(0.05) rounded: the rule is the 95% bound, and no other


def divergence_bound(divergent: int, total: int, confidence: float = 0.95, method: str = "clopper-pearson") -> float:
    """The one-sided upper bound on a divergence rate, from ``divergent`` requests that parted out of ``total``.

    Parameters
    ----------
    divergent : int
        Requests that parted from m=1 (0 to ``total``).
    total : int
        Requests compared (at least 1).
    confidence : float
        The bound's confidence, in (0, 1): the true rate lies below the bound with this probability.
    method : str
        ``"clopper-pearson"``: the exact binomial bound (0 divergences: ``1 - (1 - confidence)^(1/total)``).
        ``"rule-of-three"``: ``3 / total``, the classic approximation of the 95% bound, for 0 divergences at 95% only.

    Returns
    -------
    float
        The upper bound, in (0, 1].

    Examples
    --------
    >>> round(divergence_bound(0, 299), 6), round(divergence_bound(0, 299, method="rule-of-three"), 6)
    (0.009969, 0.010033)
    >>> round(divergence_bound(1, 2), 6)  # P(0 or 1 of 2 part) = 1 - p^2 = 0.05 at p = sqrt(0.95)
    0.974679
    """
    _check_counts(divergent, total)
    alpha = _alpha(confidence)
    if method == "rule-of-three":
        if divergent:
            raise ValueError(
                f"the rule of three bounds a rate with 0 divergences, got {divergent} of {total}; use method='clopper-pearson'"
            )
        if confidence != _RULE_OF_THREE_CONFIDENCE:
            raise ValueError(
                f"the rule of three is the 95% bound, got confidence={confidence!r}; use method='clopper-pearson'"
            )
        return min(1.0, 3 / total)
    if method != "clopper-pearson":
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if divergent == 0:
        return -math.expm1(math.log(alpha) / total)  # 1 - alpha^(1/n), without losing digits to the subtraction
    if divergent == total:
        return 1.0
    return _binomial_upper(divergent, total, alpha)


def requests_needed(max_rate: float, confidence: float = 0.95, method: str = "clopper-pearson") -> int:
    """How many requests, all bit-identical to m=1, bound the divergence rate below ``max_rate``.

    The smallest n whose :func:`divergence_bound` with 0 divergences in n is below ``max_rate``.

    Parameters
    ----------
    max_rate : float
        The rate the study must show it is below, in (0, 1].
    confidence : float
        The bound's confidence, in (0, 1).
    method : str
        ``"clopper-pearson"`` (exact, the default) or ``"rule-of-three"`` (3/n, at 95% only).

    Returns
    -------
    int
        The number of requests.

    Examples
    --------
    >>> requests_needed(0.01), requests_needed(0.01, method="rule-of-three"), requests_needed(0.05)
    (299, 301, 59)
    """
    if isinstance(max_rate, bool) or not isinstance(max_rate, (int, float)) or not 0 < max_rate <= 1:
        raise ValueError(f"max_rate must be a rate in (0, 1], got {max_rate!r}")
    _alpha(confidence)
    if method == "rule-of-three":
        guess = math.floor(3 / max_rate)
    elif max_rate < 1:
        guess = math.floor(math.log(1 - confidence) / math.log1p(-max_rate))  # n > ln(alpha) / ln(1 - r), near enough
    else:
        guess = 1
    n = max(1, guess)
    # the closed forms rounded: step to the exact smallest n by the bound itself, so the two functions always agree
    while divergence_bound(0, n, confidence, method) >= max_rate:
        n += 1
    while n > 1 and divergence_bound(0, n - 1, confidence, method) < max_rate:
        n -= 1
    return n


def _check_counts(divergent: int, total: int) -> None:
    for name, value in (("divergent", divergent), ("total", total)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be a whole number of requests, got {value!r}")
    if total < 1:
        raise ValueError(f"total must be at least 1 request, got {total}")
    if not 0 <= divergent <= total:
        raise ValueError(f"divergent must be between 0 and total ({total}), got {divergent}")


def _alpha(confidence: float) -> float:
    """``1 - confidence``, once the confidence is checked to lie in (0, 1)."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    return 1 - confidence


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), 0 < p < 1: each term in logs, so that large n neither overflows nor underflows early."""
    return _cdf(_log_binomials(k, n), n, p)


def _log_binomials(k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``log C(n, i)`` for i = 0..k, as ``lgamma(n + 1) - lgamma(i + 1) - lgamma(n - i + 1)`` in that order, and i: the terms
    of :func:`_cdf` that do not depend on p, worked out once for every p a bisection tries."""
    head = math.lgamma(n + 1)
    return np.array(
        [head - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(k + 1)], dtype=np.float64
    ), np.arange(k + 1, dtype=np.float64)


def _cdf(terms: tuple[np.ndarray, np.ndarray], n: int, p: float) -> float:
    """P(X <= k) from :func:`_log_binomials`: each term's exponent ``log C(n, i) + i log p + (n - i) log(1 - p)``, added in that
    order as float64 (the bits Python's floats give), then ``math.exp`` of each and their exact sum (``math.fsum``)."""
    log_binomial, i = terms
    log_p, log_q = math.log(p), math.log1p(-p)
    with np.errstate(invalid="ignore"):  # 0 * -inf is nan, as in Python
        exponents = log_binomial + i * log_p + (n - i) * log_q
    return math.fsum(map(math.exp, exponents.tolist()))


def _binomial_upper(k: int, n: int, alpha: float) -> float:
    """The rate p at which k or fewer of n part with probability alpha (0 < k < n): the Clopper-Pearson upper bound.

    The probability falls as p rises from 1 (at p = 0) to 0 (at p = 1), so bisection finds where it crosses alpha, down
    to two neighbouring floats; the bound is the upper one, where the probability is at most alpha (never below the bound).
    """
    terms = _log_binomials(k, n)
    low, high = 0.0, 1.0
    while (middle := (low + high) / 2) not in (low, high):
        if _cdf(terms, n, middle) > alpha:
            low = middle
        else:
            high = middle
    return high
