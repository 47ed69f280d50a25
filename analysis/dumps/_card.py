"""A dump's card in Jupyter: sizes, sources and formats, what was left out, the first requests."""

from __future__ import annotations

from ..core._cells import few, summary_html
from ..core._frames import as_polars


def dump_summary(dump) -> str:
    """A dump's card: sizes, sources and formats, what was left out, the first requests."""
    sources = list(dump.formats)
    formats = sorted({f for found in dump.formats.values() for f in found})
    facts = [("requests", len(dump.requests)), ("scored tokens", len(dump.tokens)), ("candidates", len(dump.candidates)),
             ("sources", few(sources)), ("formats", few(formats)), ("records left out", len(dump.skipped)), ("backend", dump.backend)]
    lines = [(str(e), "fail") for e in dump.skipped[:5]]
    columns = [c for c in ("request_id", "source_format", "model", "prompt_id", "role", "band_c", "slot", "completion_tokens", "finish_reason")
               if c in dump.requests.columns]
    return summary_html("bia dump", None, facts, lines, as_polars(dump.requests).select(columns))
