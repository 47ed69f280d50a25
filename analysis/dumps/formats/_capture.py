"""Capture files read value by value (the general path): JSON lines of bare payloads or of capture envelopes
``{response|sse, c, slot, ...}``, each line's format detected on its own.

The columnar path for the big cases of the same files is ``_capture_fast``; this one reads every case and names
every error.
"""

from __future__ import annotations

import hashlib
import json

from .. import _json
from .._envelope import envelope_meta
from .._kit import Meta
from .._schema import Rows
from .._values import DumpError
from ._registry import FORMATS, PAYLOAD_PARSERS, _one_format, _stream_format, parse_payload_text, payload_formats


def parse_jsonl(text: str, rows: Rows, fmt_hint: str, lenient: bool, formats: set[str]) -> None:
    """Many responses, one per line: bare payloads, or envelopes ``{response|sse, c, slot, ...}``.

    A whole file holding one (pretty-printed) envelope is read as its single record.

    Parameters
    ----------
    text : str
        The file's text.
    rows : Rows
        The rows to append to.
    fmt_hint : str
        The format asked for: "auto" or "jsonl" detect each line's, another names them all.
    lenient : bool
        Skip bad lines (listed in ``rows.skipped``) instead of failing.
    formats : set of str
        Filled with the formats found.
    """
    try:
        whole = _json.loads_payload(text)
    except _json.DuplicateKeyError as exc:  # only a whole document parses far enough to find a repeated key
        raise DumpError(rows.source, "line 1", *_json.refusal(exc)) from None
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        _parse_jsonl_line(json.dumps(whole), 1, rows, fmt_hint, lenient, formats)
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            _parse_jsonl_line(line, number, rows, fmt_hint, lenient, formats)
        except DumpError as error:
            if not lenient:
                raise
            rows.skipped.append(error)


def _parse_jsonl_line(line: str, number: int, rows: Rows, fmt_hint: str, lenient: bool, formats: set[str]) -> None:
    where = f"line {number}"
    try:
        obj = _json.loads_payload(line)
    except ValueError as exc:
        raise DumpError(rows.source, where, *_json.refusal(exc, number)) from None
    raw = line.encode("utf-8")
    if isinstance(obj, dict) and ("response" in obj or "sse" in obj):
        meta = envelope_meta(obj, number, raw)
        if "sse" in obj:
            if not isinstance(obj["sse"], str):
                raise DumpError(rows.source, where, "sse", "expected the raw SSE text as a string")
            fmt = obj.get("format") or _stream_format(obj["sse"], rows.source, f"record {number}")
            formats.add(fmt)
            rows.source_format = fmt
            parse_payload_text(obj["sse"], fmt, rows, meta, lenient)
            return
        payload = obj["response"]
        fmt = obj.get("format") or _one_format(payload_formats(payload), rows.source, where)
    else:
        meta, payload = Meta(record=number, raw_sha256=hashlib.sha256(raw).hexdigest()), obj
        fmt = (
            fmt_hint if fmt_hint not in ("auto", "jsonl") else _one_format(payload_formats(payload), rows.source, where)
        )
    if fmt not in PAYLOAD_PARSERS:
        raise DumpError(rows.source, where, "format", f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    formats.add(fmt)
    rows.source_format = fmt
    PAYLOAD_PARSERS[fmt](payload, rows, meta, where)
