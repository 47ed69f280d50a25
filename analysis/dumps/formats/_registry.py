"""The formats bia reads and how one is detected: file suffixes, payload shapes, stream shapes; and one payload's
text handed to its format's parser.

Both the general reader (``_capture``, ``dumps/_read``) and the columnar fast path (``_capture_fast``) stand on this
module, so neither needs the other's internals. The capture envelope's keys are ``dumps/_envelope``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _json
from .._kit import Meta
from .._schema import Rows
from .._sse import parse_sse
from .._values import DumpError
from ._native import parse_llamacpp, parse_primerl, parse_sglang, parse_tgi
from ._offline import looks_like_steps, parse_offline, parse_repr
from ._openai import parse_chat, parse_completion
from ._responses import parse_responses_stream
from ._streams import parse_chat_stream, parse_llamacpp_stream, parse_sglang_stream

DUMP_SUFFIXES = (".json", ".jsonl", ".ndjson", ".sse", ".pt", ".pth")

# Parsers of one JSON payload, by format name.
PAYLOAD_PARSERS: dict[str, Callable] = {
    "openai_chat": parse_chat,
    "openai_completion": parse_completion,
    "vllm_generate": parse_chat,
    "sglang": parse_sglang,
    "llamacpp": parse_llamacpp,
    "tgi": parse_tgi,
    "primerl": parse_primerl,
    "vllm_offline": parse_offline,
}


STREAM_FORMATS = ("openai_chat_sse", "openai_completion_sse", "llamacpp_sse", "sglang_sse", "openai_responses_sse")


FORMATS = (*PAYLOAD_PARSERS, *STREAM_FORMATS, "vllm_offline_repr", "jsonl", "torch")


def payload_formats(payload: Any) -> list[str]:
    """Every format whose shape ``payload`` has; one means detected, several mean ambiguous.

    Parameters
    ----------
    payload : object
        A parsed JSON document.

    Returns
    -------
    list of str

    Examples
    --------
    >>> payload_formats({"meta_info": {"output_token_logprobs": []}})
    ['sglang']
    >>> payload_formats({"choices": [{"message": {}, "logprobs": None}]})
    ['openai_chat']
    >>> payload_formats({"object": "chat.completion", "choices": [{"message": {}, "token_ids": [7]}]})  # vLLM's return_token_ids
    ['openai_chat']
    >>> payload_formats({"choices": [{"token_ids": [7], "logprobs": None}]})  # vLLM's /inference/v1/generate
    ['vllm_generate']
    """
    if isinstance(payload, list) and len(payload) == 1 and isinstance(payload[0], dict) and "details" in payload[0]:
        return ["tgi"]
    if looks_like_steps(payload):
        return ["vllm_offline"]
    if not isinstance(payload, dict):
        return []
    found = []
    if isinstance(payload.get("meta_info"), dict):
        found.append("sglang")
    if isinstance(payload.get("details"), dict) and ("generated_text" in payload or "tokens" in payload["details"]):
        found.append("tgi")
    if "schema_version" in payload and ("inference_logprobs" in payload or "trainer_logprobs" in payload):
        found.append("primerl")
    if "completion_probabilities" in payload or ("tokens_predicted" in payload and "content" in payload):
        found.append("llamacpp")
    found.extend(_choices_formats(payload))
    return found


def _choices_formats(payload: dict) -> list[str]:
    choices = payload.get("choices")
    if not isinstance(choices, list):
        return []
    if not choices:
        if payload.get("object") == "chat.completion":  # vLLM's carries "prompt_logprobs" (null unless asked for)
            return ["openai_chat"]
        return ["vllm_generate"] if payload.get("prompt_logprobs") is not None else []
    first = choices[0] if isinstance(choices[0], dict) else {}
    logprobs = first["logprobs"] if isinstance(first.get("logprobs"), dict) else {}
    legacy = payload.get("object") == "text_completion" or "text" in first
    chat = payload.get("object") == "chat.completion" or "message" in first
    if (first.get("token_ids") is not None or "compact_logprobs" in first) and not legacy and not chat:
        return ["vllm_generate"]  # vLLM's chat and legacy completions carry token_ids too (null unless asked for)
    if legacy or "tokens" in logprobs:
        return ["openai_completion"]
    if chat or "content" in logprobs or "nvext" in payload:
        return ["openai_chat"]
    return []


def _stream_format(text: str, source: str, record: str = "record 0") -> str:
    """Which stream an SSE capture is, from its first JSON event; ``record`` names the capture in errors."""
    for event in parse_sse(text).events:
        if event.data == "[DONE]":
            continue
        try:
            chunk = _json.loads_payload(event.data)
        except (
            _json.NestingError,
            _json.DuplicateKeyError,
        ) as exc:  # JSON, refused: say so rather than "no known stream"
            raise DumpError(source, f"{record} event {event.index} (line {event.line})", *_json.refusal(exc)) from None
        except ValueError:
            continue
        if isinstance(chunk, dict):
            if "completion_probabilities" in chunk or "stop" in chunk:
                return "llamacpp_sse"
            if isinstance(chunk.get("meta_info"), dict):
                return "sglang_sse"
            if isinstance(chunk.get("type"), str) and chunk["type"].startswith("response."):
                return "openai_responses_sse"
            if chunk.get("object") == "text_completion" or any(
                isinstance(c, dict) and "text" in c for c in chunk.get("choices") or []
            ):
                return "openai_completion_sse"
            if "choices" in chunk:
                return "openai_chat_sse"
    raise DumpError(
        source, "$", None, f"an SSE capture whose events match no known stream; known: {', '.join(STREAM_FORMATS)}"
    )


def _looks_sse(text: str) -> bool:
    head = text.lstrip("\ufeff \t\r\n")[:64]
    return head.startswith(("data:", "event:", ": ", "id:", "retry:"))


def detect_format(raw: bytes, source: str) -> str:
    """The format of one source's bytes. Unknown or ambiguous content is a ``DumpError`` naming the candidates.

    Parameters
    ----------
    raw : bytes
        The source's content.
    source : str
        Its name (a ``.pt``, ``.pth``, ``.jsonl`` or ``.ndjson`` suffix counts).

    Returns
    -------
    str
        One of ``FORMATS``.
    """
    if raw[:2] == b"PK" or raw[:1] == b"\x80" or str(source).endswith((".pt", ".pth")):
        return "torch"
    text = utf8_text(raw, source)
    if not text.strip():
        if str(source).endswith((".jsonl", ".ndjson")):
            return "jsonl"  # no line, no record: a capture file before its first response
        raise DumpError(source, "$", None, "an empty file")
    if _looks_sse(text):
        return _stream_format(text, source)
    try:
        payload = _json.loads_payload(text)
    except (_json.NestingError, _json.DuplicateKeyError) as exc:
        if not _first_line_is_json(text):  # one (pretty-printed) document: its refusal is the answer
            raise DumpError(source, "$", *_json.refusal(exc)) from None
        return "jsonl"  # lines of JSON: each is read (and refused) on its own line
    except ValueError as exc:
        if "Logprob(" in text[:65536]:
            return "vllm_offline_repr"
        if _first_line_is_json(text):
            return "jsonl"
        if text.lstrip()[:1] in ("{", "[") and getattr(exc, "msg", None) != "Extra data":
            # one JSON document that breaks off (a dump cut short): where it breaks is the answer; after a whole first
            # value ("Extra data") it is lines of JSON that bia cannot split, which the words below say
            raise DumpError(source, "$", *_json.refusal(exc)) from None
        raise DumpError(source, "$", None, "neither JSON, JSON lines, SSE nor a torch file") from None
    if isinstance(payload, dict) and ("response" in payload or "sse" in payload):
        return "jsonl"  # one capture envelope: a JSON-lines file of one line
    return _one_format(payload_formats(payload), source, "$")


def _first_line_is_json(text: str) -> bool:
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        _json.loads_payload(first)
    except (_json.NestingError, _json.DuplicateKeyError):
        return True  # JSON all the same; the line's own reading names the refusal
    except ValueError:
        return False
    return True


def _one_format(found: list[str], source: str, where: str) -> str:
    if len(found) == 1:
        return found[0]
    if not found:
        raise DumpError(source, where, None, f"matches no known dump format; known: {', '.join(FORMATS)}")
    raise DumpError(source, where, None, f"is ambiguous: it matches {', '.join(found)}; pass format= to choose")


def utf8_text(raw: bytes, source: str) -> str:
    """A file's bytes as text, or a DumpError naming it when they are not UTF-8.

    Parameters
    ----------
    raw : bytes
        The file's content.
    source : str
        Its name, for the error.

    Returns
    -------
    str
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DumpError(source, "$", None, f"not UTF-8 text ({exc})") from None


def parse_payload_text(text: str, fmt: str, rows: Rows, meta: Meta, lenient: bool) -> None:
    """One payload's text (a stream, a printed offline repr, or one JSON document) parsed by its format's parser.

    Parameters
    ----------
    text : str
        The payload's text.
    fmt : str
        Its format (one of ``FORMATS``, not "jsonl" or "torch").
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context.
    lenient : bool
        Skip a broken stream event (listed in ``rows.skipped``) instead of failing.
    """
    if fmt == "vllm_offline_repr":
        parse_offline(parse_repr(text, rows.source), rows, meta)
        return
    if fmt in STREAM_FORMATS:
        if fmt == "llamacpp_sse":
            parse_llamacpp_stream(text, rows, meta, lenient=lenient)
        elif fmt == "sglang_sse":
            parse_sglang_stream(text, rows, meta, lenient=lenient)
        elif fmt == "openai_responses_sse":
            parse_responses_stream(text, rows, meta, lenient=lenient)
        else:
            parse_chat_stream(text, rows, meta, lenient=lenient, legacy=fmt == "openai_completion_sse")
        return
    try:
        payload = _json.loads_payload(text)
    except ValueError as exc:
        raise DumpError(rows.source, f"record {meta.record}", *_json.refusal(exc)) from None
    PAYLOAD_PARSERS[fmt](payload, rows, meta, "$" if meta.record == 0 else f"line {meta.record}")
