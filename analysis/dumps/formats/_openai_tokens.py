"""A choice's scored tokens in OpenAI's shapes, which the chat, completion and stream parsers share: chat ``logprobs``
(``content``), vLLM's compact logprobs and sampling masks (their supports as candidates), vLLM's ``prompt_logprobs`` and
the legacy ``{tokens, token_logprobs, top_logprobs, text_offset}``. Split out of ``_openai``."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from .._kit import Meta, _int_or_none, _list, _obj, _placeholder, add_entry
from .._masks import decode_compact_logprobs, decode_sampling_mask
from .._schema import Rows, classified
from .._values import DumpError


def _parse_choice_tokens(choice: dict, rows: Rows, meta: Meta, where: str, index: int, request_id, token_ids) -> int:
    """Append the completion tokens of one choice; returns how many positions were scored."""
    if token_ids is not None:
        token_ids = _list(token_ids, rows, where, "token_ids")
        for j, tid in enumerate(token_ids):
            if _int_or_none(tid, rows, where, f"token_ids[{j}]", token_id=True) is None:
                raise DumpError(rows.source, where, f"token_ids[{j}]", "expected a token id, got null")
    logprobs = choice.get("logprobs")
    entries = None
    if logprobs is not None:
        logprobs = _obj(logprobs, rows, where, "logprobs")
        if "content" in logprobs:
            entries = (
                _list(logprobs["content"], rows, where, "logprobs.content") if logprobs["content"] is not None else []
            )
        elif "tokens" in logprobs:
            return parse_legacy_logprobs(logprobs, rows, meta, f"{where}.logprobs", index, request_id)
    compact = choice.get("compact_logprobs")
    if entries is not None and token_ids is not None and len(entries) != len(token_ids):
        raise DumpError(
            rows.source, where, "logprobs.content", f"holds {len(entries)} entries for {len(token_ids)} token_ids"
        )
    n = len(entries) if entries is not None else len(token_ids) if token_ids is not None else 0
    supports = _sampling_supports(choice, token_ids, n, rows, where)
    sizes = [None if row is None else len(row[0]) for row in supports] if supports is not None else [None] * n
    key0 = (meta.record, index, "completion")
    if entries is not None:
        for j, entry in enumerate(entries):
            add_entry(
                rows,
                entry,
                (*key0, j),
                f"{where}.logprobs.content[{j}]",
                request_id=request_id,
                meta=meta,
                known_id=None if token_ids is None else token_ids[j],
                support_size=sizes[j],
            )
    elif compact is not None:
        if token_ids is None:
            raise DumpError(rows.source, where, "token_ids", "compact_logprobs need the choice's token_ids")
        _add_compact(compact, token_ids, rows, meta, where, key0, request_id, sizes)
    else:
        for j, tid in enumerate(token_ids or []):
            rows.token(
                (*key0, j),
                where,
                raw=None,
                missing=True,
                request_id=request_id,
                sample_key=meta.sample_key,
                token_id=tid,
                support_size=sizes[j],
            )
    if supports is not None:
        _add_support_candidates(supports, token_ids, rows, f"{where}.{_mask_name(choice)}", key0)
    return n


def _add_compact(compact, token_ids, rows: Rows, meta: Meta, where: str, key0, request_id, sizes) -> None:
    """Compact rows, vectorized: a row holds the sampled id (first position wins, last value wins, as a dict)."""
    cwhere = f"{where}.compact_logprobs"
    ids, values, offsets = decode_compact_logprobs(compact, rows, cwhere)
    top_k = _int_or_none(compact.get("num_top_logprobs"), rows, cwhere, "num_top_logprobs")
    n = len(offsets) - 1
    if n != len(token_ids):
        raise DumpError(rows.source, cwhere, "offsets", f"hold {n} rows for {len(token_ids)} token_ids")
    lengths = np.diff(offsets)
    row_of = np.repeat(np.arange(n), lengths)
    sampled = np.asarray(token_ids, dtype=np.int64)
    match = ids == sampled[row_of]
    found = np.zeros(n, dtype=bool)
    found[row_of[match]] = True
    if not found.all():
        j = int(np.flatnonzero(~found)[0])
        raise DumpError(
            rows.source,
            f"{cwhere} row {j}",
            "ids",
            f"the sampled id {token_ids[j]} is missing from its row {ids[offsets[j] : offsets[j + 1]].tolist()}",
        )
    hits = np.flatnonzero(match)
    last = hits[np.r_[row_of[hits][1:] != row_of[hits][:-1], True]]
    record, choice, segment = key0
    common = {"source": rows.source, "record": record, "choice_index": choice, "segment": segment}
    tokens = pl.DataFrame(
        {
            "position": np.arange(n),
            "token_id": sampled,
            "raw_value": values[last],
            "n_candidates": lengths,
            "support_size": pl.Series(sizes, dtype=pl.Int64),
        }
    )
    rows.add_frame(
        "tokens",
        tokens.with_columns(
            *classified(pl.col("raw_value")),
            **{k: pl.lit(v) for k, v in common.items()},
            request_id=pl.lit(request_id, pl.String),
            sample_key=pl.lit(meta.sample_key, pl.String),
            top_k_requested=pl.lit(top_k, pl.Int64),
            value_kind=pl.lit("logprob"),
            logprob_semantics=pl.lit("unknown"),
            source_format=pl.lit(rows.source_format),
        ).rename({"status": "value_status"}),
    )
    key = pl.Series((row_of.astype(np.int64) << 32) | ids)
    candidates = pl.DataFrame(
        {
            "position": row_of,
            "list_index": np.arange(len(ids)) - offsets[row_of],
            "cand_token_id": ids,
            "cand_raw_value": values,
            "is_sampled": match,
            "is_duplicate": ~key.is_first_distinct(),
        }
    )
    rows.add_frame(
        "candidates",
        candidates.with_columns(
            *classified(pl.col("cand_raw_value"), "cand_"),
            **{k: pl.lit(v) for k, v in common.items()},
            list_kind=pl.lit("top_logprobs"),
        ),
    )


def _mask_name(choice: dict) -> str:
    return "sampling_mask" if choice.get("sampling_mask") is not None else "kept_tokens"


def _sampling_supports(choice: dict, token_ids, n: int, rows: Rows, where: str):
    """The decoded support rows of a sampling mask (``sampling_mask`` or ``kept_tokens``), checked, or None."""
    name = _mask_name(choice)
    if choice.get(name) is None:
        return None
    mwhere = f"{where}.{name}"
    support = decode_sampling_mask(choice[name], choice.get("sampling_mask_logprobs"), rows, mwhere)
    if len(support) != n:
        raise DumpError(rows.source, mwhere, None, f"holds {len(support)} rows for {n} completion tokens")
    for j, row in enumerate(support):
        sampled = token_ids[j] if token_ids is not None else None
        if row is not None and sampled is not None and sampled not in row[0]:
            raise DumpError(
                rows.source, f"{mwhere} row {j}", None, f"the sampled id {sampled} is missing from its support {row[0]}"
            )
    return support


def _add_support_candidates(supports, token_ids, rows: Rows, mwhere: str, key0) -> None:
    for j, row in enumerate(supports):
        if row is None:  # a count of 0: nothing recorded for this token
            continue
        ids, logprobs = row
        entries = [{"token_id": i, "raw": None if logprobs is None else logprobs[k]} for k, i in enumerate(ids)]
        rows.candidates_for(
            (*key0, j),
            f"{mwhere} row {j}",
            entries,
            list_kind="sampling_support",
            sampled_id=token_ids[j] if token_ids is not None else None,
            sampled_text=None,
        )


def parse_prompt_logprobs(prompt_logprobs: Any, rows: Rows, meta: Meta, where: str, request_id) -> None:
    """vLLM's ``prompt_logprobs``: per prompt position null or ``{"<id>": {logprob, rank, decoded_token}}``.

    The first entry of each dict is the prompt token itself (vLLM puts it first).

    Parameters
    ----------
    prompt_logprobs : object
        The list as parsed.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context.
    where : str
        Where the list is in the source, for error messages.
    request_id : str or None
        The response's id.
    """
    for p, step in enumerate(_list(prompt_logprobs, rows, where, "prompt_logprobs")):
        key = (meta.record, 0, "prompt", p)
        swhere = f"{where}[{p}]"
        if step is None:
            rows.token(key, swhere, raw=None, request_id=request_id, sample_key=meta.sample_key)
            continue
        step = _obj(step, rows, swhere)
        entries = []
        for token_key, info in step.items():
            if not token_key.lstrip("-").isdigit():
                raise DumpError(rows.source, swhere, token_key, "expected a token id as the key")
            info = _obj(info, rows, f"{swhere}.{token_key}")
            entries.append(
                {
                    "token_id": int(token_key),
                    "token_text": info.get("decoded_token"),
                    "raw": info.get("logprob"),
                    "vocab_rank": info.get("rank"),
                }
            )
        if not entries:
            raise DumpError(rows.source, swhere, None, "an empty prompt logprob step")
        first = entries[0]
        rows.token(
            key,
            swhere,
            raw=first["raw"],
            request_id=request_id,
            sample_key=meta.sample_key,
            token_id=first["token_id"],
            token_text=first["token_text"],
            vocab_rank=first["vocab_rank"],
            n_candidates=len(entries),
        )
        rows.candidates_for(
            key, swhere, entries, list_kind="top_logprobs", sampled_id=first["token_id"], sampled_text=None
        )


def parse_legacy_logprobs(
    logprobs: dict,
    rows: Rows,
    meta: Meta,
    where: str,
    index: int,
    request_id,
    *,
    start: int = 0,
    stream_chunk: int | None = None,
    t_arrival: float | None = None,
    prompt_len: int = 0,
) -> int:
    """``{tokens, token_logprobs, top_logprobs, text_offset}``; top_logprobs dicts are keyed by text.

    Parameters
    ----------
    logprobs : dict
        A choice's ``logprobs`` object.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context.
    where : str
        Where the object is in the source, for error messages.
    index : int
        The choice's index.
    request_id : str or None
        The response's id.
    start : int, default 0
        The position of its first token (a stream's chunks continue where the last one stopped).
    stream_chunk : int, optional
        The stream event that carried the tokens.
    t_arrival : float, optional
        When that event arrived, in seconds since the request was sent.
    prompt_len : int, default 0
        How many leading positions are the prompt's (with ``echo``); the rest are numbered from 0 in the completion.

    Returns
    -------
    int
        The position after the last token.
    """
    tokens = _list(logprobs.get("tokens"), rows, where, "tokens")
    values = _list(logprobs.get("token_logprobs"), rows, where, "token_logprobs")
    tops = logprobs.get("top_logprobs")
    offsets = logprobs.get("text_offset")
    for name, column in (("token_logprobs", values), ("top_logprobs", tops), ("text_offset", offsets)):
        if column is not None and len(column) != len(tokens):
            raise DumpError(rows.source, where, name, f"holds {len(column)} entries for {len(tokens)} tokens")
    for j, token in enumerate(tokens):
        position = start + j
        segment = "prompt" if position < prompt_len else "completion"
        key = (meta.record, index, segment, position if segment == "prompt" else position - prompt_len)
        twhere = f"{where}.tokens[{j}]"
        token_id = _placeholder(token, rows, where, f"tokens[{j}]")
        text = None if token_id is not None else token
        offset = None if offsets is None else _int_or_none(offsets[j], rows, where, f"text_offset[{j}]")
        top = None if tops is None or tops[j] is None else _obj(tops[j], rows, where, f"top_logprobs[{j}]")
        rows.token(
            key,
            twhere,
            raw=values[j],
            request_id=request_id,
            sample_key=meta.sample_key,
            token_id=token_id,
            token_text=text,
            text_offset=offset,
            stream_chunk=stream_chunk,
            t_arrival=t_arrival,
            n_candidates=None if top is None else len(top),
        )
        if top is not None:
            ids = [_placeholder(t, rows, where, f"top_logprobs[{j}]") for t in top]
            entries = [
                {"token_id": i, "token_text": None if i is not None else t, "raw": v}
                for i, (t, v) in zip(ids, top.items())
            ]
            rows.candidates_for(
                key,
                f"{where}.top_logprobs[{j}]",
                entries,
                list_kind="top_logprobs",
                sampled_id=token_id,
                sampled_text=text,
            )
    return len(tokens)
