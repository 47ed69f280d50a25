"""What the columnar fast path stands on: Arrow schemas of the payloads, the guards that send a file to the general path,
the chunked reader that overlaps reading with building, and small Arrow helpers.
"""

from __future__ import annotations

import queue
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ..core import INT64_MAX, INT64_MIN
from ._envelope import ENVELOPE_KEYS, envelope_c

Frames = tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]


_NULL = pa.null()  # a field that must be absent or null here: anything else sends the file to the general path


_CANDIDATE = pa.struct(
    [
        ("token", pa.string()),
        ("logprob", pa.float64()),
        ("bytes", pa.list_(pa.int64())),
        ("id", pa.int64()),
        ("prob", _NULL),
    ]
)


_ENTRY = pa.struct(
    [
        ("token", pa.string()),
        ("logprob", pa.float64()),
        ("bytes", pa.list_(pa.int64())),
        ("id", pa.int64()),
        ("top_logprobs", pa.list_(_CANDIDATE)),
        ("prob", _NULL),
        ("top_probs", _NULL),
    ]
)


_LOGPROBS = pa.struct([("content", pa.list_(_ENTRY)), ("tokens", _NULL)])


_USAGE = pa.struct([("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("total_tokens", pa.int64())])


_TIMINGS = pa.struct(
    [("predicted_n", pa.int64()), ("predicted_ms", pa.float64()), ("predicted_per_second", pa.float64())]
)  # _kit.TIMING_FIELDS


_CHOICE = pa.struct(
    [
        ("index", pa.int64()),
        ("finish_reason", pa.string()),
        ("message", pa.struct([("content", pa.string())])),
        ("logprobs", _LOGPROBS),
        ("token_ids", _NULL),
        ("compact_logprobs", _NULL),
        ("sampling_mask", _NULL),
        ("kept_tokens", _NULL),
        ("routed_experts", _NULL),
        ("text", _NULL),
    ]
)


_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("request_id", _NULL),
        ("model", pa.string()),
        ("object", pa.string()),
        ("choices", pa.list_(_CHOICE)),
        ("usage", _USAGE),
        ("timings", _TIMINGS),
        ("prompt_logprobs", _NULL),
        ("nvext", _NULL),
        ("error", _NULL),
        ("response", _NULL),
        ("sse", _NULL),
        ("meta_info", _NULL),
        ("details", _NULL),
    ]
)
# One event of a streamed chat completion (``chat.completion.chunk``).


_CHUNK_CHOICE = pa.struct(
    [
        ("index", pa.int64()),
        ("delta", pa.struct([("content", pa.string())])),
        ("finish_reason", pa.string()),
        ("logprobs", _LOGPROBS),
        ("text", _NULL),
    ]
)


_CHUNK_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("model", pa.string()),
        ("object", pa.string()),
        ("stream_mode", pa.string()),
        ("choices", pa.list_(_CHUNK_CHOICE)),
        ("usage", _USAGE),
        ("timings", _TIMINGS),
        ("error", _NULL),
        ("stop", _NULL),
        ("completion_probabilities", _NULL),
    ]
)


_PLACEHOLDER = r"^token_id:(-?\d+)$"

# Text that sends a file to the general path, searched (Rust regex, one pass) over the JSON the reader parses.
# pyarrow reads a key that is present with null like an absent one, but for the general path some keys change the
# format or the endpoint by being there at all ("compact_logprobs": null makes a choice vLLM's generate, "text": null a
# legacy completion), and others differ between null and absent ("model": null in a stream chunk clears the model).
# "token_ids" is not one of them: vLLM's chat completions carry "token_ids": null (and "routed_experts": null) unless
# asked for, and both paths read that null as absent; a list there fails the schema's null type. The key patterns assume a key
# is spelled plainly: text with a letter written as a \u escape is refused.


_ESCAPED_LETTER = r"\\u00[4-7]"


_SEPARATOR = (
    "[\u2028\u2029\x85]"  # str.splitlines ends a line there: the general path would number and cut lines its own way
)


def _keys(*names: str) -> str:
    return '"(?:' + "|".join(names) + ')"[ \t]*:'


_PAYLOAD_KEYS = ("compact_logprobs", "text", "tokens", "completion_probabilities", "tokens_predicted", "schema_version")


_RESPONSE_GUARD = "|".join([_keys(*_PAYLOAD_KEYS), _ESCAPED_LETTER, _SEPARATOR])


_BARE_GUARD = "|".join([_keys(*_PAYLOAD_KEYS, "response", "sse"), _ESCAPED_LETTER, _SEPARATOR])


_CHUNK_GUARD = "|".join(
    [
        _keys("error", "stop", "completion_probabilities", "text", "tokens"),
        _keys("id", "model", "stream_mode", "choices") + "[ \t]*null",
        _ESCAPED_LETTER,
    ]
)


_RAW_SEPARATOR = re.compile(b"\xe2\x80[\xa8\xa9]|\xc2\x85")


class _Unsupported(Exception):
    """The file needs the general path."""


# Anything these raise on a value (an id beyond int64, a digit string polars will not cast) also means: the general path.


_REFUSALS = (_Unsupported, pl.exceptions.PolarsError, pa.ArrowException, OverflowError)


_CHUNK_BYTES = (
    32 << 20
)  # lines are parsed this many bytes at a time, so memory stays bounded and reading overlaps building


def _chunks(path: Path, limit: int | None = None):
    """Whole lines of the file's first ``limit`` bytes (all of it by default), about ``_CHUNK_BYTES`` at a time:
    (buffer, size, [(start, end) of each line]); the lines lie in ``buffer[:size]``.

    One buffer is read into again and again (a fresh 64 MB each time costs as much as reading it): what the
    caller keeps of a chunk must be copied out before it asks for the next. Plain reads, not a memory map, so
    pages already parsed do not stay in this process. A CR or a blank line sends the file to the general path
    (it numbers and hashes lines its own way).
    """
    size = (
        path.stat().st_size + 1 if limit is None else limit
    )  # a small file gets a small buffer (it grows if the file does)
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


class _Scratch:
    """Where the lines the JSON reader parses are gathered, one chunk's at a time, kept from chunk to chunk: a fresh
    buffer of a chunk's size would cost its page faults (the kernel zeroing each page) every time."""

    def __init__(self) -> None:
        self.data = bytearray()

    def lines(self, pieces: list) -> memoryview:
        """The bytes-likes ``pieces`` as lines, one after another with a newline between (none after the last).
        Valid until the next call: the reader copies what it keeps."""
        size = sum(len(piece) + 1 for piece in pieces)
        if len(self.data) < size:
            self.data = bytearray(size + size // 4)  # a new one, not resized: a view of the old may be held yet
        data, at = self.data, 0
        for piece in pieces:
            end = at + len(piece)
            data[at:end] = piece
            data[end] = 10
            at = end + 1
        return memoryview(data)[: size - 1]


def _spans(data: bytes | bytearray, size: int) -> list[tuple[int, int]]:
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
        text = _series(array).cast(pl.String)
    except pl.exceptions.PolarsError:
        raise _Unsupported("not UTF-8") from None
    if text.str.contains(pattern).any():
        raise _Unsupported("a key or character the general path treats its own way")


def _table(data, n_rows: int, longest: int, schema: pa.Schema) -> pa.Table:
    # About four blocks a chunk: enough to keep the reader's threads busy, few enough that the per-batch polars work stays small.
    options = pj.ReadOptions(block_size=max(1 << 20, 2 * longest + 2, len(data) // 4 + 1))
    try:
        table = pj.read_json(
            pa.BufferReader(pa.py_buffer(data)),
            read_options=options,
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise _Unsupported(str(exc)) from None
    if table.num_rows != n_rows:
        raise _Unsupported("a line the JSON reader skipped or split")
    return table


def _series(array: pa.Array) -> pl.Series:
    """A pyarrow array (or chunked array) as a polars Series, which ``pl.from_arrow`` gives for one; its annotation says
    ``DataFrame | Series`` because a table gives a frame."""
    return cast(pl.Series, pl.from_arrow(array))


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
    return pa.Array.from_buffers(
        pa.binary(), len(lists), [mask, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=lists.null_count
    )


def _field(array: pa.Array, name: str) -> pa.Array:
    return pc.struct_field(array, name)


def _column(table: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    column = table.column(name)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _placeholder_ids(token: pl.Series) -> pl.Series:
    """The id of each ``token_id:N`` placeholder, null for any other token (``_values.placeholder_id``)."""
    marked = token.str.starts_with("token_id:").fill_null(False)
    ids = token.str.slice(9).cast(pl.Int64, strict=False)  # "-?[0-9]+" reads as an id, and so does "+5": not ours
    if (marked & (ids.is_null() | token.str.starts_with("token_id:+"))).any():
        # another digit (the general path's \d is any Unicode digit), no number, or an id beyond int64: the full rule
        ids = token.str.extract(_PLACEHOLDER, 1).cast(pl.Int64)  # strict: an id beyond int64 raises
    else:
        ids = ids.zip_with(marked, pl.Series([None], dtype=pl.Int64))
    return _token_ids(ids)


def _token_ids(ids: pl.Series) -> pl.Series:
    """``ids``, when none is negative: the general path refuses a negative token id, so it is left to it."""
    if (ids < 0).any():
        raise _Unsupported("a negative token id")
    return ids


@dataclass
class _Line:
    """One envelope line, checked: where its response lies, or its stream's events."""

    record: int
    sha: str
    env: dict[str, Any]  # the envelope's other keys, parsed
    kind: str  # "response" | "sse"
    columns: dict[str, Any]  # the request columns the envelope sets (``_envelope_columns``)
    span: tuple[int, int] | None = None  # the response's bytes in the chunk
    events: memoryview | None = None  # the data of the stream's events, one a line, UTF-8
    n_events: int = 0  # JSON events (the [DONE] that ends the stream not counted)
    arrivals: list | None = None
    explicit: bool = False  # the envelope names its format


@dataclass
class _LineMeta:
    """Per line: the request columns an envelope sets, and the keys that go to requests.extra."""

    record: list[int]
    raw_sha256: list[str]
    sample_key: list
    c: list
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

        meta = [line.columns for line in lines]
        columns = {
            name: [m[name] for m in meta]
            for name in ("sample_key", "c", "slot", "prompt_id", "role", "repeat", "t_sent")
        }
        extra = [{k: v for k, v in line.env.items() if k not in ENVELOPE_KEYS} for line in lines]
        return cls([line.record for line in lines], [line.sha for line in lines], extra=extra, **columns)

    def slice(self, start: int, stop: int) -> _LineMeta:
        return _LineMeta(*(getattr(self, name)[start:stop] for name in self.__dataclass_fields__))

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "record": pl.Series(self.record, dtype=pl.Int64),
                "raw_sha256": pl.Series(self.raw_sha256, dtype=pl.String),
                "sample_key": pl.Series(self.sample_key, dtype=pl.String),
                "c": pl.Series(self.c, dtype=pl.Int64),
                "slot": pl.Series(self.slot, dtype=pl.Int64),
                "prompt_id": pl.Series(self.prompt_id, dtype=pl.String),
                "role": pl.Series(self.role, dtype=pl.String),
                "repeat": pl.Series(self.repeat, dtype=pl.Int64),
                "t_sent": pl.Series(self.t_sent, dtype=pl.Float64, strict=False),
            }
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _envelope_columns(env: dict) -> dict[str, Any]:
    """The request columns of ``_envelope.envelope_meta``, refusing values the general path would refuse."""
    out: dict[str, Any] = {name: env.get(name) for name in ("sample_key", "slot", "role", "repeat", "t_sent")}
    out["c"] = envelope_c(env)
    for name in ("sample_key", "role"):
        if out[name] is not None and not isinstance(out[name], str):
            raise _Unsupported(f"{name} is not a string")
    for name in ("c", "slot", "repeat"):
        if out[name] is not None and not (_is_int(out[name]) and INT64_MIN <= out[name] <= INT64_MAX):
            raise _Unsupported(f"{name} is not an integer of 64 bits")
    t_sent = out["t_sent"]
    if t_sent is not None and not (_is_int(t_sent) or isinstance(t_sent, float)):
        raise _Unsupported("t_sent is not a number")
    out["prompt_id"] = None if env.get("prompt_id") is None else str(env["prompt_id"])
    return out


def _concat(parts: list[Frames]) -> Frames:
    if not parts:
        raise _Unsupported("an empty file")
    return cast(Frames, tuple(pl.concat([p[i] for p in parts], how="vertical", rechunk=False) for i in range(3)))


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
        except BaseException as error:
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
