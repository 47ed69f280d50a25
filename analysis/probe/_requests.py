"""The probe's request and its HTTP client: the greedy chat body with the engine's extras, the server's addresses from the URL
given, and a client that holds a band's c connections at once."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx

from ._engines import PROFILES, EngineProfile


def request_body(
    prompt: str,
    *,
    max_tokens: int,
    top_logprobs: int,
    seed: int = 0,
    profile: EngineProfile | None = None,
    model: str | None = None,
    logprobs: bool = True,
) -> dict[str, Any]:
    """The greedy request aprender's probe sends, with the engine's extras.

    Temperature 0, a seed, ``max_tokens``, streamed with usage, logprobs with ``top_logprobs``
    candidates (left out when ``logprobs`` is false: the observer-effect twin), plus what the
    engine profile adds (``ignore_eos``; vLLM's ``return_tokens_as_token_ids``).

    Parameters
    ----------
    prompt : str
        The text of the one user message.
    max_tokens : int
        The completion's length.
    top_logprobs : int
        Candidates per step.
    seed : int, default 0
        The request's seed.
    profile : EngineProfile, optional
        The engine whose fields are added (``apr``'s by default: ``ignore_eos``).
    model : str, optional
        The model name to send; none is sent without it.
    logprobs : bool, default True
        Ask for logprobs; false for the observer twin (which then also leaves out ``return_tokens_as_token_ids``).

    Returns
    -------
    dict of str to object

    Examples
    --------
    >>> body = request_body("Hi", max_tokens=8, top_logprobs=5, profile=PROFILES["vllm"], model="m")
    >>> body["return_tokens_as_token_ids"], body["ignore_eos"], body["top_logprobs"], body["model"]
    (True, True, 5, 'm')
    >>> sorted(request_body("Hi", max_tokens=8, top_logprobs=5, logprobs=False))  # doctest: +NORMALIZE_WHITESPACE
    ['ignore_eos', 'max_tokens', 'messages', 'seed', 'stream', 'stream_options', 'temperature']
    """
    profile = profile or PROFILES["apr"]
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "seed": seed,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model is not None:
        body["model"] = model
    if logprobs:
        body.update({"logprobs": True, "top_logprobs": top_logprobs})
    body.update({k: v for k, v in profile.body.items() if logprobs or k != "return_tokens_as_token_ids"})
    return body


def _addresses(url: str) -> tuple[str, str, str | None]:
    """The server's base URL and its chat endpoint, from either of them, and a note when the URL named another endpoint
    (``/v1/completions``, ``/v1/models``): that path is taken off, and the server probed at its base.

    Examples
    --------
    >>> _addresses("http://h:8000/"), _addresses("http://h:8000/v1/chat/completions")
    (('http://h:8000', 'http://h:8000/v1/chat/completions', None), ('http://h:8000', 'http://h:8000/v1/chat/completions', None))
    >>> _addresses("http://h:8000/proxy/v1/completions")[:2]
    ('http://h:8000/proxy', 'http://h:8000/proxy/v1/chat/completions')
    """
    stripped = url.rstrip("/")
    parts = urlsplit(stripped)
    origin, path = f"{parts.scheme}://{parts.netloc}", parts.path
    for tail in ("/v1/chat/completions", "/chat/completions"):
        if path.endswith(tail):
            return origin + path[: -len(tail)], stripped, None
    cut = path.find("/v1")
    if cut >= 0 and path[cut + 3 : cut + 4] in ("", "/"):  # the API root, or another endpoint under it
        base = origin + path[:cut]
        note = (
            None
            if path[cut:] == "/v1"
            else (
                f"note: {url} names {path[cut:]}, not the chat endpoint; probing the server at {base} "
                "(its /v1/chat/completions): give the base URL to say so"
            )
        )
        return base, base + "/v1/chat/completions", note
    return stripped, stripped + "/v1/chat/completions", None


# An idle kept-alive connection is dropped after this many seconds, well before servers close their end (uvicorn, which
# serves vLLM and SGLang, after 5 s; cpp-httplib in llama-server after 5 s; gunicorn after 2 s). httpx's default is
# also 5 s: a band sent on connections the server is closing at that moment gets resets ("ReadError: ").
KEEPALIVE_EXPIRY_S = 1.0


def _client(timeout: float, api_key: str | None) -> httpx.AsyncClient:
    """The probe's HTTP client: no cap on concurrent connections (a band of c is c at once), idle connections dropped
    after :data:`KEEPALIVE_EXPIRY_S`, the key as a bearer token."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # sent, never written into the run
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_EXPIRY_S)
    return httpx.AsyncClient(timeout=timeout, headers=headers, limits=limits)
