"""The parameters of a :class:`~analysis.experiment.model.TinyLM` as the ``row-invariant`` forward
(:mod:`~analysis.experiment.model.rowwise`) reads them, looked up once per model and made again when one changed, and
the per-row operations that read them: a Linear as one plain GEMM over every row, a LayerNorm per row.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass(frozen=True)
class _Weights:
    """A TinyLM's parameters as the forward reads them: each Linear as :func:`_linear_weights` gives it, each LayerNorm
    ``(weight, bias, eps)``, per block ``(ln1, qkv, out, ln2, fc, proj, heads)``. Looking them up once saves the forward
    about 70 calls to ``nn.Module.__getattr__`` per step. The LayerNorms and embeddings are the model's own tensors;
    the float32 Linear weights are transposed copies, made again by :func:`_weights` when a weight changed in place
    (its version counter: ``load_state_dict``, an optimizer step, any in-place op under ``no_grad``) or moved (``.to()``),
    or when a layer or Parameter was replaced by another. (A change through ``weight.data`` bumps no version and would
    go unseen; nothing in bia makes one.)"""

    tok: torch.Tensor
    pos: torch.Tensor
    blocks: tuple
    ln_f: tuple
    head: tuple[torch.Tensor, torch.Tensor | None]  # as _linear_weights gives it
    heads: int
    params: tuple  # (the parent's dict, name, object) of each submodule and Parameter, to notice one replaced
    stamp: tuple  # each Linear weight's (version, address) when copied, to notice one changed
    sources: tuple  # those weights


_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _weights(model) -> _Weights:
    """``model``'s :class:`_Weights`, made on first use and again when one of its layers or Parameters was replaced."""
    known = _WEIGHTS.get(model)
    if (
        known is not None
        and all(table.get(name) is param for table, name, param in known.params)
        and _stamp(known.sources) == known.stamp
    ):
        return known
    sources = tuple(layer.weight for layer in model.modules() if isinstance(layer, torch.nn.Linear))
    norm = lambda m: (m.weight, m.bias, m.eps)  # noqa: E731
    blocks = tuple(
        (
            norm(b.ln1),
            _linear_weights(b.qkv),
            _linear_weights(b.out),
            norm(b.ln2),
            _linear_weights(b.fc),
            _linear_weights(b.proj),
            b.n_heads,
        )
        for b in model.blocks
    )
    made = _Weights(
        model.tok.weight,
        model.pos.weight,
        blocks,
        norm(model.ln_f),
        _linear_weights(model.head),
        model.cfg.n_heads,
        _parameters(model),
        _stamp(sources),
        sources,
    )
    _WEIGHTS[model] = made
    return made


def _parameters(model) -> tuple:
    """``(dict, name, object)`` for every submodule and Parameter of ``model``, ``dict`` the one of its parent that holds
    it: the check that none was replaced is then one lookup each, cheaper than walking ``parameters()``."""
    entries = []

    def walk(module) -> None:
        for name, child in module._modules.items():
            entries.append((module._modules, name, child))
            walk(child)
        entries.extend((module._parameters, name, param) for name, param in module._parameters.items())

    walk(model)
    return tuple(entries)


def _stamp(weights) -> tuple:
    """Each weight's version counter and address: what changes when it is written to in place or moved."""
    return tuple((weight._version, weight.data_ptr()) for weight in weights)


def _linear_weights(layer) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight, bias)`` for :func:`_linear`: the weight as ``[in, out]``. In float32 a contiguous copy: MKL's GEMM
    then reads it untransposed, about a tenth faster for a few rows than ``F.linear``'s transposed view, and sums each
    row in the same order, so gives the same bits from :data:`~analysis.experiment.model.rowwise.MIN_ROWS` rows up
    (``tests/test_kernels.py``); in bfloat16 (oneDNN) the view ``F.linear`` itself takes."""
    weight = layer.weight.detach()
    return (weight.t().contiguous() if weight.dtype == torch.float32 else weight.t()), layer.bias


def _linear(x: torch.Tensor, weights: tuple) -> torch.Tensor:
    """A Linear on ``x [N, d]`` (N >= :data:`~analysis.experiment.model.rowwise.MIN_ROWS`): one plain GEMM over every
    row (``weights`` from :func:`_linear_weights`)."""
    weight, bias = weights
    return torch.mm(x, weight) if bias is None else torch.addmm(bias, x, weight)


def _layer_norm(ln: tuple, x: torch.Tensor) -> torch.Tensor:
    """Per row: LayerNorm's mean and variance run within each row, whatever the number of rows (``ln``: weight, bias, eps)."""
    return F.layer_norm(x, x.shape[-1:], ln[0], ln[1], ln[2])
