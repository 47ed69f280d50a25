"""The witness rules (``analysis.verdicts._witness_rules``), each branch on a band worked out by hand (issue 16)."""

from __future__ import annotations

import pytest

from analysis import derive_band_result, derive_run_verdict

MEASURED = [{"refused": None}] * 4


def band(**fields):
    """A c=4 band that passes under the v2 and v3 rules; ``fields`` change it."""
    base = {"c": 4, "m_formed": 4, "declared_min": 64, "intra_agree_to": 64, "divergence_at": 64,
            "max_constant_run": 15, "max_constant_run_declared": 16}
    return {**base, **fields}


@pytest.mark.parametrize("divergence_at, declared_min, expected", [
    (64, 64, ("PASS", None)),  # at the declared minimum: agreed long enough
    (63, 64, ("FAIL", None)),
    (None, 64, (None, "v1 rule needs divergence_at and declared_min")),
    (64, None, (None, "v1 rule needs divergence_at and declared_min")),
])
def test_version_1_compares_divergence_to_the_declared_minimum(divergence_at, declared_min, expected):
    # v1 looks at nothing else: no slots, no m_formed, a constant run past its bound
    assert derive_band_result(1, band(divergence_at=divergence_at, declared_min=declared_min, m_formed=None,
                                      max_constant_run=99), []) == expected


@pytest.mark.parametrize("version", [2, 3])
def test_a_band_that_holds(version):
    assert derive_band_result(version, band(), MEASURED) == ("PASS", None)


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("fields, slots, expected", [
    ({}, [], ("UNMEASURABLE", None)),  # no slots
    ({}, [{"refused": None}] * 3 + [{"refused": "HTTP 503"}], ("UNMEASURABLE", None)),  # one refused slot
    ({"m_formed": None}, MEASURED, (None, "m_formed not recorded")),
    ({"m_formed": 1}, MEASURED, ("UNMEASURABLE", None)),  # the batch never formed
    ({"m_formed": 2}, MEASURED, ("PASS", None)),  # a batch of two is a batch
    ({"max_constant_run": None}, MEASURED, (None, "max_constant_run or max_constant_run_declared not recorded")),
    ({"max_constant_run_declared": None}, MEASURED, (None, "max_constant_run or max_constant_run_declared not recorded")),
    ({"max_constant_run": 16}, MEASURED, ("FAIL", None)),  # a run as long as its bound is degenerate output
    ({"max_constant_run": 99, "max_constant_run_declared": 0}, MEASURED, ("PASS", None)),  # a bound of 0 is no bound
    ({"intra_agree_to": 63}, MEASURED, ("FAIL", None)),
    ({"intra_agree_to": None}, MEASURED, (None, "intra_agree_to or declared_min not recorded")),
    ({"declared_min": None}, MEASURED, (None, "intra_agree_to or declared_min not recorded")),
])
def test_each_v2_and_v3_rule(version, fields, slots, expected):
    assert derive_band_result(version, band(**fields), slots) == expected


def test_the_reference_band_skips_the_batch_rules():
    # c=1 has no batch to form or to agree within: m_formed and intra_agree_to are not asked for
    alone = band(c=1, m_formed=None, intra_agree_to=None, declared_min=None)
    assert derive_band_result(2, alone, MEASURED[:1]) == ("PASS", None)
    assert derive_band_result(2, {**alone, "max_constant_run": 16}, MEASURED[:1]) == ("FAIL", None)


def test_version_3_needs_one_slot_per_request():
    assert derive_band_result(3, band(), MEASURED[:3]) == ("UNMEASURABLE", None)
    assert derive_band_result(2, band(), MEASURED[:3]) == ("PASS", None)  # v2 did not count its slots


@pytest.mark.parametrize("stable, bands, verdict", [
    (True, [(1, "PASS"), (4, "PASS")], "PASS"),
    (True, [(1, "PASS"), (4, "FAIL")], "FAIL"),
    (False, [(1, "PASS"), (4, "FAIL")], "FAIL"),  # a failure stands even on an unstable reference
    (None, [(1, "PASS"), (4, "PASS")], "UNMEASURABLE"),  # stability unknown
    (False, [(1, "PASS"), (4, "PASS")], "UNMEASURABLE"),
    (True, [(1, "PASS"), (4, "PASS"), (8, "UNMEASURABLE")], "UNMEASURABLE"),
    (True, [(1, "PASS"), (4, "PASS"), (8, None)], "UNMEASURABLE"),
    (True, [(1, "PASS")], "UNMEASURABLE"),  # no batched band decided
    (True, [(1, "PASS"), (4, "UNMEASURABLE")], "UNMEASURABLE"),
    (True, [(1, None), (4, "FAIL")], "FAIL"),
    (True, [(0, "PASS"), (1, "PASS")], "UNMEASURABLE"),  # c must be above 1 to count as batched
    (True, [(2, "PASS")], "PASS"),
    (True, [], "UNMEASURABLE"),
])
def test_the_run_verdict(stable, bands, verdict):
    assert derive_run_verdict(stable, bands) == verdict


def test_a_band_of_two_is_batched():
    # c=2 is the smallest batch: it is held to m_formed and to agreement within the batch
    two = [{"refused": None}] * 2
    assert derive_band_result(2, band(c=2, m_formed=None), two) == (None, "m_formed not recorded")
    assert derive_band_result(2, band(c=2, m_formed=2, intra_agree_to=10), two) == ("FAIL", None)


def test_a_constant_run_bound_of_one():
    # a bound of 1 is a bound (only 0 means none): a run of 1 reaches it
    assert derive_band_result(2, band(max_constant_run=1, max_constant_run_declared=1), MEASURED) == ("FAIL", None)
