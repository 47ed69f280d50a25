"""``bia serve``'s ASGI app: the OpenAI-compatible routes over the decode loop, and Prometheus' metrics.

``POST /v1/chat/completions`` (whole or streamed, with logprobs and top_logprobs), ``GET /v1/models``,
``GET /health`` and ``GET /metrics``; a line per request to the ``bia.requests`` logger.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any

from ..core import duration
from ._body import _BadRequest, _params
from ._engine import BATCH_WINDOW_MS, Engine

REQUESTS = logging.getLogger("bia.requests")  # a line per request: what the terminal shows without -v


def _error(status: int, message: str, param: str | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}},
        status_code=status,
    )


def create_app(
    model,
    mode: str = "default",
    model_name: str = "tiny_lm",
    *,
    batch_window_ms: float = BATCH_WINDOW_MS,
    max_batch: int | None = None,
):
    """The ASGI app: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``, and ``GET /metrics`` in
    Prometheus' text format (``bia:num_requests_running``, ``bia:num_requests_waiting``, ``bia:decode_steps_total``).

    Parameters
    ----------
    model : TinyLM or HFModel
        The model, as ``analysis.experiment.model.load_model`` gives it.
    mode : str, default "default"
        The kernel mode: ``default``, ``one-by-one`` (alias ``batch-invariant``), ``fixed-tiles`` or ``row-invariant``.
    model_name : str, default "tiny_lm"
        The model's name in responses and in ``/v1/models``.
    batch_window_ms : float, default 50.0
        How long an idle engine waits for the requests that arrive together before its first step (see :class:`~analysis.serve.Engine`).
    max_batch : int, optional
        The most requests one decode step holds (no limit when None).

    Returns
    -------
    starlette.applications.Starlette
    """
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    engine = Engine(model, mode, batch_window_ms=batch_window_ms, max_batch=max_batch)
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state["loop"] = asyncio.create_task(engine.run())  # the decode loop lives as long as the server
        yield
        state["loop"].cancel()

    async def chat(request):
        try:
            params = _params(await request.body())
        except _BadRequest as exc:
            return _error(400, str(exc), exc.param)
        prompt = model.encode(params.content)
        if not prompt:
            return _error(400, "the prompt is empty", "messages")
        want_logprobs, max_tokens = params.logprobs, params.max_tokens
        started = time.monotonic()
        pending = await engine.submit(prompt, max_tokens, params.top_k)
        rid = f"chatcmpl-{uuid.uuid4().hex[:16]}"
        if params.stream:
            return StreamingResponse(
                _stream(pending, rid, want_logprobs, params.include_usage, len(prompt), started),
                media_type="text/event-stream",
            )
        entries, text = [], []
        while True:
            event = await pending.events.get()
            entries.append(_entry(model, event))
            text.append(entries[-1]["token"])
            if event["done"]:
                break
        _said(rid, len(prompt), len(entries), started, streamed=False)
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion",
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "".join(text)},
                        "finish_reason": "length",
                        "logprobs": {"content": entries} if want_logprobs else None,
                    }
                ],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(entries),
                    "total_tokens": len(prompt) + len(entries),
                },
                "timings": event["timings"],
            }
        )

    async def _stream(pending, rid, want_logprobs, usage, n_prompt, started):
        def chunk(payload):
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        yield chunk(
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "model": model_name,
                "stream_mode": "live",
                "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}],
            }
        )
        n = 0
        while True:
            event = await pending.events.get()
            entry = _entry(model, event)
            n += 1
            yield chunk(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "model": model_name,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": entry["token"]},
                            "logprobs": {"content": [entry]} if want_logprobs else None,
                            "finish_reason": "length" if event["done"] else None,
                        }
                    ],
                    **({"timings": event["timings"]} if event["done"] else {}),
                }
            )
            if event["done"]:
                break
        _said(rid, n_prompt, n, started, streamed=True)
        if usage:
            yield chunk(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "model": model_name,
                    "choices": [],
                    "usage": {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n},
                }
            )
        yield "data: [DONE]\n\n"

    def _said(rid: str, n_prompt: int, n: int, started: float, *, streamed: bool) -> None:
        REQUESTS.info(
            "%s: %d prompt and %d completion tokens in %s%s",
            rid,
            n_prompt,
            n,
            duration(time.monotonic() - started),
            " (streamed)" if streamed else "",
        )

    async def health(request):
        parameter = next(model.parameters())
        return JSONResponse(
            {
                "status": "ok",
                "server": "bia serve",
                "kernel_mode": engine.mode,
                "batch_window_ms": engine.batch_window_ms,
                "max_batch": engine.max_batch,
                "dtype": str(parameter.dtype).removeprefix("torch."),
                "device": str(parameter.device),
            }
        )

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "bia"}]})

    registry = CollectorRegistry()
    Gauge("bia:num_requests_running", "Requests in the decode batch.", registry=registry).set_function(
        lambda: len(engine.active)
    )
    Gauge("bia:num_requests_waiting", "Requests waiting to join the batch.", registry=registry).set_function(
        lambda: engine.waiting.qsize()
    )
    steps = Counter("bia:decode_steps", "Decode steps run.", registry=registry)
    engine.on_step = lambda m: steps.inc()

    async def metrics(request):
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
            Route("/metrics", metrics),
        ],
        lifespan=lifespan,
    )


def _entry(model, event: dict) -> dict:
    def token(i: int) -> dict:
        text, data = model.token(i)
        return {"id": i, "token": text, "bytes": list(data)}

    return {
        **token(event["token_id"]),
        "logprob": event["logprob"],
        "top_logprobs": [{**token(i), "logprob": v} for i, v in zip(event["top_ids"], event["top_logprobs"])],
    }
