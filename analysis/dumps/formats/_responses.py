"""OpenAI's Responses API stream: ``response.output_text.delta`` events carry the tokens and their logprobs, the done
and completed events repeat them (rounded), and ``response.completed`` carries the usage that the deltas are checked
against. Split out of ``_streams``, whose event reading and arrival times it shares."""

from __future__ import annotations

from .._kit import Meta, _list, _obj, _str_or_none, add_entry
from .._liveness import timing_columns
from .._schema import Rows
from .._sse import parse_sse
from .._values import DumpError
from ._streams import _arrival, _problem, stream_events

RESPONSES_ROUNDING = 1e-3  # the done and completed events repeat the deltas' logprobs, rounded


def parse_responses_stream(text: str, rows: Rows, meta: Meta, *, lenient: bool = False) -> None:
    """OpenAI's Responses API stream (OpenAI, vLLM ``/v1/responses``): typed events, no [DONE].

    The ``response.output_text.delta`` events carry each new token with its logprobs; they are read.
    ``response.output_text.done`` repeats them (rounded): checked for agreement, not read again.
    ``response.completed`` ends the stream and carries the usage, whose ``output_tokens`` counts the end-of-message
    token it never streams: that difference is recorded in ``extra`` (``usage_minus_entries``), not refused.

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
    events = stream_events(text, rows, meta, needs_done=False, lenient=lenient)
    n_events = len(parse_sse(text).events) if meta.arrivals is not None else 0
    n, pieces, times, entries = 0, [], [], []
    response: dict = {}
    completed = False
    for event, chunk in events:
        ewhere = f"record {meta.record} event {event.index} (line {event.line})"
        chunk = _obj(chunk, rows, ewhere)
        kind = chunk.get("type")
        t = _arrival(meta, event, rows, n_events)
        if isinstance(chunk.get("response"), dict):
            response = chunk["response"]
        if kind in ("response.failed", "error"):
            detail = response.get("error") if kind == "response.failed" else chunk.get("message", chunk)
            raise DumpError(rows.source, ewhere, "type", f"the server reported {kind}: {detail!r:.200}")
        completed = completed or kind == "response.completed"
        if kind == "response.output_text.delta":
            piece = _str_or_none(chunk.get("delta"), rows, ewhere, "delta")
            for k, entry in enumerate(_list(chunk.get("logprobs") or [], rows, ewhere, "logprobs")):
                add_entry(
                    rows,
                    entry,
                    (meta.record, 0, "completion", n),
                    f"{ewhere}.logprobs[{k}]",
                    request_id=response.get("id"),
                    meta=meta,
                    stream_chunk=event.index,
                    t_arrival=t,
                )
                entries.append(entry)
                n += 1
            if piece:
                pieces.append(piece)
                times.append(t)
        elif kind == "response.output_text.done" and chunk.get("logprobs") is not None:
            _check_copy(_list(chunk["logprobs"], rows, ewhere, "logprobs"), entries, rows, ewhere, lenient)
    if not completed:
        _problem(
            rows,
            lenient,
            DumpError(rows.source, f"record {meta.record}", None, "the stream ended without response.completed"),
        )
    usage = response["usage"] if isinstance(response.get("usage"), dict) else {}
    completion_tokens = usage.get("output_tokens")
    gap = {}
    if completion_tokens is not None and n and completion_tokens != n:
        gap = _unsent_end_of_message(completion_tokens, entries, "".join(pieces), response)
        if not gap:
            _problem(
                rows,
                lenient,
                DumpError(
                    rows.source,
                    f"record {meta.record}",
                    "usage.output_tokens",
                    f"says {completion_tokens} tokens but the stream carried {n} logprob entries",
                ),
            )
    incomplete = response.get("incomplete_details")
    finish = incomplete.get("reason") if isinstance(incomplete, dict) else response.get("status")
    rows.request(
        **meta.request_columns(),
        choice_index=0,
        request_id=response.get("id"),
        model=response.get("model"),
        endpoint="responses",
        stream=True,
        finish_reason=finish,
        prompt_tokens=usage.get("input_tokens"),
        completion_tokens=completion_tokens,
        n_prompt_scored=0,
        n_completion_scored=n,
        completion_text="".join(pieces),
        **timing_columns(None, times, n),
        extra={**meta.extra, **({"usage": usage} if usage else {}), **gap},
    )


END_OF_MESSAGE = "the end-of-message token: usage.output_tokens counts it, the stream never sends it"
REASONING = "reasoning tokens (usage.output_tokens_details.reasoning_tokens): counted, never streamed with logprobs"


def _unsent_end_of_message(counted: int, entries: list, text: str, response: dict) -> dict:
    """Tokens the Responses API counts in ``usage.output_tokens`` but streams no entry for: the message's end token
    (in a completed response) and a reasoning model's reasoning tokens (as many as ``usage.output_tokens_details``
    says). When the count is the entries plus exactly those, and the entries spell the whole text, the difference is
    recorded, not refused. Entries that were lost (llama.cpp held a byte token back) leave text they do not spell,
    and any other difference is no such token: those stay errors (``{}`` here).

    Examples
    --------
    >>> hi = [{"token": "Hi", "bytes": [72, 105]}]
    >>> _unsent_end_of_message(2, hi, "Hi", {"status": "completed"})["usage_minus_entries"]
    1
    >>> _unsent_end_of_message(2, hi, "Hi!", {"status": "completed"}), _unsent_end_of_message(3, hi, "Hi", {"status": "completed"})
    ({}, {})
    >>> thought = {"status": "completed", "usage": {"output_tokens_details": {"reasoning_tokens": 64}}}
    >>> _unsent_end_of_message(66, hi, "Hi", thought)["usage_minus_entries"], _unsent_end_of_message(65, hi, "Hi", thought)["usage_minus_entries"]
    (65, 64)
    >>> _unsent_end_of_message(67, hi, "Hi", thought)
    {}
    """
    usage = response["usage"] if isinstance(response.get("usage"), dict) else {}
    details = usage["output_tokens_details"] if isinstance(usage.get("output_tokens_details"), dict) else {}
    reasoning = details.get("reasoning_tokens")
    reasoning = reasoning if isinstance(reasoning, int) and not isinstance(reasoning, bool) and reasoning > 0 else 0
    end_token = int(response.get("status") == "completed")
    allowed = {reasoning + end_token: [REASONING] * bool(reasoning) + [END_OF_MESSAGE] * end_token}
    if reasoning:
        allowed[reasoning] = [REASONING]  # a reasoning model's count may leave the end token out
    reasons = allowed.get(counted - len(entries))
    if not reasons:
        return {}
    spelled = b"".join(
        bytes(e["bytes"]) if isinstance(e.get("bytes"), list) else (e.get("token") or "").encode() for e in entries
    )
    if spelled != text.encode():
        return {}
    said = "; and ".join(f"{reasoning} {REASONING}" if r == REASONING else r for r in reasons)
    return {"usage_minus_entries": counted - len(entries), "usage_minus_entries_reason": said}


def _check_copy(copy: list, entries: list, rows: Rows, where: str, lenient: bool) -> None:
    """The done event's logprobs repeat the deltas': the same tokens, values equal up to rounding."""
    same = len(copy) == len(entries) and all(
        isinstance(a, dict)
        and a.get("token") == b.get("token")
        and isinstance(a.get("logprob"), (int, float))
        and isinstance(b.get("logprob"), (int, float))
        and abs(a["logprob"] - b["logprob"]) <= RESPONSES_ROUNDING
        for a, b in zip(copy, entries)
    )
    if not same:
        _problem(
            rows,
            lenient,
            DumpError(
                rows.source,
                where,
                "logprobs",
                f"the done event's {len(copy)} logprobs disagree with the {len(entries)} the deltas carried",
            ),
        )
