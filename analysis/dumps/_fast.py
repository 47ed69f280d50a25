"""A columnar path for the big cases: JSON lines of OpenAI chat completions, bare or in capture envelopes.

Three kinds of line are read here, each giving exactly the frames the general (per-value Python)
path gives:

- a bare chat completion (``{"id", "object": "chat.completion", "choices": [...], ...}``);
- a capture envelope around one: ``{"response": {...}, "prompt_id", "role", "band_c", ...}``;
- a capture envelope around a streamed one: ``{"sse": "data: {...}\\n\\n...data: [DONE]\\n\\n", "arrival_times": [...], ...}``.

pyarrow's multithreaded JSON reader parses the payloads straight into Arrow with an explicit
schema (an envelope's response is cut out of its line first; a stream's events are split out of
its text and read as JSON lines of their own), and the tokens, candidates and requests are
derived with vectorized polars expressions; a thread reads, hashes and parses the next 32 MB while
the frames of the last are built. Whatever the file holds that this path does not cover
(another shape on some line, a null value, a value the checks refuse, a key whose
mere presence changes what the general path does, an SSE text that is not plain ``data:`` blocks,
blank lines) makes it return ``None``: the caller then takes the general path, which reads every
case and names every error. The general path is the authority; this one only ever agrees with it,
but for one thing: the JSON reader skips the values of keys that the schemas below do not name
without parsing them, so a key repeated in such a value, or nesting there deeper than
``_strictjson.MAX_DEPTH``, is not seen here (the general path refuses it). Keys it reads that are
repeated make the JSON reader fail, and capture envelopes are checked whole (``_check_strict``).
"""

from __future__ import annotations

import hashlib
import json
import queue
import re
import threading
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from .._fields import INT64_MAX, INT64_MIN
from . import _json
from ._openai import USAGE_FIELDS
from ._schema import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA, classified, conform
from ._liveness import LIVE_SHARE, LIVE_SPAN
from ._values import MAX_LOGPROB

Frames = tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]

_NULL = pa.null()  # a field that must be absent or null here: anything else sends the file to the general path
_CANDIDATE = pa.struct([("token", pa.string()), ("logprob", pa.float64()), ("bytes", pa.list_(pa.int64())), ("id", pa.int64()), ("prob", _NULL)])
_ENTRY = pa.struct([
    ("token", pa.string()), ("logprob", pa.float64()), ("bytes", pa.list_(pa.int64())), ("id", pa.int64()),
    ("top_logprobs", pa.list_(_CANDIDATE)), ("prob", _NULL), ("top_probs", _NULL),
])
_LOGPROBS = pa.struct([("content", pa.list_(_ENTRY)), ("tokens", _NULL)])
_USAGE = pa.struct([("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("total_tokens", pa.int64())])
_CHOICE = pa.struct([
    ("index", pa.int64()), ("finish_reason", pa.string()), ("message", pa.struct([("content", pa.string())])), ("logprobs", _LOGPROBS),
    ("token_ids", _NULL), ("compact_logprobs", _NULL), ("sampling_mask", _NULL), ("kept_tokens", _NULL), ("routed_experts", _NULL), ("text", _NULL),
])
_SCHEMA = pa.schema([
    ("id", pa.string()), ("request_id", _NULL), ("model", pa.string()), ("object", pa.string()), ("choices", pa.list_(_CHOICE)), ("usage", _USAGE),
    ("prompt_logprobs", _NULL), ("nvext", _NULL), ("error", _NULL), ("response", _NULL), ("sse", _NULL), ("meta_info", _NULL), ("details", _NULL),
])
# One event of a streamed chat completion (``chat.completion.chunk``).
_CHUNK_CHOICE = pa.struct([
    ("index", pa.int64()), ("delta", pa.struct([("content", pa.string())])), ("finish_reason", pa.string()), ("logprobs", _LOGPROBS), ("text", _NULL),
])
_CHUNK_SCHEMA = pa.schema([
    ("id", pa.string()), ("model", pa.string()), ("object", pa.string()), ("stream_mode", pa.string()), ("choices", pa.list_(_CHUNK_CHOICE)),
    ("usage", _USAGE), ("error", _NULL), ("stop", _NULL), ("completion_probabilities", _NULL),
])
_PLACEHOLDER = r"^token_id:(-?\d+)$"

# Text that sends a file to the general path, searched (Rust regex, one pass) over the JSON the reader parses.
# pyarrow reads a key that is present with null like an absent one, but for the general path some keys change the
# format or the endpoint by being there at all ("token_ids": null makes a choice vLLM's generate), and others
# differ between null and absent ("model": null in a stream chunk clears the model). The key patterns assume a key
# is spelled plainly: text with a letter written as a \u escape is refused.
_ESCAPED_LETTER = r"\\u00[4-7]"
_SEPARATOR = "[\u2028\u2029\x85]"  # str.splitlines ends a line there: the general path would number and cut lines its own way


def _keys(*names: str) -> str:
    return '"(?:' + "|".join(names) + ')"[ \t]*:'


_PAYLOAD_KEYS = ("token_ids", "compact_logprobs", "text", "tokens", "completion_probabilities", "tokens_predicted", "schema_version")
_RESPONSE_GUARD = "|".join([_keys(*_PAYLOAD_KEYS), _ESCAPED_LETTER, _SEPARATOR])
_BARE_GUARD = "|".join([_keys(*_PAYLOAD_KEYS, "response", "sse"), _ESCAPED_LETTER, _SEPARATOR])
_CHUNK_GUARD = "|".join([_keys("error", "stop", "completion_probabilities", "text", "tokens"),
                         _keys("id", "model", "stream_mode", "choices") + "[ \t]*null", _ESCAPED_LETTER])
_RAW_SEPARATOR = re.compile(b"\xe2\x80[\xa8\xa9]|\xc2\x85")


class _Unsupported(Exception):
    """The file needs the general path."""


# Anything these raise on a value (an id beyond int64, a digit string polars will not cast) also means: the general path.
_REFUSALS = (_Unsupported, pl.exceptions.PolarsError, pa.ArrowException, OverflowError)


_CHUNK_BYTES = 32 << 20  # lines are parsed this many bytes at a time, so memory stays bounded and reading overlaps building


def _chunks(path: Path, limit: int | None = None):
    """Whole lines of the file's first ``limit`` bytes (all of it by default), about ``_CHUNK_BYTES`` at a time:
    (buffer, size, [(start, end) of each line]); the lines lie in ``buffer[:size]``.

    One buffer is read into again and again (a fresh 64 MB each time costs as much as reading it): what the
    caller keeps of a chunk must be copied out before it asks for the next. Plain reads, not a memory map, so
    pages already parsed do not stay in this process. A CR or a blank line sends the file to the general path
    (it numbers and hashes lines its own way).
    """
    size = path.stat().st_size + 1 if limit is None else limit  # a small file gets a small buffer (it grows if the file does)
    buffer = bytearray(max(1, min(_CHUNK_BYTES, size)))
    held = 0  # the start of a line the last chunk did not end, kept at the front
    left = limit
    with path.open("rb") as handle:
        while True:
            if held == len(buffer):  # a line longer than the buffer: grow it
                grown = bytearray(2 * len(buffer))
                grown[:held] = buffer
                buffer = grown
            want = len(buffer) - held if left is None else min(len(buffer) - held, left)
            read = handle.readinto(memoryview(buffer)[held : held + want]) if want > 0 else 0
            if left is not None:
                left -= read
            size = held + read
            if not read:
                if size:
                    yield buffer, size, _spans(buffer, size)
                return
            cut = buffer.rfind(b"\n", 0, size)
            if cut == -1:
                held = size
                continue
            yield buffer, cut + 1, _spans(buffer, cut + 1)
            held = size - cut - 1
            buffer[:held] = buffer[cut + 1 : size]


def _spans(data: bytes, size: int) -> list[tuple[int, int]]:
    """(start, end) of each line in ``data[:size]``."""
    if data.find(b"\r", 0, size) != -1:
        raise _Unsupported("CR line ends")
    spans, start = [], 0
    while start < size:
        end = data.find(b"\n", start, size)
        end = size if end == -1 else end
        if end - start < 64 and not data[start:end].strip():
            raise _Unsupported("a blank line")
        spans.append((start, end))
        start = end + 1
    return spans


def _check_text(data, ends: list[int] | np.ndarray, pattern: str) -> None:
    """Refuse bytes that are not UTF-8, or that hold ``pattern`` (which never spans a newline). ``ends``: where the
    lines (or groups of lines) of ``data`` end; the search runs over them in parallel."""
    ends = np.asarray(ends, dtype=np.int64)
    offsets = pa.py_buffer(np.concatenate([[0], np.minimum(ends, len(data))]).astype(np.int64))
    array = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(ends), [None, offsets, pa.py_buffer(data)])
    try:
        text = pl.from_arrow(array).cast(pl.String)
    except pl.exceptions.PolarsError:
        raise _Unsupported("not UTF-8") from None
    if text.str.contains(pattern).any():
        raise _Unsupported("a key or character the general path treats its own way")


def _table(data, n_rows: int, longest: int, schema: pa.Schema) -> pa.Table:
    # About four blocks a chunk: enough to keep the reader's threads busy, few enough that the per-batch polars work stays small.
    options = pj.ReadOptions(block_size=max(1 << 20, 2 * longest + 2, len(data) // 4 + 1))
    try:
        table = pj.read_json(pa.BufferReader(pa.py_buffer(data)), read_options=options,
                             parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise _Unsupported(str(exc)) from None
    if table.num_rows != n_rows:
        raise _Unsupported("a line the JSON reader skipped or split")
    return table


def _flatten(lists: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """The values of a list array, each value's parent row, and its index within its list."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    values = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.asarray(lists.offsets, dtype=np.int64)
    index = np.arange(len(values), dtype=np.int64) - (offsets[parents] - offsets[0])
    return values, parents, index


def _binary(lists: pa.Array) -> pa.Array:
    """list<int64> of byte values to binary, refusing values outside 0..255."""
    values = pc.list_flatten(lists)
    if len(values) and (pc.min(values).as_py() < 0 or pc.max(values).as_py() > 255):
        raise _Unsupported("a byte value outside 0..255")
    data = values.cast(pa.uint8()).to_numpy(zero_copy_only=False)
    offsets = np.asarray(lists.offsets, dtype=np.int64)
    offsets = (offsets - offsets[0]).astype(np.int32)
    validity = pc.is_valid(lists)
    mask = None if lists.null_count == 0 else validity.buffers()[1]
    if mask is not None and validity.offset:
        raise _Unsupported("an unaligned validity bitmap")
    return pa.Array.from_buffers(pa.binary(), len(lists), [mask, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=lists.null_count)


def _field(array: pa.Array, name: str) -> pa.Array:
    return pc.struct_field(array, name)


def _column(table: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    column = table.column(name)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _placeholder_ids(token: pl.Series) -> pl.Series:
    """The id of each ``token_id:N`` placeholder, null for any other token (``_values.placeholder_id``)."""
    marked = token.str.starts_with("token_id:").fill_null(False)
    digits = token.str.strip_prefix("token_id:")
    plain = digits.str.contains(r"^-?[0-9]+$").fill_null(False)
    if (marked & ~plain).any():  # another digit (the general path's \d is any Unicode digit), or no number: the full rule
        ids = token.str.extract(_PLACEHOLDER, 1).cast(pl.Int64)
    else:
        ids = digits.zip_with(marked, pl.Series([None], dtype=pl.String)).cast(pl.Int64)  # strict: an id beyond int64 raises
    return _token_ids(ids)


def _token_ids(ids: pl.Series) -> pl.Series:
    """``ids``, when none is negative: the general path refuses a negative token id, so it is left to it."""
    if (ids < 0).any():
        raise _Unsupported("a negative token id")
    return ids


# --- entry points -----------------------------------------------------------------------------


def read_jsonl(path: Path, source: str, fmt: str = "auto", limit: int | None = None) -> tuple[Frames, set[str]] | None:
    """The three frames of a JSON-lines file (its first ``limit`` bytes) and the formats found, or None when the
    general path is needed. The first line decides: a bare chat completion, or a capture envelope."""
    if fmt not in ("auto", "jsonl") or path.suffix in (".pt", ".pth"):  # a named payload format reads the file as one document
        return None
    with path.open("rb") as handle:
        first = handle.readline() if limit is None else handle.readline(limit)
        budget = 4096 if limit is None else min(4096, limit - len(first))
        more = handle.read(budget).strip() if budget > 0 else b""
    if not more:  # one document: the general path reads it as a single response
        return None
    from ._read import payload_formats

    envelope = _FIRST_KEY.match(first) is not None
    if not envelope:
        try:
            payload = _json.loads(first)
        except ValueError:
            return None
        envelope = isinstance(payload, dict) and ("response" in payload or "sse" in payload)
        if not envelope and payload_formats(payload) != ["openai_chat"]:
            return None
    try:
        return _read_envelopes(path, source, limit) if envelope else (_read_bare(path, source, limit), {"openai_chat"})
    except _REFUSALS:
        return None


def read_chat_jsonl(path: Path, source: str) -> Frames | None:
    """The three frames of a file of bare chat completions, one a line, or None when the general path is needed."""
    try:
        return _read_bare(path, source)
    except _REFUSALS:
        return None


def read_capture_jsonl(path: Path, source: str, limit: int | None = None) -> tuple[Frames, set[str]] | None:
    """The three frames of a file of capture envelopes (``response`` or ``sse``) and the formats found, or None."""
    try:
        return _read_envelopes(path, source, limit)
    except _REFUSALS:
        return None


def _concat(parts: list[Frames]) -> Frames:
    if not parts:
        raise _Unsupported("an empty file")
    return tuple(pl.concat([p[i] for p in parts], how="vertical", rechunk=False) for i in range(3))


def _read_bare(path: Path, source: str, limit: int | None = None) -> Frames:
    return _concat([_payload_frames(table, meta, source) for table, meta in _ahead(_parsed_bare(path, limit))])


def _parsed_bare(path: Path, limit: int | None):
    """Each chunk of bare responses checked and parsed: (table, line meta)."""
    line = 0
    for data, size, spans in _chunks(path, limit):
        view = memoryview(data)[:size]  # a view: no copy of the chunk
        if line == 0 and data.find(b"Logprob(", 0, min(size, 262144)) != -1:
            raise _Unsupported("the general path would take this file for printed vLLM Logprob reprs")
        _check_text(view, [b + 1 for _, b in spans], _BARE_GUARD)
        table = _table(view, len(spans), max(b - a for a, b in spans), _SCHEMA)
        _check_shapes(table, lambda i, s=spans, d=data: d[s[i][0] : s[i][1]])
        yield table, _LineMeta.bare([line + i + 1 for i in range(len(spans))], [hashlib.sha256(view[a:b]).hexdigest() for a, b in spans])
        line += len(spans)


def _ahead(items):
    """Iterate the generator ``items`` from a thread, one item ahead: while the caller builds frames from one chunk
    (polars, mostly on one core), the next is read, hashed and parsed (pyarrow on the other; both release the GIL).
    What ``items`` raises is raised here. Each item must not refer to the reused chunk buffer."""
    handoff: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    break
            else:
                put((False, None))
        except BaseException as error:  # noqa: BLE001 - handed to the caller, which raises it
            put((False, error))
        finally:
            items.close()

    thread = threading.Thread(target=produce, name="bia-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            more, value = handoff.get()
            if not more:
                if value is not None:
                    raise value
                return
            yield value
    finally:
        stop.set()
        thread.join()


# --- capture envelopes ------------------------------------------------------------------------


_FIRST_KEY = re.compile(rb'\{[ \t]*"(response|sse)"[ \t]*:[ \t]*')
_WS = b" \t"
_KEY_WINDOW = 1 << 16  # an envelope's keys before its response or sse: searched this far into the line


@dataclass
class _Line:
    """One envelope line, checked: where its response lies, or its stream's events."""

    record: int
    sha: str
    env: dict[str, Any]  # the envelope's other keys, parsed
    kind: str  # "response" | "sse"
    span: tuple[int, int] | None = None  # the response's bytes in the chunk
    events: list[str] | None = None  # the data of the stream's events
    n_events: int = 0  # JSON events (the [DONE] that ends the stream not counted)
    arrivals: list | None = None
    explicit: bool = False  # the envelope names its format


@dataclass
class _LineMeta:
    """Per line: the request columns an envelope sets, and the keys that go to requests.extra."""

    record: list[int]
    raw_sha256: list[str]
    sample_key: list
    band_c: list
    slot: list
    prompt_id: list
    role: list
    repeat: list
    t_sent: list
    extra: list[dict]

    @classmethod
    def bare(cls, records: list[int], hashes: list[str]) -> _LineMeta:
        none = [None] * len(records)
        return cls(records, hashes, none, none, none, none, none, none, none, [{}] * len(records))

    @classmethod
    def of(cls, lines: list[_Line]) -> _LineMeta:
        from ._read import _ENVELOPE_KEYS

        meta = [_envelope_columns(line.env) for line in lines]
        columns = {name: [m[name] for m in meta] for name in ("sample_key", "band_c", "slot", "prompt_id", "role", "repeat", "t_sent")}
        extra = [{k: v for k, v in line.env.items() if k not in _ENVELOPE_KEYS} for line in lines]
        return cls([line.record for line in lines], [line.sha for line in lines], extra=extra, **columns)

    def slice(self, start: int, stop: int) -> _LineMeta:
        return _LineMeta(*(getattr(self, name)[start:stop] for name in self.__dataclass_fields__))

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame({
            "record": pl.Series(self.record, dtype=pl.Int64),
            "raw_sha256": pl.Series(self.raw_sha256, dtype=pl.String),
            "sample_key": pl.Series(self.sample_key, dtype=pl.String),
            "band_c": pl.Series(self.band_c, dtype=pl.Int64),
            "slot": pl.Series(self.slot, dtype=pl.Int64),
            "prompt_id": pl.Series(self.prompt_id, dtype=pl.String),
            "role": pl.Series(self.role, dtype=pl.String),
            "repeat": pl.Series(self.repeat, dtype=pl.Int64),
            "t_sent": pl.Series(self.t_sent, dtype=pl.Float64, strict=False),
        })


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _envelope_columns(env: dict) -> dict[str, Any]:
    """The request columns of ``_read._envelope_meta``, refusing values the general path would refuse."""
    out = {name: env.get(name) for name in ("sample_key", "band_c", "slot", "role", "repeat", "t_sent")}
    for name in ("sample_key", "role"):
        if out[name] is not None and not isinstance(out[name], str):
            raise _Unsupported(f"{name} is not a string")
    for name in ("band_c", "slot", "repeat"):
        if out[name] is not None and not (_is_int(out[name]) and INT64_MIN <= out[name] <= INT64_MAX):
            raise _Unsupported(f"{name} is not an integer of 64 bits")
    t_sent = out["t_sent"]
    if t_sent is not None and not (_is_int(t_sent) or isinstance(t_sent, float)):
        raise _Unsupported("t_sent is not a number")
    out["prompt_id"] = None if env.get("prompt_id") is None else str(env["prompt_id"])
    return out


def _read_envelopes(path: Path, source: str, limit: int | None = None) -> tuple[Frames, set[str]]:
    parts: list[Frames] = []
    formats: set[str] = set()
    for kind, parsed in _ahead(_parsed_runs(path, limit)):
        if kind == "response":
            parts.append(_payload_frames(*parsed, source))
            formats.add("openai_chat")
        else:
            parts.append(_sse_frames(*parsed, source))
            formats.add("openai_chat_sse")
    return _concat(parts), formats


def _parsed_runs(path: Path, limit: int | None):
    """Each run of consecutive envelopes of one kind, checked and parsed: ("response", (table, meta)) or
    ("sse", (table, run))."""
    line = 0
    for data, size, spans in _chunks(path, limit):
        if line == 0 and data.find(b"Logprob(", 0, min(size, 262144)) != -1:
            raise _Unsupported("the general path would take this file for printed vLLM Logprob reprs")
        lines = [_envelope_line(data, a, b, line + i + 1) for i, (a, b) in enumerate(spans)]
        start = 0
        while start < len(lines):  # runs of one kind, each read in one go
            stop = start + 1
            while stop < len(lines) and lines[stop].kind == lines[start].kind:
                stop += 1
            run = lines[start:stop]
            if run[0].kind == "response":
                yield "response", _parsed_responses(data, run)
            else:
                yield "sse", (_parsed_events(run), run)
            start = stop
        line += len(spans)


def _envelope_line(data: bytes, a: int, b: int, record: int) -> _Line:
    view = memoryview(data)[a:b]
    sha = hashlib.sha256(view).hexdigest()
    first = _FIRST_KEY.match(data, a, b)
    kind, start = (first.group(1).decode(), first.end()) if first else _later_key(data, a, b)
    if kind == "response":
        return _response_line(data, a, b, start, record, sha)
    return _sse_line(_sse_envelope(data, a, b, start), record, sha)


def _check_strict(raw: bytes, value: Any) -> None:
    """Leave to the general path what it refuses in parsed JSON: nesting past the limit, a repeated key."""
    try:
        _json.check_depth(raw, parsed=value)
        _json.check_unique_keys(raw, value)
    except _json.StrictJsonError:
        raise _Unsupported("nesting or a repeated key the general path refuses") from None


_DONE_END = b'[DONE]\\n\\n"'  # the end of a stream's text as JSON writers escape it


def _sse_envelope(data, a: int, b: int, start: int) -> Any:
    """An SSE envelope line (its ``sse`` value starting at ``start``) parsed, and left to the general path
    (``_check_strict``) when that refuses it.

    The stream's text, most of the line, is read as one string on its own when it ends at the line's
    last ``[DONE]\\n\\n"`` (the bytes up to there must read as one string): the repeated-key and
    nesting checks then look at the envelope's other keys only.
    """
    at = data.rfind(_DONE_END, start, b)
    if at != -1:
        end = at + len(_DONE_END)
        rest = bytes(data[a:start]) + b"null" + bytes(data[end:b])
        try:
            sse, env = orjson.loads(memoryview(data)[start:end]), orjson.loads(rest)
        except orjson.JSONDecodeError:  # the bytes up to that quote are more than one string
            env = None
        if isinstance(env, dict) and isinstance(sse, str) and "sse" in env and env["sse"] is None:
            _check_strict(rest, env)
            env["sse"] = sse
            return env
    line = bytes(data[a:b])
    try:
        env = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise _Unsupported("not JSON for orjson") from None
    _check_strict(line, env)
    return env


def _later_key(data: bytes, a: int, b: int) -> tuple[str, int]:
    """The first of "response" and "sse" that is a key of the line's object (not the first key), and where its value starts."""
    if data[a : a + 1] != b"{":
        raise _Unsupported("a line that is not a JSON object")
    found = None
    end = min(b, a + _KEY_WINDOW)
    for name in (b'"response"', b'"sse"'):
        at = data.find(name, a, end)
        while at != -1:
            start = _top_level_value(data, a, b, at, len(name))
            if start is not None:
                if found is None or at < found[0]:
                    found = (at, name[1:-1].decode(), start)
                break
            at = data.find(name, at + 1, end)
    if found is None:
        raise _Unsupported("a line that is not a capture envelope")
    return found[1], found[2]


def _top_level_value(data: bytes, a: int, b: int, at: int, length: int) -> int | None:
    """Where the value of the key at ``at`` starts, if that key follows whole pairs of the line's object; else None."""
    p = at - 1
    while p > a and data[p] in _WS:
        p -= 1
    if data[p] != ord(","):
        return None
    q = at + length
    while q < b and data[q] in _WS:
        q += 1
    if q >= b or data[q] != ord(":"):
        return None
    q += 1
    while q < b and data[q] in _WS:
        q += 1
    try:  # what precedes the key must be the line's opening brace and whole pairs
        head = orjson.loads(data[a:p] + b"}")
    except orjson.JSONDecodeError:
        return None
    return q if isinstance(head, dict) else None


def _response_line(data: bytes, a: int, b: int, start: int, record: int, sha: str) -> _Line:
    """Cut the response out of its envelope: the envelope's other keys parsed, the response's bytes located.

    The response ends at the closing brace after which the line holds only whole pairs and the envelope's
    brace; the candidate is trusted only because the JSON reader must then read the response's bytes as one
    object, and orjson the envelope with ``null`` in its place.
    """
    if data[start : start + 1] != b"{":
        raise _Unsupported("a response that is not a JSON object")
    end = b
    while end > start and data[end - 1] in _WS:
        end -= 1
    if data[end - 1] != ord("}"):
        raise _Unsupported("a line that does not end its object")
    close = data.rfind(b"}", start, end - 1)
    for _ in range(64):
        if close <= start:
            break
        if _pairs_follow(data[close + 1 : end - 1]):
            pair = _object_pair_ending(data, start, close)
            if pair is None:
                break
            close = data.rfind(b"}", start, pair)  # that brace closed a later key's object: the response ends before its pair
            continue
        close = data.rfind(b"}", start, close)
    else:
        close = -1
    if close <= start:
        raise _Unsupported("no end found for the response")
    rest = data[a:start] + b"null" + data[close + 1 : b]
    try:
        env = orjson.loads(rest)
    except orjson.JSONDecodeError:
        raise _Unsupported("the envelope is not JSON for orjson") from None
    _check_strict(rest, env)
    if env.get("response", 0) is not None or "sse" in env:
        raise _Unsupported("a second response, or an sse beside it")
    after = data[close + 1 : b]
    if b'"response"' in after or b"\\u" in after:  # a later "response" key would be the one the general path reads
        try:
            pairs = json.loads(rest, object_pairs_hook=lambda p: p)
        except ValueError:
            raise _Unsupported("the envelope is not JSON") from None
        if [key for key, _ in pairs].count("response") != 1:
            raise _Unsupported("a second response key")
    if _RAW_SEPARATOR.search(rest):
        raise _Unsupported("a line separator for str.splitlines")
    fmt = env.get("format")
    if fmt and fmt != "openai_chat":
        raise _Unsupported(f"format {fmt!r}")
    _envelope_columns(env)
    return _Line(record, sha, env, "response", span=(start, close + 1), explicit=bool(fmt))


def _pairs_follow(tail: bytes) -> bool:
    """Whether ``tail`` (what follows a candidate end of the response, up to the envelope's closing brace) is
    nothing, or a comma and whole pairs."""
    tail = tail.strip(_WS)
    if not tail:
        return True
    if tail[:1] != b",":
        return False
    try:
        return isinstance(orjson.loads(b"{" + tail[1:] + b"}"), dict)
    except orjson.JSONDecodeError:
        return False


_PAIR_WINDOW = 1 << 14  # an envelope key's object value after the response is looked for this far back


def _object_pair_ending(data: bytes, floor: int, close: int) -> int | None:
    """If the brace at ``close`` ends the object value of a pair ``, "key": {...}`` that starts after ``floor``,
    where that pair's comma is; else None (then ``close`` is taken to end the response, which the JSON reader
    confirms or refuses)."""
    low = max(floor + 1, close - _PAIR_WINDOW)
    tight, spaced = data.rfind(b":{", low, close), data.rfind(b": {", low, close)  # as json.dumps and orjson write a pair
    while True:
        colon = max(tight, spaced)
        if colon == -1:
            return None
        at = colon + 1 if colon == tight else colon + 2
        if colon == tight:
            tight = data.rfind(b":{", low, colon)
        else:
            spaced = data.rfind(b": {", low, colon)
        try:
            if not isinstance(orjson.loads(data[at : close + 1]), dict):
                continue
        except orjson.JSONDecodeError:
            continue
        key_end = colon - 1
        while key_end > floor and data[key_end] in _WS:
            key_end -= 1
        if data[key_end] != ord('"'):
            continue
        key_start = data.rfind(b'"', floor, key_end)
        while key_start > floor and _escaped(data, key_start):
            key_start = data.rfind(b'"', floor, key_start)
        comma = key_start - 1
        while comma > floor and data[comma] in _WS:
            comma -= 1
        if key_start > floor and data[comma] == ord(","):
            return comma


def _escaped(data: bytes, at: int) -> bool:
    """Whether the character at ``at`` follows an odd run of backslashes."""
    run = 0
    while data[at - 1 - run] == ord("\\"):
        run += 1
    return run % 2 == 1


_LAST = "\n\ndata: [DONE]\n\n"


def _sse_events(sse: str) -> list[str]:
    """The data of each event of an SSE text made only of ``data: {...}`` blocks that ends with [DONE]
    (that the data hold no newline is checked once they are joined)."""
    if not sse.startswith("data: ") or not sse.endswith(_LAST) or "\r" in sse:
        raise _Unsupported("an SSE text that is not plain data blocks ending with [DONE]")
    if "\x85" in sse or "\u2028" in sse or "\u2029" in sse:  # str.splitlines ends lines there
        raise _Unsupported("a line separator for str.splitlines")
    events = sse.split("\n\ndata: ")
    events.pop()  # "[DONE]\n\n"
    events[0] = events[0][6:]
    return events


def _sse_line(env: Any, record: int, sha: str) -> _Line:
    if not isinstance(env, dict) or not isinstance(env.get("sse"), str):
        raise _Unsupported("an sse that is not a string")
    fmt = env.get("format")
    if fmt and fmt != "openai_chat_sse":
        raise _Unsupported(f"format {fmt!r}")
    events = _sse_events(env["sse"])
    n = len(events)
    if _RAW_SEPARATOR.search(orjson.dumps({k: v for k, v in env.items() if k != "sse"})):
        raise _Unsupported("a line separator for str.splitlines")
    arrivals = env.get("arrival_times")
    if arrivals is not None:
        if not isinstance(arrivals, list) or len(arrivals) != n + 1:
            raise _Unsupported("arrival_times do not match the events")
        if not all(t is None or _is_int(t) or isinstance(t, float) for t in arrivals[:n]):
            raise _Unsupported("an arrival time that is not a number")
    _envelope_columns(env)
    return _Line(record, sha, env, "sse", events=events, n_events=n, arrivals=arrivals, explicit=bool(fmt))


def _parsed_responses(data: bytes, run: list[_Line]) -> tuple[pa.Table, _LineMeta]:
    view = memoryview(data)
    buffer = b"\n".join(view[line.span[0] : line.span[1]] for line in run)
    _check_text(buffer, np.cumsum([line.span[1] - line.span[0] + 1 for line in run]), _RESPONSE_GUARD)
    table = _table(buffer, len(run), max(line.span[1] - line.span[0] for line in run), _SCHEMA)
    _check_shapes(table, lambda i: data[run[i].span[0] : run[i].span[1]])
    return table, _LineMeta.of(run)


# --- non-streamed responses -------------------------------------------------------------------


def _check_shapes(table: pa.Table, raw) -> None:
    """Refuse what the general path would take for another format: a legacy object, or a response without
    choices that is not a plain chat completion (the general path detects its format from the object alone).
    ``raw(i)`` gives row i's bytes."""
    choices = table.column("choices")
    if choices.null_count:
        raise _Unsupported("a line without choices")
    objects = table.column("object")
    if pc.any(pc.equal(objects, "text_completion").fill_null(False)).as_py():
        raise _Unsupported("a legacy completion")
    n_choices = pc.list_value_length(choices).to_numpy()
    is_chat = pc.equal(objects, "chat.completion").fill_null(False).to_numpy()
    for i in np.flatnonzero(n_choices == 0):
        if not is_chat[i] or b'"prompt_logprobs"' in raw(int(i)):
            raise _Unsupported("a response without choices that is not a plain chat completion")


def _payload_frames(table: pa.Table, meta: _LineMeta, source: str) -> Frames:
    """Frames of chat completions parsed one a row (checked by ``_check_shapes``)."""
    parts, row = [], 0
    for batch in table.to_batches():
        n = batch.num_rows
        parts.append(_batch(batch, meta.slice(row, row + n), source))
        row += n
    return _concat(parts)


def _batch(batch: pa.RecordBatch, meta: _LineMeta, source: str) -> Frames:
    choices_column = batch.column("choices")
    objects = batch.column("object")
    is_chat = pc.equal(objects, "chat.completion").fill_null(False).to_numpy(zero_copy_only=False)
    choices, choice_line, choice_pos = _flatten(choices_column)
    has_message = pc.is_valid(_field(choices, "message")).to_numpy(zero_copy_only=False)
    if not np.all(has_message | is_chat[choice_line]):
        raise _Unsupported("a choice that is not a chat choice")
    entries, entry_choice, position = _flatten(_field(_field(choices, "logprobs"), "content"))
    requests = _requests(batch, choices, choice_line, choice_pos, entry_choice, meta, source)
    keys = requests.select("record", "choice_index", "request_id", "sample_key")[entry_choice].with_columns(position=pl.Series(position))
    tokens = _tokens(entries, keys, source, "openai_chat")
    candidates = _candidates(entries, tokens, source)
    return tokens, candidates, requests


def _extra_json(base: dict, usage: dict | None) -> str | None:
    """requests.extra as the general path writes it: the envelope's other keys and the usage counts."""
    kept = {k: usage[k] for k in USAGE_FIELDS if usage.get(k) is not None} if usage else {}
    extra = {**base, **({"usage": kept} if kept else {})}
    return json.dumps(extra, sort_keys=True, default=str) if extra else None


def _requests(batch, choices, choice_line, choice_pos, entry_choice, meta: _LineMeta, source: str) -> pl.DataFrame:
    usage = batch.column("usage")
    lines = meta.frame().with_columns(
        id=pl.from_arrow(batch.column("id")),
        model=pl.from_arrow(batch.column("model")),
        prompt_tokens=pl.from_arrow(_field(usage, "prompt_tokens")),
        completion_tokens=pl.from_arrow(_field(usage, "completion_tokens")),
        n_choices=pl.Series(np.bincount(choice_line, minlength=batch.num_rows)),
        extra=pl.Series([_extra_json(base, u) for base, u in zip(meta.extra, usage.to_pylist())], dtype=pl.String),
    )
    scored = np.bincount(entry_choice, minlength=len(choices))
    frame = pl.concat([pl.DataFrame({
        "choice_index": pl.from_arrow(_field(choices, "index")).fill_null(pl.Series(choice_pos)),
        "finish_reason": pl.from_arrow(_field(choices, "finish_reason")),
        "completion_text": pl.from_arrow(_field(_field(choices, "message"), "content")),
        "n_completion_scored": scored,
        "has_logprobs": pc.is_valid(_field(choices, "logprobs")).to_numpy(zero_copy_only=False),
    }), lines[choice_line]], how="horizontal")
    single = pl.col("n_choices") == 1
    disagree = pl.col("completion_tokens") != pl.col("n_completion_scored")
    if frame.filter(single & pl.col("has_logprobs") & pl.col("completion_tokens").is_not_null() & disagree).height:
        raise _Unsupported("usage disagrees with the logprob entries")
    return _envelope_requests(
        frame, source, "openai_chat", stream=False,
        completion_text=pl.col("completion_text"),
        choice_index=pl.col("choice_index"),
        request_id=pl.when(pl.col("id") != "").then(pl.col("id")),  # payload.get("id") or payload.get("request_id")
        finish_reason=pl.col("finish_reason"),
        prompt_tokens=pl.col("prompt_tokens"),
        completion_tokens=pl.when(single).then(pl.col("completion_tokens")),
        n_completion_scored=pl.col("n_completion_scored"),
    )


def _envelope_requests(frame: pl.DataFrame, source: str, source_format: str, *, stream: bool, **columns: pl.Expr) -> pl.DataFrame:
    """The requests table of a chunk of capture envelopes: what both kinds take from the envelope, and ``columns`` from the payload."""
    out = frame.select(
        source=pl.lit(source),
        record=pl.col("record"),
        sample_key=pl.col("sample_key"),
        source_format=pl.lit(source_format),
        model=pl.col("model"),
        endpoint=pl.lit("chat"),
        stream=pl.lit(stream),
        n_prompt_scored=pl.lit(0, pl.Int64),
        band_c=pl.col("band_c"), slot=pl.col("slot"), prompt_id=pl.col("prompt_id"), role=pl.col("role"), repeat=pl.col("repeat"),
        t_sent=pl.col("t_sent"),
        raw_sha256=pl.col("raw_sha256"),
        extra=pl.col("extra"),
        **columns,
    )
    return conform(out, REQUEST_SCHEMA)


# --- tokens and candidates (both kinds) -------------------------------------------------------


def _token_key(source: str) -> dict[str, pl.Expr]:
    """The token key columns (see ``_schema.KEY``) that the tokens and candidates tables both lead with."""
    return {"source": pl.lit(source), "record": pl.col("record"), "choice_index": pl.col("choice_index"), "segment": pl.lit("completion"),
            "position": pl.col("position")}


def _tokens(entries, keys: pl.DataFrame, source: str, source_format: str) -> pl.DataFrame:
    """One row per ``logprobs.content`` entry; ``keys`` holds each entry's record, choice_index, position, request_id,
    sample_key (and for streams stream_chunk and t_arrival)."""
    token = pl.from_arrow(_field(entries, "token"))
    own_id = _token_ids(pl.from_arrow(_field(entries, "id")))
    placeholder = _placeholder_ids(token)
    raw = pl.from_arrow(_field(entries, "logprob"))
    conflict = (own_id.is_not_null() & placeholder.is_not_null() & (own_id != placeholder)).any()
    if raw.null_count() or conflict or (token.is_null() & own_id.is_null()).any():
        raise _Unsupported("placeholder conflicts, null values or entries without a token")
    frame = keys.with_columns(
        token=token,
        placeholder=placeholder,
        own_id=own_id,
        raw_value=raw,
        bytes=pl.from_arrow(_binary(_field(entries, "bytes"))),
        n_candidates=pl.from_arrow(pc.list_value_length(_field(entries, "top_logprobs"))).cast(pl.Int64),
    ).with_columns(*classified(pl.col("raw_value"), ""))
    if ((frame["status"] == "ok") & (frame["raw_value"] > MAX_LOGPROB)).any():
        raise _Unsupported("a positive logprob")
    own_placeholder_bytes = pl.col("placeholder").is_not_null() & (pl.col("bytes") == pl.col("token").cast(pl.Binary)).fill_null(False)
    stream = [pl.col(name) for name in ("stream_chunk", "t_arrival") if name in keys.columns]
    out = frame.select(
        *stream,
        **_token_key(source),
        request_id=pl.col("request_id"),
        sample_key=pl.col("sample_key"),
        token_id=pl.coalesce("placeholder", "own_id"),
        token_text=pl.when(pl.col("placeholder").is_null()).then(pl.col("token")),
        token_bytes=pl.when(own_placeholder_bytes).then(None).otherwise(pl.col("bytes")),
        logprob=pl.col("logprob"),
        prob=pl.col("prob"),
        raw_value=pl.col("raw_value"),
        value_status=pl.col("status"),
        value_kind=pl.lit("logprob"),
        logprob_semantics=pl.lit("unknown"),
        n_candidates=pl.col("n_candidates"),
        source_format=pl.lit(source_format),
    )
    return conform(out, TOKEN_SCHEMA)


def _duplicates(parent: pl.Expr, cand_id: pl.Expr, text: pl.Expr, data: pl.Expr, all_ids: bool) -> pl.Expr:
    """True for a candidate whose identity (its id, else text and bytes) already appeared in its list."""
    if all_ids:  # one integer key hashes far faster than a struct
        return ~(parent * (1 << 32) + cand_id).is_first_distinct()
    identity = pl.struct(parent, cand_id, pl.when(cand_id.is_null()).then(text).alias("t"), pl.when(cand_id.is_null()).then(data).alias("b"))
    return ~identity.is_first_distinct()


def _candidates(entries, tokens: pl.DataFrame, source: str) -> pl.DataFrame:
    cands, parent, list_index = _flatten(_field(entries, "top_logprobs"))
    token = pl.from_arrow(_field(cands, "token"))
    placeholder = _placeholder_ids(token)
    own_id = _token_ids(pl.from_arrow(_field(cands, "id")))
    raw = pl.from_arrow(_field(cands, "logprob"))
    if raw.null_count():
        raise _Unsupported("a null candidate value")
    parent = pl.Series("parent", parent)
    frame = pl.DataFrame({
        "parent": parent,
        "record": tokens["record"].gather(parent),
        "choice_index": tokens["choice_index"].gather(parent),
        "position": tokens["position"].gather(parent),
        "sampled_id": tokens["token_id"].gather(parent),
        "sampled_text": tokens["token_text"].gather(parent),
        "list_index": list_index,
        "token": token,
        "cand_id": placeholder.fill_null(own_id),
        "placeholder": placeholder,
        "raw": raw,
        "bytes": pl.from_arrow(_binary(_field(cands, "bytes"))),
    }).with_columns(*classified(pl.col("raw"), "c_"))
    if ((frame["c_status"] == "ok") & (frame["raw"] > MAX_LOGPROB)).any():
        raise _Unsupported("a positive candidate logprob")
    own_bytes = pl.col("placeholder").is_not_null() & (pl.col("bytes") == pl.col("token").cast(pl.Binary)).fill_null(False)
    frame = frame.with_columns(
        cand_text=pl.when(pl.col("placeholder").is_null()).then(pl.col("token")),
        cand_bytes=pl.when(own_bytes).then(None).otherwise(pl.col("bytes")),
    )
    ids = frame["cand_id"]
    all_ids = ids.null_count() == 0 and (frame.height == 0 or (ids.min() >= 0 and ids.max() < (1 << 32) and frame["parent"].max() < (1 << 30)))
    sampled = (
        pl.when(pl.col("sampled_id").is_not_null() & pl.col("cand_id").is_not_null()).then(pl.col("cand_id") == pl.col("sampled_id"))
        .when(pl.col("sampled_text").is_not_null() & pl.col("cand_id").is_null()).then(pl.col("cand_text") == pl.col("sampled_text"))
    )
    out = frame.select(
        **_token_key(source),
        list_kind=pl.lit("top_logprobs"),
        list_index=pl.col("list_index"),
        cand_token_id=pl.col("cand_id"),
        cand_token_text=pl.col("cand_text"),
        cand_token_bytes=pl.col("cand_bytes"),
        cand_logprob=pl.col("c_logprob"),
        cand_prob=pl.col("c_prob"),
        cand_raw_value=pl.col("raw"),
        cand_status=pl.col("c_status"),
        is_sampled=sampled,
        is_duplicate=_duplicates(pl.col("parent"), pl.col("cand_id"), pl.col("cand_text"), pl.col("cand_bytes"), all_ids),
    )
    return conform(out, CANDIDATE_SCHEMA)


# --- streamed responses -----------------------------------------------------------------------


def _parsed_events(run: list[_Line]) -> pa.Table:
    """Every event of every stream of consecutive SSE envelopes, read as one JSON-lines buffer."""
    try:
        buffer = "\n".join(chain.from_iterable(line.events for line in run)).encode()
    except UnicodeEncodeError:
        raise _Unsupported("a lone surrogate") from None
    longest = max(len(event) for line in run for event in line.events)
    for line in run:
        line.events = None  # parsed now: not kept while the next chunk is read
    n_events = sum(line.n_events for line in run)
    if buffer.count(b"\n") != n_events - 1:  # another field, a comment, a multi-line event, an extra blank line
        raise _Unsupported("an SSE text that is not one data line per event")
    _check_text(buffer, _newline_ends(buffer), _CHUNK_GUARD)
    table = _table(buffer, n_events, 4 * longest, _CHUNK_SCHEMA)
    return table.combine_chunks()  # the streams' events are accumulated across the reader's blocks: one chunk (a copy made ahead)


def _newline_ends(data: bytes, pieces: int = 8) -> list[int]:
    """Where to cut ``data`` into about ``pieces`` parts, each after a newline (for ``_check_text``)."""
    ends, at = [], 0
    for k in range(1, pieces):
        cut = data.find(b"\n", max(at, k * len(data) // pieces))
        if cut == -1:
            break
        ends.append(cut + 1)
        at = cut + 1
    return [*ends, len(data)]


def _sse_frames(table: pa.Table, run: list[_Line], source: str) -> Frames:
    """Frames of consecutive SSE envelopes, accumulated per choice the way ``_stream.parse_chat_stream`` does,
    event by event."""
    counts = np.array([line.n_events for line in run], dtype=np.int64)
    choices_column = _column(table, "choices")
    usage = _column(table, "usage")
    line_of = np.repeat(np.arange(len(run), dtype=np.int64), counts)
    event = np.arange(len(line_of), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    times = chain.from_iterable(line.arrivals[:-1] if line.arrivals is not None else [None] * line.n_events for line in run)
    chunks = pl.DataFrame({
        "line": line_of,
        "event": event,
        "id": pl.from_arrow(_column(table, "id")),
        "model": pl.from_arrow(_column(table, "model")),
        "object": pl.from_arrow(_column(table, "object")),
        "stream_mode": pl.from_arrow(_column(table, "stream_mode")),
        "u_prompt": pl.from_arrow(_field(usage, "prompt_tokens")),
        "u_completion": pl.from_arrow(_field(usage, "completion_tokens")),
        "u_total": pl.from_arrow(_field(usage, "total_tokens")),
        "has_choices": pc.is_valid(choices_column).to_numpy(zero_copy_only=False),
        "t": pl.Series(list(times), dtype=pl.Float64, strict=False),
    })
    if (chunks["object"] == "text_completion").any():
        raise _Unsupported("a legacy completion stream")
    has_choices = chunks.group_by("line").agg(pl.col("has_choices").any()).sort("line")["has_choices"].to_list()
    if any(not found and not line.explicit for found, line in zip(has_choices, run)):
        raise _Unsupported("a stream the general path finds no format for")
    chunks = chunks.with_columns(request_id=pl.col("id").forward_fill().over("line"))

    choices, choice_chunk, choice_pos = _flatten(choices_column)
    content = _field(_field(choices, "logprobs"), "content")
    per_choice = pl.concat([pl.DataFrame({
        "index": pl.from_arrow(_field(choices, "index")).fill_null(pl.Series(choice_pos)),
        "piece": pl.from_arrow(_field(_field(choices, "delta"), "content")),
        "finish": pl.from_arrow(_field(choices, "finish_reason")),
        "n_entries": pl.from_arrow(pc.list_value_length(content)).fill_null(0).cast(pl.Int64),
    }), chunks.select("line", "event", "t", "request_id")[choice_chunk]], how="horizontal")

    meta = _LineMeta.of(run)
    line_meta = meta.frame().with_row_index("line").with_columns(pl.col("line").cast(pl.Int64))
    entries, entry_choice, _ = _flatten(content)
    keys = per_choice.select("line", pl.col("index").alias("choice_index"), pl.col("event").alias("stream_chunk"), pl.col("t").alias("t_arrival"),
                             "request_id")[entry_choice]
    keys = keys.with_columns(
        position=pl.int_range(pl.len(), dtype=pl.Int64).over("line", "choice_index"),  # each choice counts its tokens across the stream
        record=line_meta["record"].gather(keys["line"]),
        sample_key=line_meta["sample_key"].gather(keys["line"]),
    )
    tokens = _tokens(entries, keys, source, "openai_chat_sse")
    candidates = _candidates(entries, tokens, source)
    return tokens, candidates, _stream_requests(per_choice, chunks, line_meta, meta, source)


def _liveness() -> pl.Expr:
    """``_liveness.liveness`` as an expression over a choice's aggregated content-chunk times."""
    span = pl.col("last_known_t") - pl.col("first_t")
    observed_live = (span > 0) & ((pl.col("distinct_t") > LIVE_SHARE * pl.col("n_timed")) | (span >= LIVE_SPAN * pl.col("last_known_t")))
    return (pl.when(pl.col("declared").is_not_null()).then(pl.when(pl.col("declared") == "live").then(pl.lit("declared live"))
                                                           .otherwise(pl.lit("declared replay")))
            .when(pl.col("n_timed") < 2).then(pl.lit("untimed"))
            .when(observed_live).then(pl.lit("observed live"))
            .otherwise(pl.lit("observed burst")))


def _stream_requests(per_choice: pl.DataFrame, chunks: pl.DataFrame, line_meta: pl.DataFrame, meta: _LineMeta, source: str) -> pl.DataFrame:
    is_content = pl.col("piece").fill_null("") != ""  # a chunk whose delta carries text
    acc = per_choice.with_columns(content=is_content).group_by("line", "index").agg(
        n=pl.col("n_entries").sum(),
        text=pl.col("piece").filter(pl.col("content")).str.join(""),
        n_content=pl.col("content").sum().cast(pl.Int64),
        first_t=pl.col("t").filter(pl.col("content")).drop_nulls().first(),
        last_t=pl.col("t").filter(pl.col("content")).last(),
        n_timed=pl.col("t").filter(pl.col("content")).count(),
        distinct_t=pl.col("t").filter(pl.col("content")).drop_nulls().n_unique(),
        last_known_t=pl.col("t").filter(pl.col("content")).drop_nulls().last(),
        finish=pl.col("finish").filter(pl.col("finish").fill_null("") != "").last(),
    ).sort("line", "index")
    has_usage = pl.any_horizontal(pl.col("u_prompt", "u_completion", "u_total").is_not_null())
    per_line = chunks.group_by("line").agg(
        request_id=pl.col("id").drop_nulls().last(),
        model=pl.col("model").drop_nulls().last(),
        declared=pl.col("stream_mode").drop_nulls().first(),
        u_prompt=pl.col("u_prompt").filter(has_usage).last(),
        u_completion=pl.col("u_completion").filter(has_usage).last(),
        u_total=pl.col("u_total").filter(has_usage).last(),
    ).sort("line")
    usages = per_line.select(prompt_tokens="u_prompt", completion_tokens="u_completion", total_tokens="u_total").to_dicts()
    per_line = per_line.with_columns(extra=pl.Series([_extra_json(base, u) for base, u in zip(meta.extra, usages)], dtype=pl.String))
    n_indices = acc.group_by("line").len("n_indices")
    frame = acc.join(n_indices, on="line").join(per_line, on="line").join(line_meta, on="line").sort("line", "index")
    single = pl.col("n_indices") == 1
    if frame.filter(single & pl.col("u_completion").is_not_null() & (pl.col("n") > 0) & (pl.col("n") != pl.col("u_completion"))).height:
        raise _Unsupported("usage disagrees with the logprob entries")
    return _envelope_requests(
        frame, source, "openai_chat_sse", stream=True,
        completion_text=pl.col("text"),
        choice_index=pl.col("index"),
        request_id=pl.col("request_id"),
        finish_reason=pl.col("finish"),
        prompt_tokens=pl.col("u_prompt"),
        completion_tokens=pl.when(single).then(pl.col("u_completion")),
        n_completion_scored=pl.col("n"),
        ttft_s=pl.col("first_t"),
        t_last_content=pl.col("last_t"),
        n_content_chunks=pl.col("n_content"),
        liveness=_liveness(),
        stream_live=pl.when(_liveness().is_in(["declared live", "observed live"])).then(True).when(_liveness() != "untimed").then(False),
    )
