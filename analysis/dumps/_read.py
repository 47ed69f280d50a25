"""``read_dump`` and ``read_dumps``: detect a dump's format, parse it into the one schema."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from .._frames import check_backend, to_backend
from .._frames import progress as show_progress
from .._sources import expand_sources, local_path
from . import _json
from ._native import parse_llamacpp, parse_primerl, parse_sglang, parse_tgi
from ._offline import looks_like_steps, parse_offline, parse_repr
from ._openai import Meta, parse_chat, parse_completion
from ._schema import SCHEMAS, Rows
from ._sse import parse_sse
from ._stream import parse_chat_stream, parse_llamacpp_stream, parse_responses_stream, parse_sglang_stream
from ._values import DumpError

DUMP_SUFFIXES = (".json", ".jsonl", ".ndjson", ".sse", ".pt", ".pth")

# Parsers of one JSON payload, by format name.
PAYLOAD_PARSERS: dict[str, Callable] = {
    "openai_chat": parse_chat,
    "openai_completion": parse_completion,
    "vllm_generate": parse_chat,
    "sglang": parse_sglang,
    "llamacpp": parse_llamacpp,
    "tgi": parse_tgi,
    "primerl": parse_primerl,
    "vllm_offline": parse_offline,
}
STREAM_FORMATS = ("openai_chat_sse", "openai_completion_sse", "llamacpp_sse", "sglang_sse", "openai_responses_sse")
FORMATS = (*PAYLOAD_PARSERS, *STREAM_FORMATS, "vllm_offline_repr", "jsonl", "torch")


def payload_formats(payload: Any) -> list[str]:
    """Every format whose shape ``payload`` has; one means detected, several mean ambiguous.

    Examples
    --------
    >>> payload_formats({"meta_info": {"output_token_logprobs": []}})
    ['sglang']
    >>> payload_formats({"choices": [{"message": {}, "logprobs": None}]})
    ['openai_chat']
    """
    if isinstance(payload, list) and len(payload) == 1 and isinstance(payload[0], dict) and "details" in payload[0]:
        return ["tgi"]
    if looks_like_steps(payload):
        return ["vllm_offline"]
    if not isinstance(payload, dict):
        return []
    found = []
    if isinstance(payload.get("meta_info"), dict):
        found.append("sglang")
    if isinstance(payload.get("details"), dict) and ("generated_text" in payload or "tokens" in payload["details"]):
        found.append("tgi")
    if "schema_version" in payload and ("inference_logprobs" in payload or "trainer_logprobs" in payload):
        found.append("primerl")
    if "completion_probabilities" in payload or ("tokens_predicted" in payload and "content" in payload):
        found.append("llamacpp")
    found.extend(_choices_formats(payload))
    return found


def _choices_formats(payload: dict) -> list[str]:
    choices = payload.get("choices")
    if not isinstance(choices, list):
        return []
    if not choices:
        return ["vllm_generate"] if "prompt_logprobs" in payload else (["openai_chat"] if payload.get("object") == "chat.completion" else [])
    first = choices[0] if isinstance(choices[0], dict) else {}
    logprobs = first.get("logprobs") if isinstance(first.get("logprobs"), dict) else {}
    if "token_ids" in first or "compact_logprobs" in first:
        return ["vllm_generate"]
    if payload.get("object") == "text_completion" or "text" in first or "tokens" in logprobs:
        return ["openai_completion"]
    if payload.get("object") == "chat.completion" or "message" in first or "content" in logprobs or "nvext" in payload:
        return ["openai_chat"]
    return []


def _stream_format(text: str, source: str, record: str = "record 0") -> str:
    """Which stream an SSE capture is, from its first JSON event; ``record`` names the capture in errors."""
    for event in parse_sse(text).events:
        if event.data == "[DONE]":
            continue
        try:
            chunk = _json.loads(event.data)
        except (_json.NestingError, _json.DuplicateKeyError) as exc:  # JSON, refused: say so rather than "no known stream"
            raise DumpError(source, f"{record} event {event.index} (line {event.line})", *_json.refusal(exc)) from None
        except ValueError:
            continue
        if isinstance(chunk, dict):
            if "completion_probabilities" in chunk or "stop" in chunk:
                return "llamacpp_sse"
            if isinstance(chunk.get("meta_info"), dict):
                return "sglang_sse"
            if isinstance(chunk.get("type"), str) and chunk["type"].startswith("response."):
                return "openai_responses_sse"
            if chunk.get("object") == "text_completion" or any(isinstance(c, dict) and "text" in c for c in chunk.get("choices") or []):
                return "openai_completion_sse"
            if "choices" in chunk:
                return "openai_chat_sse"
    raise DumpError(source, "$", None, f"an SSE capture whose events match no known stream; known: {', '.join(STREAM_FORMATS)}")


def _looks_sse(text: str) -> bool:
    head = text.lstrip("\ufeff \t\r\n")[:64]
    return head.startswith(("data:", "event:", ": ", "id:", "retry:"))


def detect_format(raw: bytes, source: str) -> str:
    """The format of one source's bytes. Unknown or ambiguous content is a ``DumpError`` naming the candidates."""
    if raw[:2] == b"PK" or raw[:1] == b"\x80" or str(source).endswith((".pt", ".pth")):
        return "torch"
    text = _text(raw, source)
    if not text.strip():
        if str(source).endswith((".jsonl", ".ndjson")):
            return "jsonl"  # no line, no record: a capture file before its first response
        raise DumpError(source, "$", None, "an empty file")
    if _looks_sse(text):
        return _stream_format(text, source)
    try:
        payload = _json.loads(text)
    except (_json.NestingError, _json.DuplicateKeyError) as exc:
        if not _first_line_is_json(text):  # one (pretty-printed) document: its refusal is the answer
            raise DumpError(source, "$", *_json.refusal(exc)) from None
        return "jsonl"  # lines of JSON: each is read (and refused) on its own line
    except ValueError:
        if "Logprob(" in text[:65536]:
            return "vllm_offline_repr"
        if _first_line_is_json(text):
            return "jsonl"
        raise DumpError(source, "$", None, "neither JSON, JSON lines, SSE nor a torch file") from None
    if isinstance(payload, dict) and ("response" in payload or "sse" in payload):
        return "jsonl"  # one capture envelope: a JSON-lines file of one line
    return _one_format(payload_formats(payload), source, "$")


def _first_line_is_json(text: str) -> bool:
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        _json.loads(first)
    except (_json.NestingError, _json.DuplicateKeyError):
        return True  # JSON all the same; the line's own reading names the refusal
    except ValueError:
        return False
    return True


def _one_format(found: list[str], source: str, where: str) -> str:
    if len(found) == 1:
        return found[0]
    if not found:
        raise DumpError(source, where, None, f"matches no known dump format; known: {', '.join(FORMATS)}")
    raise DumpError(source, where, None, f"is ambiguous: it matches {', '.join(found)}; pass format= to choose")


def _text(raw: bytes, source: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DumpError(source, "$", None, f"not UTF-8 text ({exc})") from None


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


_ENVELOPE_KEYS = {"response", "sse", "format", "band_c", "slot", "prompt_id", "role", "repeat", "sample_key", "t_sent", "arrival_times"}
# Other envelope keys go to requests.extra; "logprobs_mode" there also sets vLLM offline semantics.


def _envelope_meta(line: dict, record: int, raw: bytes) -> Meta:
    extra = {k: v for k, v in line.items() if k not in _ENVELOPE_KEYS}
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
        raise DumpError(rows.source, where, *_json.refusal(exc)) from None
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
        from .._show import dump_summary

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
    from ._fast import read_jsonl

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
    for source in show_progress(expand_sources(sources, suffix=DUMP_SUFFIXES), progress, "reading dumps"):
        path = local_path(source, **fetch)
        keep, torn = _torn_tail(path, source) if torn_tail else (None, None)
        fast = _fast_jsonl(path, source, format, keep)
        if fast is not None:
            parts, found = fast
            formats[source] = sorted(found)
            if torn is not None:
                skipped.append(torn)
        else:
            raw = path.read_bytes()
            rows, found = parse_source(raw if keep is None else raw[:keep], source, format, lenient=lenient, torch_options=torch_options)
            if torn is not None:
                rows.skipped.append(torn)
            formats[source] = sorted(found)
            skipped.extend(rows.skipped)
            parts = rows.frames()
        for name, frame in zip(tables, parts):
            tables[name].append(frame)
    frames = {name: pl.concat(parts, how="vertical") if parts else pl.DataFrame(schema=SCHEMAS[name]) for name, parts in tables.items()}
    return Dump(**{n: to_backend(f, backend) for n, f in frames.items()}, formats=formats, skipped=skipped, backend=backend)


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

