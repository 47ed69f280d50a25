"""How bia's objects show themselves: a one-line repr everywhere, a compact HTML summary in Jupyter.

Values are written for people (rounded numbers, ``—`` for missing, yes/no), never as Python reprs,
and every value is escaped by the templates.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Any

from ._frames import as_polars
from ._html import render

MISSING = "—"


def cell(value: Any) -> str:
    """A value as a person reads it.

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


def pairs(mapping: Mapping[str, Any] | None) -> str:
    """A mapping as ``key = value`` pairs for people (the sampler, the environment).

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

    Examples
    --------
    >>> share(3, 8), share(0, 0)
    ('38% (3 of 8)', '—')
    """
    return f"{percent(part, whole)} ({part} of {whole})" if whole else MISSING


def frame_html(frame: Any, *, caption: str = "", empty: str = "nothing to show", limit: int | None = None) -> str:
    """A polars or pandas frame as an escaped HTML table of people-formatted cells; with ``limit``,
    the first rows and a count of the rest."""
    frame = as_polars(frame)
    shown = frame if limit is None else frame.head(limit)
    rows = [[cell(v) for v in row] for row in shown.iter_rows()]
    more = f"the first {shown.height} of {frame.height} rows" if frame.height > shown.height else ""
    return render("table.html.j2", columns=shown.columns, rows=rows, caption=caption, empty=empty, more=more)


def summary_html(kind: str, name: str | None, facts: list[tuple[str, Any]], lines: list[tuple[str, str | None]] = (),
                 preview: Any = None, preview_rows: int = 5) -> str:
    """The compact HTML card an object shows in Jupyter."""
    table = frame_html(preview, limit=preview_rows) if preview is not None else ""
    return render("summary.html.j2", kind=kind, name=name, facts=[(label, cell(value)) for label, value in facts], lines=list(lines),
                  preview=table)


def _few(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "") if items else MISSING


def run_summary(run) -> str:
    """A run's card: what served it, its plan, what it lacks, and per c how much of it matched m=1."""
    from ._review import run_counts
    from .run import slot_table

    manifest = run.manifest
    identity = manifest.get("identity") or {}
    facts = [("engine", identity.get("engine") or manifest.get("producer")), ("model", (identity.get("model") or {}).get("path")),
             ("prompts", _few(run.prompts)), ("ladder", run.ladder), ("requests", len(run.dump.requests)),
             ("complete", manifest.get("complete", True)), ("missing", len(run.missing())), ("refused", len(manifest.get("refused") or [])),
             ("capture records left out", len(run.dump.skipped))]
    lines = []
    for c, requests, bitwise, same, earliest in run_counts(slot_table(run)).select("c", "requests", "bitwise", "same", "first").iter_rows():
        words = f"c={c}: {bitwise} of {requests} requests bit-identical to ref #1, {same} token-identical"
        words += f"; the earliest parts at token {earliest}" if earliest is not None else ""
        lines.append((words, "pass" if bitwise == requests else "fail" if same < requests else None))
    return summary_html("bia run", str(run.path) if run.path else "assembled", facts, lines)


def dump_summary(dump) -> str:
    """A dump's card: sizes, sources and formats, what was left out, the first requests."""
    sources = list(dump.formats)
    formats = sorted({f for found in dump.formats.values() for f in found})
    facts = [("requests", len(dump.requests)), ("scored tokens", len(dump.tokens)), ("candidates", len(dump.candidates)),
             ("sources", _few(sources)), ("formats", _few(formats)), ("records left out", len(dump.skipped)), ("backend", dump.backend)]
    lines = [(str(e), "fail") for e in dump.skipped[:5]]
    columns = [c for c in ("request_id", "source_format", "model", "prompt_id", "role", "band_c", "slot", "completion_tokens", "finish_reason")
               if c in dump.requests.columns]
    return summary_html("bia dump", None, facts, lines, as_polars(dump.requests).select(columns))


def witness_summary(ws) -> str:
    """A witness set's card: counts, each witness's recorded and re-derived verdict, the first bands."""
    polars_set = ws.to_backend("polars")
    facts = [("witnesses", polars_set.witnesses.height), ("bands", polars_set.bands.height), ("slots", polars_set.slots.height),
             ("release markers", polars_set.markers.height), ("discrepancies", polars_set.discrepancies.height)]
    lines = []
    for source, recorded, derived in polars_set.witnesses.select("source", "recorded_verdict", "derived_verdict").iter_rows():
        agree = recorded == derived
        lines.append((f"{source}: recorded {cell(recorded)}, re-derived {cell(derived)}", None if agree else "fail"))
    bands = polars_set.bands.select([c for c in ("source", "c", "m_formed", "divergence_at", "decode_tok_s", "result", "derived_result")
                                     if c in polars_set.bands.columns])
    return summary_html("bia witnesses", None, facts, lines, bands)
