"""Greedy decoding of several requests at once, in either kernel mode, recording every step."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .model import KERNEL_MODES


@dataclass
class Decoded:
    """One request's decode: per step the token, its logprob, the top-k and when it was ready."""

    prompt: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # seconds since the batch started


def _step_outputs(logits: torch.Tensor, top_k: int):
    """Greedy choice, its float32 logprob and the top-k, from the last position's logits."""
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
        ids[row, longest - len(prompt):] = torch.tensor(prompt, device=device)
        valid[row, longest - len(prompt):] = True
    positions = (valid.cumsum(dim=1) - 1).clamp(min=0)
    outs = [Decoded(p) for p in prompts]
    with torch.no_grad():
        logits, caches = model(ids, positions, valid)
        last = logits[:, -1]
        lengths = valid.sum(dim=1)
        for step in range(max_tokens):
            chosen, own, top_ids, top_values = _step_outputs(last, top_k)
            now = time.perf_counter() - start
            for row, out in enumerate(outs):
                out.token_ids.append(int(chosen[row]))
                out.logprobs.append(float(own[row]))
                out.top_ids.append(top_ids[row].tolist())
                out.top_logprobs.append(top_values[row].tolist())
                out.arrivals.append(now)
            if step == max_tokens - 1:
                break
            valid = torch.cat([valid, torch.ones(len(prompts), 1, dtype=torch.bool, device=device)], dim=1)
            logits, caches = model(chosen[:, None], (lengths + step)[:, None], valid, caches)
            last = logits[:, -1]
    return outs


def decode(model, prompts: list[list[int]], *, mode: str, max_tokens: int, top_k: int) -> list[Decoded]:
    """Greedy-decode ``prompts`` as one batch of ``len(prompts)`` requests.

    ``default`` runs the batch together; ``batch-invariant`` runs each request as its own batch of
    one through every layer, one step of every request after another, so the batch still advances
    in lockstep but no row shares a kernel call with another.
    """
    if mode not in KERNEL_MODES:
        raise ValueError(f"mode must be one of {KERNEL_MODES}, got {mode!r}")
    start = time.perf_counter()
    if mode == "default":
        return _decode_together(model, prompts, max_tokens, top_k, start)
    return _decode_row_by_row(model, prompts, max_tokens, top_k, start)


def _decode_row_by_row(model, prompts: list[list[int]], max_tokens: int, top_k: int, start: float) -> list[Decoded]:
    device = next(model.parameters()).device
    outs = [Decoded(p) for p in prompts]
    state = []
    with torch.no_grad():
        for prompt in prompts:
            n = len(prompt)
            logits, caches = model(torch.tensor([prompt], device=device), torch.arange(n, device=device)[None],
                                   torch.ones(1, n, dtype=torch.bool, device=device))
            state.append([logits[:, -1], caches])
        for step in range(max_tokens):
            for row, out in enumerate(outs):
                last, caches = state[row]
                chosen, own, top_ids, top_values = _step_outputs(last, top_k)
                out.token_ids.append(int(chosen[0]))
                out.logprobs.append(float(own[0]))
                out.top_ids.append(top_ids[0].tolist())
                out.top_logprobs.append(top_values[0].tolist())
                out.arrivals.append(time.perf_counter() - start)
                if step < max_tokens - 1:
                    seen = len(out.prompt) + step
                    logits, caches = model(chosen[:, None], torch.tensor([[seen]], device=device),
                                           torch.ones(1, seen + 1, dtype=torch.bool, device=device), caches)
                    state[row] = [logits[:, -1], caches]
    return outs
