"""The attention of the ``row-invariant`` forward (:mod:`~analysis.experiment.model.rowwise`): each query alone
against a window of its own sequence's keys in whole splits of :data:`~analysis.experiment.model.kernels.KV_SPLIT`,
the queries of one window length grouped into one batched call (:func:`_windows` plans the calls of a forward,
:func:`_attention` runs them), in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import torch

from .kernels import KV_SPLIT

QUERY_GROUP = 64  # queries per attention call: their copied windows (about 1 MB) stay in the cache (256: a quarter slower at c = 32)


@dataclass
class _Window:
    """Queries whose windows hold ``splits`` splits of keys: their packed indexes ``take`` (a slice when consecutive),
    the cache row each reads (a slice when consecutive; else counted from ``first``, the first of the rows it spans)
    and the additive mask ``[queries * heads, 1, splits * KV_SPLIT]``: 0 for a key at or before the query's position,
    -inf past it."""

    take: torch.Tensor | slice
    rows: torch.Tensor | slice
    splits: int
    mask: torch.Tensor
    span: slice  # the cache rows ``rows`` counts within, when a tensor


def _windows(order: list[int], at: list[int], positions: torch.Tensor, heads: int, room: int) -> list[_Window]:
    """The attention calls of one forward: queries grouped by window length, at most :data:`QUERY_GROUP` to a call
    (``order``, ``at``: the cache rows and positions as lists; ``room``: the cache's keys per row)."""
    table = _mask_table(heads, room, positions.device)
    lengths = sorted({p // KV_SPLIT + 1 for p in at})
    calls = []
    for length in lengths:
        chosen = range(len(at)) if len(lengths) == 1 else [i for i, p in enumerate(at) if p // KV_SPLIT + 1 == length]
        for start in range(0, len(chosen), QUERY_GROUP):
            take = chosen[start : start + QUERY_GROUP]
            index = _as_slice(take) or torch.tensor(take, device=positions.device)
            width = length * KV_SPLIT
            mask = table[positions[index], :, :width].reshape(
                -1, 1, width
            )  # [queries * heads, 1, W], a view of the rows taken
            read = [order[i] for i in take]
            rows: torch.Tensor | slice | None = _as_slice(read)
            span = slice(min(read), max(read) + 1)
            if rows is None:
                rows = torch.tensor([r - span.start for r in read], device=positions.device)
            calls.append(_Window(index, rows, length, mask, span))
    return calls


_MASKS: dict = {}


def _mask_table(heads: int, room: int, device) -> torch.Tensor:
    """``[P, heads, P]`` (P >= ``room``): row p is 0 up to key p and -inf past it, once per head; made once and kept
    (the largest asked for), so that a step's mask is one lookup rather than a dozen calls."""
    key = (heads, device)
    table = _MASKS.get(key)
    if table is None or table.shape[0] < room:
        keys = torch.arange(room, device=device)
        table = torch.zeros(room, room, device=device).masked_fill_(keys[None, :] > keys[:, None], -math.inf)
        table = _MASKS[key] = table[:, None].expand(-1, heads, -1).contiguous()
    return table


def _as_slice(index) -> slice | None:
    """``index`` (a sequence of ints) as a slice when it counts up by one, else None."""
    first = index[0]
    if index[-1] - first == len(index) - 1 and all(b - a == 1 for a, b in pairwise(index)):
        return slice(first, first + len(index))
    return None


def _attention(q: torch.Tensor, kv: torch.Tensor, plan: list[_Window], heads: int, y: torch.Tensor) -> None:
    """Every packed query's attention output ``[N, d]`` in float32 into ``y``, window by window."""
    for window in plan:
        if isinstance(window.take, slice):
            _attend(q[window.take], kv, window, heads, y[window.take])
        else:
            y[window.take] = _attend(q[window.take], kv, window, heads)


def _attend(
    q: torch.Tensor, kv: torch.Tensor, window: _Window, heads: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Queries ``[Q, d]`` each against its own row's first ``window.splits`` splits of keys: one ``[1, hd] @ [hd, W]``
    product per query and head, a softmax over W, one ``[1, W] @ [W, hd]`` product (into ``out`` when given)."""
    count, d = q.shape
    hd = d // heads
    k, v = _read(kv[0], window, hd), _read(kv[1], window, hd)  # [Q * H, W, hd]
    scores = torch.baddbmm(
        window.mask, _float(q).reshape(count * heads, 1, hd), k.transpose(1, 2), alpha=1 / math.sqrt(hd)
    )
    if out is None:
        return torch.bmm(scores.softmax(dim=-1), v).view(count, d)
    torch.bmm(scores.softmax(dim=-1), v, out=out.view(count * heads, 1, hd))
    return out


def _read(cache: torch.Tensor, window: _Window, hd: int) -> torch.Tensor:
    """The window's keys or values of each query's row, ``[Q * H, W, hd]`` in float32, from one layer's
    ``[rows, H, room, hd]``: a view when the queries' rows are consecutive (a decode step), else one copy per query
    (a prefill's queries repeat their sequences' rows), taken from the windows of the rows they span made contiguous
    first (two fifths of the time of a gather from the strided cache)."""
    width = window.splits * KV_SPLIT
    if isinstance(window.rows, slice):
        return _float(cache[window.rows, :, :width].reshape(-1, width, hd))
    return _float(cache[window.span, :, :width].contiguous().index_select(0, window.rows).view(-1, width, hd))


def _float(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 (itself when it is: a float32 model pays no conversion call)."""
    return t if t.dtype == torch.float32 else t.float()
