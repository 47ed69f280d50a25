"""A columnar path for the big case: a JSON-lines file of OpenAI chat completions.

pyarrow's multithreaded JSON reader parses straight into Arrow with an explicit schema, and the
tokens and candidates are derived with vectorized polars expressions. It gives exactly the frames
the general (per-value Python) path gives, or ``None`` when the file holds anything it does not
cover (another shape on some line, a null or non-JSON number, a value the checks refuse, blank
lines): the caller then takes the general path, which reads every case and names every error.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ._schema import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA, classified, conform
from ._values import MAX_LOGPROB

_NULL = pa.null()  # a field that must be absent or null here: anything else sends the file to the general path
_CANDIDATE = pa.struct([("token", pa.string()), ("logprob", pa.float64()), ("bytes", pa.list_(pa.int64())), ("id", pa.int64()), ("prob", _NULL)])
_ENTRY = pa.struct([
    ("token", pa.string()), ("logprob", pa.float64()), ("bytes", pa.list_(pa.int64())), ("id", pa.int64()),
    ("top_logprobs", pa.list_(_CANDIDATE)), ("prob", _NULL), ("top_probs", _NULL),
])
_CHOICE = pa.struct([
    ("index", pa.int64()), ("finish_reason", pa.string()), ("message", pa.struct([("content", pa.string())])),
    ("logprobs", pa.struct([("content", pa.list_(_ENTRY)), ("tokens", _NULL)])),
    ("token_ids", _NULL), ("compact_logprobs", _NULL), ("sampling_mask", _NULL), ("kept_tokens", _NULL), ("routed_experts", _NULL), ("text", _NULL),
])
_SCHEMA = pa.schema([
    ("id", pa.string()), ("request_id", _NULL), ("model", pa.string()), ("object", pa.string()), ("choices", pa.list_(_CHOICE)),
    ("usage", pa.struct([("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("total_tokens", pa.int64())])),
    ("prompt_logprobs", _NULL), ("nvext", _NULL), ("error", _NULL), ("response", _NULL), ("sse", _NULL), ("meta_info", _NULL),
])
_PLACEHOLDER = r"^token_id:(-?\d+)$"


class _Unsupported(Exception):
    """The file needs the general path."""


_CHUNK_BYTES = 64 << 20  # lines are parsed this many bytes at a time, so memory stays bounded


def _chunks(path: Path):
    """Whole lines of the file, about ``_CHUNK_BYTES`` at a time: (buffer, [(start, end) of each line]).

    Read with plain reads, not a memory map, so pages already parsed do not stay in this process.
    A CR or a blank line sends the file to the general path (it numbers and hashes lines its own way).
    """
    carry = b""
    with path.open("rb") as handle:
        while True:
            block = handle.read(_CHUNK_BYTES)
            data = carry + block
            if not block:
                if data:
                    yield data, _spans(data, len(data))
                return
            cut = data.rfind(b"\n")
            if cut == -1:  # a line longer than a chunk: keep reading
                carry = data
                continue
            carry = data[cut + 1 :]
            yield memoryview(data)[: cut + 1], _spans(data, cut + 1)  # a view: no copy of the chunk


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


def _table(data: bytes, spans: list[tuple[int, int]]) -> pa.Table:
    longest = max(b - a for a, b in spans)
    options = pj.ReadOptions(block_size=max(1 << 20, 2 * longest + 2))
    try:
        table = pj.read_json(pa.BufferReader(pa.py_buffer(data)), read_options=options,
                             parse_options=pj.ParseOptions(explicit_schema=_SCHEMA, unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise _Unsupported(str(exc)) from None
    if table.num_rows != len(spans):
        raise _Unsupported("a line the JSON reader skipped")
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


def _placeholder_ids(token: pl.Series) -> pl.Series:
    """The id of each ``token_id:N`` placeholder, null for any other token."""
    return token.str.extract(_PLACEHOLDER, 1).cast(pl.Int64)


def read_chat_jsonl(path: Path, source: str) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame] | None:
    """The three frames of a chat-completions JSON-lines file, or None when the general path is needed."""
    try:
        return _read(path, source)
    except _Unsupported:
        return None


def _read(path: Path, source: str):
    parts: list[tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]] = []
    line = 0
    for data, spans in _chunks(path):
        table = _table(data, spans)
        first, view = line, memoryview(data)
        for batch in table.to_batches():
            hashes = [hashlib.sha256(view[a:b]).hexdigest() for a, b in spans[line - first : line - first + batch.num_rows]]
            parts.append(_batch(batch, line, hashes, source))
            line += batch.num_rows
    if not parts:
        raise _Unsupported("an empty file")
    return tuple(pl.concat([p[i] for p in parts], how="vertical", rechunk=False) for i in range(3))


def _batch(batch: pa.RecordBatch, first_line: int, hashes: list[str], source: str):
    choices_column = batch.column("choices")
    if choices_column.null_count:
        raise _Unsupported("a line without choices")
    choices, choice_line, choice_pos = _flatten(choices_column)
    objects = batch.column("object")
    has_message = pc.is_valid(_field(choices, "message")).to_numpy(zero_copy_only=False)
    is_chat = pc.equal(objects, "chat.completion").fill_null(False).to_numpy(zero_copy_only=False)[choice_line]
    if not np.all(has_message | is_chat):
        raise _Unsupported("a choice that is not a chat choice")
    entries, entry_choice, position = _flatten(_field(_field(choices, "logprobs"), "content"))
    requests = _requests(batch, choices, choice_line, choice_pos, entry_choice, first_line, hashes, source)
    tokens = _tokens(entries, entry_choice, position, requests, source)
    candidates = _candidates(entries, tokens, source)
    return tokens, candidates, requests


def _requests(batch, choices, choice_line, choice_pos, entry_choice, first_line, hashes, source) -> pl.DataFrame:
    lines = pl.from_arrow(pa.Table.from_batches([batch.select(["id", "model", "usage"])])).unnest("usage")
    n_choices = np.bincount(choice_line, minlength=batch.num_rows)
    scored = np.bincount(entry_choice, minlength=len(choices))
    frame = pl.DataFrame({
        "line": choice_line,
        "choice_index": pl.from_arrow(_field(choices, "index")).fill_null(pl.Series(choice_pos)),
        "finish_reason": pl.from_arrow(_field(choices, "finish_reason")),
        "completion_text": pl.from_arrow(_field(_field(choices, "message"), "content")),
        "n_completion_scored": scored,
        "has_logprobs": pc.is_valid(_field(choices, "logprobs")).to_numpy(zero_copy_only=False),
    }).join(lines.with_row_index("line").with_columns(pl.col("line").cast(pl.Int64), n_choices=pl.Series(n_choices)), on="line", how="left")
    single = pl.col("n_choices") == 1
    bad = frame.filter(single & pl.col("has_logprobs") & pl.col("completion_tokens").is_not_null() & (pl.col("completion_tokens") != pl.col("n_completion_scored")))
    if bad.height:
        raise _Unsupported("usage disagrees with the logprob entries")
    usage = pl.struct(["completion_tokens", "prompt_tokens", "total_tokens"])
    extra = usage.map_elements(_usage_json, return_dtype=pl.String)
    out = frame.select(
        source=pl.lit(source),
        record=pl.col("line") + first_line + 1,
        choice_index=pl.col("choice_index"),
        request_id=pl.col("id"),
        sample_key=pl.lit(None, pl.String),
        source_format=pl.lit("openai_chat"),
        model=pl.col("model"),
        endpoint=pl.lit("chat"),
        stream=pl.lit(False),
        finish_reason=pl.col("finish_reason"),
        prompt_tokens=pl.col("prompt_tokens"),
        completion_tokens=pl.when(single).then(pl.col("completion_tokens")),
        n_prompt_scored=pl.lit(0, pl.Int64),
        n_completion_scored=pl.col("n_completion_scored"),
        completion_text=pl.col("completion_text"),
        raw_sha256=pl.col("line").map_elements(lambda i: hashes[i], return_dtype=pl.String),
        extra=extra,
    )
    return out.with_columns([pl.lit(None, dtype).alias(name) for name, dtype in REQUEST_SCHEMA.items() if name not in out.columns]).select(
        [pl.col(n).cast(t) for n, t in REQUEST_SCHEMA.items()])


def _usage_json(usage: dict) -> str | None:
    kept = {k: v for k, v in usage.items() if v is not None}
    return json.dumps({"usage": kept}, sort_keys=True) if kept else None


def _token_key(source: str) -> dict[str, pl.Expr]:
    """The token key columns (see ``_schema.KEY``) that the tokens and candidates tables both lead with."""
    return {"source": pl.lit(source), "record": pl.col("record"), "choice_index": pl.col("choice_index"), "segment": pl.lit("completion"),
            "position": pl.col("position")}


def _tokens(entries, entry_choice, position, requests: pl.DataFrame, source: str) -> pl.DataFrame:
    token = pl.from_arrow(_field(entries, "token"))
    own_id = pl.from_arrow(_field(entries, "id"))
    placeholder = _placeholder_ids(token)
    raw = pl.from_arrow(_field(entries, "logprob"))
    if raw.null_count() or (own_id.is_not_null() & placeholder.is_not_null() & (own_id != placeholder)).any() or (token.is_null() & own_id.is_null()).any():
        raise _Unsupported("placeholder conflicts, null values or entries without a token")
    choice_row = pl.Series(entry_choice)
    frame = pl.DataFrame({
        "record": requests["record"].gather(choice_row),
        "choice_index": requests["choice_index"].gather(choice_row),
        "request_id": requests["request_id"].gather(choice_row),
        "position": position,
        "token": token,
        "placeholder": placeholder,
        "own_id": own_id,
        "raw_value": raw,
        "bytes": pl.from_arrow(_binary(_field(entries, "bytes"))),
        "n_candidates": pl.from_arrow(pc.list_value_length(_field(entries, "top_logprobs"))).cast(pl.Int64),
    }).with_columns(*classified(pl.col("raw_value"), ""))
    if ((frame["status"] == "ok") & (frame["raw_value"] > MAX_LOGPROB)).any():
        raise _Unsupported("a positive logprob")
    own_placeholder_bytes = pl.col("placeholder").is_not_null() & (pl.col("bytes") == pl.col("token").cast(pl.Binary)).fill_null(False)
    out = frame.select(
        **_token_key(source),
        request_id=pl.col("request_id"),
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
        source_format=pl.lit("openai_chat"),
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
    own_id = pl.from_arrow(_field(cands, "id"))
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
