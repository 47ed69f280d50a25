"""The fast path's frame builders: tokens, candidates and requests from Arrow tables of chat completions and of streams.
"""

from __future__ import annotations

import json
from itertools import chain

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ._openai import TIMING_FIELDS, USAGE_FIELDS
from ._schema import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA, classified, conform
from ._liveness import LIVE_SHARE, LIVE_SPAN, RUSH_GAP_S
from ._values import MAX_LOGPROB

from ._fastkit import Frames, _CHUNK_GUARD, _CHUNK_SCHEMA, _Line, _LineMeta, _Unsupported, _binary, _check_text, _column, _field, _flatten, _placeholder_ids, _table, _token_ids
from ._fastkit import _concat


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


def _extra_json(base: dict, usage: dict | None, timings: dict | None) -> str | None:
    """requests.extra as the general path writes it: the envelope's other keys, the usage counts and the server's timings."""
    kept = {k: usage[k] for k in USAGE_FIELDS if usage.get(k) is not None} if usage else {}
    timed = {k: timings[k] for k in TIMING_FIELDS if timings.get(k) is not None} if timings else {}
    extra = {**base, **({"usage": kept} if kept else {}), **({"timings": timed} if timed else {})}
    return json.dumps(extra, sort_keys=True, default=str) if extra else None


def _timed() -> pl.Expr:
    """A chunk whose ``timings`` holds one of ``TIMING_FIELDS`` (an empty object is none, as in ``_openai.server_timings``)."""
    return pl.any_horizontal(pl.col("timings").struct.field(name).is_not_null() for name in TIMING_FIELDS)


def _requests(batch, choices, choice_line, choice_pos, entry_choice, meta: _LineMeta, source: str) -> pl.DataFrame:
    usage = batch.column("usage")
    lines = meta.frame().with_columns(
        id=pl.from_arrow(batch.column("id")),
        model=pl.from_arrow(batch.column("model")),
        prompt_tokens=pl.from_arrow(_field(usage, "prompt_tokens")),
        completion_tokens=pl.from_arrow(_field(usage, "completion_tokens")),
        n_choices=pl.Series(np.bincount(choice_line, minlength=batch.num_rows)),
        extra=pl.Series([_extra_json(base, u, t) for base, u, t in zip(meta.extra, usage.to_pylist(), batch.column("timings").to_pylist())],
                        dtype=pl.String),
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
        "timings": pl.from_arrow(_column(table, "timings")),
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
    steps = pl.max_horizontal(pl.col("n_timed"), pl.col("n").fill_null(0))  # the tokens the chunks carried, when more than the chunks
    rush = (span < LIVE_SPAN * pl.col("last_known_t")) & (span < RUSH_GAP_S * (steps - 1))
    observed_live = (span > 0) & ((pl.col("distinct_t") > LIVE_SHARE * pl.col("n_timed")) | (span >= LIVE_SPAN * pl.col("last_known_t")))
    rushed = rush & (pl.col("n_timed") >= 2)
    return (pl.when(pl.col("declared").is_not_null() & (pl.col("declared") != "live")).then(pl.lit("declared replay"))
            .when(pl.col("declared").is_not_null()).then(pl.when(rushed).then(pl.lit("observed rush")).otherwise(pl.lit("declared live")))
            .when(pl.col("n_timed") < 2).then(pl.lit("untimed"))
            .when(observed_live & rush).then(pl.lit("observed rush"))
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
        timings=pl.col("timings").filter(_timed()).last(),  # the general path keeps the last chunk's that has one of them
    ).sort("line")
    usages = per_line.select(prompt_tokens="u_prompt", completion_tokens="u_completion", total_tokens="u_total").to_dicts()
    per_line = per_line.with_columns(extra=pl.Series([_extra_json(base, u, t) for base, u, t in zip(meta.extra, usages, per_line["timings"].to_list())],
                                                     dtype=pl.String))
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
