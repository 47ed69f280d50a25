"""``bia serve``'s decode loop: continuous batching over the experiment's torch model in each kernel mode.

An idle engine that gets a request waits its batching window for the requests that arrive with it (each arrival prefilled
as it comes), so that requests released together start decoding in one batch even on a loaded machine. Requests that
arrive while others decode are prefilled alone and join the next decode step; at most ``max_batch`` rows step at once. Each step
chooses every active row's next token and advances the rows that continue, as the kernel mode says
(the package's docstring tells the modes apart), and logs aprender's ``[PMAT-044] Batch m=N done`` line.
A finished request's event carries its ``timings`` in llama.cpp's fields (:func:`timings`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..experiment.model import PACKED_KERNELS, check_tiled, kernels, step_outputs
from ..experiment.modes import kernel_mode

LOG = logging.getLogger("bia.serve")
MAX_TOP_LOGPROBS = 20
#: How long, in milliseconds, an idle engine waits after each arrival for the next before its first step (``bia serve
#: --batch-window-ms``): on a busy 2-core machine, 16 requests a client releases together reach the server up to a few tens of
#: milliseconds apart.
BATCH_WINDOW_MS = 50.0
#: The batching window's bound: an idle engine starts stepping after this many windows whatever still arrives.
WINDOW_BOUND = 10


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
    """The decode loop: admits waiting requests between steps and steps every active row.

    Parameters
    ----------
    model : TinyLM or HFModel
        The model, as ``analysis.experiment.model.load_model`` gives it.
    mode : str, default "default"
        The kernel mode.
    batch_window_ms : float, default 50.0
        An idle engine that gets a request waits until no other has arrived for this long (at most
        10 windows in all, or until ``max_batch`` have come) before its first step; 0 steps at once.
    max_batch : int, optional
        The most rows one decode step holds; the rest wait for a row to finish. No limit when None.
    """

    def __init__(
        self, model, mode: str = "default", *, batch_window_ms: float = BATCH_WINDOW_MS, max_batch: int | None = None
    ) -> None:
        mode = kernel_mode(mode)
        check_tiled(model, mode)
        if not (batch_window_ms >= 0 and batch_window_ms < float("inf")):
            raise ValueError(f"batch_window_ms must be a number of milliseconds >= 0, got {batch_window_ms!r}")
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
            raise ValueError(f"max_batch must be an integer >= 1 or None, got {max_batch!r}")
        self.model, self.mode = model, mode
        self.batch_window_ms, self.max_batch = float(batch_window_ms), max_batch
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

    def _room(self) -> bool:
        return self.max_batch is None or len(self.active) < self.max_batch

    async def _admit(self, request: _Request) -> None:
        await asyncio.to_thread(self._prefill, request)
        self.active.append(request)

    async def _window(self) -> None:
        """From idle: admit the first request, then each that arrives within the window of the one before (bounded)."""
        await self._admit(await self.waiting.get())
        window = self.batch_window_ms / 1000
        if window <= 0:
            return
        loop = asyncio.get_running_loop()
        ends = loop.time() + WINDOW_BOUND * window
        while self._room() and (left := ends - loop.time()) > 0:
            try:
                async with asyncio.timeout(
                    min(window, left)
                ):  # in this task: a request got as it times out stays queued
                    request = await self.waiting.get()
            except TimeoutError:
                return
            await self._admit(request)

    async def run(self) -> None:
        """Step until cancelled: wait the batching window from idle, admit what waits (up to ``max_batch``), step."""
        while True:
            if not self.active:
                await self._window()
            while self._room() and not self.waiting.empty():
                await self._admit(self.waiting.get_nowait())
            started = time.perf_counter()
            emitted = await asyncio.to_thread(self._step)
            elapsed = time.perf_counter() - started
            for request, event in emitted:
                request.events.put_nowait(event)
            m = len(emitted)
            self.on_step(m)
            LOG.info(
                "[PMAT-044] Batch m=%d done in %.2f ms (%.1f tok/s/slot)",
                m,
                1000 * elapsed,
                1 / elapsed if elapsed > 0 else 0.0,
            )
            self.active = [r for r in self.active if r.generated < r.max_tokens]
            await asyncio.sleep(0)

    def _prefill(self, request: _Request) -> None:
        started = time.perf_counter()
        if self.mode in PACKED_KERNELS:
            self._prefill_tiled(request)
        else:
            n = len(request.prompt)
            with torch.no_grad():
                logits, cache = self.model(
                    torch.tensor([request.prompt], device=self.device),
                    torch.arange(n, device=self.device)[None],
                    torch.ones(1, n, dtype=torch.bool, device=self.device),
                )
            request.last, request.cache, request.length = logits[:, -1], cache, n
        request.decode_from = time.perf_counter()
        request.prefill_s = request.decode_from - started

    def _step(self) -> list[tuple[_Request, dict]]:
        """Choose every active row's next token, then advance the rows that continue."""
        emitted, going = [], []
        for request in self.active:
            chosen, own, top_ids, top_values = step_outputs(request.last, MAX_TOP_LOGPROBS)
            request.generated += 1
            event = {
                "token_id": int(chosen[0]),
                "logprob": float(own[0]),
                "top_ids": top_ids[0].tolist()[: request.top_k],
                "top_logprobs": top_values[0].tolist()[: request.top_k],
                "done": request.generated >= request.max_tokens,
            }
            emitted.append((request, event))
            if event["done"]:  # the request's own timing, in llama.cpp's fields, for a client that could not time it
                event["timings"] = timings(
                    len(request.prompt), request.prefill_s, request.generated, time.perf_counter() - request.decode_from
                )
            else:
                going.append((request, chosen[0]))
        if going:
            with torch.no_grad():
                (
                    self._advance_tiled
                    if self.mode in PACKED_KERNELS
                    else {"default": self._advance_together, "one-by-one": self._advance_alone}[self.mode]
                )(going)
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
        logits = PACKED_KERNELS[self.mode].forward(
            self.model, torch.stack([t for _, t in going]), positions, rows, cache, want=rows
        )
        for row, request in enumerate(requests):
            request.last, request.length = logits[row : row + 1], request.length + 1

    def _advance_alone(self, going) -> None:
        for request, token in going:
            valid = torch.ones(1, request.length + 1, dtype=torch.bool, device=self.device)
            logits, request.cache = self.model(
                token.view(1, 1), torch.tensor([[request.length]], device=self.device), valid, request.cache
            )
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
            valid[row, longest - request.length :] = True
        tokens = torch.stack([t for _, t in going]).view(-1, 1)
        positions = torch.tensor([[r.length] for r, _ in going], device=self.device)
        logits, new = self.model(tokens, positions, valid, caches)
        for row, (request, _) in enumerate(going):
            start = longest - request.length
            request.cache = [(k[row : row + 1, :, start:], v[row : row + 1, :, start:]) for k, v in new]
            request.last, request.length = logits[row : row + 1, -1], request.length + 1


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

    return {
        "prompt_n": prompt_n,
        "prompt_ms": round(1000 * prompt_s, 3),
        "prompt_per_second": per_second(prompt_n, prompt_s),
        "predicted_n": predicted_n,
        "predicted_ms": round(1000 * predicted_s, 3),
        "predicted_per_second": per_second(predicted_n, predicted_s),
    }
