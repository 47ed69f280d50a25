"""JSON parsing as strict as serde_json: no NaN or Infinity, no overflowing numbers, no lone
surrogates, no nesting deeper than :data:`MAX_DEPTH`, and duplicate keys remembered so a typed
reader can refuse them.

:func:`check_depth` is the one nesting guard of every reader of JSON in bia (witnesses, the V3
check, run manifests, dumps, ``bia serve``'s request bodies): Python's parser recurses once per
level and would end in a ``RecursionError`` near a thousand, orjson refuses past 1024, and
serde_json (what aprender reads witnesses with) past 128. bia refuses past 128 everywhere.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

# serde_json's recursion limit: arrays and objects nested deeper are refused before parsing.
MAX_DEPTH = 128

# A lone surrogate can only enter through a \uD800-\uDFFF escape: decoded UTF-8 never holds one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class JsonObject(dict):
    """A JSON object that remembers which keys appeared more than once (the last value wins)."""

    duplicates: frozenset[str] = frozenset()


class StrictJsonError(ValueError):
    """Text that serde_json would refuse; the message says where and why.

    Attributes
    ----------
    problem : str
        What is wrong (the message).
    field : str or None
        The path of the offending key (``choices[0].logprob``) when one is to blame.
    """

    def __init__(
        self, problem: str, field: str | None = None, decode_error: json.JSONDecodeError | None = None
    ) -> None:
        super().__init__(problem)
        self.problem, self.field = problem, field
        self.decode_error = decode_error  # where the parser stopped, when it did: not_json says it


NOT_JSON = "not valid JSON"  # how every reader starts to say that a file is no JSON at all (not_json)


def not_json(exc: ValueError | RecursionError, line: int = 1) -> str:
    """bia's one wording for text a JSON parser refused: ``not valid JSON at line L column C (why)``, or
    ``not valid JSON (why)`` when the parser named no place; the caller prefixes the file and record.

    Parameters
    ----------
    exc : ValueError or RecursionError
        What :func:`loads_strict`, ``json.loads`` or ``orjson.loads`` raised (``json.loads`` raises a RecursionError for
        nesting past Python's limit).
    line : int
        The file's line the parsed text starts on (a JSON-lines record's), so that the place is the file's.

    Examples
    --------
    >>> not_json(json.JSONDecodeError("Expecting ',' delimiter", '{"a": 1\\n "b": 2}', 9))
    "not valid JSON at line 2 column 2 (Expecting ',' delimiter)"
    >>> not_json(json.JSONDecodeError("Expecting value", '{"a": ', 6))
    'not valid JSON at line 1 column 7 (Expecting value at the end of the text: cut short?)'
    >>> not_json(StrictJsonError("NaN is not a JSON number"))
    'not valid JSON (NaN is not a JSON number)'
    """
    at = exc if isinstance(exc, json.JSONDecodeError) else getattr(exc, "decode_error", None)
    if at is None:
        return f"{NOT_JSON} ({exc})"
    ends = not at.doc[at.pos :].strip()  # nothing after where it stopped: a file cut short, the commonest cause
    return f"{NOT_JSON} at line {at.lineno + line - 1} column {at.colno} ({at.msg}{' at the end of the text: cut short?' if ends else ''})"


class NestingError(StrictJsonError):
    """Arrays and objects nested deeper than the limit."""


class DuplicateKeyError(StrictJsonError):
    """An object that names a key twice (a parser would keep only the last value)."""


def _object(pairs: list[tuple[str, Any]]) -> JsonObject:
    obj = JsonObject()
    seen: set[str] = set()
    for key, value in pairs:
        if key in obj:
            seen.add(key)
        obj[key] = value
    if seen:
        obj.duplicates = frozenset(seen)
    return obj


def _refuse_constant(name: str) -> Any:
    raise StrictJsonError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise StrictJsonError(f"number {text} is out of range for a 64-bit float")
    return value


def _bounded_int(text: str) -> int:
    value = int(text)
    if len(text) > 300:  # serde_json reads a long integer as a float: one beyond a double's range is refused
        try:
            float(value)
        except OverflowError:
            raise StrictJsonError(
                f"number {text[:20]}... ({len(text)} digits) is out of range for a 64-bit float"
            ) from None
    return value


def _has_lone_surrogate(text: str) -> bool:
    return any("\ud800" <= char <= "\udfff" for char in text)


def _check_strings(value: Any, path: str) -> None:
    if isinstance(value, str):
        if _has_lone_surrogate(value):
            raise StrictJsonError(f"{path}: a string holds a lone surrogate escape")
    elif isinstance(value, dict):
        for key, item in value.items():
            if _has_lone_surrogate(key):
                raise StrictJsonError(f"{path}: a key holds a lone surrogate escape")
            _check_strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_strings(item, f"{path}[{index}]")


def _openers(data: str | bytes) -> int:
    """How many ``[`` and ``{`` the text holds, in strings or not: an upper bound of its depth."""
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


def _too_deep_at(raw: bytes, limit: int) -> int | None:
    """The offset of the first ``[`` or ``{`` outside strings that opens level ``limit + 1``, or None.

    Vectorized: a quote ends or starts a string unless an odd run of backslashes precedes it,
    and a bracket is outside strings when an even number of such quotes precede it.
    """
    a = np.frombuffer(raw, dtype=np.uint8)
    quotes = np.flatnonzero(a == 0x22)
    slashes = np.flatnonzero(a == 0x5C)
    if slashes.size:  # arrays the size of the quotes and backslashes, not of the text: a 30 MB manifest stays small
        run_start = np.maximum.accumulate(np.where(np.diff(slashes, prepend=-2) != 1, slashes, 0))
        at = np.minimum(np.searchsorted(slashes, quotes - 1), slashes.size - 1)
        run = np.where(slashes[at] == quotes - 1, quotes - run_start[at], 0)  # backslashes just before each quote
        quotes = quotes[run % 2 == 0]
    low = a | 0x20  # [ and ] fold onto { and }
    marks = np.flatnonzero((low == 0x7B) | (low == 0x7D))
    marks = marks[np.searchsorted(quotes, marks) % 2 == 0]
    depth = np.cumsum(np.where(low[marks] == 0x7B, 1, -1))
    over = np.flatnonzero(depth > limit)
    return int(marks[over[0]]) if len(over) else None


def _where(raw: bytes, at: int) -> str:
    start = raw.rfind(b"\n", 0, at) + 1
    line = raw.count(b"\n", 0, at) + 1
    return f"line {line} column {len(raw[start:at].decode('utf-8', 'replace')) + 1}"


def _value_too_deep(value: Any, limit: int) -> bool:
    """Whether an already parsed value nests arrays and objects deeper than ``limit`` (no recursion)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def check_depth(data: str | bytes, limit: int = MAX_DEPTH, *, parsed: Any = None) -> None:
    """Refuse JSON text that nests arrays and objects deeper than ``limit``.

    Text with at most ``limit`` brackets passes at once; other text is scanned (strings skipped),
    or, when ``parsed`` holds the value a non-recursive parser already made of it, that value is
    walked instead.

    Parameters
    ----------
    data : str or bytes
        The JSON text (bytes as UTF-8).
    limit : int, default MAX_DEPTH
        The deepest nesting allowed (128, serde_json's limit).
    parsed : Any, optional
        The value already parsed from ``data``, walked instead of scanning the text; None scans.

    Raises
    ------
    NestingError
        The message names the limit and, for a scan, the line and column of the first bracket past it.

    Examples
    --------
    >>> check_depth("[[1]]", limit=2)
    >>> check_depth('["[[["]', limit=1)
    >>> check_depth('{"a": [[1]]}', limit=2)
    Traceback (most recent call last):
    ...
    analysis.core._strictjson.NestingError: arrays and objects nested deeper than 2, at line 1 column 8
    """
    if _openers(data) <= limit:
        return
    if parsed is not None:
        if _value_too_deep(parsed, limit):
            raise NestingError(f"arrays and objects nested deeper than {limit}")
        return
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    at = _too_deep_at(raw, limit)
    if at is not None:
        raise NestingError(f"arrays and objects nested deeper than {limit}, at {_where(raw, at)}")


def first_duplicate(value: Any, path: str = "") -> str | None:
    """The path of the first key that an object of ``value`` (parsed by :func:`loads_strict`) names twice, or None.

    Parameters
    ----------
    value : Any
        A parsed JSON value; only :class:`JsonObject` objects know their duplicated keys.
    path : str, default ""
        The path of ``value`` itself, prefixed to what is found; empty at the top.

    Returns
    -------
    str or None
        A path such as ``a[0].b``.

    Examples
    --------
    >>> first_duplicate(loads_strict('{"a": [{"b": 1, "b": 2}]}'))
    'a[0].b'
    """
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, Mapping):
            repeated = sorted(getattr(item, "duplicates", ()))
            if repeated:
                return f"{where}.{repeated[0]}" if where else repeated[0]
            stack.extend((v, f"{where}.{k}" if where else k) for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


def duplicate_path(text: str | bytes) -> str | None:
    """The path of the first key that an object of ``text`` names twice, or None; NaN and Infinity
    are read as Python writes them (for dumps).

    Parameters
    ----------
    text : str or bytes
        The JSON text.

    Returns
    -------
    str or None

    Raises
    ------
    NestingError
        Arrays and objects nested deeper than ``MAX_DEPTH``.
    json.JSONDecodeError
        The text is not JSON.

    Examples
    --------
    >>> duplicate_path('{"a": NaN, "b": {"c": 1, "c": 2}}')
    'b.c'
    """
    check_depth(text)
    return first_duplicate(json.loads(text, object_pairs_hook=_object))


def loads_strict(text: str) -> Any:
    """Parse ``text`` as strict JSON; objects come back as :class:`JsonObject`.

    Parameters
    ----------
    text : str
        The JSON text. Refused: nesting deeper than ``MAX_DEPTH``, NaN and Infinity, a float beyond a 64-bit
        float's range, a lone surrogate escape, and what serde_json would not read; a duplicated key is kept
        (the last value wins) and named in its object's ``duplicates``.

    Returns
    -------
    Any
        The value, objects as :class:`JsonObject`.

    Raises
    ------
    StrictJsonError
        The text is refused; the message says where.

    Examples
    --------
    >>> loads_strict('{"a": 1, "a": 2}').duplicates
    frozenset({'a'})
    >>> loads_strict('"\\\\ud800"')  # a \\u escape in the JSON text
    Traceback (most recent call last):
    ...
    analysis.core._strictjson.StrictJsonError: $: a string holds a lone surrogate escape
    >>> loads_strict('NaN')
    Traceback (most recent call last):
    ...
    analysis.core._strictjson.StrictJsonError: NaN is not a JSON number
    >>> loads_strict("[" * 200 + "]" * 200)
    Traceback (most recent call last):
    ...
    analysis.core._strictjson.NestingError: arrays and objects nested deeper than 128, at line 1 column 129
    """
    check_depth(text)
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
        )
    except json.JSONDecodeError as exc:
        raise StrictJsonError(f"{exc.msg} at line {exc.lineno} column {exc.colno}", decode_error=exc) from None
    except ValueError as exc:  # int digit limits, or our own refusals
        if isinstance(exc, StrictJsonError):
            raise
        raise StrictJsonError(str(exc)) from None
    if _SURROGATE_ESCAPE.search(text):
        _check_strings(value, "$")
    return value
