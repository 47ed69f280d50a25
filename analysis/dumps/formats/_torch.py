"""torch dumps (``torch.save`` files), loaded with ``weights_only=True`` only.

Two layouts:

- full: ``sequences [B, P+T]`` with per-step ``scores`` (after the logits processors) or
  ``logits`` (before), as a list of T ``[B, V]`` tensors or one ``[B, T, V]`` tensor, as HF's
  ``generate(output_scores=True, return_dict_in_generate=True)`` gives. Reduced here with torch
  to float32 log-softmax and the top k.
- reduced: ``token_ids [B, T]``, ``top_ids [B, T, k]``, ``top_logprobs [B, T, k]`` and
  optionally ``token_logprobs [B, T]``.

Optional keys: ``prompt_length`` (else P = L - T), ``eos_token_id`` (rows stop after their first
EOS: generate keeps emitting padding after it), ``model``, ``sample_keys`` (one per row).
"""

from __future__ import annotations

import io
import warnings
from typing import Any

from .._schema import Rows
from .._values import DumpError


def _load(raw: bytes, source: str) -> dict:
    try:
        import torch
    except ModuleNotFoundError:
        raise DumpError(source, "$", None, "a torch dump needs PyTorch: pip install 'bia[torch]'") from None
    try:
        with warnings.catch_warnings():  # torch's note about a pickle protocol says nothing the error below does not
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            obj = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise DumpError(
            source,
            "$",
            None,
            f"not loadable with torch.load(weights_only=True): {(str(exc).splitlines() or [type(exc).__name__])[0]}",
        ) from None
    if not isinstance(obj, dict):
        raise DumpError(source, "$", None, f"expected a dict of tensors, got {type(obj).__name__}")
    return obj


def _tensor(obj: dict, key: str, source: str, ndim: int):
    import torch

    value = obj.get(key)
    if not isinstance(value, torch.Tensor) or value.ndim != ndim:
        raise DumpError(
            source,
            "$",
            key,
            f"expected a {ndim}-D tensor, got {type(value).__name__}{'' if value is None else getattr(value, 'shape', '')}",
        )
    return value


def _steps(obj: dict, source: str) -> tuple[Any, str, str]:
    """The per-step scores as one float32 ``[B, T, V]`` tensor, the key used, and its semantics."""
    import torch

    for key, semantics in (("scores", "processed"), ("logits", "raw")):
        if key not in obj:
            continue
        value = obj[key]
        if isinstance(value, (list, tuple)):
            if not value or not all(isinstance(v, torch.Tensor) and v.ndim == 2 for v in value):
                raise DumpError(source, "$", key, "expected a list of [B, V] tensors, one per step")
            value = torch.stack(list(value), dim=1)
        if not isinstance(value, torch.Tensor) or value.ndim != 3:
            raise DumpError(source, "$", key, "expected [B, T, V] or a list of [B, V] tensors")
        return value.float(), key, semantics  # float32 before log_softmax: bf16 sums lose bits
    raise DumpError(
        source,
        "$",
        None,
        "a torch dump needs scores or logits with sequences, or token_ids with top_ids and top_logprobs",
    )


def _kept_length(ids: list[int], eos: int | None) -> tuple[int, str]:
    if eos is not None and eos in ids:
        return ids.index(eos) + 1, "eos"
    return len(ids), "length"


def parse_torch(
    raw: bytes, rows: Rows, *, top_k: int = 20, prompt_length: int | None = None, eos_token_id: int | None = None
) -> None:
    """Append the tokens and top-k candidates of a torch dump to ``rows``.

    Parameters
    ----------
    raw : bytes
        The ``torch.save`` file's content.
    rows : Rows
        The rows to append to.
    top_k : int, default 20
        How many candidates to keep per step from full logits.
    prompt_length : int, optional
        Where the generated tokens start in ``sequences`` (the dump's own ``prompt_length`` wins); None: the
        last ``n_steps`` tokens.
    eos_token_id : int, optional
        The end-of-sequence id, when the dump does not record it.
    """
    obj = _load(raw, rows.source)
    eos = obj.get("eos_token_id", eos_token_id)
    if "top_ids" in obj:
        _reduced(obj, rows, eos)
    else:
        _full(obj, rows, top_k, obj.get("prompt_length", prompt_length), eos)


def _full(obj: dict, rows: Rows, top_k: int, prompt_length: int | None, eos: int | None) -> None:
    import torch

    sequences = _tensor(obj, "sequences", rows.source, 2)
    steps, key, semantics = _steps(obj, rows.source)
    batch, n_steps, vocab = steps.shape
    if sequences.shape[0] != batch:
        raise DumpError(rows.source, "$", key, f"has {batch} rows but sequences has {sequences.shape[0]}")
    start = sequences.shape[1] - n_steps if prompt_length is None else int(prompt_length)
    if start < 0 or start + n_steps > sequences.shape[1]:
        raise DumpError(
            rows.source,
            "$",
            "sequences",
            f"length {sequences.shape[1]} cannot hold {n_steps} generated steps after a prompt of {start}",
        )
    generated = sequences[:, start : start + n_steps]
    logprobs = torch.log_softmax(steps, dim=-1)
    chosen = logprobs.gather(-1, generated.unsqueeze(-1)).squeeze(-1)
    ranks = (logprobs > chosen.unsqueeze(-1)).sum(-1) + 1
    k = min(top_k, vocab)
    top_values, top_ids = torch.topk(logprobs, k, dim=-1)
    for b in range(batch):
        ids = generated[b].tolist()
        keep, finish = _kept_length(ids, eos)
        _emit_row(
            rows,
            obj,
            b,
            ids[:keep],
            chosen[b, :keep].tolist(),
            ranks[b, :keep].tolist(),
            top_ids[b, :keep].tolist(),
            top_values[b, :keep].tolist(),
            k,
            semantics,
            finish,
        )


def _reduced(obj: dict, rows: Rows, eos: int | None) -> None:
    token_ids = _tensor(obj, "token_ids", rows.source, 2)
    top_ids = _tensor(obj, "top_ids", rows.source, 3)
    top_values = _tensor(obj, "top_logprobs", rows.source, 3).float()
    if top_ids.shape != top_values.shape or top_ids.shape[:2] != token_ids.shape:
        raise DumpError(
            rows.source,
            "$",
            "top_ids",
            f"shapes disagree: token_ids {tuple(token_ids.shape)}, top_ids {tuple(top_ids.shape)}, top_logprobs {tuple(top_values.shape)}",
        )
    own = obj.get("token_logprobs")
    for b in range(token_ids.shape[0]):
        ids = token_ids[b].tolist()
        keep, finish = _kept_length(ids, eos)
        tops, values = top_ids[b, :keep].tolist(), top_values[b, :keep].tolist()
        if own is not None:
            chosen = own[b, :keep].float().tolist()
        else:  # the sampled token's value from its top-k row, when it is there
            chosen = [row_v[row.index(t)] if t in row else None for t, row, row_v in zip(ids, tops, values)]
        _emit_row(
            rows,
            obj,
            b,
            ids[:keep],
            chosen,
            [None] * keep,
            tops,
            values,
            top_ids.shape[2],
            obj.get("logprob_semantics", "unknown"),
            finish,
        )


def _emit_row(
    rows: Rows, obj: dict, b: int, ids, chosen, ranks, tops, values, k: int, semantics: str, finish: str
) -> None:
    """Append one batch row's tokens; candidate ranks are known only for a full-vocabulary top-k."""
    ranked = any(r is not None for r in ranks)
    sample_keys = obj.get("sample_keys")
    sample_key = sample_keys[b] if isinstance(sample_keys, (list, tuple)) and b < len(sample_keys) else None
    for t, token_id in enumerate(ids):
        key = (0, b, "completion", t)
        where = f"row {b} step {t}"
        missing = chosen[t] is None
        rows.token(
            key,
            where,
            raw=chosen[t],
            missing=missing,
            sample_key=sample_key,
            token_id=token_id,
            vocab_rank=ranks[t],
            top_k_requested=k,
            n_candidates=len(tops[t]),
            logprob_semantics=semantics,
        )
        rows.candidates_for(
            key,
            where,
            [
                {"token_id": i, "raw": v, "vocab_rank": r + 1 if ranked else None}
                for r, (i, v) in enumerate(zip(tops[t], values[t]))
            ],
            list_kind="top_logprobs",
            sampled_id=token_id,
            sampled_text=None,
        )
    rows.request(
        record=0,
        choice_index=b,
        sample_key=sample_key,
        model=obj.get("model") if isinstance(obj.get("model"), str) else None,
        endpoint="torch",
        stream=False,
        finish_reason=finish,
        completion_tokens=len(ids),
        n_prompt_scored=0,
        n_completion_scored=len(ids),
    )
