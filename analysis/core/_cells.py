"""Cells for people: how every value in bia's cards, tables and reports is written. Imports no bia object.

Values are written for people (rounded numbers, ``—`` for missing, yes/no), never as Python reprs,
and every value is escaped by the templates.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

MISSING = "—"


def cell(value: Any) -> str:
    """A value as a person reads it.

    Parameters
    ----------
    value : Any
        None, a bool, number, date or datetime, list, tuple, dict or anything with a ``str``; a NaN float and
        None are ``—``, infinities ``∞``/``-∞``, floats of 1000 and more whole with thousands separators, smaller
        ones to 4 significant digits, containers joined by ``, ``.

    Returns
    -------
    str

    Examples
    --------
    >>> [cell(v) for v in (None, True, 3, 1234.5678, 0.000123456, float("nan"), "x", [1, 2])]
    ['—', 'yes', '3', '1,235', '0.0001235', '—', 'x', '1, 2']
    >>> cell(dt.datetime(2026, 9, 9, 18, 15, 37, tzinfo=dt.timezone.utc))
    '2026-09-09 18:15 UTC'
    """
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date)):
        return _when(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return MISSING if math.isnan(value) else ("∞" if value > 0 else "-∞")
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(cell(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {cell(v)}" for k, v in value.items())
    return str(value)


def _when(value: dt.date) -> str:
    """A date, or a time to the minute with its zone (UTC when the value says so)."""
    if not isinstance(value, dt.datetime):
        return value.isoformat()
    zone = "" if value.tzinfo is None else " UTC" if value.utcoffset() == dt.timedelta(0) else value.strftime(" %z")
    return value.strftime("%Y-%m-%d %H:%M") + zone


def duration(seconds: float | None) -> str:
    """A span of time as bia shows it everywhere (cards, the report, CLI lines and errors): one format, so that times compare at a glance.

    Under a minute, seconds to 3 significant digits with trailing zeros dropped and never an exponent (``0.0123 s``,
    ``1.5 s``, ``12.3 s``, ``2 s``): what a timing can tell, not the clock's noise. From a minute on, whole seconds in
    minutes and hours (``2 min 05 s``, ``1 h 02 min``), trailing zero parts dropped. Never milliseconds, never
    ``0:00:03``. Missing (None or NaN) is ``—``.

    Parameters
    ----------
    seconds : float or None
        The span in seconds; negative spans get a leading ``-``.

    Returns
    -------
    str

    Examples
    --------
    >>> [duration(s) for s in (0.012345, 0.5, 1.5, 2, 12.34, 59.96, 125, 120, 3725, 3600, None)]
    ['0.0123 s', '0.5 s', '1.5 s', '2 s', '12.3 s', '1 min', '2 min 05 s', '2 min', '1 h 02 min 05 s', '1 h', '—']
    >>> duration(0.0000123), duration(0)
    ('0.0000123 s', '0 s')
    """
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return MISSING
    if seconds < 0:
        return "-" + duration(-seconds)
    short = float(f"{seconds:.3g}")
    if short < 60:
        return f"{Decimal(repr(short)).normalize():f} s"
    whole = round(seconds)
    parts = [(whole // 3600, "h"), (whole // 60 % 60, "min"), (whole % 60, "s")]
    while parts[0][0] == 0:
        parts.pop(0)
    while parts[-1][0] == 0:
        parts.pop()
    return " ".join(f"{n:02d} {unit}" if k else f"{n} {unit}" for k, (n, unit) in enumerate(parts))


def pairs(mapping: Mapping[str, Any] | None) -> str:
    """A mapping as ``key = value`` pairs for people (the sampler, the environment).

    Parameters
    ----------
    mapping : Mapping of str to Any, or None
        The pairs, in their order; each value written by :func:`cell`. None or empty gives ``—``.

    Returns
    -------
    str

    Examples
    --------
    >>> pairs({"temperature": 0.0, "ignore_eos": True, "gpu": None})
    'temperature = 0, ignore_eos = yes, gpu = —'
    >>> pairs({})
    '—'
    """
    return ", ".join(f"{k} = {cell(v)}" for k, v in (mapping or {}).items()) or MISSING


def percent(part: int, whole: int) -> str:
    """``part`` of ``whole`` as a percentage, never "100%" short of all nor "0%" above none.

    Parameters
    ----------
    part : int
        The count of the share.
    whole : int
        The count it is a share of; 0 gives ``—``.

    Returns
    -------
    str
        Whole percent, or with up to 3 decimals when rounding would say 0% or 100% of a share strictly between.

    Examples
    --------
    >>> percent(3, 8), percent(0, 0), percent(1852, 1856), percent(1, 3000)
    ('38%', '—', '99.8%', '0.03%')
    """
    if not whole:
        return MISSING
    text = f"{part / whole:.0%}"
    for digits in (1, 2, 3):
        if not (0 < part < whole and float(text[:-1]) in (0.0, 100.0)):
            break
        text = f"{part / whole:.{digits}%}"
    return text


def share(part: int, whole: int) -> str:
    """``part`` of ``whole`` as a percentage with both counts.

    Parameters
    ----------
    part : int
        The count of the share.
    whole : int
        The count it is a share of; 0 gives ``—``.

    Returns
    -------
    str

    Examples
    --------
    >>> share(3, 8), share(0, 0)
    ('38% (3 of 8)', '—')
    """
    return f"{percent(part, whole)} ({part} of {whole})" if whole else MISSING


def few(items: list[str], n: int = 3) -> str:
    """The first items of a list joined by commas, with a count of the rest; ``—`` when empty.

    Parameters
    ----------
    items : list of str
        The items, in the order shown.
    n : int, default 3
        How many are named.

    Returns
    -------
    str

    Examples
    --------
    >>> few(["a", "b", "c", "d", "e"]), few(["a"]), few([])
    ('a, b, c and 2 more', 'a', '—')
    """
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "") if items else MISSING
