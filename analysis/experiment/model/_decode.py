"""Greedy decoding of several requests at once, in any kernel mode, recording every step."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..modes import kernel_mode
from . import kernels, rowwise
from ._model import TinyLM


@dataclass
class Decoded:
    """One request's decode: per step the token, its logprob, the top-k and when it was ready."""

    prompt: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # seconds since the batch started


def step_outputs(logits: torch.Tensor, top_k: int):
    """Greedy choice, its float32 logprob and the top-k, from the last position's logits (per row in every mode).

    Parameters
    ----------
    logits : torch.Tensor
        ``[rows, vocab]`` logits.
    top_k : int
        How many candidates to keep.

    Returns
    -------
    tuple of torch.Tensor
        The chosen ids, their logprobs, the top-k ids and their logprobs.
    """
    logprobs = logits.float().log_softmax(dim=-1)
    chosen = logprobs.argmax(dim=-1)
    values, ids = torch.topk(logprobs, top_k, dim=-1)
    return chosen, logprobs.gather(-1, chosen[:, None])[:, 0], ids, values


def _decode_together(model, prompts: list[list[int]], max_tokens: int, top_k: int, start: float) -> list[Decoded]:
    """Every row in one batch at every layer (left-padded prompts; padding is never attended to)."""
    device = next(model.parameters()).device
    longest = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.long, device=device)
    valid = torch.zeros(len(prompts), longest, dtype=torch.bool, device=device)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt, device=device)
        valid[row, longest - len(prompt) :] = True
    positions = (valid.cumsum(dim=1) - 1).clamp(min=0)
    outs = [Decoded(p) for p in prompts]
    with torch.no_grad():
        logits, caches = model(ids, positions, valid)
        last = logits[:, -1]
        lengths = valid.sum(dim=1)
        for step in range(max_tokens):
            chosen = _record(outs, step_outputs(last, top_k), start)
            if step == max_tokens - 1:
                break
            valid = torch.cat([valid, torch.ones(len(prompts), 1, dtype=torch.bool, device=device)], dim=1)
            logits, caches = model(chosen[:, None], (lengths + step)[:, None], valid, caches)
            last = logits[:, -1]
    return outs


def decode(model, prompts: list[list[int]], *, mode: str, max_tokens: int, top_k: int) -> list[Decoded]:
    """Greedy-decode ``prompts`` as one batch of ``len(prompts)`` requests.

    ``default`` runs the batch together; ``one-by-one`` runs each request as its own batch of one
    through every layer, one step of every request after another, so the batch still advances in
    lockstep but no row shares a kernel call with another; ``fixed-tiles`` runs the batch together
    on :mod:`.kernels` and ``row-invariant`` on :mod:`.rowwise` (a :class:`TinyLM` only). ``mode`` may be an
    alias (:func:`.model.kernel_mode`).

    Parameters
    ----------
    model : TinyLM or HFModel
        The model.
    prompts : list of list of int
        The batch's prompts, as token ids.
    mode : str
        The kernel mode.
    max_tokens : int
        Greedy tokens decoded per request (no end token stops one).
    top_k : int
        Candidates recorded per step.

    Returns
    -------
    list of Decoded
        One per prompt, in order.
    """
    mode = kernel_mode(mode)
    check_tiled(model, mode)
    start = time.perf_counter()
    if mode in ("default", "one-by-one"):
        return {"default": _decode_together, "one-by-one": _decode_row_by_row}[mode](
            model, prompts, max_tokens, top_k, start
        )
    return _decode_packed(model, prompts, max_tokens, top_k, start, PACKED_KERNELS[mode])


def check_tiled(model, mode: str) -> None:
    """Refuse ``fixed-tiles`` or ``row-invariant`` for a model whose layers :mod:`.kernels` and :mod:`.rowwise` do not
    know (a Hugging Face model), and ``row-invariant`` on a BLAS branch it cannot use (:func:`.rowwise.check_blas`).

    Parameters
    ----------
    model : TinyLM or HFModel
        The model.
    mode : str
        The kernel mode (not an alias).
    """
    if mode in PACKED_KERNELS and not isinstance(model, TinyLM):
        raise ValueError(f"the {mode} mode runs bia's own TinyLM layers; {type(model).__name__} has its own kernels")
    if mode == "row-invariant":
        rowwise.check_blas()
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"the row-invariant mode rests on MKL's CPU GEMM; on {device} use fixed-tiles")


def _decode_row_by_row(model, prompts: list[list[int]], max_tokens: int, top_k: int, start: float) -> list[Decoded]:
    device = next(model.parameters()).device
    outs = [Decoded(p) for p in prompts]
    state = []
    with torch.no_grad():
        for prompt in prompts:
            n = len(prompt)
            logits, caches = model(
                torch.tensor([prompt], device=device),
                torch.arange(n, device=device)[None],
                torch.ones(1, n, dtype=torch.bool, device=device),
            )
            state.append([logits[:, -1], caches])
        for step in range(max_tokens):
            for row, out in enumerate(outs):
                last, caches = state[row]
                chosen, own, top_ids, top_values = step_outputs(last, top_k)
                out.token_ids.append(int(chosen[0]))
                out.logprobs.append(float(own[0]))
                out.top_ids.append(top_ids[0].tolist())
                out.top_logprobs.append(top_values[0].tolist())
                out.arrivals.append(time.perf_counter() - start)
                if step < max_tokens - 1:
                    seen = len(out.prompt) + step
                    logits, caches = model(
                        chosen[:, None],
                        torch.tensor([[seen]], device=device),
                        torch.ones(1, seen + 1, dtype=torch.bool, device=device),
                        caches,
                    )
                    state[row] = [logits[:, -1], caches]
    return outs


PACKED_KERNELS = {
    "fixed-tiles": kernels,
    "row-invariant": rowwise,
}  # the modes that pack the batch's tokens as rows: their module


def _decode_packed(model, prompts: list[list[int]], max_tokens: int, top_k: int, start: float, kernel) -> list[Decoded]:
    """The whole batch through every layer on ``kernel`` (:mod:`.kernels`' fixed tiles or :mod:`.rowwise`): prompts
    packed into one prefill, then one token of every request per step."""
    device = next(model.parameters()).device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    rows = torch.arange(len(prompts), device=device)
    cache = kernel.TiledCache.empty(model, len(prompts), int(lengths.max()) + max_tokens)
    ids = torch.tensor([t for p in prompts for t in p], device=device)
    positions = torch.cat([torch.arange(len(p), device=device) for p in prompts])
    outs = [Decoded(p) for p in prompts]
    with torch.no_grad():
        last = kernel.forward(
            model, ids, positions, rows.repeat_interleave(lengths), cache, want=lengths.cumsum(0) - 1, prefill=True
        )
        for step in range(max_tokens):
            chosen = _record(outs, step_outputs(last, top_k), start)
            if step < max_tokens - 1:
                last = kernel.forward(model, chosen, lengths + step, rows, cache, want=rows)
    return outs


def _record(outs: list[Decoded], step, start: float) -> torch.Tensor:
    """Append one step's outputs to every request; the chosen tokens."""
    chosen, own, top_ids, top_values = step
    now = time.perf_counter() - start
    for row, out in enumerate(outs):
        out.token_ids.append(int(chosen[row]))
        out.logprobs.append(float(own[row]))
        out.top_ids.append(top_ids[row].tolist())
        out.top_logprobs.append(top_values[row].tolist())
        out.arrivals.append(now)
    return chosen
