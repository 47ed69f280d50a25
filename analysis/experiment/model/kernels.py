"""The ``fixed-tiles`` kernel mode: :class:`~analysis.experiment.model.TinyLM` run on the whole batch at
once, with every operation computing each row the same way at any batch size and position.

A request's bits in the ``default`` mode depend on its batch because a kernel's reduction order may
follow the shape it is handed: a matmul over 16 rows can block (and so sum) differently from one
over 1 row, and attention over a batch padded to its longest sequence sums over that length. Here
no reduction ever sees a shape that depends on the batch:

- matmuls: the batch's tokens (a prompt's tokens, or one new token per request) are packed as rows
  and padded to whole tiles of :data:`TILE_ROWS` rows; every Linear is one GEMM of fixed shape
  ``[TILE_ROWS, d] @ [d, out]`` per tile (issued as one batched call);
- attention: each row reads its own sequence's keys from a :class:`TiledCache`, in fixed splits of
  :data:`KV_SPLIT` keys: a query meets one split's keys in a product of fixed shape, one split's
  weights meet its values likewise, and the splits' sums are combined over a fixed count (the
  model's context in splits), so a split past the row's length, there because a neighbour is
  longer, adds exact zeros rather than a new summation order;
- LayerNorm (mean and variance within a row), softmax's maximum and the log-softmax (float32, in
  :mod:`._decode`) are per row; GELU, additions and embedding lookups are per element.

Rows are then identical to the same request decoded alone (m=1) in this mode, prompt lengths and
positions in the batch notwithstanding; the tests check it for every c up to 32, both layouts and
both dtypes. A prefill's queries meet their keys one at a time, as a decode step's do, so a token's
logprob from one forward pass over the whole sequence (a trainer's recompute, :mod:`analysis.experiment.trainer`) has
the bits its decode step gave (tests/test_trainer.py). The batch keeps its matmuls: the cost over
``default`` is the padding of the last tile (a request alone runs a whole tile) and the attention's
splits (``benchmarks/bench_kernels.py``).
The attention computes in float32, also for a bfloat16 model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

TILE_ROWS = 16  # every row-wise kernel call sees exactly this many rows
KV_SPLIT = 32  # keys per attention split
QUERY_GROUP = 256  # query rows per attention call: bounds the keys gathered at once


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` with zero rows appended up to a whole number of tiles (at least one).

    Parameters
    ----------
    x : torch.Tensor
        Rows along the first dimension.

    Returns
    -------
    torch.Tensor

    Examples
    --------
    >>> pad_rows(torch.ones(17, 2)).shape
    torch.Size([32, 2])
    """
    missing = -x.shape[0] % TILE_ROWS or (TILE_ROWS if x.shape[0] == 0 else 0)
    return torch.cat([x, x.new_zeros((missing, *x.shape[1:]))]) if missing else x


@dataclass
class TiledCache:
    """Keys and values of ``count`` sequences, per layer ``[splits, rows, heads, KV_SPLIT, head_dim]``.

    Split-major, so that the first splits of every row are one block that the attention's products
    read without a copy. Rows come in whole tiles (those past ``count`` are spare, for a tile's
    padding queries to read); positions past a sequence's length hold zeros, never written, so a
    masked key's value is finite.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    count: int

    @classmethod
    def empty(cls, model, count: int, length: int) -> TiledCache:
        """Room for ``count`` sequences of up to ``length`` tokens.

        Parameters
        ----------
        model : TinyLM
            The model whose blocks, heads and dtype the cache takes.
        count : int
            How many sequences.
        length : int
            Tokens of room per sequence (rounded up to whole splits).

        Returns
        -------
        TiledCache
        """
        cfg, p = model.cfg, next(model.parameters())
        shape = (_splits(length), count + (-count % TILE_ROWS), cfg.n_heads, KV_SPLIT, cfg.d_model // cfg.n_heads)
        zeros = lambda: torch.zeros(shape, dtype=p.dtype, device=p.device)  # noqa: E731
        return cls([zeros() for _ in model.blocks], [zeros() for _ in model.blocks], count)

    @property
    def splits(self) -> int:
        return self.keys[0].shape[0]

    def reserve(self, length: int) -> None:
        """Grow every sequence's room to at least ``length`` tokens.

        Parameters
        ----------
        length : int
            Tokens of room wanted.
        """
        more = _splits(length) - self.splits
        if more > 0:
            grow = lambda t: torch.cat([t, t.new_zeros((more, *t.shape[1:]))])  # noqa: E731
            self.keys, self.values = [grow(k) for k in self.keys], [grow(v) for v in self.values]

    def select(self, rows: list[int]) -> TiledCache:
        """These sequences, in this order.

        Parameters
        ----------
        rows : list of int
            The sequences' rows in this cache.

        Returns
        -------
        TiledCache
        """
        index = torch.tensor(rows, dtype=torch.long, device=self.keys[0].device)
        take = lambda t: _pad_dim1(t.index_select(1, index))  # noqa: E731
        return TiledCache([take(k) for k in self.keys], [take(v) for v in self.values], len(rows))

    @classmethod
    def join(cls, caches: list[TiledCache]) -> TiledCache:
        """The sequences of every cache, one cache after another, with the room of the longest.

        Parameters
        ----------
        caches : list of TiledCache
            The caches, of the same model.

        Returns
        -------
        TiledCache
        """
        room = max(c.splits for c in caches) * KV_SPLIT
        for cache in caches:
            cache.reserve(room)
        layers = range(len(caches[0].keys))
        glue = lambda parts: _pad_dim1(torch.cat([t[:, : c.count] for t, c in zip(parts, caches)], dim=1))  # noqa: E731
        return cls(
            [glue([c.keys[i] for c in caches]) for i in layers],
            [glue([c.values[i] for c in caches]) for i in layers],
            sum(c.count for c in caches),
        )


def _pad_dim1(t: torch.Tensor) -> torch.Tensor:
    """``t`` with zero rows (dimension 1) appended up to whole tiles."""
    return pad_rows(t.transpose(0, 1)).transpose(0, 1).contiguous()


def _splits(length: int) -> int:
    """Attention splits that hold ``length`` keys (at least one)."""
    return max(1, math.ceil(length / KV_SPLIT))


def forward(
    model,
    ids: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor,
    cache: TiledCache,
    want: torch.Tensor,
    *,
    prefill: bool = False,
) -> torch.Tensor:
    """Logits at the packed tokens ``want`` indexes, after writing every token's keys and values to ``cache``.

    ``ids``, ``positions`` and ``rows`` (the cache row of each token's sequence) are 1-D, one entry per
    token; a token attends to its sequence's positions up to its own, so several prompts, or several
    requests' next tokens, are packed together. Every query meets its keys alone, in a prefill as in
    a decode step: a token's logprob from a one-pass forward over a whole sequence (a trainer's
    recompute) then has the bits its decode step gave. With ``prefill``, only the ``want`` rows go
    on past the last layer's attention.

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
    cache : TiledCache
        The sequences' keys and values, written in place (and grown as needed).
    want : torch.Tensor
        The indices of the tokens whose logits are wanted.
    prefill : bool, default False
        A prefill: only the ``want`` rows go past the last attention.

    Returns
    -------
    torch.Tensor
        ``[len(want), vocab]`` logits.
    """
    limits = [p + 1 for p in positions.tolist()]
    cache.reserve(max(limits))
    slots = (positions // KV_SPLIT, rows, positions % KV_SPLIT)  # where each token's key and value go
    ids, positions, rows, limits = _padded(ids, positions, rows, limits, cache)
    x = model.tok(ids) + model.pos(positions)
    shape = (model.cfg.context, model.cfg.n_heads)
    plan = _step_plan(
        rows, limits, *shape
    )  # prefill too: a query's products have a decode step's shapes, so its bits do
    keep = pad_rows(want) if prefill else None
    last = len(model.blocks) - 1
    for layer, (block, keys, values) in enumerate(zip(model.blocks, cache.keys, cache.values)):
        x = _block(block, x, slots, keys, values, plan, keep if layer == last else None)
    x = x if keep is not None else pad_rows(x[want])
    return _linear(model.head, _layer_norm(model.ln_f, x))[: want.shape[0]]


def _padded(ids, positions, rows, limits: list[int], cache: TiledCache):
    """The tokens padded to whole tiles: token 0 at position 0 of the next rows (spare ones where the
    batch does not fill its tile, so a decode step's rows stay consecutive). They write nothing."""
    n, missing = ids.shape[0], -ids.shape[0] % TILE_ROWS
    if not missing:
        return ids, positions, rows, limits
    spare = torch.arange(n, n + missing, device=rows.device).clamp(max=cache.keys[0].shape[1] - 1)
    return pad_rows(ids), pad_rows(positions), torch.cat([rows, spare]), limits + [1] * missing


@dataclass(frozen=True)
class _Group:
    """One attention call: ``take`` (the packed rows of its queries, tile by tile, ``queries`` per
    tile), the cache row each tile reads (a slice when consecutive), the splits its longest query
    needs, and an additive mask ``[splits * tiles * heads, queries, KV_SPLIT]``, 0 for a key the
    query sees and -inf for one it does not."""

    take: torch.Tensor | slice
    queries: int
    rows: torch.Tensor | slice
    splits: int
    mask: torch.Tensor


@dataclass(frozen=True)
class _Plan:
    groups: list[_Group]
    every: int  # the model's context in splits: the fixed count the splits are combined over


def _mask(limits: list[int], splits: int, queries: int, heads: int, device) -> torch.Tensor:
    """The additive mask of queries that see ``limits`` keys each, ``queries`` to a tile, as the scores lie."""
    keys = torch.arange(splits * KV_SPLIT, device=device).view(splits, 1, 1, 1, KV_SPLIT)
    seen = keys < torch.tensor(limits, device=device).view(1, -1, 1, queries, 1)
    mask = torch.zeros(seen.shape, dtype=torch.float32, device=device).masked_fill_(~seen, -math.inf)
    return mask.expand(-1, -1, heads, -1, -1).reshape(
        -1, queries, KV_SPLIT
    )  # one row per split, tile and head, as the scores


def _step_plan(rows: torch.Tensor, limits: list[int], context: int, heads: int) -> _Plan:
    """A decode step: each row's query alone, in groups of :data:`QUERY_GROUP` rows (grouping bounds
    memory; it changes no row's bits)."""
    groups = []
    for start in range(0, len(limits), QUERY_GROUP):
        part, group_rows = limits[start : start + QUERY_GROUP], rows[start : start + QUERY_GROUP]
        splits, first = _splits(max(part)), int(group_rows[0])
        consecutive = torch.equal(group_rows, torch.arange(first, first + len(part), device=rows.device))
        groups.append(
            _Group(
                slice(start, start + len(part)),
                1,
                slice(first, first + len(part)) if consecutive else group_rows,
                splits,
                _mask(part, splits, 1, heads, rows.device),
            )
        )
    return _Plan(groups, _splits(context))


def _linear(layer, x: torch.Tensor) -> torch.Tensor:
    """``layer`` on ``x [N, d]`` (N whole tiles): one GEMM of fixed shape ``[TILE_ROWS, d] @ [d, out]`` per tile,
    issued as one batched call."""
    tiles, (out, d) = x.shape[0] // TILE_ROWS, layer.weight.shape
    weight = layer.weight.t().expand(tiles, d, out)
    tiled = x.view(tiles, TILE_ROWS, d)
    y = torch.bmm(tiled, weight) if layer.bias is None else torch.baddbmm(layer.bias, tiled, weight)
    return y.view(-1, out)


def _layer_norm(ln, x: torch.Tensor) -> torch.Tensor:
    """Per row: LayerNorm's mean and variance run within each row, whatever the number of rows."""
    return F.layer_norm(x, x.shape[-1:], ln.weight, ln.bias, ln.eps)


def _block(block, x, slots, keys, values, plan: _Plan, keep=None):
    """One pre-norm block on the packed rows; the real tokens' keys and values are written first.

    ``keep``: only these rows go on past the attention (a row's result does not depend on which
    others go with it).
    """
    d, heads, n = x.shape[-1], block.n_heads, slots[0].shape[0]
    q, k, v = _linear(block.qkv, _layer_norm(block.ln1, x)).split(d, dim=-1)
    keys[slots[0], slots[1], :, slots[2]] = k[:n].view(n, heads, -1)
    values[slots[0], slots[1], :, slots[2]] = v[:n].view(n, heads, -1)
    y = _attention(q, keys, values, plan, heads)
    if keep is not None:
        x, y = x[keep], y[keep]
    x = x + _linear(block.out, y.to(x.dtype))
    return x + _linear(block.proj, F.gelu(_linear(block.fc, _layer_norm(block.ln2, x))))


def _attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, plan: _Plan, heads: int) -> torch.Tensor:
    """Every packed row's attention output ``[N, d]``, group by group."""
    hd = q.shape[-1] // heads
    parts = []
    for group in plan.groups:
        tiles = q[group.take].reshape(-1, group.queries, heads, hd).transpose(1, 2)  # [T, H, queries, hd]
        parts.append(_attend(tiles, keys, values, group, plan.every).transpose(1, 2).reshape(-1, heads * hd))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _read(cache: torch.Tensor, group: _Group) -> torch.Tensor:
    """The group's rows of one layer's keys or values, its splits only, in float32 (a view when the rows are consecutive)."""
    block = cache[: group.splits]
    rows = block[:, group.rows] if isinstance(group.rows, slice) else block.index_select(1, group.rows)
    return rows.float()


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, group: _Group, every: int) -> torch.Tensor:
    """Attention of query tiles ``[T, H, queries, hd]``, each over its own cache row's keys, in float32.

    Every product has a fixed shape: a tile's queries against one split's :data:`KV_SPLIT` keys (a
    dot over ``hd`` each), and their weights against that split's values. The splits' sums are
    combined over the model's context in splits (``every``), so a query's result is the same
    whatever splits its group needs and whatever room the cache holds: a split past the query's
    length adds exact zeros.
    """
    (tiles, heads, queries, hd), splits = q.shape, group.splits
    expanded = q.float().expand(splits, tiles, heads, queries, hd).reshape(-1, queries, hd)  # each tile once per split
    keys = _read(keys, group).reshape(-1, KV_SPLIT, hd).transpose(1, 2)
    scores = torch.baddbmm(group.mask, expanded, keys, alpha=1 / math.sqrt(hd)).view(
        splits, tiles, heads, queries, KV_SPLIT
    )
    weights = (scores - scores.amax(dim=(0, -1), keepdim=True)).exp()
    short = every - splits
    total = F.pad(weights.sum(dim=-1), (0, 0, 0, 0, 0, 0, 0, short)).sum(dim=0)  # [T, H, queries]
    mixed = torch.bmm(weights.view(-1, queries, KV_SPLIT), _read(values, group).reshape(-1, KV_SPLIT, hd))
    mixed = F.pad(mixed.view(splits, tiles, heads, queries, hd), (0, 0, 0, 0, 0, 0, 0, 0, 0, short)).sum(
        dim=0
    )  # [T, H, queries, hd]
    return mixed / total[..., None]
