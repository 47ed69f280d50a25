"""``bia serve``: the experiment's torch model behind an OpenAI-compatible ``/v1/chat/completions``,
with continuous batching, so a probe has a real server to measure on this machine.

Continuous batching: requests that arrive while others decode are prefilled alone and join the
next decode step. In the ``default`` kernel mode the step runs every active row through each
layer together (KV caches left-padded to the longest), so a row's bits depend on its batch; in
``one-by-one`` mode (alias ``batch-invariant``) each row steps as its own batch of one; in
``fixed-tiles`` mode the step runs every active row together on fixed row tiles and attention
splits (``analysis.experiment.model.kernels``), so the batch is kept and a row's bits are still those
it would have alone; ``row-invariant`` mode does the same on GEMMs whose per-row order does not
depend on the row count (``analysis.experiment.model.rowwise``), at about the default mode's cost. Each step logs one line in
aprender's form, ``[PMAT-044] Batch m=N done in X ms (Y tok/s/slot)``, which both bia's probe and
aprender's read. Streams declare ``"stream_mode": "live"`` and carry logprobs with top_logprobs; a response's last
chunk (or the whole response) carries the request's ``timings`` in llama.cpp's fields (:func:`timings`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Self

import torch

from .core import StrictJsonError, duration, first_duplicate, loads_strict
from .experiment.model import PACKED_KERNELS, check_tiled, kernels, step_outputs
from .experiment.modes import kernel_mode

LOG = logging.getLogger("bia.serve")
REQUESTS = logging.getLogger("bia.requests")  # a line per request: what the terminal shows without -v
MAX_TOP_LOGPROBS = 20


@dataclass
class _Request:
    prompt: list[int]
    max_tokens: int
    top_k: int
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    generated: int = 0
    last: Any = None  # logits for the next token
    cache: Any = None  # per layer (k, v), shape [1, H, S, hd]; fixed-tiles, row-invariant: its mode's cache until it joins the engine's
    length: int = 0  # tokens in the cache
    prefill_s: float = 0.0  # the prompt pass, and when it ended (perf_counter): the start of the request's decode, as llama.cpp times it
    decode_from: float = 0.0


@dataclass(eq=False)
class _Pool:
    """fixed-tiles and row-invariant: one cache of the mode's (:class:`~analysis.experiment.model.kernels.TiledCache`,
    :class:`~analysis.experiment.model.rowwise.RowCache`) for the requests stepped last, in their order."""

    kind: Any = kernels.TiledCache  # the mode's cache class
    members: list = field(default_factory=list)
    cache: Any = None

    def regroup(self, requests: list[_Request]) -> Any:
        """The cache with a row per request, in this order: rows kept, newly prefilled caches joined,
        finished requests' rows dropped (copied only when the membership changes)."""
        if [id(r) for r in requests] == [id(r) for r in self.members]:
            return self.cache
        index = {id(r): row for row, r in enumerate(self.members)}
        fresh = [r for r in requests if id(r) not in index]
        index.update({id(r): len(self.members) + k for k, r in enumerate(fresh)})
        joined = self.kind.join(([self.cache] if self.members else []) + [r.cache for r in fresh])
        cache = joined.select([index[id(r)] for r in requests])
        for request in fresh:
            request.cache = None  # its rows live in the pool now
        self.members, self.cache = list(requests), cache
        return cache


class Engine:
    """The decode loop: admits waiting requests between steps and steps every active row."""

    def __init__(self, model, mode: str = "default") -> None:
        mode = kernel_mode(mode)
        check_tiled(model, mode)
        self.model, self.mode = model, mode
        self._pool = _Pool(PACKED_KERNELS[mode].TiledCache) if mode in PACKED_KERNELS else _Pool()
        self.waiting: asyncio.Queue[_Request] = asyncio.Queue()
        self.active: list[_Request] = []
        self.device = next(model.parameters()).device
        self.on_step = lambda m: None  # called with the width of every decode step

    async def submit(self, prompt: list[int], max_tokens: int, top_k: int) -> _Request:
        """Queue a request for the decode loop, which prefills it and admits it between steps.

        Parameters
        ----------
        prompt : list of int
            The prompt's token ids.
        max_tokens : int
            How many tokens to decode (there is no end-of-sequence stop).
        top_k : int
            How many top logprobs each step's event carries.

        Returns
        -------
        _Request
            The request; its ``events`` queue gets one dict per decoded token, ``done`` set on the last.
        """
        request = _Request(prompt, max_tokens, top_k)
        await self.waiting.put(request)
        return request

    async def run(self) -> None:
        while True:
            if not self.active:
                self.active.append(await self.waiting.get())
                await asyncio.to_thread(self._prefill, self.active[-1])
            while not self.waiting.empty():
                request = self.waiting.get_nowait()
                await asyncio.to_thread(self._prefill, request)
                self.active.append(request)
            started = time.perf_counter()
            emitted = await asyncio.to_thread(self._step)
            elapsed = time.perf_counter() - started
            for request, event in emitted:
                request.events.put_nowait(event)
            m = len(emitted)
            self.on_step(m)
            LOG.info("[PMAT-044] Batch m=%d done in %.2f ms (%.1f tok/s/slot)", m, 1000 * elapsed, 1 / elapsed if elapsed > 0 else 0.0)
            self.active = [r for r in self.active if r.generated < r.max_tokens]
            await asyncio.sleep(0)

    def _prefill(self, request: _Request) -> None:
        started = time.perf_counter()
        if self.mode in PACKED_KERNELS:
            self._prefill_tiled(request)
        else:
            n = len(request.prompt)
            with torch.no_grad():
                logits, cache = self.model(torch.tensor([request.prompt], device=self.device), torch.arange(n, device=self.device)[None],
                                           torch.ones(1, n, dtype=torch.bool, device=self.device))
            request.last, request.cache, request.length = logits[:, -1], cache, n
        request.decode_from = time.perf_counter()
        request.prefill_s = request.decode_from - started

    def _step(self) -> list[tuple[_Request, dict]]:
        """Choose every active row's next token, then advance the rows that continue."""
        emitted, going = [], []
        for request in self.active:
            chosen, own, top_ids, top_values = step_outputs(request.last, MAX_TOP_LOGPROBS)
            request.generated += 1
            event = {"token_id": int(chosen[0]), "logprob": float(own[0]), "top_ids": top_ids[0].tolist()[: request.top_k],
                     "top_logprobs": top_values[0].tolist()[: request.top_k], "done": request.generated >= request.max_tokens}
            emitted.append((request, event))
            if event["done"]:  # the request's own timing, in llama.cpp's fields, for a client that could not time it
                event["timings"] = timings(len(request.prompt), request.prefill_s, request.generated, time.perf_counter() - request.decode_from)
            else:
                going.append((request, chosen[0]))
        if going:
            with torch.no_grad():
                (self._advance_tiled if self.mode in PACKED_KERNELS else {"default": self._advance_together, "one-by-one": self._advance_alone}[self.mode])(going)
        return emitted

    def _prefill_tiled(self, request: _Request) -> None:
        n, device = len(request.prompt), self.device
        cache = PACKED_KERNELS[self.mode].TiledCache.empty(self.model, 1, n)
        with torch.no_grad():
            ids, positions = torch.tensor(request.prompt, device=device), torch.arange(n, device=device)
            rows, last = torch.zeros(n, dtype=torch.long, device=device), torch.tensor([n - 1], device=device)
            logits = PACKED_KERNELS[self.mode].forward(self.model, ids, positions, rows, cache, want=last, prefill=True)
        request.last, request.cache, request.length = logits, cache, n

    def _advance_tiled(self, going) -> None:
        """Every continuing row in one batch on the mode's kernels; each reads its own row of the engine's pool."""
        requests = [r for r, _ in going]
        cache = self._pool.regroup(requests)
        rows = torch.arange(len(requests), device=self.device)
        positions = torch.tensor([r.length for r in requests], device=self.device)
        logits = PACKED_KERNELS[self.mode].forward(self.model, torch.stack([t for _, t in going]), positions, rows, cache, want=rows)
        for row, request in enumerate(requests):
            request.last, request.length = logits[row:row + 1], request.length + 1

    def _advance_alone(self, going) -> None:
        for request, token in going:
            valid = torch.ones(1, request.length + 1, dtype=torch.bool, device=self.device)
            logits, request.cache = self.model(token.view(1, 1), torch.tensor([[request.length]], device=self.device), valid, request.cache)
            request.last, request.length = logits[:, -1], request.length + 1

    def _advance_together(self, going) -> None:
        longest = max(r.length for r, _ in going)
        layers = len(going[0][0].cache)
        caches = []
        for layer in range(layers):
            ks, vs = [], []
            for request, _ in going:
                k, v = request.cache[layer]
                pad = longest - request.length
                ks.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
                vs.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
            caches.append((torch.cat(ks), torch.cat(vs)))
        valid = torch.zeros(len(going), longest + 1, dtype=torch.bool, device=self.device)
        for row, (request, _) in enumerate(going):
            valid[row, longest - request.length:] = True
        tokens = torch.stack([t for _, t in going]).view(-1, 1)
        positions = torch.tensor([[r.length] for r, _ in going], device=self.device)
        logits, new = self.model(tokens, positions, valid, caches)
        for row, (request, _) in enumerate(going):
            start = longest - request.length
            request.cache = [(k[row:row + 1, :, start:], v[row:row + 1, :, start:]) for k, v in new]
            request.last, request.length = logits[row:row + 1, -1], request.length + 1


def timings(prompt_n: int, prompt_s: float, predicted_n: int, predicted_s: float) -> dict[str, float | int | None]:
    """A request's timings as llama.cpp's server reports them (``timings`` in its last chunk): the prompt pass, and the
    decode from the end of that pass to the step that chose the last token.

    A client reading a stream in one burst (its tokens buffered on the way) cannot time the decode; these times it can.

    Parameters
    ----------
    prompt_n : int
        The prompt's tokens.
    prompt_s : float
        The prompt pass, in seconds.
    predicted_n : int
        The tokens decoded.
    predicted_s : float
        The decode, in seconds.

    Returns
    -------
    dict
        ``prompt_n``, ``prompt_ms``, ``prompt_per_second``, ``predicted_n``, ``predicted_ms`` and
        ``predicted_per_second``; a rate is None for a time of 0.

    Examples
    --------
    >>> timings(18, 0.0047, 64, 0.0205)["predicted_per_second"]
    3121.95
    """
    def per_second(n: int, s: float) -> float | None:
        return round(n / s, 2) if s > 0 else None

    return {"prompt_n": prompt_n, "prompt_ms": round(1000 * prompt_s, 3), "prompt_per_second": per_second(prompt_n, prompt_s),
            "predicted_n": predicted_n, "predicted_ms": round(1000 * predicted_s, 3), "predicted_per_second": per_second(predicted_n, predicted_s)}


# --- the HTTP side -------------------------------------------------------------------------------------


def _error(status: int, message: str, param: str | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}, status_code=status)


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
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
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
    return _Params(content, max_tokens, top_k, _optional(body, "logprobs", bool, False), _optional(body, "stream", bool, False),
                   _optional(options or {}, "include_usage", bool, False))


def create_app(model, mode: str = "default", model_name: str = "tiny_lm"):
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

    Returns
    -------
    starlette.applications.Starlette
    """
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    engine = Engine(model, mode)
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
            return StreamingResponse(_stream(pending, rid, want_logprobs, params.include_usage, len(prompt), started),
                                     media_type="text/event-stream")
        entries, text = [], []
        while True:
            event = await pending.events.get()
            entries.append(_entry(model, event))
            text.append(entries[-1]["token"])
            if event["done"]:
                break
        _said(rid, len(prompt), len(entries), started, streamed=False)
        return JSONResponse({"id": rid, "object": "chat.completion", "model": model_name,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(text)}, "finish_reason": "length",
                                          "logprobs": {"content": entries} if want_logprobs else None}],
                             "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(entries), "total_tokens": len(prompt) + len(entries)},
                             "timings": event["timings"]})

    async def _stream(pending, rid, want_logprobs, usage, n_prompt, started):
        def chunk(payload):
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        yield chunk({"id": rid, "object": "chat.completion.chunk", "model": model_name, "stream_mode": "live",
                     "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]})
        n = 0
        while True:
            event = await pending.events.get()
            entry = _entry(model, event)
            n += 1
            yield chunk({"id": rid, "object": "chat.completion.chunk", "model": model_name,
                         "choices": [{"index": 0, "delta": {"content": entry["token"]}, "logprobs": {"content": [entry]} if want_logprobs else None,
                                      "finish_reason": "length" if event["done"] else None}],
                         **({"timings": event["timings"]} if event["done"] else {})})
            if event["done"]:
                break
        _said(rid, n_prompt, n, started, streamed=True)
        if usage:
            yield chunk({"id": rid, "object": "chat.completion.chunk", "model": model_name, "choices": [],
                         "usage": {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}})
        yield "data: [DONE]\n\n"

    def _said(rid: str, n_prompt: int, n: int, started: float, *, streamed: bool) -> None:
        REQUESTS.info("%s: %d prompt and %d completion tokens in %s%s", rid, n_prompt, n, duration(time.monotonic() - started),
                      " (streamed)" if streamed else "")

    async def health(request):
        parameter = next(model.parameters())
        return JSONResponse({"status": "ok", "server": "bia serve", "kernel_mode": engine.mode, "dtype": str(parameter.dtype).removeprefix("torch."),
                             "device": str(parameter.device)})

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "bia"}]})

    registry = CollectorRegistry()
    Gauge("bia:num_requests_running", "Requests in the decode batch.", registry=registry).set_function(lambda: len(engine.active))
    Gauge("bia:num_requests_waiting", "Requests waiting to join the batch.", registry=registry).set_function(lambda: engine.waiting.qsize())
    steps = Counter("bia:decode_steps", "Decode steps run.", registry=registry)
    engine.on_step = lambda m: steps.inc()

    async def metrics(request):
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/models", models), Route("/health", health),
                             Route("/metrics", metrics)], lifespan=lifespan)


def serve(app, host: str, port: int, *, said: str, say=None) -> bool:
    """Serve ``app`` on ``host:port`` until stopped (Ctrl-C); once it listens, ``say`` (a line to stdout by default) gets
    ``bia serve: listening on http://HOST:PORT (said)``, the port the one bound (``port=0`` picks a free one). False when it
    could not listen there (uvicorn logs why: the port in use, an address not of this host).

    Parameters
    ----------
    app : starlette.applications.Starlette
        The app, as :func:`create_app` makes it.
    host : str
        The address to listen on.
    port : int
        The port; 0 picks a free one.
    said : str
        What is served, in the listening line's parentheses.
    say : callable, optional
        Gets the listening line; ``print`` to stdout when None.

    Returns
    -------
    bool
        Whether it listened.
    """
    import uvicorn

    say = say or (lambda line: print(line, flush=True))

    class Announcing(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:  # bound and listening (a port in use stops the server instead, with uvicorn's error)
                bound = self.servers[0].sockets[0].getsockname()
                name = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
                say(f"bia serve: listening on http://{name}:{bound[1]} ({said}); Ctrl-C stops it")

    server = Announcing(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    try:
        server.run()
    except KeyboardInterrupt:  # Ctrl-C stops it, as uvicorn.run does
        pass
    except SystemExit:  # uvicorn's own exit when it cannot start (its exit 3, bia's code for a missing path): the caller says so
        if server.started:
            raise
    return server.started


def _entry(model, event: dict) -> dict:
    def token(i: int) -> dict:
        text, data = model.token(i)
        return {"id": i, "token": text, "bytes": list(data)}

    return {**token(event["token_id"]), "logprob": event["logprob"],
            "top_logprobs": [{**token(i), "logprob": v} for i, v in zip(event["top_ids"], event["top_logprobs"])]}


class BackgroundServer:
    """``bia serve`` in a thread of this process, on a free loopback port: for notebooks and tests.

    With ``log_file``, the per-step ``Batch m=N done`` lines also go to that file, for the probe's
    ``server_log``. Use it as a context manager, or call :meth:`stop`.

    Examples
    --------
    >>> with BackgroundServer("fixed-tiles") as server:  # doctest: +SKIP
    ...     run_dir = asyncio.run(probe(server.url, "runs/demo", prompts=["If the argument is"], server_log=server.log_file))
    """

    def __init__(self, mode: str = "default", *, model_path=None, log_file=None, dtype: str = "float32", device: str = "cpu") -> None:
        import socket
        import threading
        from pathlib import Path

        import uvicorn

        from .experiment import bundled_model
        from .experiment.model import load_model

        weights = Path(model_path) if model_path else bundled_model()
        self.log_file = Path(log_file) if log_file else None
        self._handler = None
        if self.log_file is not None:
            self._handler = logging.FileHandler(self.log_file)
            self._handler.setFormatter(logging.Formatter("%(message)s"))
            LOG.addHandler(self._handler)
            LOG.setLevel(logging.INFO)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        app = create_app(load_model(weights, getattr(torch, dtype), device), mode, weights.stem)
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.time() + 30
        while not self._server.started:
            if time.time() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError(f"bia serve did not start on {self.url}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server and its log file."""
        self._server.should_exit = True
        self._thread.join(timeout=10)
        if self._handler is not None:
            LOG.removeHandler(self._handler)
            self._handler.close()
            self._handler = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
