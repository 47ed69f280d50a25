"""Property tests: corrupted witnesses give a verdict or a named error, never a crash."""

from __future__ import annotations

import json

from conftest import CONTROL, V2_WITNESS, corrupted, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import WitnessError, shape_check_data, shape_check_text
from analysis.witness._parse import parse_document

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
V2 = json.loads(V2_WITNESS.read_text())


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), replacement=json_values)
def test_v3_never_crashes_on_a_corrupted_control(data, replacement):
    witness = corrupted(data, CONTROL, replacement)
    verdict = shape_check_data(json.loads(json.dumps(witness)))
    assert verdict.status in ("ADMISSIBLE", "NOT ADMISSIBLE", "RED")
    assert (verdict.status == "ADMISSIBLE") == (verdict.reasons == ())
    assert verdict.exit_code == {"ADMISSIBLE": 0, "NOT ADMISSIBLE": 5, "RED": 4}[verdict.status]


@settings(max_examples=examples(200))
@given(text=st.text(max_size=60))
def test_v3_on_arbitrary_text_is_red_or_a_verdict(text):
    verdict = shape_check_text(text)
    if verdict.status == "RED":
        assert verdict.reasons[0].startswith("RED: ")


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), replacement=json_values)
def test_reader_gives_frames_or_a_named_error(data, replacement):
    witness = corrupted(data, V2, replacement)
    raw = json.dumps(witness).encode()
    try:
        parsed = parse_document(raw, "corrupt.json")
    except WitnessError as error:
        assert error.source == "corrupt.json" and str(error).startswith("corrupt.json: $")
    else:
        assert len(parsed.witnesses) == 1


@settings(max_examples=examples(100))
@given(cut=st.integers(1, len(V2_WITNESS.read_bytes().rstrip()) - 1))  # always cuts the closing brace
def test_truncated_file_is_a_named_error(cut):
    raw = V2_WITNESS.read_bytes()[:cut]
    try:
        parse_document(raw, "cut.json")
    except WitnessError as error:
        assert error.source == "cut.json"
    else:
        raise AssertionError("a truncated witness parsed")
