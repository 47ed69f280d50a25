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
  the property (a row's sums change every 4 rows), so the mode refuses it (:func:`check_blas`).
  So every Linear here is one plain GEMM over all of the call's rows, the rows padded with zero rows to at least :data:`MIN_ROWS`: a lone
  decode row pays for three zero rows of one GEMM, about what its GEMV costs, never a 16-row
  tile (``fixed-tiles``, :mod:`.kernels`); a batch of 4 or more pays nothing. With several
  threads MKL splits a GEMM's rows between them, and a share of fewer than 4 rows takes the
  small path again (measured: 5, 6 and 7 rows on 2 threads), so the mode computes on one thread
  (:func:`one_thread`). ``tests/test_kernels.py`` checks the property for 4 to 600 rows at several
  offsets, so a BLAS that breaks it fails there first, naming the shape.
- attention: each query alone against a window of its own sequence's keys whose length is its
  own position rounded up to whole splits of :data:`~.kernels.KV_SPLIT` keys (vLLM's and SGLang's
  fixed split *size*, here one split per query): one product ``[1, head_dim] @ [head_dim, W]``,
  a softmax over those W scores (the keys past the query masked to weight 0) and one product
  ``[1, W] @ [W, head_dim]``, all of a shape that depends on the query's position alone, never on
  a neighbour's length or on how many queries share the call (queries of one window length share
  one batched call; a batched product runs each entry as its own GEMM).
- LayerNorm, GELU, additions, embeddings and the float32 log-softmax are per row or per element.

A prefill runs the prompt's tokens as rows of the same GEMMs and each token's query alone against
its own sequence's keys up to its position, so a teacher-forced forward over prompt and completion
gives every token the bits the decode step gave it (the same GEMM order for any row count >= 4,
the same attention product per query). The attention computes in float32, also for a bfloat16
model. The cost over ``default`` is measured by ``benchmarks/bench_kernels.py``.

What a step costs: at a small batch a decode step is mostly torch's per-call overhead, so the mode
keeps its calls few. The keys and values live in a :class:`RowCache` laid out by row (a decode
step's window is a view, one store per layer writes every token's key and value), the step's
attention mask is one lookup in a table kept per head count, the plan is worked out on Python
lists, the parameters are looked up once per model, and a float32 Linear's weight is transposed
once so that MKL reads it untransposed (the same bits, a tenth faster for a few rows). None of
this changes a bit of the arithmetic above.

What this does not have: a kernel of its own. The GEMM property is measured, for MKL on x86 (its
AVX2 and AVX512 branches); another BLAS (OpenBLAS, Accelerate) is untested, and on a GPU cuBLAS
picks its kernels by shape, so the mode runs on the CPU only (``fixed-tiles`` runs anywhere).

This module holds the mode's face, its cache and the forward over the blocks; the attention's windows and calls are in
:mod:`~analysis.experiment.model._rowwise_attention`, the parameters as the forward reads them with the Linear and the
LayerNorm in :mod:`~analysis.experiment.model._rowwise_weights`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ._rowwise_attention import QUERY_GROUP as QUERY_GROUP
from ._rowwise_attention import _attention, _windows
from ._rowwise_weights import _layer_norm, _linear, _weights
from ._rowwise_weights import _linear_weights as _linear_weights
from .kernels import KV_SPLIT

MIN_ROWS = 4  # fewest rows any GEMM here sees: MKL's sgemm sums in one order from 4 rows up

__all__ = ["MIN_ROWS", "RowCache", "TiledCache", "check_blas", "forward", "one_thread", "pad_to_min_rows"]


def check_blas(environ=None) -> None:
    """Refuse MKL's ``COMPATIBLE`` code branch (``MKL_CBWR``), whose GEMM sums a row in an order that
    changes with the row count; ValueError naming the variable.

    Parameters
    ----------
    environ : mapping, optional
        The environment to read ``MKL_CBWR`` from; by default ``os.environ``.

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
        raise ValueError(
            "the row-invariant mode needs MKL's GEMM to sum each row alike whatever the row count, which "
            f"MKL_CBWR={branch} does not: set MKL_CBWR=AVX2 (or leave it unset) before torch loads"
        )


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

    Parameters
    ----------
    x : torch.Tensor
        Rows along the first dimension.

    Returns
    -------
    torch.Tensor

    Examples
    --------
    >>> pad_to_min_rows(torch.ones(1, 3)).shape, pad_to_min_rows(torch.ones(9, 3)).shape
    (torch.Size([4, 3]), torch.Size([9, 3]))
    """
    missing = MIN_ROWS - x.shape[0]
    return torch.cat([x, x.new_zeros((missing, *x.shape[1:]))]) if missing > 0 else x


@dataclass
class RowCache:
    """Keys and values of ``count`` sequences, per layer one tensor ``[2, rows, heads, room, head_dim]`` (the keys, then
    the values), laid out by row: a decode step's window of keys is a view of its rows, and one indexed store per layer
    writes every new token's key and value. ``room`` comes in whole splits of :data:`~.kernels.KV_SPLIT`; positions past
    a sequence's length hold zeros, never written, so a masked key's value is finite.

    Examples
    --------
    >>> from analysis.experiment.model import ModelConfig, TinyLM
    >>> cache = RowCache.empty(TinyLM(ModelConfig(d_model=16, n_heads=2, n_layers=1)), 3, 40)
    >>> cache.layers[0].shape, cache.room
    (torch.Size([2, 3, 2, 64, 8]), 64)
    >>> RowCache.join([cache.select([2, 0]), cache]).layers[0].shape
    torch.Size([2, 5, 2, 64, 8])
    """

    layers: list[torch.Tensor]
    count: int

    @classmethod
    def empty(cls, model, count: int, length: int) -> RowCache:
        """Room for ``count`` sequences of up to ``length`` tokens.

        Parameters
        ----------
        model : TinyLM
            The model whose blocks, heads and dtype the cache takes.
        count : int
            How many sequences.
        length : int
            Tokens of room per sequence (rounded up).

        Returns
        -------
        RowCache
        """
        cfg, p = model.cfg, next(model.parameters())
        shape = (2, count, cfg.n_heads, _room(length), cfg.d_model // cfg.n_heads)
        return cls([torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in model.blocks], count)

    @property
    def room(self) -> int:
        """Positions each sequence has room for."""
        return self.layers[0].shape[3]

    def reserve(self, length: int) -> None:
        """Grow every sequence's room to at least ``length`` tokens.

        Parameters
        ----------
        length : int
            Tokens of room wanted.
        """
        more = _room(length) - self.room
        if more > 0:
            self.layers = [torch.cat([t, t.new_zeros((*t.shape[:3], more, t.shape[4]))], dim=3) for t in self.layers]

    def select(self, rows: list[int]) -> RowCache:
        """These sequences, in this order.

        Parameters
        ----------
        rows : list of int
            The sequences' rows in this cache.

        Returns
        -------
        RowCache
        """
        index = torch.tensor(rows, dtype=torch.long, device=self.layers[0].device)
        return RowCache([t.index_select(1, index) for t in self.layers], len(rows))

    @classmethod
    def join(cls, caches: list[RowCache]) -> RowCache:
        """The sequences of every cache, one cache after another, with the room of the longest.

        Parameters
        ----------
        caches : list of RowCache
            The caches, of the same model.

        Returns
        -------
        RowCache
        """
        room = max(c.room for c in caches)
        for cache in caches:
            cache.reserve(room)
        return cls(
            [torch.cat([c.layers[i][:, : c.count] for c in caches], dim=1) for i in range(len(caches[0].layers))],
            sum(c.count for c in caches),
        )


TiledCache = RowCache  # the name decode.py, trainer.py and serve.py call a packed mode's cache by (kernels.TiledCache)


def _room(length: int) -> int:
    """Positions in whole splits that hold ``length`` tokens (at least one split)."""
    return max(1, math.ceil(length / KV_SPLIT)) * KV_SPLIT


def forward(
    model,
    ids: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor,
    cache: RowCache,
    want: torch.Tensor,
    *,
    prefill: bool = False,
) -> torch.Tensor:
    """Logits at the packed tokens ``want`` indexes, after writing every token's keys and values to ``cache``.

    ``ids``, ``positions`` and ``rows`` (the cache row of each token's sequence) are 1-D, one entry
    per token; a token attends to its sequence's positions up to its own. Prompts (a prefill, any
    number of tokens per sequence) and one new token per request (a decode step) go through the
    same arithmetic per token, so a token's logits are the same bits either way: ``prefill`` changes
    nothing here (it is taken so that this and :func:`.kernels.forward` are called alike).

    Parameters
    ----------
    model : TinyLM
        The model.
    ids : torch.Tensor
        The packed tokens' ids, 1-D.
    positions : torch.Tensor
        Each token's position in its sequence.
    rows : torch.Tensor
        Each token's row in ``cache``.
    cache : RowCache
        The sequences' keys and values, written in place (and grown as needed).
    want : torch.Tensor
        The indices of the tokens whose logits are wanted.
    prefill : bool, default False
        Ignored (see above).

    Returns
    -------
    torch.Tensor
        ``[len(want), vocab]`` logits.

    Examples
    --------
    >>> from analysis.experiment.model import ModelConfig, TinyLM
    >>> _ = torch.manual_seed(0)
    >>> model = TinyLM(ModelConfig(d_model=16, n_heads=2, n_layers=1, context=64)).eval()
    >>> cache = RowCache.empty(model, 1, 8)
    >>> with torch.no_grad():
    ...     logits = forward(model, torch.tensor([5, 6, 7]), torch.arange(3), torch.zeros(3, dtype=torch.long), cache,
    ...                      want=torch.tensor([2]))
    >>> logits.shape
    torch.Size([1, 256])
    """
    with one_thread():
        return _forward(model, ids, positions, rows, cache, want)


def _forward(model, ids, positions, rows, cache: RowCache, want) -> torch.Tensor:
    # A decode step at a small c is all call overhead (each torch call costs about as much as its arithmetic), so the
    # plan is worked out on Python lists read once, and the parameters are looked up once per model (_Weights).
    n, at, order = ids.shape[0], positions.tolist(), rows.tolist()
    cache.reserve(max(at) + 1)
    weights = _weights(model)
    slots = (slice(None), rows, slice(None), positions)  # where each token's key and value go
    plan = _windows(order, at, positions, weights.heads, cache.room)
    x = pad_to_min_rows(F.embedding(ids, weights.tok) + F.embedding(positions, weights.pos))
    # the attention's output, padded to the rows of x: the out GEMM reads it as it is (its padding rows stay zero)
    y = x.new_zeros((x.shape[0], x.shape[1]), dtype=torch.float32)
    last = len(weights.blocks) - 1
    every = want.shape[0] == n and want.tolist() == list(range(n))  # a decode step wants every row
    for layer, (block, kv) in enumerate(zip(weights.blocks, cache.layers)):
        x = _block(block, x, y, n, slots, kv, plan, want if layer == last and not every else None)
    return _linear(_layer_norm(weights.ln_f, x), weights.head)[: want.shape[0]]


def _block(
    block: tuple, x: torch.Tensor, y: torch.Tensor, n: int, slots, kv: torch.Tensor, plan, keep=None
) -> torch.Tensor:
    """One pre-norm block on the packed rows (the first ``n`` real, the rest zero padding); the real tokens' keys and
    values are written to ``kv`` (one layer of a :class:`RowCache`) before any query reads them, and the attention's
    output to ``y``'s first ``n`` rows.

    ``keep``: only these rows go on past the attention, padded again to :data:`MIN_ROWS` (a row's
    result does not depend on which others go with it).
    """
    ln1, qkv, out, ln2, fc, proj, heads = block
    d = x.shape[-1]
    mixed = _linear(_layer_norm(ln1, x), qkv)
    kv[slots] = mixed[:n, d:].view(n, 2, heads, -1)  # each token's key and value, [n, 2, H, hd], in one store
    _attention(mixed[:n, :d], kv, plan, heads, y[:n])
    z = y if y.dtype == x.dtype else y.to(x.dtype)
    if keep is not None:
        x, z = pad_to_min_rows(x[keep]), pad_to_min_rows(z[keep])
    x = x + _linear(z, out)
    return x + _linear(F.gelu(_linear(_layer_norm(ln2, x), fc)), proj)
