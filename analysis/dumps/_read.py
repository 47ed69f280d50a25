"""``read_dump`` and ``read_dumps``: detect a dump's format, parse it into the one schema."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..core._frames import check_backend, to_backend
from ..core._frames import progress as show_progress
from ..io._sources import expand_sources, local_path
from . import _json
from ._offline import parse_offline, parse_repr
from ._openai import Meta
from ._schema import SCHEMAS, Rows
from ._stream import parse_chat_stream, parse_llamacpp_stream, parse_responses_stream, parse_sglang_stream
from ._values import DumpError
from ._formats import (DUMP_SUFFIXES, ENVELOPE_KEYS, FORMATS, PAYLOAD_PARSERS, STREAM_FORMATS, _one_format, _stream_format,
                       detect_format, payload_formats)
from ._card import dump_summary
from ._fast import read_jsonl
from ._formats import _text

# --- parsing a source -------------------------------------------------------------------------


def _parse_payload_text(text: str, fmt: str, rows: Rows, meta: Meta, lenient: bool) -> None:
    if fmt == "vllm_offline_repr":
        parse_offline(parse_repr(text, rows.source), rows, meta)
        return
    if fmt in STREAM_FORMATS:
        if fmt == "llamacpp_sse":
            parse_llamacpp_stream(text, rows, meta, lenient=lenient)
        elif fmt == "sglang_sse":
            parse_sglang_stream(text, rows, meta, lenient=lenient)
        elif fmt == "openai_responses_sse":
            parse_responses_stream(text, rows, meta, lenient=lenient)
        else:
            parse_chat_stream(text, rows, meta, lenient=lenient, legacy=fmt == "openai_completion_sse")
        return
    try:
        payload = _json.loads(text)
    except ValueError as exc:
        raise DumpError(rows.source, f"record {meta.record}", *_json.refusal(exc)) from None
    PAYLOAD_PARSERS[fmt](payload, rows, meta, "$" if meta.record == 0 else f"line {meta.record}")


def _envelope_meta(line: dict, record: int, raw: bytes) -> Meta:
    extra = {k: v for k, v in line.items() if k not in ENVELOPE_KEYS}
    return Meta(record=record, sample_key=line.get("sample_key"), band_c=line.get("band_c"), slot=line.get("slot"),
                prompt_id=None if line.get("prompt_id") is None else str(line["prompt_id"]), role=line.get("role"), repeat=line.get("repeat"),
                t_sent=line.get("t_sent"),
                arrivals=line.get("arrival_times"), raw_sha256=hashlib.sha256(raw).hexdigest(), extra=extra)


def _parse_jsonl(text: str, rows: Rows, fmt_hint: str, lenient: bool, formats: set[str]) -> None:
    """Many responses, one per line: bare payloads, or envelopes ``{response|sse, band_c, slot, ...}``.

    A whole file holding one (pretty-printed) envelope is read as its single record.
    """
    try:
        whole = _json.loads(text)
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
        obj = _json.loads(line)
    except ValueError as exc:
        raise DumpError(rows.source, where, *_json.refusal(exc, number)) from None
    raw = line.encode("utf-8")
    if isinstance(obj, dict) and ("response" in obj or "sse" in obj):
        meta = _envelope_meta(obj, number, raw)
        if "sse" in obj:
            if not isinstance(obj["sse"], str):
                raise DumpError(rows.source, where, "sse", "expected the raw SSE text as a string")
            fmt = obj.get("format") or _stream_format(obj["sse"], rows.source, f"record {number}")
            formats.add(fmt)
            rows.source_format = fmt
            _parse_payload_text(obj["sse"], fmt, rows, meta, lenient)
            return
        payload = obj["response"]
        fmt = obj.get("format") or _one_format(payload_formats(payload), rows.source, where)
    else:
        meta, payload = Meta(record=number, raw_sha256=hashlib.sha256(raw).hexdigest()), obj
        fmt = fmt_hint if fmt_hint not in ("auto", "jsonl") else _one_format(payload_formats(payload), rows.source, where)
    if fmt not in PAYLOAD_PARSERS:
        raise DumpError(rows.source, where, "format", f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    formats.add(fmt)
    rows.source_format = fmt
    PAYLOAD_PARSERS[fmt](payload, rows, meta, where)


def parse_source(raw: bytes, source: str, fmt: str = "auto", *, lenient: bool = False, torch_options: dict | None = None) -> tuple[Rows, set[str]]:
    """Parse one source's bytes; returns its rows and the formats found in it."""
    if fmt not in ("auto", *FORMATS):
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {fmt!r}")
    detected = detect_format(raw, source) if fmt == "auto" else fmt
    rows = Rows(source, detected)
    formats = {detected}
    if detected == "torch":
        from ._torch import parse_torch

        parse_torch(raw, rows, **(torch_options or {}))
        return rows, formats
    text = _text(raw, source)
    if detected == "jsonl":
        formats.clear()
        _parse_jsonl(text, rows, fmt, lenient, formats)
        return rows, formats or {"jsonl"}
    meta = Meta(raw_sha256=hashlib.sha256(raw).hexdigest())
    _parse_payload_text(text, detected, rows, meta, lenient)
    return rows, formats


# --- the public object --------------------------------------------------------------------------


@dataclass(frozen=True)
class Dump:
    """Per-token logprob dumps in one schema.

    Attributes
    ----------
    tokens : frame
        One row per scored position (key: source, record, choice_index, segment, position).
    candidates : frame
        One row per delivered candidate (the token key plus list_kind, list_index).
    requests : frame
        One row per request and choice.
    formats : dict
        The format detected (or given) for each source.
    skipped : list of DumpError
        What lenient mode skipped, each with its source, record and reason; empty otherwise.
    """

    tokens: Any
    candidates: Any
    requests: Any
    formats: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[DumpError] = field(default_factory=list)
    backend: str = "polars"

    def __repr__(self) -> str:
        return (f"Dump({len(self.tokens)} tokens, {len(self.candidates)} candidates, {len(self.requests)} requests "
                f"from {len(self.formats)} source(s); skipped {len(self.skipped)}; backend={self.backend!r})")

    def _repr_html_(self) -> str:
        return dump_summary(self)

    def write_parquet(self, folder: str | os.PathLike[str]) -> Path:
        """Write the three tables as Parquet (plus a manifest), so the dump is parsed only once."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("tokens", "candidates", "requests"):
            frame = getattr(self, name)
            frame = frame if isinstance(frame, pl.DataFrame) else pl.from_pandas(frame, schema_overrides=SCHEMAS[name])
            frame.write_parquet(folder / f"{name}.parquet")
        manifest = {"formats": self.formats, "skipped": [str(e) for e in self.skipped], "schema_version": 1}
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        return folder


@dataclass(frozen=True)
class ScannedDump:
    """A dump written by :meth:`Dump.write_parquet`, as lazy frames (nothing read until collected)."""

    tokens: pl.LazyFrame
    candidates: pl.LazyFrame
    requests: pl.LazyFrame
    formats: dict[str, list[str]]


def scan_dump(folder: str | os.PathLike[str]) -> ScannedDump:
    """Lazily open a dump folder written by :meth:`Dump.write_parquet`."""
    folder = Path(folder)
    manifest = folder / "manifest.json"
    if not manifest.exists():
        raise FileNotFoundError(f"{folder}: no manifest.json; write one with Dump.write_parquet")
    formats = json.loads(manifest.read_text(encoding="utf-8"))["formats"]
    return ScannedDump(*(pl.scan_parquet(folder / f"{name}.parquet") for name in ("tokens", "candidates", "requests")), formats=formats)


def _fast_jsonl(path: Path, source: str, fmt: str, limit: int | None = None) -> tuple[tuple[pl.DataFrame, ...], set[str]] | None:
    """The columnar path (frames and formats found), when the file is JSON lines of chat completions, bare or in
    capture envelopes; ``limit`` reads only the file's first bytes (a torn tail left out). None: take the general path."""
    return read_jsonl(path, source, fmt, limit)


def read_dumps(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    format: str = "auto",
    backend: str = "polars",
    lenient: bool = False,
    progress: bool | None = None,
    timeout: float | None = None,
    max_bytes: int | None = None,
    torch_options: dict | None = None,
    torn_tail: bool = False,
) -> Dump:
    """Read logprob dumps from files, folders, glob patterns or http(s) URLs into one schema.

    Parameters
    ----------
    sources : path, URL, or an iterable of them
        A folder contributes its ``.json``, ``.jsonl``, ``.ndjson``, ``.sse``, ``.pt`` files.
    format : str
        "auto" (detect, and say what was detected in ``Dump.formats``) or one of ``FORMATS``.
    backend : {"polars", "pandas"}
    lenient : bool
        Skip bad records (JSONL lines, broken stream events) instead of failing; every skip is
        reported in ``Dump.skipped``.
    progress : bool, optional
        A progress bar over sources; by default only in a terminal.
    timeout, max_bytes : optional
        Limits for URL downloads.
    torch_options : dict, optional
        For ``.pt`` files: ``top_k``, ``prompt_length``, ``eos_token_id``.
    torn_tail : bool
        A JSON-lines file being appended to when its writer was killed can end in a cut line: no
        newline, not JSON. With ``torn_tail`` that line is left out and listed in ``Dump.skipped``
        (``read_run`` uses it); otherwise it is an error like any other.

    Returns
    -------
    Dump

    Examples
    --------
    >>> d = read_dumps("tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json")
    >>> d.tokens.select("position", "token_id", "value_status").head(2).rows()
    [(0, 9707, 'ok'), (1, 0, 'ok')]
    >>> d.formats
    {'tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json': ['openai_chat']}
    """
    check_backend(backend)
    fetch = {k: v for k, v in {"timeout": timeout, "max_bytes": max_bytes}.items() if v is not None}
    tables: dict[str, list[pl.DataFrame]] = {"tokens": [], "candidates": [], "requests": []}
    formats, skipped = {}, []
    if format not in ("auto", *FORMATS):
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    failed: list[DumpError] = []
    for source in show_progress(expand_sources(sources, suffix=DUMP_SUFFIXES), progress, "reading dumps"):
        path = local_path(source, **fetch)
        try:
            if not torn_tail and path.suffix in (".jsonl", ".ndjson") and _blank(path):
                raise DumpError(source, "$", None, "an empty file: no JSON line (a run's capture file may be empty before its first "
                                                   "response: read_run reads those)")
            keep, torn = _torn_tail(path, source) if torn_tail else (None, None)
            fast = _fast_jsonl(path, source, format, keep)
            if fast is not None:
                parts, found = fast
                if torn is not None:
                    skipped.append(torn)
            else:
                raw = path.read_bytes()
                rows, found = parse_source(raw if keep is None else raw[:keep], source, format, lenient=lenient, torch_options=torch_options)
                if torn is not None:
                    rows.skipped.append(torn)
                skipped.extend(rows.skipped)
                parts = rows.frames()
        except DumpError as exc:  # every source is tried, so one error names all that cannot be read, not only the first
            failed.append(exc)
            continue
        formats[source] = sorted(found)
        for name, frame in zip(tables, parts):
            tables[name].append(frame)
    if failed:
        raise _all_failures(failed)
    frames = {name: pl.concat(parts, how="vertical") if parts else pl.DataFrame(schema=SCHEMAS[name]) for name, parts in tables.items()}
    return Dump(**{n: to_backend(f, backend) for n, f in frames.items()}, formats=formats, skipped=skipped, backend=backend)


def _blank(path: Path) -> bool:
    """Whether a file holds nothing but whitespace (read a block at a time: a real dump's first block has content)."""
    with path.open("rb") as handle:
        while block := handle.read(1 << 16):
            if block.strip():
                return False
    return True


def _all_failures(failed: list[DumpError]) -> DumpError:
    """The first source's error, naming every other source that could not be read either (each with its own reason).

    Examples
    --------
    >>> str(_all_failures([DumpError("a.json", "$", None, "an empty file"), DumpError("b.json", "line 2", "x", "bad")]))
    'a.json: $: an empty file; 1 more source could not be read: b.json: line 2.x: bad'
    """
    first, *others = failed
    if not others:
        return first
    shown = "; ".join(str(e) for e in others[:10]) + (f"; and {len(others) - 10} more" if len(others) > 10 else "")
    more = f"{len(others)} more source{'s' if len(others) > 1 else ''} could not be read"
    error = DumpError(first.source, first.record, first.field, f"{first.problem}; {more}: {shown}")
    error.others = others
    return error


def _torn_tail(path: Path, source: str) -> tuple[int | None, DumpError | None]:
    """How many leading bytes of a JSON-lines file to keep when its last line was cut, and the error that lists
    the cut; (None, None) when whole. Only the file's tail is read (and, for a cut, its newlines counted)."""
    if path.suffix not in (".jsonl", ".ndjson"):
        return None, None
    size = path.stat().st_size
    if not size:
        return None, None
    with path.open("rb") as handle:
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return None, None
        pieces, at, cut = [], size, 0
        while at > 0:
            step = min(1 << 20, at)
            at -= step
            handle.seek(at)
            piece = handle.read(step)
            newline = piece.rfind(b"\n")
            if newline != -1:
                pieces.append(piece[newline + 1 :])
                cut = at + newline + 1
                break
            pieces.append(piece)
        tail = b"".join(reversed(pieces))
        try:
            _json.loads(tail)
            return None, None  # a whole last line that merely lacks its newline
        except (_json.NestingError, _json.DuplicateKeyError):
            return None, None  # whole too: reading it names what is wrong with it
        except ValueError:
            pass
        handle.seek(0)
        lines, left = 1, cut
        while left > 0:
            block = handle.read(min(1 << 24, left))
            lines += block.count(b"\n")
            left -= len(block)
    return cut, DumpError(source, f"line {lines}", None, f"cut short ({size - cut} bytes, no newline, not JSON): an append the writer "
                                                         "did not finish; left out")


def read_dump(source: str | os.PathLike[str], **options: Any) -> Dump:
    """Read one dump source (file, folder or URL); see :func:`read_dumps` for the options.

    Examples
    --------
    >>> d = read_dump("tests/samples/sglang_generate_meta_info_logprobs__sglang-jax-pr13.partial.json")
    >>> d.tokens.group_by("segment").len().sort("segment").rows()
    [('completion', 6), ('prompt', 4)]
    """
    return read_dumps([source], **options)

