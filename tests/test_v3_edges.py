"""Edges of aprender's V3 check that mutation testing showed no test pinned (issue 16): the u32 limit,
ShapeVerdict's properties, the frame of a verdict with no reasons, and policy errors in full."""

from __future__ import annotations

import copy

import polars as pl
import pytest
from conftest import CONTROL

from analysis import PolicyError, V3Policy, shape_check_data


def test_the_u32_limit_at_its_edge():
    at_limit = copy.deepcopy(CONTROL)
    at_limit["bands"][1]["m_formed"] = 4294967295  # the largest u32: read, then judged
    verdict = shape_check_data(at_limit)
    assert (verdict.status, verdict.reasons) == ("NOT ADMISSIBLE", ("c=4: m_formed 4294967295 != c (shape not served)",))
    past = copy.deepcopy(CONTROL)
    past["bands"][1]["m_formed"] = 4294967296  # one past it: unreadable, as serde refuses it
    verdict = shape_check_data(past)
    assert verdict.status == "RED" and verdict.exit_code == 4 and not verdict.admissible
    assert verdict.reasons == ("RED: unreadable witness: bands[1].m_formed: invalid value: integer `4294967296`, "
                               "expected a non-negative integer of at most 4294967295 (u32)",)


def test_an_admissible_verdict_and_its_empty_frame():
    verdict = shape_check_data(CONTROL, source="control.json")
    assert (verdict.status, verdict.admissible, verdict.exit_code, verdict.reasons) == ("ADMISSIBLE", True, 0, ())
    assert verdict.source == "control.json" and verdict.policy == V3Policy()
    frame = verdict.to_frame()
    assert frame.height == 0 and frame.schema == pl.Schema({"source": pl.String, "status": pl.String, "order": pl.Int64, "reason": pl.String})
    assert str(verdict) == "V3 shape check control.json: ADMISSIBLE"


@pytest.mark.parametrize("fields, words", [
    ({"near_tie_epsilon": -0.1}, "options: near_tie_epsilon must be a finite number >= 0, got -0.1"),
    ({"s7_ratio": True}, "options: s7_ratio must be a finite number >= 0, got True"),
    ({"near_tie_cap": "1"}, "options: near_tie_cap must hold non-negative integers, got '1'"),
    ({"bands": [1, 4, 4]}, "options: bands must be distinct batch sizes, got (1, 4, 4)"),
    ({"bands": [[1]]}, "options: bands must hold non-negative integers, got [1]"),
    ({"bands": "1,4"}, "options: bands must be a list of batch sizes, got '1,4'"),
    ({"model_prefix": 7}, "options: model_prefix must be a string, got 7"),
    ({"colour": "red"}, "options: unknown policy fields ['colour']; known: "),
])
def test_every_policy_error_in_full(fields, words):
    with pytest.raises(PolicyError) as caught:
        V3Policy.from_mapping(fields, source="options")
    assert str(caught.value).startswith(words)
