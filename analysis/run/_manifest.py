"""The types a run manifest's fields must have, checked once when the run is read.

A manifest is JSON that people and scripts write too; a field of the wrong type would otherwise
surface later as a TypeError deep in a table. :func:`manifest_problem` names the first field that
is wrong, as a path (``m_formed[3].c``), with what was expected and what was found.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]


INT64_MAX = 2**63 - 1  # every integer of a manifest lands in a 64-bit column


def _int(low: int) -> Check:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= INT64_MAX


def _too_big(value: Any) -> bool:
    """Whether ``value`` is, or a list of it holds, an integer past ``INT64_MAX``."""
    items = value if isinstance(value, list) else [value]
    return any(isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT64_MAX for v in items)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is(*types: type) -> Check:
    return lambda v: isinstance(v, types) and not (isinstance(v, bool) and bool not in types)


def _list_of(check: Check) -> Check:
    return lambda v: isinstance(v, list) and all(check(item) for item in v)


# The control arms a run may name (analysis.run._arms says what each fires), in the order the issue lists them.
ARM_NAMES = ("repeat", "copies", "mixed", "prefix", "cache", "serial", "prefill")

_ID = _is(str, int)
_OBJECT = _is(dict)
_NULLABLE_OBJECT = lambda v: v is None or isinstance(v, dict)  # noqa: E731

# field -> (what is expected, in words; the check)
_TOP: dict[str, tuple[str, Check]] = {
    "ladder": ("a list of distinct integers >= 1", lambda v: _list_of(_int(1))(v) and len(set(v)) == len(v)),
    "repeats": ("an integer >= 1", _int(1)),
    "declared_min": ("an integer >= 0", _int(0)),
    "max_constant_run": ("an integer >= 0", _int(0)),
    "observer": ("true or false", _is(bool)),
    "bands_anyway": ("true or false", _is(bool)),
    "complete": ("true or false", _is(bool)),
    "prompts": ("a list of objects", _list_of(_OBJECT)),
    "fillers": ("a list of strings", _list_of(_is(str))),
    "m_formed": ("a list of objects", _list_of(_OBJECT)),
    "refused": ("a list of objects", _list_of(_OBJECT)),
    "skipped": ("a list of objects", _list_of(_OBJECT)),
    "done": ("a list of strings", _list_of(_is(str))),
    "label": ("a string", _is(str)),
    "arms": (
        f"a list of distinct arm names ({', '.join(ARM_NAMES)})",
        lambda v: (
            isinstance(v, list) and all(isinstance(a, str) and a in ARM_NAMES for a in v) and len(set(v)) == len(v)
        ),
    ),
    "prefill_skipped": ("a list of objects", _list_of(_OBJECT)),
    "resent": ("a list of objects", _list_of(_OBJECT)),
    "expected": ("a list of strings", _list_of(_is(str))),
    "sampler": ("an object", _OBJECT),
    "identity": ("an object", _OBJECT),
    "environment": ("an object", _OBJECT),
    "requested": ("an object", _OBJECT),
    "effective": ("an object", _OBJECT),
    "engine": ("an object", _OBJECT),
    "server": ("an object", _OBJECT),
}
_PROMPT = {"prompt_id": ("a string or an integer", _ID), "text": ("a string", _is(str))}
_BAND = {
    "prompt_id": ("a string or an integer", _ID),
    "c": ("an integer >= 1", _int(1)),
    "repeat": ("an integer >= 0 or null", lambda v: v is None or _int(0)(v)),
    "role": ("a string", _is(str)),
    "widths": ("a list of integers >= 0", _list_of(_int(0))),
    "running": ("a list of integers >= 0", _list_of(_int(0))),
    "max": ("an integer >= 0 or null", lambda v: v is None or _int(0)(v)),
    "streams": (
        "an object with co_resident an integer >= 0",
        lambda v: isinstance(v, dict) and _int(0)(v.get("co_resident")),
    ),
    "cache": (
        "an object of {before, after} numbers",
        lambda v: (
            isinstance(v, dict)
            and all(isinstance(e, dict) and all(x is None or _number(x) for x in e.values()) for e in v.values())
        ),
    ),
    "engine": (
        "an object of {metric, before, after}: a name and two numbers",
        lambda v: (
            isinstance(v, dict)
            and all(
                isinstance(e, dict)
                and isinstance(e.get("metric"), str)
                and all(e.get(k) is None or _number(e.get(k)) for k in ("before", "after"))
                for e in v.values()
            )
        ),
    ),
}
_ENTRY = {
    "prompt_id": ("a string or an integer", _ID),
    "c": ("an integer >= 1 or null", lambda v: v is None or _int(1)(v)),
    "slot": ("an integer >= 0 or null", lambda v: v is None or _int(0)(v)),
}
_IDENTITY = {"model": ("an object", _NULLABLE_OBJECT)}
_COUNT = ("an integer >= 0 or null", lambda v: v is None or _int(0)(v))
_SAMPLER = {
    "max_tokens": _COUNT,
    "n_predict": _COUNT,
    "top_logprobs": _COUNT,
    "temperature": ("a number or null", lambda v: v is None or _number(v)),
    "seed": ("an integer or null", lambda v: v is None or _int(-(2**63))(v)),
    "ignore_eos": ("true, false or null", lambda v: v is None or isinstance(v, bool)),
}
_REQUESTED = {"layout": ("a string or null", lambda v: v is None or isinstance(v, str))}


def _first_wrong(record: dict[str, Any], rules: dict[str, tuple[str, Check]], prefix: str) -> str | None:
    for key, (expected, check) in rules.items():
        if key in record and not check(record[key]):
            shown = repr(record[key])
            shown = shown[:80] + "..." if len(shown) > 80 else shown
            bits = f" (integers are 64-bit: at most {INT64_MAX})" if _too_big(record[key]) else ""
            return f'field "{prefix}{key}": expected {expected}{bits}, got {shown}'
    return None


def manifest_problem(manifest: dict[str, Any]) -> str | None:
    """The first field of a run manifest whose type is wrong, in words; None when all are right.

    Parameters
    ----------
    manifest : dict of str to Any
        A run manifest as parsed from JSON.

    Returns
    -------
    str or None

    Examples
    --------
    >>> manifest_problem({"ladder": [1, 4], "prompts": [{"prompt_id": "p0", "text": "Hi"}]}) is None
    True
    >>> manifest_problem({"ladder": "1,4,8"})
    'field "ladder": expected a list of distinct integers >= 1, got \\'1,4,8\\''
    >>> manifest_problem({"arms": ["copies", "needle"]})
    'field "arms": expected a list of distinct arm names (repeat, copies, mixed, prefix, cache, serial, prefill), got [\\'copies\\', \\'needle\\']'
    >>> manifest_problem({"m_formed": [{"c": 4}, {"c": -4}]})
    'field "m_formed[1].c": expected an integer >= 1, got -4'
    >>> manifest_problem({"m_formed": [{"widths": [2**63]}]})
    'field "m_formed[0].widths": expected a list of integers >= 0 (integers are 64-bit: at most 9223372036854775807), got [9223372036854775808]'
    """
    problem = _first_wrong(manifest, _TOP, "")
    if problem:
        return problem
    for name, rules in (("prompts", _PROMPT), ("m_formed", _BAND), ("refused", _ENTRY), ("skipped", _ENTRY)):
        for index, record in enumerate(manifest.get(name) or []):
            problem = _first_wrong(record, rules, f"{name}[{index}].")
            if problem:
                return problem
    for name, rules in (("identity", _IDENTITY), ("sampler", _SAMPLER), ("requested", _REQUESTED)):
        problem = _first_wrong(manifest.get(name) or {}, rules, f"{name}.")
        if problem:
            return problem
    return None
