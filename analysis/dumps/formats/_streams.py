"""Streamed captures: OpenAI chat and legacy completion chunks over SSE, llama.cpp's native
``/completion`` stream (no [DONE]; the last event says ``stop: true``), SGLang's streamed
``/generate`` (also lmdeploy's SGLang-style endpoint); and the event reading and arrival times that OpenAI's Responses API
stream (``_responses``) shares."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from .. import _json
from .._kit import Meta, _list, _obj, _str_or_none, add_entry, choice_index, server_timings, usage_counts
from .._liveness import timing_columns
from .._schema import Rows
from .._sse import Event, parse_sse
from .._values import DumpError
from ._openai_tokens import parse_legacy_logprobs


def _arrival(meta: Meta, event: Event, rows: Rows, n_events: int) -> float | None:
    if meta.arrivals is None:
        return None
    if not isinstance(meta.arrivals, list) or not all(
        t is None or (isinstance(t, (int, float)) and not isinstance(t, bool)) for t in meta.arrivals
    ):
        raise DumpError(
            rows.source,
            f"record {meta.record}",
            "arrival_times",
            f"expected a list of seconds (numbers or null), got {str(meta.arrivals)[:60]!r}",
        )
    if len(meta.arrivals) != n_events:
        raise DumpError(
            rows.source,
            f"record {meta.record}",
            "arrival_times",
            f"holds {len(meta.arrivals)} times for {n_events} events",
        )
    return meta.arrivals[event.index]


def stream_events(text: str, rows: Rows, meta: Meta, *, needs_done: bool, lenient: bool) -> list[tuple[Event, Any]]:
    """The JSON events of a capture, checked: cut mid-event, data after [DONE], no [DONE], error events.

    Parameters
    ----------
    text : str
        The SSE capture's text.
    rows : Rows
        The rows being built (problems are listed in ``rows.skipped`` when lenient).
    meta : Meta
        The capture's batch context (its record number names where).
    needs_done : bool
        The format ends with ``data: [DONE]``: a stream without one was cut.
    lenient : bool
        Skip a broken event instead of failing.

    Returns
    -------
    list of tuple of (Event, object)
        Each event with its parsed JSON.
    """
    stream = parse_sse(text)
    where = f"record {meta.record}"
    if stream.cut_mid_event:
        _problem(
            rows,
            lenient,
            DumpError(
                rows.source,
                f"{where} line {stream.trailing_line}",
                None,
                "the stream was cut mid-event (no blank line ends it)",
            ),
        )
    out: list[tuple[Event, Any]] = []
    done_at: Event | None = None
    for event in stream.events:
        ewhere = f"{where} event {event.index} (line {event.line})"
        if event.data == "[DONE]":
            if done_at is not None:
                _problem(rows, lenient, DumpError(rows.source, ewhere, None, "a second [DONE]"))
            done_at = done_at or event
            continue
        if done_at is not None:
            _problem(rows, lenient, DumpError(rows.source, ewhere, None, f"data after [DONE] (line {done_at.line})"))
            continue
        try:
            payload = _json.loads_payload(event.data)
        except _json.StrictJsonError as exc:
            _problem(rows, lenient, DumpError(rows.source, ewhere, *_json.refusal(exc)))
            continue
        except ValueError as exc:
            _problem(rows, lenient, DumpError(rows.source, ewhere, None, f"event data is not JSON: {exc}"))
            continue
        if event.event == "error" or (isinstance(payload, dict) and "error" in payload and "choices" not in payload):
            raise DumpError(
                rows.source,
                ewhere,
                "error",
                f"the server sent an error event: {payload.get('error', payload) if isinstance(payload, dict) else payload!r}",
            )
        out.append((event, payload))
    if needs_done and done_at is None:
        _problem(rows, lenient, DumpError(rows.source, where, None, "the stream ended without [DONE]"))
    return out


def _problem(rows: Rows, lenient: bool, error: DumpError) -> None:
    if not lenient:
        raise error
    rows.skipped.append(error)


class _Choice:
    """What accumulates for one choice across chunks."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.n = 0
        self.finish_reason: str | None = None
        self.content_times: list[float | None] = []  # arrival of each chunk that carried text


def parse_chat_stream(text: str, rows: Rows, meta: Meta, *, lenient: bool = False, legacy: bool = False) -> None:
    """An SSE capture of chat (``delta``) or legacy completion (``text``) chunks.

    Parameters
    ----------
    text : str
        The SSE capture's text.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context and timing (record number, arrival times of the events, ...).
    lenient : bool, default False
        Skip a broken event (listed in ``rows.skipped``) instead of failing.
    legacy : bool, default False
        Legacy completion chunks (``choices[].text``, ``logprobs.tokens``) rather than chat ``delta`` ones.
    """
    events = stream_events(text, rows, meta, needs_done=True, lenient=lenient)
    n_events = len(parse_sse(text).events) if meta.arrivals is not None else 0
    choices: dict[int, _Choice] = {}
    model = request_id = usage = timings = None
    declared = live_seen = None
    for event, chunk in events:
        ewhere = f"record {meta.record} event {event.index} (line {event.line})"
        chunk = _obj(chunk, rows, ewhere)
        t = _arrival(meta, event, rows, n_events)
        model = _str_or_none(chunk.get("model", model), rows, ewhere, "model")
        request_id = _str_or_none(chunk.get("id", request_id), rows, ewhere, "id")
        if not live_seen and "stream_mode" in chunk:
            declared, live_seen = chunk["stream_mode"], True
        if usage_counts(chunk.get("usage")) is not None:
            usage = usage_counts(chunk["usage"])
        timings = (
            server_timings(chunk.get("timings"), rows.source, ewhere) or timings
        )  # llama.cpp's and bia serve's, in the last chunk
        for c, choice in enumerate(_list(chunk.get("choices", []), rows, ewhere, "choices")):
            cwhere = f"{ewhere}.choices[{c}]"
            choice = _obj(choice, rows, cwhere)
            index = choice_index(choice, c, rows, cwhere)
            acc = choices.setdefault(index, _Choice())
            delta = _obj(choice.get("delta") or {}, rows, cwhere, "delta")
            piece = _str_or_none(
                choice.get("text") if legacy else delta.get("content"),
                rows,
                cwhere,
                "text" if legacy else "delta.content",
            )
            if piece:
                acc.text.append(piece)
                acc.content_times.append(t)
            acc.finish_reason = choice.get("finish_reason") or acc.finish_reason
            logprobs = choice.get("logprobs")
            if logprobs is None:
                continue
            logprobs = _obj(logprobs, rows, cwhere, "logprobs")
            if "tokens" in logprobs:
                acc.n += parse_legacy_logprobs(
                    logprobs,
                    rows,
                    meta,
                    f"{cwhere}.logprobs",
                    index,
                    request_id,
                    start=acc.n,
                    stream_chunk=event.index,
                    t_arrival=t,
                )
                continue
            for entry in _list(logprobs.get("content") or [], rows, cwhere, "logprobs.content"):
                add_entry(
                    rows,
                    entry,
                    (meta.record, index, "completion", acc.n),
                    f"{cwhere}.logprobs.content[{acc.n}]",
                    request_id=request_id,
                    meta=meta,
                    stream_chunk=event.index,
                    t_arrival=t,
                )
                acc.n += 1
    completion_tokens = usage.get("completion_tokens") if usage else None
    if len(choices) == 1 and completion_tokens is not None:
        only = next(iter(choices.values()))
        if only.n and only.n != completion_tokens:
            _problem(
                rows,
                lenient,
                DumpError(
                    rows.source,
                    f"record {meta.record}",
                    "usage.completion_tokens",
                    f"says {completion_tokens} tokens but the stream carried {only.n} logprob entries",
                ),
            )
    for index, acc in sorted(choices.items()):
        rows.request(
            **meta.request_columns(),
            choice_index=index,
            request_id=request_id,
            model=model,
            endpoint="completions" if legacy else "chat",
            stream=True,
            finish_reason=acc.finish_reason,
            prompt_tokens=usage.get("prompt_tokens") if usage else None,
            completion_tokens=completion_tokens if len(choices) == 1 else None,
            n_prompt_scored=0,
            n_completion_scored=acc.n,
            completion_text="".join(acc.text),
            **timing_columns(declared, acc.content_times, acc.n),
            extra={**meta.extra, **({"usage": usage} if usage else {}), **({"timings": timings} if timings else {})},
        )


def parse_llamacpp_stream(text: str, rows: Rows, meta: Meta, *, lenient: bool = False) -> None:
    """llama.cpp's native ``/completion`` stream: one JSON object per event, the last with ``stop: true``.

    Parameters
    ----------
    text : str
        The SSE capture's text.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context and timing (record number, arrival times of the events, ...).
    lenient : bool, default False
        Skip a broken event (listed in ``rows.skipped``) instead of failing.
    """
    from ._native import add_llamacpp_probabilities

    events = stream_events(text, rows, meta, needs_done=False, lenient=lenient)
    n_events = len(parse_sse(text).events) if meta.arrivals is not None else 0
    n, pieces, last, times = 0, [], None, []
    for event, chunk in events:
        ewhere = f"record {meta.record} event {event.index} (line {event.line})"
        chunk = _obj(chunk, rows, ewhere)
        t = _arrival(meta, event, rows, n_events)
        pieces.append(_str_or_none(chunk.get("content"), rows, ewhere, "content") or "")
        if pieces[-1]:
            times.append(t)
        probs = chunk.get("completion_probabilities")
        if probs:
            n = add_llamacpp_probabilities(
                probs, rows, meta, f"{ewhere}.completion_probabilities", start=n, stream_chunk=event.index, t_arrival=t
            )
        last = chunk
    if last is None or last.get("stop") is not True:
        _problem(
            rows,
            lenient,
            DumpError(rows.source, f"record {meta.record}", "stop", "the stream ended before an event with stop: true"),
        )
    last = last or {}
    rows.request(
        **meta.request_columns(),
        choice_index=0,
        model=last.get("model"),
        endpoint="completion",
        stream=True,
        finish_reason=last.get("stop_type"),
        prompt_tokens=last.get("tokens_evaluated"),
        completion_tokens=last.get("tokens_predicted"),
        n_prompt_scored=0,
        n_completion_scored=n,
        completion_text="".join(pieces),
        **timing_columns(None, times, n),
        extra={**meta.extra, **({"timings": last["timings"]} if "timings" in last else {})},
    )


def parse_sglang_stream(text: str, rows: Rows, meta: Meta, *, lenient: bool = False) -> None:
    """SGLang's streamed ``/generate``: events ``{"text", "output_ids", "meta_info": {...}}``, then [DONE].

    SGLang resends the whole ``output_token_logprobs`` (and ``text``) in every event by default;
    lmdeploy's SGLang-style endpoint sends only the new tokens. A stream is read as resent when
    every event's list starts with the one before and some event adds to it; each token then
    counts once, at the event that first carried it.

    Parameters
    ----------
    text : str
        The SSE capture's text.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context and timing (record number, arrival times of the events, ...).
    lenient : bool, default False
        Skip a broken event (listed in ``rows.skipped``) instead of failing.
    """
    from ._native import add_sglang_token

    events = stream_events(text, rows, meta, needs_done=True, lenient=lenient)
    n_events = len(parse_sse(text).events) if meta.arrivals is not None else 0
    steps = []  # (event, info, where) of each event
    for event, chunk in events:
        ewhere = f"record {meta.record} event {event.index} (line {event.line})"
        chunk = _obj(chunk, rows, ewhere)
        steps.append((event, chunk, _obj(chunk.get("meta_info"), rows, ewhere, "meta_info"), ewhere))
    lists = [
        _list(info.get("output_token_logprobs") or [], rows, ewhere, "meta_info.output_token_logprobs")
        for _, _, info, ewhere in steps
    ]
    resent = all(len(b) >= len(a) and b[: len(a)] == a for a, b in pairwise(lists)) and any(
        a and len(b) > len(a) for a, b in pairwise(lists)
    )
    n = 0
    times: list[float | None] = []
    texts: list[str] = []
    info: dict[str, Any] = {}
    request_id = None
    for (event, chunk, info, ewhere), triples in zip(steps, lists):
        t = _arrival(meta, event, rows, n_events)
        request_id = info.get("id", request_id)
        new = triples[n:] if resent else triples
        tops = info.get("output_top_logprobs")
        if tops is not None and len(_list(tops, rows, ewhere, "meta_info.output_top_logprobs")) != len(triples):
            raise DumpError(
                rows.source,
                ewhere,
                "meta_info.output_top_logprobs",
                f"holds {len(tops)} positions for {len(triples)} tokens",
            )
        new_tops = (tops[n:] if resent else tops) if tops is not None else [None] * len(new)
        for k, (triple, top) in enumerate(zip(new, new_tops)):
            at = (n if resent else 0) + k
            add_sglang_token(
                rows,
                meta,
                (meta.record, 0, "completion", n + k),
                f"{ewhere}.meta_info.output_token_logprobs[{at}]",
                triple,
                top,
                f"{ewhere}.meta_info.output_top_logprobs[{at}]",
                request_id,
                stream_chunk=event.index,
                t_arrival=t,
            )
        piece = _str_or_none(chunk.get("text"), rows, ewhere, "text")
        if piece is not None:
            texts = [piece] if resent else [*texts, piece]
        if new:
            n += len(new)
            times.append(t)
    completion_tokens = info.get("completion_tokens")
    if completion_tokens is not None and n and completion_tokens != n:
        _problem(
            rows,
            lenient,
            DumpError(
                rows.source,
                f"record {meta.record}",
                "meta_info.completion_tokens",
                f"says {completion_tokens} tokens but the stream carried {n} logprob entries",
            ),
        )
    finish = info.get("finish_reason")
    rows.request(
        **meta.request_columns(),
        choice_index=0,
        request_id=request_id,
        endpoint="generate",
        stream=True,
        finish_reason=finish.get("type") if isinstance(finish, dict) else finish,
        prompt_tokens=info.get("prompt_tokens"),
        completion_tokens=completion_tokens,
        n_prompt_scored=0,
        n_completion_scored=n,
        completion_text="".join(texts),
        **timing_columns(None, times, n),
        extra={**meta.extra, "resent": resent},
    )
