"""JSON parsing as strict as serde_json: no NaN or Infinity, no overflowing numbers, no lone
surrogates, and duplicate keys remembered so a typed reader can refuse them."""

from __future__ import annotations

import json
import math
import re
from typing import Any

# A lone surrogate can only enter through a \uD800-\uDFFF escape: decoded UTF-8 never holds one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class JsonObject(dict):
    """A JSON object that remembers which keys appeared more than once (the last value wins)."""

    duplicates: frozenset[str] = frozenset()


class StrictJsonError(ValueError):
    """Text that serde_json would refuse; the message says where and why."""


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


def loads(text: str) -> Any:
    """Parse ``text`` as strict JSON; objects come back as :class:`JsonObject`.

    Examples
    --------
    >>> loads('{"a": 1, "a": 2}').duplicates
    frozenset({'a'})
    >>> loads('"\\\\ud800"')  # a \\u escape in the JSON text
    Traceback (most recent call last):
    ...
    analysis._strictjson.StrictJsonError: $: a string holds a lone surrogate escape
    >>> loads('NaN')
    Traceback (most recent call last):
    ...
    analysis._strictjson.StrictJsonError: NaN is not a JSON number
    """
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
        )
    except json.JSONDecodeError as exc:
        raise StrictJsonError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # int digit limits, or our own refusals
        if isinstance(exc, StrictJsonError):
            raise
        raise StrictJsonError(str(exc)) from None
    if _SURROGATE_ESCAPE.search(text):
        _check_strings(value, "$")
    return value
