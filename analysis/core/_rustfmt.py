"""Text formatting that matches Rust's ``Display`` and ``Debug``, so reasons read byte for byte.

aprender's V3 check is written in Rust and its reason texts interpolate ``f64`` values with
``{}`` and the model path with ``{:?}``. Python's ``repr`` differs from both (exponent form,
``'`` quotes), so the few rules that matter are restated here.
"""

from __future__ import annotations

from decimal import Decimal

import regex

# Rust's `char::is_whitespace` is Unicode White_Space; Python's str.strip also strips
# U+001C..U+001F, which Rust keeps, so the set is spelled out.
RUST_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"

_GRAPHEME_EXTEND = regex.compile(r"\p{Grapheme_Extend}")
_SIMPLE_ESCAPES = {"\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\", '"': '\\"', "\0": "\\0"}


def rust_trim(text: str) -> str:
    """Strip leading and trailing whitespace the way Rust's ``str::trim`` does.

    Parameters
    ----------
    text : str
        The text.

    Returns
    -------
    str

    Examples
    --------
    >>> rust_trim("  host\\n")
    'host'
    >>> rust_trim("\\x1c")  # a separator, not whitespace in Rust
    '\\x1c'
    """
    return text.strip(RUST_WHITESPACE)


def rust_is_blank(text: str) -> bool:
    """True when ``text`` is empty or only whitespace, as ``text.trim().is_empty()`` in Rust.

    Parameters
    ----------
    text : str
        The text.

    Returns
    -------
    bool
    """
    return rust_trim(text) == ""


def format_number(value: float | int) -> str:
    """Format a number as Rust's ``Display`` for ``f64`` does.

    Shortest digits that round-trip, never an exponent, and a whole value without ``.0``.

    Parameters
    ----------
    value : float or int
        The number; NaN and infinities are written ``NaN``, ``inf`` and ``-inf``.

    Returns
    -------
    str

    Examples
    --------
    >>> format_number(40.0), format_number(19.6), format_number(0.05), format_number(1e-7)
    ('40', '19.6', '0.05', '0.0000001')
    >>> format_number(1e21)
    '1000000000000000000000'
    """
    number = float(value)
    if number != number:
        return "NaN"
    if number in (float("inf"), float("-inf")):
        return "inf" if number > 0 else "-inf"
    text = format(Decimal(repr(number)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def format_percent_1(value: float) -> str:
    """Format with exactly one decimal, as Rust's ``{:.1}`` does (correctly rounded).

    Parameters
    ----------
    value : float
        The number (a percentage, as the V3 reasons write it).

    Returns
    -------
    str

    Examples
    --------
    >>> format_percent_1(49.0), format_percent_1(0.25)
    ('49.0', '0.2')
    """
    return f"{value:.1f}"


def _needs_unicode_escape(char: str) -> bool:
    if _GRAPHEME_EXTEND.match(char):
        return True
    # Rust's `is_printable` excludes the same categories Python's isprintable does
    # (controls, format, surrogates, private use, unassigned, separators but space).
    return not char.isprintable()


def rust_debug_str(text: str) -> str:
    """Quote a string as Rust's ``{:?}`` does for ``&str``.

    Parameters
    ----------
    text : str
        The string.

    Returns
    -------
    str
        The string in double quotes, with Rust's escapes.

    Examples
    --------
    >>> rust_debug_str('qwen2.5-coder.gguf')
    '"qwen2.5-coder.gguf"'
    >>> rust_debug_str('a "b"\\n\\x01')
    '"a \\\\"b\\\\"\\\\n\\\\u{1}"'
    >>> rust_debug_str("it's")
    '"it\\'s"'
    """
    out = ['"']
    for char in text:
        if char in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[char])
        elif _needs_unicode_escape(char):
            out.append(f"\\u{{{ord(char):x}}}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


__all__ = [
    "format_number",
    "format_percent_1",
    "rust_debug_str",
    "rust_is_blank",
    "rust_trim",
]
