"""The fast path for streamed chat completions in capture envelopes: each stream's ``data:`` events read as JSON
lines of their own, and the per-choice accumulation ``_streams.parse_chat_stream`` does event by event, done
with polars expressions. The envelope lines themselves are cut out by ``_capture_fast``.
"""

from __future__ import annotations

from itertools import chain
from typing import cast

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from .._fastkit import (
    _CHUNK_GUARD,
    _CHUNK_SCHEMA,
    Frames,
    _check_text,
    _column,
    _field,
    _flatten,
    _Line,
    _LineMeta,
    _Scratch,
    _table,
    _Unsupported,
)
from .._liveness import LIVE_SHARE, LIVE_SPAN, RUSH_GAP_S
from ._openai_fast import _candidates, _envelope_requests, _extra_json, _timed, _tokens

_LAST = "\n\ndata: [DONE]\n\n"
_NEXT = "\n\ndata: "  # what ends one event and begins the next
_DONE = "\n[DONE]\n\n"  # _LAST once _NEXT is replaced


def _sse_events(sse: str) -> tuple[memoryview, int]:
    """The data of the events of an SSE text made only of ``data: {...}`` blocks that ends with [DONE], one event
    a line (UTF-8), and how many events it holds.

    One ``replace`` rather than a split and a join: the events are only ever read as JSON lines.
    """
    if not sse.startswith("data: ") or not sse.endswith(_LAST):
        raise _Unsupported("an SSE text that is not plain data blocks ending with [DONE]")
    text = sse.replace(_NEXT, "\n")  # "data: " + the events + "\n[DONE]\n\n" (no _NEXT spans the ends)
    if "\r" in text:
        raise _Unsupported("an SSE text that is not plain data blocks ending with [DONE]")
    if not text.isascii() and ("\x85" in text or "\u2028" in text or "\u2029" in text):
        raise _Unsupported("a line separator for str.splitlines")  # str.splitlines ends lines there
    try:
        data = text.encode()
    except UnicodeEncodeError:
        raise _Unsupported("a lone surrogate") from None
    n = (len(sse) - len(text)) // (len(_NEXT) - 1)  # each _NEXT replaced ends an event, the last one's before [DONE]
    return memoryview(data)[6 : len(data) - len(_DONE)], n


def _parsed_events(run: list[_Line], scratch: _Scratch) -> pa.Table:
    """Every event of every stream of consecutive SSE envelopes, read as one JSON-lines buffer."""
    buffer = scratch.lines([line.events for line in run])
    longest = max(len(cast(memoryview, line.events)) for line in run)  # a stream's events: no one event is longer
    for line in run:
        line.events = None  # parsed now: not kept while the next chunk is read
    n_events = sum(line.n_events for line in run)
    if scratch.data.count(b"\n", 0, len(buffer)) != n_events - 1:  # another field, a comment, a multi-line event
        raise _Unsupported("an SSE text that is not one data line per event")
    _check_text(buffer, _newline_ends(scratch.data, len(buffer)), _CHUNK_GUARD)
    table = _table(buffer, n_events, longest, _CHUNK_SCHEMA)
    return (
        table.combine_chunks()
    )  # the streams' events are accumulated across the reader's blocks: one chunk (a copy made ahead)


def _newline_ends(data: bytearray, size: int, pieces: int = 8) -> list[int]:
    """Where to cut ``data[:size]`` into about ``pieces`` parts, each after a newline (for ``_check_text``)."""
    ends, at = [], 0
    for k in range(1, pieces):
        cut = data.find(b"\n", max(at, k * size // pieces), size)
        if cut == -1:
            break
        ends.append(cut + 1)
        at = cut + 1
    return [*ends, size]


def _sse_frames(table: pa.Table, run: list[_Line], source: str) -> Frames:
    """Frames of consecutive SSE envelopes, accumulated per choice the way ``_streams.parse_chat_stream`` does,
    event by event."""
    counts = np.array([line.n_events for line in run], dtype=np.int64)
    choices_column = _column(table, "choices")
    usage = _column(table, "usage")
    line_of = np.repeat(np.arange(len(run), dtype=np.int64), counts)
    event = np.arange(len(line_of), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    times = chain.from_iterable(
        line.arrivals[:-1] if line.arrivals is not None else [None] * line.n_events for line in run
    )
    chunks = pl.DataFrame(
        {
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
        }
    )
    if (chunks["object"] == "text_completion").any():
        raise _Unsupported("a legacy completion stream")
    has_choices = chunks.group_by("line").agg(pl.col("has_choices").any()).sort("line")["has_choices"].to_list()
    if any(not found and not line.explicit for found, line in zip(has_choices, run)):
        raise _Unsupported("a stream the general path finds no format for")
    chunks = chunks.with_columns(request_id=pl.col("id").forward_fill().over("line"))

    choices, choice_chunk, choice_pos = _flatten(choices_column)
    content = _field(_field(choices, "logprobs"), "content")
    per_choice = pl.concat(
        [
            pl.DataFrame(
                {
                    "index": pl.from_arrow(_field(choices, "index")).fill_null(pl.Series(choice_pos)),
                    "piece": pl.from_arrow(_field(_field(choices, "delta"), "content")),
                    "finish": pl.from_arrow(_field(choices, "finish_reason")),
                    "n_entries": pl.from_arrow(pc.list_value_length(content)).fill_null(0).cast(pl.Int64),
                }
            ),
            chunks.select("line", "event", "t", "request_id")[choice_chunk],
        ],
        how="horizontal",
    )

    meta = _LineMeta.of(run)
    line_meta = meta.frame().with_row_index("line").with_columns(pl.col("line").cast(pl.Int64))
    entries, entry_choice, _ = _flatten(content)
    keys = per_choice.select(
        "line",
        pl.col("index").alias("choice_index"),
        pl.col("event").alias("stream_chunk"),
        pl.col("t").alias("t_arrival"),
        "request_id",
    )[entry_choice]
    keys = keys.with_columns(
        position=pl.int_range(pl.len(), dtype=pl.Int64).over(
            "line", "choice_index"
        ),  # each choice counts its tokens across the stream
        record=line_meta["record"].gather(keys["line"]),
        sample_key=line_meta["sample_key"].gather(keys["line"]),
    )
    tokens = _tokens(entries, keys, source, "openai_chat_sse")
    candidates = _candidates(entries, tokens, source)
    return tokens, candidates, _stream_requests(per_choice, chunks, line_meta, meta, source)


def _liveness() -> pl.Expr:
    """``_liveness.liveness`` as an expression over a choice's aggregated content-chunk times."""
    span = pl.col("last_known_t") - pl.col("first_t")
    steps = pl.max_horizontal(
        pl.col("n_timed"), pl.col("n").fill_null(0)
    )  # the tokens the chunks carried, when more than the chunks
    rush = (span < LIVE_SPAN * pl.col("last_known_t")) & (span < RUSH_GAP_S * (steps - 1))
    observed_live = (span > 0) & (
        (pl.col("distinct_t") > LIVE_SHARE * pl.col("n_timed")) | (span >= LIVE_SPAN * pl.col("last_known_t"))
    )
    rushed = rush & (pl.col("n_timed") >= 2)
    return (
        pl.when(pl.col("declared").is_not_null() & (pl.col("declared") != "live"))
        .then(pl.lit("declared replay"))
        .when(pl.col("declared").is_not_null())
        .then(pl.when(rushed).then(pl.lit("observed rush")).otherwise(pl.lit("declared live")))
        .when(pl.col("n_timed") < 2)
        .then(pl.lit("untimed"))
        .when(observed_live & rush)
        .then(pl.lit("observed rush"))
        .when(observed_live)
        .then(pl.lit("observed live"))
        .otherwise(pl.lit("observed burst"))
    )


def _stream_requests(
    per_choice: pl.DataFrame, chunks: pl.DataFrame, line_meta: pl.DataFrame, meta: _LineMeta, source: str
) -> pl.DataFrame:
    is_content = pl.col("piece").fill_null("") != ""  # a chunk whose delta carries text
    acc = (
        per_choice.with_columns(content=is_content)
        .group_by("line", "index")
        .agg(
            n=pl.col("n_entries").sum(),
            text=pl.col("piece").filter(pl.col("content")).str.join(""),
            n_content=pl.col("content").sum().cast(pl.Int64),
            first_t=pl.col("t").filter(pl.col("content")).drop_nulls().first(),
            last_t=pl.col("t").filter(pl.col("content")).last(),
            n_timed=pl.col("t").filter(pl.col("content")).count(),
            distinct_t=pl.col("t").filter(pl.col("content")).drop_nulls().n_unique(),
            last_known_t=pl.col("t").filter(pl.col("content")).drop_nulls().last(),
            finish=pl.col("finish").filter(pl.col("finish").fill_null("") != "").last(),
        )
        .sort("line", "index")
    )
    has_usage = pl.any_horizontal(pl.col("u_prompt", "u_completion", "u_total").is_not_null())
    per_line = (
        chunks.group_by("line")
        .agg(
            request_id=pl.col("id").drop_nulls().last(),
            model=pl.col("model").drop_nulls().last(),
            declared=pl.col("stream_mode").drop_nulls().first(),
            u_prompt=pl.col("u_prompt").filter(has_usage).last(),
            u_completion=pl.col("u_completion").filter(has_usage).last(),
            u_total=pl.col("u_total").filter(has_usage).last(),
            timings=pl.col("timings")
            .filter(_timed())
            .last(),  # the general path keeps the last chunk's that has one of them
        )
        .sort("line")
    )
    usages = per_line.select(
        prompt_tokens="u_prompt", completion_tokens="u_completion", total_tokens="u_total"
    ).to_dicts()
    per_line = per_line.with_columns(
        extra=pl.Series(
            [_extra_json(base, u, t) for base, u, t in zip(meta.extra, usages, per_line["timings"].to_list())],
            dtype=pl.String,
        )
    )
    n_indices = acc.group_by("line").len("n_indices")
    frame = acc.join(n_indices, on="line").join(per_line, on="line").join(line_meta, on="line").sort("line", "index")
    single = pl.col("n_indices") == 1
    if frame.filter(
        single & pl.col("u_completion").is_not_null() & (pl.col("n") > 0) & (pl.col("n") != pl.col("u_completion"))
    ).height:
        raise _Unsupported("usage disagrees with the logprob entries")
    return _envelope_requests(
        frame,
        source,
        "openai_chat_sse",
        stream=True,
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
        stream_live=pl.when(_liveness().is_in(["declared live", "observed live"]))
        .then(True)
        .when(_liveness() != "untimed")
        .then(False),
    )
