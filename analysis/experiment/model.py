"""A small byte-level decoder-only transformer with a KV cache, for batch-invariance experiments.

Kernel modes:

- ``default``: the batch runs through every layer together, as a serving engine does; torch picks
  its kernels by the batch's shape, so a row's bits may depend on how many rows it shares a
  matmul with.
- ``batch-invariant``: every request runs through the same arithmetic as it would alone — each row
  is its own batch of one at every layer (the matmul shapes of a single request). A row's bits are
  then independent of the batch by construction; the cost is decode rate, which the run records.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

KERNEL_MODES = ("default", "batch-invariant")


@dataclass(frozen=True)
class ModelConfig:
    """The shape of the model; saved beside its weights."""

    vocab: int = 256
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 3
    context: int = 256

    def to_dict(self) -> dict:
        return asdict(self)


class Block(nn.Module):
    """Pre-norm attention and MLP."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x, cache, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        heads = lambda z: z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_heads) + mask
        y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(y)
        x = x + self.proj(F.gelu(self.fc(self.ln2(x))))
        return x, (k, v)


class TinyLM(nn.Module):
    """Byte-level GPT: token and position embeddings, ``n_layers`` blocks, a final norm and head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, ids, positions, mask, caches=None):
        """Logits for ``ids [B, T]`` at ``positions [B, T]``; ``mask [B, 1, T, S]`` is additive (0 or -inf)."""
        x = self.tok(ids) + self.pos(positions)
        new = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if caches is None else caches[i], mask)
            new.append(kv)
        return self.head(self.ln_f(x)), new


def load_model(path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> TinyLM:
    """Load weights saved by ``scripts/train_tiny_model.py`` (safetensors plus a JSON config)."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    path = Path(path)
    cfg = ModelConfig(**json.loads(path.with_suffix(".json").read_text())["config"])
    model = TinyLM(cfg)
    model.load_state_dict(load_file(str(path)))
    return model.to(device=device, dtype=dtype).eval()
