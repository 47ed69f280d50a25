"""Taps on every op of a :class:`~analysis.experiment.model.TinyLM`: what each op outputs, per forward call.

A tap is a forward hook on the submodule that computes the op (or on the one that consumes it, for
the attention mix and the GELU), plus the two explicit tap points of ``Block.forward`` (the attention
scores and their softmax). Nothing is registered while no :class:`Taps` is open, so a model without
taps runs exactly the code it ran before (``benchmarks/bench_kernels.py --taps`` measures it).

Ops are numbered in forward order (:func:`tapped_ops`): the embedding, then per layer its ten ops,
then the final norm and the logits. A kernel mode whose decode does not call ``TinyLM.forward`` (the
fixed tiles of :mod:`.kernels`) fires no tap at all.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# Each layer's ops in forward order, with the submodule whose hook sees it: "out" is the submodule's
# output, "in" its input (the attention mix is what the out projection reads, the GELU what the
# down projection reads); None for Block.forward's own tap points.
LAYER_OPS = (
    ("ln1", "ln1", "out"),
    ("qkv", "qkv", "out"),
    ("scores", None, None),
    ("softmax", None, None),
    ("attention", "out", "in"),
    ("attn_out", "out", "out"),
    ("ln2", "ln2", "out"),
    ("mlp_up", "fc", "out"),
    ("gelu", "proj", "in"),
    ("mlp_down", "proj", "out"),
)


def tapped_ops(n_layers: int) -> list[tuple[int | None, str]]:
    """Every tapped op of a model of ``n_layers`` blocks as (layer, op), in forward order.

    Parameters
    ----------
    n_layers : int
        The model's blocks.

    Returns
    -------
    list of tuple of (int or None, str)

    Examples
    --------
    >>> ops = tapped_ops(2)
    >>> ops[:3], ops[-2:], len(ops)
    ([(None, 'embedding'), (0, 'ln1'), (0, 'qkv')], [(None, 'ln_f'), (None, 'logits')], 23)
    """
    return [
        (None, "embedding"),
        *((layer, op) for layer in range(n_layers) for op, _, _ in LAYER_OPS),
        (None, "ln_f"),
        (None, "logits"),
    ]


Sink = Callable[[int, int, torch.Tensor], None]  # (forward call, op index, the op's output) for every op of every call


class Taps:
    """Hooks on every op of ``model`` while open (a context manager); each op's output goes to ``sink``.

    ``calls`` counts the model's forward calls since the taps opened and ``rows`` holds each call's
    batch size, so a caller can tell whether a decode ran one call per step with the whole batch.
    """

    def __init__(self, model, sink: Sink) -> None:
        self.model, self.sink = model, sink
        self.ops = tapped_ops(len(model.blocks))
        self.calls = -1
        self.rows: list[int] = []
        self._handles: list = []

    def __enter__(self) -> Taps:
        index = {op: i for i, op in enumerate(self.ops)}
        model = self.model
        self._hook(model, "pre", lambda _m, args: self._new_call(args[0]))
        self._hook(model.blocks[0], "pre", lambda _m, args: self._seen(index[None, "embedding"], args[0]))
        for layer, block in enumerate(model.blocks):
            for op, module, side in LAYER_OPS:
                if module is None:
                    continue
                where = index[layer, op]
                if side == "in":
                    self._hook(getattr(block, module), "pre", lambda _m, args, where=where: self._seen(where, args[0]))
                else:
                    self._hook(
                        getattr(block, module), "out", lambda _m, _args, out, where=where: self._seen(where, out)
                    )
            block.tap = lambda op, value, layer=layer: self._seen(index[layer, op], value)
        self._hook(model.ln_f, "out", lambda _m, _args, out: self._seen(index[None, "ln_f"], out))
        self._hook(model.head, "out", lambda _m, _args, out: self._seen(index[None, "logits"], out))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for block in self.model.blocks:
            del block.tap  # back to the class's None: no tap point fires

    def _hook(self, module, kind: str, hook) -> None:
        register = module.register_forward_pre_hook if kind == "pre" else module.register_forward_hook
        self._handles.append(register(hook))

    def _new_call(self, ids: torch.Tensor) -> None:
        self.calls += 1
        self.rows.append(ids.shape[0])

    def _seen(self, op: int, value: torch.Tensor) -> None:
        self.sink(self.calls, op, value)
