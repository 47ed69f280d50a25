"""The ``row-invariant`` kernel mode: :class:`~analysis.experiment.model.TinyLM` run on the whole batch at
once, each row's reductions in an order that does not depend on how many rows share the call, and a
prompt's one-pass forward (prefill) computing every token exactly as the decode step that made it.

The idea, from the batch-invariant kernels of Thinking Machines' batch_invariant_ops, vLLM's
batch-invariant mode and SGLang's deterministic mode: a matmul is batch-invariant when the order
in which it sums each output over the reduction dimension never changes with the number of rows
(on a GPU: one tile configuration and no split-K whatever M), and attention is when it splits
the keys by a fixed split *size* rather than into a number of splits chosen by the batch. On a
CPU the row-count dependence is a matter of which code path the BLAS picks:

- matmuls: torch's float32 GEMM (MKL) sums each output in one order for every row count of
  :data:`MIN_ROWS` (4) and more; only its small cases (a GEMV at 1 row, another kernel at 2 and 3)
  sum differently (measured for this model's shapes from 4 to 8,192 rows at several row offsets
  and buffer alignments, with MKL's own code branch and with ``MKL_CBWR=AVX2`` or ``AVX512``;
  bfloat16 GEMMs go to oneDNN, invariant from 1 row). MKL's ``COMPATIBLE`` branch does not have
  the property (a row's sums change every 4 rows), so the mode refuses it (:func:`check_blas`). So every Linear here is one plain GEMM over
  all of the call's rows, the rows padded with zero rows to at least :data:`MIN_ROWS`: a lone
  decode row pays for three zero rows of one GEMM, about what its GEMV costs, never a 16-row
  tile (``fixed-tiles``, :mod:`.kernels`); a batch of 4 or more pays nothing. With several
  threads MKL splits a GEMM's rows between them, and a share of fewer than 4 rows takes the
  small path again (measured: 5, 6 and 7 rows on 2 threads), so the mode computes on one thread
  (:func:`one_thread`). ``tests/test_kernels.py`` checks the property for 4 to 600 rows at several
  offsets, so a BLAS that breaks it fails there first, naming the shape.
- attention: each query alone (a product of shape ``[1, head_dim] @ [head_dim, KV_SPLIT]`` per
  split of the keys, ``KV_SPLIT`` fixed), the splits' sums combined over the model's whole
  context in splits, so a split a neighbour needs and this row does not adds exact zeros
  (:func:`.kernels._attend`, the same arithmetic as ``fixed-tiles``' decode step).
- LayerNorm, GELU, additions, embeddings and the float32 log-softmax are per row or per element.

A prefill runs the prompt's tokens as rows of the same GEMMs and each token's query alone against
its own sequence's keys up to its position, so a teacher-forced forward over prompt and completion
gives every token the bits the decode step gave it (the same GEMM order for any row count >= 4,
the same attention product per query). The attention computes in float32, also for a bfloat16
model. The cost over ``default`` is measured by ``benchmarks/bench_kernels.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.nn import functional as F

from .kernels import KV_SPLIT, TiledCache, _attention, _step_plan

MIN_ROWS = 4  # fewest rows any GEMM here sees: MKL's sgemm sums in one order from 4 rows up

__all__ = ["MIN_ROWS", "TiledCache", "check_blas", "forward", "one_thread", "pad_to_min_rows"]


def check_blas(environ=None) -> None:
    """Refuse MKL's ``COMPATIBLE`` code branch (``MKL_CBWR``), whose GEMM sums a row in an order that
    changes with the row count; ValueError naming the variable.

    Examples
    --------
    >>> check_blas({"MKL_CBWR": "AVX2"})
    >>> check_blas({"MKL_CBWR": "COMPATIBLE"})
    Traceback (most recent call last):
    ...
    ValueError: the row-invariant mode needs MKL's GEMM to sum each row alike whatever the row count, which MKL_CBWR=COMPATIBLE does not: set MKL_CBWR=AVX2 (or leave it unset) before torch loads
    """
    import os

    branch = (os.environ if environ is None else environ).get("MKL_CBWR", "")
    if branch.upper().startswith("COMPATIBLE"):
        raise ValueError("the row-invariant mode needs MKL's GEMM to sum each row alike whatever the row count, which "
                         f"MKL_CBWR={branch} does not: set MKL_CBWR=AVX2 (or leave it unset) before torch loads")


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch (and so MKL) on one intra-op thread inside, as many as before outside.

    MKL splits a GEMM's rows between its threads, and a thread's share of fewer than
    :data:`MIN_ROWS` rows is summed in the small kernel's order, so more threads would let a row's
    bits depend on the row count again.

    Examples
    --------
    >>> before = torch.get_num_threads()
    >>> with one_thread():
    ...     torch.get_num_threads()
    1
    >>> torch.get_num_threads() == before
    True
    """
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def pad_to_min_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` with zero rows appended up to :data:`MIN_ROWS` rows; ``x`` itself when it has that many.

    Examples
    --------
    >>> pad_to_min_rows(torch.ones(1, 3)).shape, pad_to_min_rows(torch.ones(9, 3)).shape
    (torch.Size([4, 3]), torch.Size([9, 3]))
    """
    missing = MIN_ROWS - x.shape[0]
    return torch.cat([x, x.new_zeros((missing, *x.shape[1:]))]) if missing > 0 else x


def forward(model, ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, cache: TiledCache,
            want: torch.Tensor, *, prefill: bool = False) -> torch.Tensor:
    """Logits at the packed tokens ``want`` indexes, after writing every token's keys and values to ``cache``.

    ``ids``, ``positions`` and ``rows`` (the cache row of each token's sequence) are 1-D, one entry
    per token; a token attends to its sequence's positions up to its own. Prompts (a prefill, any
    number of tokens per sequence) and one new token per request (a decode step) go through the
    same arithmetic per token, so a token's logits are the same bits either way: ``prefill`` changes
    nothing here (it is taken so that this and :func:`.kernels.forward` are called alike).

    Examples
    --------
    >>> from analysis.experiment.model import ModelConfig, TinyLM
    >>> _ = torch.manual_seed(0)
    >>> model = TinyLM(ModelConfig(d_model=16, n_heads=2, n_layers=1, context=64)).eval()
    >>> cache = TiledCache.empty(model, 1, 8)
    >>> with torch.no_grad():
    ...     logits = forward(model, torch.tensor([5, 6, 7]), torch.arange(3), torch.zeros(3, dtype=torch.long), cache,
    ...                      want=torch.tensor([2]))
    >>> logits.shape
    torch.Size([1, 256])
    """
    with one_thread():
        return _forward(model, ids, positions, rows, cache, want)


def _forward(model, ids, positions, rows, cache: TiledCache, want) -> torch.Tensor:
    n = ids.shape[0]
    limits = [p + 1 for p in positions.tolist()]
    cache.reserve(max(limits))
    slots = (positions // KV_SPLIT, rows, positions % KV_SPLIT)  # where each token's key and value go
    plan = _step_plan(rows, limits, model.cfg.context, model.cfg.n_heads)  # every query alone, as a decode step
    x = pad_to_min_rows(model.tok(ids) + model.pos(positions))
    last = len(model.blocks) - 1
    for layer, (block, keys, values) in enumerate(zip(model.blocks, cache.keys, cache.values)):
        x = _block(block, x, n, slots, keys, values, plan, want if layer == last else None)
    return _linear(model.head, F.layer_norm(x, x.shape[-1:], model.ln_f.weight, model.ln_f.bias, model.ln_f.eps))[: want.shape[0]]


def _linear(layer, x: torch.Tensor) -> torch.Tensor:
    """``layer`` on ``x [N, d]`` (N >= :data:`MIN_ROWS`): one plain GEMM over every row."""
    return F.linear(x, layer.weight, layer.bias)


def _layer_norm(ln, x: torch.Tensor) -> torch.Tensor:
    """Per row: LayerNorm's mean and variance run within each row, whatever the number of rows."""
    return F.layer_norm(x, x.shape[-1:], ln.weight, ln.bias, ln.eps)


def _block(block, x: torch.Tensor, n: int, slots, keys, values, plan, keep=None) -> torch.Tensor:
    """One pre-norm block on the packed rows (the first ``n`` real, the rest zero padding); the real
    tokens' keys and values are written before any query reads them.

    ``keep``: only these rows go on past the attention, padded again to :data:`MIN_ROWS` (a row's
    result does not depend on which others go with it).
    """
    d, heads = x.shape[-1], block.n_heads
    q, k, v = _linear(block.qkv, _layer_norm(block.ln1, x)).split(d, dim=-1)
    keys[slots[0], slots[1], :, slots[2]] = k[:n].view(n, heads, -1)
    values[slots[0], slots[1], :, slots[2]] = v[:n].view(n, heads, -1)
    y = _attention(q[:n], keys, values, plan, heads).to(x.dtype)
    if keep is not None:
        x, y = pad_to_min_rows(x[keep]), pad_to_min_rows(y[keep])
    elif y.shape[0] < x.shape[0]:
        y = pad_to_min_rows(y)
    x = x + _linear(block.out, y)
    return x + _linear(block.proj, F.gelu(_linear(block.fc, _layer_norm(block.ln2, x))))
