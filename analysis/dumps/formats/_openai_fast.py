"""The fast path for chat completions: files of bare ones, one a line, and the frame builders (tokens, candidates,
requests from Arrow tables) that the capture and stream fast paths share. The general path is ``_openai``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import cast

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from .._fastkit import (
    _BARE_GUARD,
    _REFUSALS,
    _SCHEMA,
    Frames,
    _ahead,
    _binary,
    _check_text,
    _chunks,
    _concat,
    _field,
    _flatten,
    _LineMeta,
    _placeholder_ids,
    _series,
    _table,
    _token_ids,
    _Unsupported,
)
from .._kit import TIMING_FIELDS, USAGE_FIELDS
from .._schema import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA, classified, conform
from .._values import MAX_LOGPROB


def read_chat_jsonl(path: Path, source: str) -> Frames | None:
    """The three frames of a file of bare chat completions, one a line, or None when the general path is needed.

    Parameters
    ----------
    path : pathlib.Path
        The file.
    source : str
        Its name, for the ``source`` column and error messages.

    Returns
    -------
    Frames or None
    """
    try:
        return _read_bare(path, source)
    except _REFUSALS:
        return None


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
        _check_shapes(table)
        yield (
            table,
            _LineMeta.bare(
                [line + i + 1 for i in range(len(spans))], [hashlib.sha256(view[a:b]).hexdigest() for a, b in spans]
            ),
        )
        line += len(spans)


def _check_shapes(table: pa.Table) -> None:
    """Refuse what the general path would take for another format: a legacy object, or a response without
    choices that is not a chat completion (the general path detects its format from the object alone; a
    non-null ``prompt_logprobs`` fails the schema)."""
    choices = table.column("choices")
    if choices.null_count:
        raise _Unsupported("a line without choices")
    objects = table.column("object")
    if pc.any(pc.equal(objects, "text_completion").fill_null(False)).as_py():
        raise _Unsupported("a legacy completion")
    n_choices = pc.list_value_length(choices).to_numpy()
    is_chat = pc.equal(objects, "chat.completion").fill_null(False).to_numpy()
    for i in np.flatnonzero(n_choices == 0):
        if not is_chat[i]:
            raise _Unsupported("a response without choices that is not a plain chat completion")


# --- frames -------------------------------------------------------------------------------------


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
    keys = requests.select("record", "choice_index", "request_id", "sample_key")[entry_choice].with_columns(
        position=pl.Series(position)
    )
    tokens = _tokens(entries, keys, source, "openai_chat")
    candidates = _candidates(entries, tokens, source)
    return tokens, candidates, requests


def _extra_json(base: dict, usage: dict | None, timings: dict | None) -> str | None:
    """requests.extra as the general path writes it: the envelope's other keys, the usage counts and the server's timings."""
    kept = {k: usage[k] for k in USAGE_FIELDS if usage.get(k) is not None} if usage else {}
    timed = {k: timings[k] for k in TIMING_FIELDS if timings.get(k) is not None} if timings else {}
    extra = {**base, **({"usage": kept} if kept else {}), **({"timings": timed} if timed else {})}
    return json.dumps(extra, sort_keys=True, default=str) if extra else None


def _timed() -> pl.Expr:
    """A chunk whose ``timings`` holds one of ``TIMING_FIELDS`` (an empty object is none, as in ``_kit.server_timings``)."""
    return pl.any_horizontal(pl.col("timings").struct.field(name).is_not_null() for name in TIMING_FIELDS)


def _requests(batch, choices, choice_line, choice_pos, entry_choice, meta: _LineMeta, source: str) -> pl.DataFrame:
    usage = batch.column("usage")
    lines = meta.frame().with_columns(
        id=_series(batch.column("id")),
        model=_series(batch.column("model")),
        prompt_tokens=_series(_field(usage, "prompt_tokens")),
        completion_tokens=_series(_field(usage, "completion_tokens")),
        n_choices=pl.Series(np.bincount(choice_line, minlength=batch.num_rows)),
        extra=pl.Series(
            [
                _extra_json(base, u, t)
                for base, u, t in zip(meta.extra, usage.to_pylist(), batch.column("timings").to_pylist())
            ],
            dtype=pl.String,
        ),
    )
    scored = np.bincount(entry_choice, minlength=len(choices))
    frame = pl.concat(
        [
            pl.DataFrame(
                {
                    "choice_index": _series(_field(choices, "index")).fill_null(pl.Series(choice_pos)),
                    "finish_reason": _series(_field(choices, "finish_reason")),
                    "completion_text": _series(_field(_field(choices, "message"), "content")),
                    "n_completion_scored": scored,
                    "has_logprobs": pc.is_valid(_field(choices, "logprobs")).to_numpy(zero_copy_only=False),
                }
            ),
            lines[choice_line],
        ],
        how="horizontal",
    )
    single = pl.col("n_choices") == 1
    # no entry at all is logprobs not recorded (evidence missing), not a disagreement: as the general reader reads it
    disagree = (pl.col("completion_tokens") != pl.col("n_completion_scored")) & (pl.col("n_completion_scored") > 0)
    if frame.filter(single & pl.col("has_logprobs") & pl.col("completion_tokens").is_not_null() & disagree).height:
        raise _Unsupported("usage disagrees with the logprob entries")
    return _envelope_requests(
        frame,
        source,
        "openai_chat",
        stream=False,
        completion_text=pl.col("completion_text"),
        choice_index=pl.col("choice_index"),
        request_id=pl.when(pl.col("id") != "").then(pl.col("id")),  # payload.get("id") or payload.get("request_id")
        finish_reason=pl.col("finish_reason"),
        prompt_tokens=pl.col("prompt_tokens"),
        completion_tokens=pl.when(single).then(pl.col("completion_tokens")),
        n_completion_scored=pl.col("n_completion_scored"),
    )


def _envelope_requests(
    frame: pl.DataFrame, source: str, source_format: str, *, stream: bool, **columns: pl.Expr
) -> pl.DataFrame:
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
        c=pl.col("c"),
        slot=pl.col("slot"),
        prompt_id=pl.col("prompt_id"),
        role=pl.col("role"),
        repeat=pl.col("repeat"),
        t_sent=pl.col("t_sent"),
        raw_sha256=pl.col("raw_sha256"),
        extra=pl.col("extra"),
        **columns,
    )
    return conform(out, REQUEST_SCHEMA)


def _token_key(source: str) -> dict[str, pl.Expr]:
    """The token key columns (see ``_schema.KEY``) that the tokens and candidates tables both lead with."""
    return {
        "source": pl.lit(source),
        "record": pl.col("record"),
        "choice_index": pl.col("choice_index"),
        "segment": pl.lit("completion"),
        "position": pl.col("position"),
    }


def _tokens(entries, keys: pl.DataFrame, source: str, source_format: str) -> pl.DataFrame:
    """One row per ``logprobs.content`` entry; ``keys`` holds each entry's record, choice_index, position, request_id,
    sample_key (and for streams stream_chunk and t_arrival)."""
    token = _series(_field(entries, "token"))
    own_id = _token_ids(_series(_field(entries, "id")))
    placeholder = _placeholder_ids(token)
    raw = _series(_field(entries, "logprob"))
    conflict = (own_id.is_not_null() & placeholder.is_not_null() & (own_id != placeholder)).any()
    if raw.null_count() or conflict or (token.is_null() & own_id.is_null()).any():
        raise _Unsupported("placeholder conflicts, null values or entries without a token")
    frame = keys.with_columns(
        token=token,
        placeholder=placeholder,
        own_id=own_id,
        raw_value=raw,
        bytes=_series(_binary(_field(entries, "bytes"))),
        n_candidates=_series(pc.list_value_length(_field(entries, "top_logprobs"))).cast(pl.Int64),
    ).with_columns(*classified(pl.col("raw_value"), ""))
    if ((frame["status"] == "ok") & (frame["raw_value"] > MAX_LOGPROB)).any():
        raise _Unsupported("a positive logprob")
    own_placeholder_bytes = pl.col("placeholder").is_not_null() & (
        pl.col("bytes") == pl.col("token").cast(pl.Binary)
    ).fill_null(False)
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
    identity = pl.struct(
        parent,
        cand_id,
        pl.when(cand_id.is_null()).then(text).alias("t"),
        pl.when(cand_id.is_null()).then(data).alias("b"),
    )
    return ~identity.is_first_distinct()


def _candidates(entries, tokens: pl.DataFrame, source: str) -> pl.DataFrame:
    cands, parents, list_index = _flatten(_field(entries, "top_logprobs"))
    token = _series(_field(cands, "token"))
    placeholder = _placeholder_ids(token)
    own_id = _token_ids(_series(_field(cands, "id")))
    raw = _series(_field(cands, "logprob"))
    if raw.null_count():
        raise _Unsupported("a null candidate value")
    parent = pl.Series("parent", parents)
    frame = pl.DataFrame(
        {
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
            "bytes": _series(_binary(_field(cands, "bytes"))),
        }
    ).with_columns(*classified(pl.col("raw"), "cand_"))
    if ((frame["cand_status"] == "ok") & (frame["raw"] > MAX_LOGPROB)).any():
        raise _Unsupported("a positive candidate logprob")
    own_bytes = pl.col("placeholder").is_not_null() & (pl.col("bytes") == pl.col("token").cast(pl.Binary)).fill_null(
        False
    )
    frame = frame.with_columns(
        cand_text=pl.when(pl.col("placeholder").is_null()).then(pl.col("token")),
        cand_bytes=pl.when(own_bytes).then(None).otherwise(pl.col("bytes")),
    )
    ids = frame["cand_id"]
    # Int64 columns with no null, so a non-empty frame's min and max are ints
    all_ids = ids.null_count() == 0 and (
        frame.height == 0
        or (
            cast(int, ids.min()) >= 0
            and cast(int, ids.max()) < (1 << 32)
            and cast(int, frame["parent"].max()) < (1 << 30)
        )
    )
    sampled = (
        pl.when(pl.col("sampled_id").is_not_null() & pl.col("cand_id").is_not_null())
        .then(pl.col("cand_id") == pl.col("sampled_id"))
        .when(pl.col("sampled_text").is_not_null() & pl.col("cand_id").is_null())
        .then(pl.col("cand_text") == pl.col("sampled_text"))
    )
    out = frame.select(
        **_token_key(source),
        list_kind=pl.lit("top_logprobs"),
        list_index=pl.col("list_index"),
        cand_token_id=pl.col("cand_id"),
        cand_token_text=pl.col("cand_text"),
        cand_token_bytes=pl.col("cand_bytes"),
        cand_logprob=pl.col("cand_logprob"),
        cand_prob=pl.col("cand_prob"),
        cand_raw_value=pl.col("raw"),
        cand_status=pl.col("cand_status"),
        is_sampled=sampled,
        is_duplicate=_duplicates(
            pl.col("parent"), pl.col("cand_id"), pl.col("cand_text"), pl.col("cand_bytes"), all_ids
        ),
    )
    return conform(out, CANDIDATE_SCHEMA)
