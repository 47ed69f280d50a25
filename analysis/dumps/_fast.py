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
import math
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ._schema import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA
from ._values import FLOAT32_LOWEST, MAX_LOGPROB, SENTINEL_9999

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


def _table(path: Path) -> pa.Table:
    block = 16 << 20
    size = path.stat().st_size
    while True:
        try:
            return pj.read_json(path, read_options=pj.ReadOptions(block_size=block),
                                parse_options=pj.ParseOptions(explicit_schema=_SCHEMA, unexpected_field_behavior="ignore"))
        except pa.ArrowInvalid as exc:
            if "straddl" in str(exc) and block < size + 1:
                block *= 4  # a line longer than a block: read bigger blocks
                continue
            raise _Unsupported(str(exc)) from None
        except (pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise _Unsupported(str(exc)) from None


def _line_hashes(path: Path) -> list[str]:
    """sha256 of every line, as the general path records it; blank lines or CR need that path."""
    hashes = []
    with path.open("rb") as handle:
        for line in handle:
            body = line[:-1] if line.endswith(b"\n") else line
            if not body.strip() or b"\r" in body:
                raise _Unsupported("blank lines or CR line ends")
            hashes.append(hashlib.sha256(body).hexdigest())
    return hashes


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


def _classified(raw: pl.Expr, prefix: str) -> list[pl.Expr]:
    """Status, logprob and prob columns for a raw logprob, in the general path's order of rules."""
    status = (
        pl.when(raw.is_null()).then(pl.lit("null_in_source"))
        .when(raw == SENTINEL_9999).then(pl.lit("sentinel_9999"))
        .when(raw.is_nan() | (raw == math.inf)).then(pl.lit("nonfinite"))
        .when(raw == -math.inf).then(pl.lit("neg_inf"))
        .when(raw <= FLOAT32_LOWEST).then(pl.lit("float_lowest"))
        .otherwise(pl.lit("ok"))
    )
    logprob = pl.when(status == "ok").then(raw)
    return [status.alias(f"{prefix}status"), logprob.alias(f"{prefix}logprob"), logprob.exp().alias(f"{prefix}prob")]


def _identity(token: pl.Expr, token_id: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """(id, text): the placeholder's id when there is one, else ``id`` with the token as text."""
    placeholder = token.str.extract(_PLACEHOLDER, 1).cast(pl.Int64)
    return pl.coalesce(placeholder, token_id), pl.when(placeholder.is_null()).then(token)


def read_chat_jsonl(path: Path, source: str) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame] | None:
    """The three frames of a chat-completions JSON-lines file, or None when the general path is needed."""
    try:
        return _read(path, source)
    except _Unsupported:
        return None


def _read(path: Path, source: str):
    table = _table(path)
    hashes = _line_hashes(path)
    if table.num_rows != len(hashes) or table.column("choices").null_count:
        raise _Unsupported("a line without choices")
    choices, choice_line, choice_pos = _flatten(table.column("choices"))
    objects = table.column("object").combine_chunks()
    has_message = pc.is_valid(_field(choices, "message")).to_numpy(zero_copy_only=False)
    is_chat = (pc.equal(objects, "chat.completion").fill_null(False).to_numpy(zero_copy_only=False))[choice_line]
    if not np.all(has_message | is_chat):
        raise _Unsupported("a choice that is not a chat choice")
    entries, entry_choice, position = _flatten(_field(_field(choices, "logprobs"), "content"))
    requests = _requests(table, choices, choice_line, choice_pos, entry_choice, hashes, source)
    tokens = _tokens(entries, entry_choice, position, requests, source)
    candidates = _candidates(entries, tokens, source)
    return tokens, candidates, requests


def _requests(table, choices, choice_line, choice_pos, entry_choice, hashes, source) -> pl.DataFrame:
    lines = pl.from_arrow(table.select(["id", "model", "usage"])).unnest("usage")
    n_choices = np.bincount(choice_line, minlength=table.num_rows)
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
        record=pl.col("line") + 1,
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


def _tokens(entries, entry_choice, position, requests: pl.DataFrame, source: str) -> pl.DataFrame:
    frame = pl.DataFrame({
        "choice_row": entry_choice,
        "position": position,
        "token": pl.from_arrow(_field(entries, "token")),
        "id": pl.from_arrow(_field(entries, "id")),
        "raw_value": pl.from_arrow(_field(entries, "logprob")),
        "bytes": pl.from_arrow(_binary(_field(entries, "bytes"))),
        "n_candidates": pl.from_arrow(pc.list_value_length(_field(entries, "top_logprobs"))).cast(pl.Int64),
    })
    keys = requests.select("record", "choice_index", "request_id").with_row_index("choice_row").with_columns(pl.col("choice_row").cast(pl.Int64))
    frame = frame.join(keys, on="choice_row", how="left", maintain_order="left")
    token_id, text = _identity(pl.col("token"), pl.col("id"))
    placeholder = pl.col("token").str.contains(_PLACEHOLDER).fill_null(False)
    conflict = frame.filter(pl.col("id").is_not_null() & (pl.col("token").str.extract(_PLACEHOLDER, 1).cast(pl.Int64) != pl.col("id")))
    if conflict.height or frame["raw_value"].null_count() or frame.filter(pl.col("token").is_null() & pl.col("id").is_null()).height:
        raise _Unsupported("placeholder conflicts, null values or entries without a token")
    frame = frame.with_columns(*_classified(pl.col("raw_value"), ""))
    if frame.filter((pl.col("status") == "ok") & (pl.col("raw_value") > MAX_LOGPROB)).height:
        raise _Unsupported("a positive logprob")
    own_placeholder_bytes = placeholder & (pl.col("bytes") == pl.col("token").cast(pl.Binary))
    out = frame.select(
        source=pl.lit(source),
        record=pl.col("record"),
        choice_index=pl.col("choice_index"),
        segment=pl.lit("completion"),
        position=pl.col("position"),
        request_id=pl.col("request_id"),
        token_id=token_id,
        token_text=text,
        token_bytes=pl.when(own_placeholder_bytes.fill_null(False)).then(None).otherwise(pl.col("bytes")),
        logprob=pl.col("logprob"),
        prob=pl.col("prob"),
        raw_value=pl.col("raw_value"),
        value_status=pl.col("status"),
        value_kind=pl.lit("logprob"),
        logprob_semantics=pl.lit("unknown"),
        n_candidates=pl.col("n_candidates"),
        source_format=pl.lit("openai_chat"),
    )
    return _conform(out, TOKEN_SCHEMA)


def _candidates(entries, tokens: pl.DataFrame, source: str) -> pl.DataFrame:
    cands, parent, list_index = _flatten(_field(entries, "top_logprobs"))
    frame = pl.DataFrame({
        "parent": parent,
        "list_index": list_index,
        "token": pl.from_arrow(_field(cands, "token")),
        "id": pl.from_arrow(_field(cands, "id")),
        "raw": pl.from_arrow(_field(cands, "logprob")),
        "bytes": pl.from_arrow(_binary(_field(cands, "bytes"))),
    })
    if frame["raw"].null_count():
        raise _Unsupported("a null candidate value")
    parents = tokens.select("record", "choice_index", "position", sampled_id="token_id", sampled_text="token_text").with_row_index("parent")
    frame = frame.join(parents.with_columns(pl.col("parent").cast(pl.Int64)), on="parent", how="left", maintain_order="left")
    cand_id, text = _identity(pl.col("token"), pl.col("id"))
    frame = frame.with_columns(*_classified(pl.col("raw"), "c_"), cand_id=cand_id, cand_text=text)
    if frame.filter((pl.col("c_status") == "ok") & (pl.col("raw") > MAX_LOGPROB)).height:
        raise _Unsupported("a positive candidate logprob")
    placeholder = pl.col("token").str.contains(_PLACEHOLDER).fill_null(False)
    own = placeholder & (pl.col("bytes") == pl.col("token").cast(pl.Binary)).fill_null(False)
    frame = frame.with_columns(cand_bytes=pl.when(own).then(None).otherwise(pl.col("bytes")))
    identity = pl.struct(
        pl.col("parent"), pl.col("cand_id"),
        pl.when(pl.col("cand_id").is_null()).then(pl.col("cand_text")).alias("t"),
        pl.when(pl.col("cand_id").is_null()).then(pl.col("cand_bytes")).alias("b"),
    )
    sampled = (
        pl.when(pl.col("sampled_id").is_not_null() & pl.col("cand_id").is_not_null()).then(pl.col("cand_id") == pl.col("sampled_id"))
        .when(pl.col("sampled_text").is_not_null() & pl.col("cand_id").is_null()).then(pl.col("cand_text") == pl.col("sampled_text"))
    )
    out = frame.select(
        source=pl.lit(source),
        record=pl.col("record"),
        choice_index=pl.col("choice_index"),
        segment=pl.lit("completion"),
        position=pl.col("position"),
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
        is_duplicate=~identity.is_first_distinct(),
    )
    return _conform(out, CANDIDATE_SCHEMA)


def _conform(frame: pl.DataFrame, schema: dict) -> pl.DataFrame:
    """Every schema column, in order and type; those this path never fills are null."""
    missing = [pl.lit(None, dtype).alias(name) for name, dtype in schema.items() if name not in frame.columns]
    return frame.with_columns(missing).select([pl.col(n).cast(t) for n, t in schema.items()])
