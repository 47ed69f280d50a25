"""The entry, usage and timing helpers every JSON payload parser shares: what a capture knows beyond its payload
(:class:`Meta`), checked field access, one logprob entry and its candidates into rows, ``usage`` and ``timings``.

Split out of the OpenAI parser (``formats/_openai``), which the native, offline and stream parsers leaned on
for these alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core import INT64_MAX, INT64_MIN
from ._schema import Rows
from ._values import DumpError, placeholder_id


@dataclass
class Meta:
    """What a capture knows beyond the payload: batch context and timing."""

    record: int = 0
    sample_key: str | None = None
    c: int | None = None
    slot: int | None = None
    prompt_id: str | None = None
    role: str | None = None
    repeat: int | None = None
    t_sent: float | None = None
    arrivals: list[float] | None = None  # per SSE event, seconds since the request was sent
    raw_sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def request_columns(self) -> dict[str, Any]:
        return {
            "record": self.record,
            "sample_key": self.sample_key,
            "c": self.c,
            "slot": self.slot,
            "prompt_id": self.prompt_id,
            "role": self.role,
            "repeat": self.repeat,
            "t_sent": self.t_sent,
            "raw_sha256": self.raw_sha256,
        }


def _obj(value: Any, rows: Rows, where: str, field_name: str | None = None) -> dict:
    if not isinstance(value, dict):
        raise DumpError(rows.source, where, field_name, f"expected a JSON object, got {type(value).__name__}")
    return value


def _list(value: Any, rows: Rows, where: str, field_name: str | None) -> list:
    if not isinstance(value, list):
        raise DumpError(rows.source, where, field_name, f"expected a list, got {type(value).__name__}")
    return value


def _str_or_none(value: Any, rows: Rows, where: str, field_name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise DumpError(rows.source, where, field_name, f"expected a string, got {type(value).__name__} {value!r:.60}")


def choice_index(choice: dict, position: int, rows: Rows, where: str) -> int:
    """A choice's ``index``, or its position when the engine omits it.

    Parameters
    ----------
    choice : dict
        One element of ``choices``.
    position : int
        Its position in the list.
    rows : Rows
        The rows being built (for the source's name in errors).
    where : str
        Where the choice is in the source, for error messages.

    Returns
    -------
    int
    """
    index = _int_or_none(choice.get("index"), rows, where, "index")
    return position if index is None else index


def _int_or_none(value: Any, rows: Rows, where: str, field_name: str, *, token_id: bool = False) -> int | None:
    """An integer that fits the 64-bit columns (with ``token_id``, a non-negative one), or None for null."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise DumpError(rows.source, where, field_name, f"expected an integer, got {value!r}")
    if token_id and not 0 <= value <= INT64_MAX:
        raise DumpError(rows.source, where, field_name, f"expected a token id (an integer 0..{INT64_MAX}), got {value}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise DumpError(rows.source, where, field_name, f"expected an integer that fits in 64 bits, got {value}")
    return value


def _placeholder(token: Any, rows: Rows, where: str, field_name: str) -> int | None:
    """The id of vLLM's ``token_id:N`` placeholder, refused when N is no token id; None for other tokens."""
    found = placeholder_id(token)
    if found is not None and not 0 <= found <= INT64_MAX:
        raise DumpError(
            rows.source, where, field_name, f"placeholder {token!r} holds no token id (an integer 0..{INT64_MAX})"
        )
    return found


# --- one entry of logprobs.content --------------------------------------------------------------


def _entry_identity(entry: dict, rows: Rows, where: str) -> tuple[int | None, str | None]:
    """(token_id, token_text) from ``id`` (llama.cpp) or a ``token_id:N`` placeholder (vLLM)."""
    token = entry.get("token")
    if token is not None and not isinstance(token, str):
        raise DumpError(rows.source, where, "token", f"expected a string, got {token!r}")
    token_id = _int_or_none(entry.get("id"), rows, where, "id", token_id=True)
    from_placeholder = _placeholder(token, rows, where, "token")
    if from_placeholder is not None:
        if token_id is not None and token_id != from_placeholder:
            raise DumpError(rows.source, where, "token", f"placeholder {token!r} disagrees with id {token_id}")
        return from_placeholder, None
    return token_id, token


def _entry_bytes(entry: dict, token: str | None, placeholder: bool, rows: Rows, where: str) -> bytes | None:
    raw = entry.get("bytes")
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255 for b in raw
    ):
        raise DumpError(rows.source, where, "bytes", "expected a list of integers 0..255")
    data = bytes(raw)
    if placeholder and token is not None and data == token.encode():
        return None  # vLLM gives the placeholder's own bytes here, not the token's
    return data


def _value_field(entry: dict) -> tuple[Any, str]:
    if "logprob" in entry:
        return entry["logprob"], "logprob"
    if "prob" in entry:
        return entry["prob"], "prob"
    return None, "missing"


def _candidates(entry: dict, rows: Rows, where: str) -> tuple[list[dict[str, Any]], str, str] | None:
    """The delivered candidate list of an entry, normalised, with its value kind."""
    for name, kind in (("top_logprobs", "logprob"), ("top_probs", "prob")):
        if name in entry and entry[name] is not None:
            out = []
            for k, cand in enumerate(_list(entry[name], rows, where, name)):
                cwhere = f"{where}.{name}[{k}]"
                cand = _obj(cand, rows, cwhere)
                cand_id, text = _entry_identity(cand, rows, cwhere)
                raw = cand.get("logprob" if kind == "logprob" else "prob")
                out.append(
                    {
                        "token_id": cand_id,
                        "token_text": text,
                        "token_bytes": _entry_bytes(
                            cand, cand.get("token"), placeholder_id(cand.get("token")) is not None, rows, cwhere
                        ),
                        "raw": raw,
                    }
                )
            return out, kind, name
    return None


def add_entry(
    rows: Rows,
    entry: Any,
    key: tuple[int, int, str, int],
    where: str,
    *,
    request_id: str | None,
    meta: Meta,
    known_id: int | None = None,
    stream_chunk: int | None = None,
    t_arrival: float | None = None,
    text_offset: int | None = None,
    support_size: int | None = None,
) -> None:
    """Append one ``logprobs.content`` entry and its candidates.

    Parameters
    ----------
    rows : Rows
        The rows being built.
    entry : object
        The ``logprobs.content`` entry as parsed (``token``, ``logprob`` or ``prob``, ``bytes``, ``top_logprobs``, ...).
    key : tuple of (int, int, str, int)
        (record, choice_index, segment, position).
    where : str
        Where the entry is in the source, for error messages.
    request_id : str or None
        The request's id.
    meta : Meta
        The capture's batch context (its ``sample_key`` is kept).
    known_id : int, optional
        The token id a parallel ``token_ids`` list gives; the entry's own id must agree with it.
    stream_chunk : int, optional
        The stream event that carried the token.
    t_arrival : float, optional
        When that event arrived, in seconds since the request was sent.
    text_offset : int, optional
        The token's character offset in the text.
    support_size : int, optional
        How many tokens the sampler could draw from at this step.
    """
    entry = _obj(entry, rows, where)
    token_id, text = _entry_identity(entry, rows, where)
    if known_id is not None:
        if token_id is not None and token_id != known_id:
            raise DumpError(
                rows.source, where, "token", f"token id {token_id} disagrees with token_ids[{key[3]}] = {known_id}"
            )
        token_id = known_id
    raw, kind = _value_field(entry)
    cands = _candidates(entry, rows, where)
    rows.token(
        key,
        where,
        raw=raw,
        kind="logprob" if kind == "missing" else kind,
        missing=kind == "missing",
        request_id=request_id,
        sample_key=meta.sample_key,
        token_id=token_id,
        token_text=text,
        token_bytes=_entry_bytes(
            entry, entry.get("token"), placeholder_id(entry.get("token")) is not None, rows, where
        ),
        n_candidates=None if cands is None else len(cands[0]),
        stream_chunk=stream_chunk,
        t_arrival=t_arrival,
        text_offset=text_offset,
        support_size=support_size,
        logprob_semantics="post_sampler" if kind == "prob" else "unknown",
    )
    if cands:
        entries, cand_kind, _ = cands
        rows.candidates_for(
            key, f"{where}", entries, list_kind="top_logprobs", sampled_id=token_id, sampled_text=text, kind=cand_kind
        )


USAGE_FIELDS = ("completion_tokens", "prompt_tokens", "total_tokens")


def usage_counts(usage: Any) -> dict | None:
    """The token counts of a ``usage`` object (the part every engine shares), or None.

    Parameters
    ----------
    usage : object
        A response's ``usage``, as parsed; anything else than an object gives None.

    Returns
    -------
    dict or None
    """
    if not isinstance(usage, dict):
        return None
    kept = {k: usage[k] for k in USAGE_FIELDS if usage.get(k) is not None}
    return kept or None


TIMING_FIELDS = (
    "predicted_n",
    "predicted_ms",
    "predicted_per_second",
)  # llama.cpp's (and bia serve's) decode timing of one request


def server_timings(timings: Any, source: str, where: str) -> dict | None:
    """The decode part of a server's per-request ``timings`` (llama.cpp's fields, which bia serve also sends), or None
    without one: counts as int, times and rates as float, so that every reader writes the same ``extra``.

    Parameters
    ----------
    timings : object
        The response's ``timings``, as parsed (None when it has none).
    source : str
        The source's name, for error messages.
    where : str
        Where the response is in the source, for error messages.

    Returns
    -------
    dict or None

    Examples
    --------
    >>> server_timings({"prompt_n": 18, "predicted_n": 64, "predicted_ms": 20.558, "predicted_per_second": 3064.5}, "f.jsonl", "record 0")
    {'predicted_n': 64, 'predicted_ms': 20.558, 'predicted_per_second': 3064.5}
    >>> server_timings({"predicted_ms": "fast"}, "f.jsonl", "record 0")
    Traceback (most recent call last):
    analysis.DumpError: f.jsonl: record 0.timings.predicted_ms: expected a number, got 'fast'
    """
    if timings is None:
        return None
    if not isinstance(timings, dict):
        raise DumpError(source, where, "timings", f"expected an object, got {timings!r}")
    kept = {}
    for name in TIMING_FIELDS:
        value = timings.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DumpError(source, where, f"timings.{name}", f"expected a number, got {value!r}")
        kept[name] = int(value) if name == "predicted_n" else float(value)
    return kept or None
