"""OpenAI-shaped payloads: chat completions, legacy completions, and vLLM's token-in/token-out
``/inference/v1/generate``, non-streamed and streamed. llama.cpp's OpenAI endpoints share them
(entries carry ``id``; with ``post_sampling_probs`` they carry ``prob``/``top_probs``)."""

from __future__ import annotations

from typing import Any

from .._kit import Meta, _list, _obj, _str_or_none, choice_index, server_timings, usage_counts
from .._masks import validate_routed_experts
from .._schema import Rows
from .._values import DumpError
from ._openai_tokens import _parse_choice_tokens, parse_legacy_logprobs, parse_prompt_logprobs

# --- chat completions -------------------------------------------------------------------------------


def _usage(payload: dict) -> tuple[int | None, int | None, dict | None]:
    usage = usage_counts(payload.get("usage"))
    if usage is None:
        return None, None, None
    return usage.get("prompt_tokens"), usage.get("completion_tokens"), usage


def _check_usage(
    rows: Rows, where: str, n_choices: int, completion_tokens: int | None, scored: int, has_logprobs: bool
) -> None:
    # no entry at all is logprobs not recorded (evidence missing, which the verdict counts), not a disagreement
    if n_choices == 1 and has_logprobs and scored and completion_tokens is not None and completion_tokens != scored:
        raise DumpError(
            rows.source,
            where,
            "usage.completion_tokens",
            f"says {completion_tokens} tokens but logprobs hold {scored} entries",
        )


def parse_chat(payload: Any, rows: Rows, meta: Meta, where: str = "$") -> None:
    """A non-streamed chat completion (``object: chat.completion``), or vLLM's generate response.

    Parameters
    ----------
    payload : object
        The parsed JSON document.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context and timing (record number, sample key, arrivals, ...).
    where : str, default "$"
        Where the payload is in the source, for error messages.
    """
    payload = _obj(payload, rows, where)
    if "error" in payload and "choices" not in payload:
        raise DumpError(rows.source, where, "error", f"the server answered with an error: {payload['error']!r}")
    choices = _list(payload.get("choices"), rows, where, "choices")
    prompt_tokens, completion_tokens, usage = _usage(payload)
    request_id = _str_or_none(payload.get("id") or payload.get("request_id"), rows, where, "id")
    timings = server_timings(payload.get("timings"), rows.source, where)
    extra = {**({"usage": usage} if usage else {}), **({"timings": timings} if timings else {})}
    nvext_ids = ((payload.get("nvext") or {}).get("engine_data") or {}).get("completion_token_ids")
    if isinstance(payload.get("nvext"), dict) and payload["nvext"].get("routed_experts") is not None:
        extra["routed_experts"] = validate_routed_experts(
            payload["nvext"]["routed_experts"], rows, f"{where}.nvext.routed_experts"
        )
    for c, choice in enumerate(choices):
        cwhere = f"{where}.choices[{c}]"
        choice = _obj(choice, rows, cwhere)
        index = choice_index(choice, c, rows, cwhere)
        token_ids = choice.get("token_ids")  # null (vLLM's chat unless return_token_ids) is the same as absent
        if token_ids is None and len(choices) == 1:
            token_ids = nvext_ids
        scored = _parse_choice_tokens(choice, rows, meta, cwhere, index, request_id, token_ids)
        has_logprobs = choice.get("logprobs") is not None or choice.get("compact_logprobs") is not None
        _check_usage(rows, cwhere, len(choices), completion_tokens, scored, has_logprobs)
        choice_extra = dict(extra)
        if choice.get("routed_experts") is not None:
            choice_extra["routed_experts"] = validate_routed_experts(
                choice["routed_experts"], rows, f"{cwhere}.routed_experts"
            )
        message = choice.get("message") or {}
        rows.request(
            **meta.request_columns(),
            choice_index=index,
            request_id=request_id,
            model=payload.get("model"),
            endpoint=_chat_endpoint(payload, choice),
            stream=False,
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens if len(choices) == 1 else None,
            n_completion_scored=scored,
            n_prompt_scored=0,
            completion_text=message.get("content") if isinstance(message, dict) else None,
            extra={**meta.extra, **choice_extra},
        )
    if payload.get("prompt_logprobs") is not None:
        parse_prompt_logprobs(payload["prompt_logprobs"], rows, meta, f"{where}.prompt_logprobs", request_id)
        if not choices:
            endpoint = "chat" if payload.get("object") == "chat.completion" else "generate"
            rows.request(
                **meta.request_columns(),
                choice_index=0,
                request_id=request_id,
                model=payload.get("model"),
                endpoint=endpoint,
                stream=False,
                prompt_tokens=prompt_tokens,
                n_prompt_scored=len(payload["prompt_logprobs"]),
                n_completion_scored=0,
                extra={**meta.extra, **extra},
            )


def _chat_endpoint(payload: dict, choice: dict) -> str | None:
    """ "chat" for a chat completion (vLLM's carries ``token_ids`` too), "generate" for vLLM's ``/inference/v1/generate``.

    Examples
    --------
    >>> _chat_endpoint({"object": "chat.completion"}, {"message": {}, "token_ids": None, "routed_experts": None})
    'chat'
    >>> _chat_endpoint({"request_id": "r"}, {"token_ids": [7]})
    'generate'
    """
    if "message" in choice or payload.get("object") == "chat.completion":
        return "chat"
    if choice.get("token_ids") is not None or "compact_logprobs" in choice:
        return "generate"
    return None


# --- legacy completions -----------------------------------------------------------------------


def parse_completion(payload: Any, rows: Rows, meta: Meta, where: str = "$") -> None:
    """A non-streamed legacy completion (``object: text_completion``); with ``echo`` the prompt leads.

    Parameters
    ----------
    payload : object
        The parsed JSON document.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context and timing (record number, sample key, arrivals, ...).
    where : str, default "$"
        Where the payload is in the source, for error messages.
    """
    payload = _obj(payload, rows, where)
    choices = _list(payload.get("choices"), rows, where, "choices")
    prompt_tokens, completion_tokens, usage = _usage(payload)
    request_id = _str_or_none(payload.get("id"), rows, where, "id")
    for c, choice in enumerate(choices):
        cwhere = f"{where}.choices[{c}]"
        choice = _obj(choice, rows, cwhere)
        index = choice_index(choice, c, rows, cwhere)
        logprobs = choice.get("logprobs")
        scored = prompt_len = 0
        if logprobs is not None:
            logprobs = _obj(logprobs, rows, cwhere, "logprobs")
            if "content" in logprobs:  # llama.cpp's /v1/completions uses the chat shape
                scored = _parse_choice_tokens(choice, rows, meta, cwhere, index, request_id, None)
            else:
                n = len(logprobs.get("tokens") or [])
                echoed = (
                    prompt_tokens is not None
                    and completion_tokens is not None
                    and n == prompt_tokens + completion_tokens
                )
                prompt_len = prompt_tokens if echoed and prompt_tokens is not None else 0  # echoed: it is not None
                scored = (
                    parse_legacy_logprobs(
                        logprobs, rows, meta, f"{cwhere}.logprobs", index, request_id, prompt_len=prompt_len
                    )
                    - prompt_len
                )
        _check_usage(rows, cwhere, len(choices), completion_tokens, scored, logprobs is not None)
        text = choice.get("text")
        rows.request(
            **meta.request_columns(),
            choice_index=index,
            request_id=request_id,
            model=payload.get("model"),
            endpoint="completions",
            stream=False,
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens if len(choices) == 1 else None,
            n_prompt_scored=prompt_len,
            n_completion_scored=scored,
            completion_text=text if isinstance(text, str) else None,
            extra={**meta.extra, **({"usage": usage} if usage else {})},
        )
