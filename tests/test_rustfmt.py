"""Rust Display/Debug formatting, checked on hand-worked values and by round-trip properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from analysis.core._rustfmt import format_number, format_percent_1, rust_debug_str, rust_is_blank


def test_numbers_worked_by_hand():
    cases = {40.0: "40", 19.6: "19.6", 0.05: "0.05", -0.01: "-0.01", 1e-7: "0.0000001", 1e21: "1000000000000000000000",
             0.1 + 0.2: "0.30000000000000004", -0.0: "-0", 3: "3", 2.5e-5: "0.000025", 123456789.125: "123456789.125"}
    for value, text in cases.items():
        assert format_number(value) == text, value


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_number_round_trips_without_exponent(value):
    text = format_number(value)
    assert "e" not in text.lower()
    assert float(text) == value
    assert not text.endswith(".0")


def test_percent_one_decimal():
    assert [format_percent_1(v) for v in (49.0, 100 * 19.6 / 40, 33.33333, 0.25, 99.95)] == ["49.0", "49.0", "33.3", "0.2", "100.0"]


def test_debug_strings():
    assert rust_debug_str("") == '""'
    assert rust_debug_str("plain-é-名") == '"plain-é-名"'
    assert rust_debug_str('a"b\\c') == '"a\\"b\\\\c"'
    assert rust_debug_str("t\tn\nr\r0\0") == '"t\\tn\\nr\\r0\\0"'
    assert rust_debug_str("\x07\x7f\u200b") == '"\\u{7}\\u{7f}\\u{200b}"'
    assert rust_debug_str("e\u0301") == '"e\\u{301}"'  # a combining mark is Grapheme_Extend
    assert rust_debug_str("it's") == '"it\'s"'


def test_blank_is_rust_whitespace():
    assert rust_is_blank(" \t\n\u3000\u00a0")
    assert not rust_is_blank("\x1c")
    assert not rust_is_blank("x")


@given(st.text())
def test_debug_string_is_quoted_and_reversible_for_printable_text(text):
    quoted = rust_debug_str(text)
    assert quoted.startswith('"') and quoted.endswith('"')
    if all(ch.isprintable() and ch not in '"\\' for ch in text) and "\\u{" not in quoted:
        assert quoted[1:-1] == text
