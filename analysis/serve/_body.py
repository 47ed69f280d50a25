"""What a chat completion request may ask of ``bia serve``: its body checked, each refusal a 400 naming the field.

The body is strict JSON (no nesting past the limit, no repeated key); greedy decoding only (temperature 0,
one choice), 1 to 4096 tokens, at most ``MAX_TOP_LOGPROBS`` top logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import StrictJsonError, first_duplicate, loads_strict
from ._engine import MAX_TOP_LOGPROBS


class _BadRequest(ValueError):
    """A request body this server refuses (400); ``param`` names the offending field, as OpenAI's errors do."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class _Params:
    """What a chat completion request asks of this server."""

    content: str
    max_tokens: int
    top_k: int
    logprobs: bool
    stream: bool
    include_usage: bool


def _json_body(raw: bytes) -> dict:
    """The body as a strict JSON object (``_strictjson``: no nesting past its limit, no repeated key)."""
    try:
        body = loads_strict(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _BadRequest("the body is not UTF-8 text") from None
    except StrictJsonError as exc:
        raise _BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    repeated = first_duplicate(body)
    if repeated is not None:
        raise _BadRequest(f"the body names {repeated} more than once", repeated)
    return body


def _optional(body: dict, key: str, kind: type, default: Any) -> Any:
    """``body[key]`` when present and not null, of type ``kind`` (a bool is no int here)."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _BadRequest(f"{key} must be {'a boolean' if kind is bool else 'an integer'}", key)
    return value


def _messages_content(body: dict) -> str:
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)
    ):
        raise _BadRequest("messages must be a non-empty list of {role, content}", "messages")
    return messages[-1]["content"]


def _params(raw: bytes) -> _Params:
    """Check a chat completion body; every refusal is a ``_BadRequest``."""
    body = _json_body(raw)
    content = _messages_content(body)
    temperature = body.get("temperature", 0)
    if isinstance(temperature, bool) or temperature not in (0, 0.0):
        raise _BadRequest("this server decodes greedily: temperature must be 0", "temperature")
    if _optional(body, "n", int, 1) != 1:  # one greedy choice: more would be copies of it
        raise _BadRequest("this server returns one greedy choice: n must be 1", "n")
    max_tokens = _optional(body, "max_tokens", int, 64)
    if not 1 <= max_tokens <= 4096:
        raise _BadRequest("max_tokens must be 1..4096", "max_tokens")
    top_k = _optional(body, "top_logprobs", int, 0)
    if not 0 <= top_k <= MAX_TOP_LOGPROBS:
        raise _BadRequest(f"top_logprobs must be 0..{MAX_TOP_LOGPROBS}", "top_logprobs")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _BadRequest("stream_options must be an object", "stream_options")
    return _Params(
        content,
        max_tokens,
        top_k,
        _optional(body, "logprobs", bool, False),
        _optional(body, "stream", bool, False),
        _optional(options or {}, "include_usage", bool, False),
    )
