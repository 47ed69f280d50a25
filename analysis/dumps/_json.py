"""JSON for dumps: orjson for speed, the standard library for what Python itself writes
(NaN, Infinity, -Infinity from ``json.dumps``), which the classifier then marks non-finite.

Whichever parser reads a text, two things are refused as in witnesses: arrays and objects nested
deeper than ``_strictjson.MAX_DEPTH``, and an object that names a key twice (both parsers would
silently keep the last value).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from ..core import MAX_DEPTH, DuplicateKeyError, NestingError, StrictJsonError, check_depth, duplicate_path, not_json

__all__ = [
    "DuplicateKeyError",
    "NestingError",
    "StrictJsonError",
    "check_depth",
    "check_unique_keys",
    "loads_payload",
    "refusal",
]


def loads_payload(data: bytes | str) -> Any:
    """Parse JSON; raises ValueError with the parser's message, or a ``StrictJsonError`` for nesting or a repeated key.

    Parameters
    ----------
    data : bytes or str
        JSON text (``NaN`` and ``Infinity`` accepted).

    Returns
    -------
    object

    Examples
    --------
    >>> loads_payload(b'{"logprob": -Infinity}')
    {'logprob': -inf}
    >>> loads_payload('{"a": 1, "a": 2}')
    Traceback (most recent call last):
    ...
    analysis.core._strictjson.DuplicateKeyError: key appears more than once (a parser keeps only its last value)
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            value = json.loads(data)
        except RecursionError:  # the standard parser recurses: this deep is past the limit anyway
            check_depth(data)  # which names where
            raise NestingError(f"arrays and objects nested deeper than {MAX_DEPTH}") from None
    check_depth(data, parsed=value)
    check_unique_keys(data, value)
    return value


def check_unique_keys(data: bytes | str, value: Any) -> None:
    """Refuse ``data`` when one of its objects names a key twice; ``value`` is what a parser made of it.

    Every member of an object has one colon outside strings, and strings hold the same colons once
    written again, so a repeated key leaves ``data`` with more colons than ``value`` written by
    orjson. Only then (or when a colon may be written as a ``\\u`` escape) is the text parsed again
    to name the key.

    Parameters
    ----------
    data : bytes or str
        The JSON text.
    value : object
        What a parser made of ``data``.

    Raises
    ------
    DuplicateKeyError
        ``field`` is the path of the repeated key.
    """
    if not _colons_differ(data, value):
        return
    path = duplicate_path(data)
    if path is not None:
        raise DuplicateKeyError("key appears more than once (a parser keeps only its last value)", field=path)


def _colons_differ(data: bytes | str, value: Any) -> bool:
    try:
        written = orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):  # an integer beyond 64 bits, a lone surrogate: look closely
        return True
    if isinstance(data, str):
        return "\\u003" in data or data.count(":") != written.count(b":")
    return b"\\u003" in data or data.count(b":") != written.count(b":")


def refusal(exc: ValueError, line: int = 1) -> tuple[str | None, str]:
    """(field, problem) of a ``DumpError`` for what :func:`loads_payload` raised; ``line``: the file's line the text starts on.

    Parameters
    ----------
    exc : ValueError
        What :func:`loads_payload` raised.
    line : int, default 1
        The file's line the text starts on.

    Returns
    -------
    tuple of (str or None, str)
    """
    if isinstance(exc, (NestingError, DuplicateKeyError)):
        return exc.field, exc.problem
    return None, not_json(exc, line)
