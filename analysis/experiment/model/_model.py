"""A small byte-level decoder-only transformer with a KV cache, for batch-invariance experiments.

The kernel modes that run it are listed in :mod:`analysis.experiment.modes`; ``fixed-tiles`` runs it on :mod:`.kernels`,
``row-invariant`` on :mod:`.rowwise`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F


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

    # While analysis.experiment.model._taps records, a callable (op, tensor) for the two attention ops no
    # submodule's hook sees; None otherwise, which costs one attribute check per call.
    tap = None

    def forward(self, x, cache, mask):
        """One transformer block over ``x``, appending its keys and values to ``cache``.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, T, d_model]`` hidden states.
        cache : tuple of torch.Tensor or None
            The keys and values of earlier positions, ``[B, heads, S - T, d_head]`` each; None before any.
        mask : torch.Tensor
            The additive attention mask, broadcast to ``[B, heads, T, S]`` (the dtype's lowest value where not allowed).

        Returns
        -------
        tuple of (torch.Tensor, tuple of torch.Tensor)
            The block's output and the keys and values of all ``S`` positions.
        """
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        heads = lambda z: z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_heads) + mask
        weights = scores.softmax(dim=-1)
        if self.tap is not None:
            self.tap("scores", scores)
            self.tap("softmax", weights)
        y = (weights @ v).transpose(1, 2).reshape(b, t, d)
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

    def forward(self, ids, positions, valid, caches=None):
        """Logits for ``ids [B, T]`` at ``positions [B, T]``.

        ``valid [B, S]`` marks the key positions a row may attend to (the cache's and these T, not
        padding); causality within the new tokens is added here.

        Parameters
        ----------
        ids : torch.Tensor
            ``[B, T]`` token ids.
        positions : torch.Tensor
            ``[B, T]`` their positions.
        valid : torch.Tensor
            ``[B, S]`` booleans.
        caches : list of tuple of torch.Tensor, optional
            Each block's keys and values of the ``S - T`` earlier positions; None before any.

        Returns
        -------
        tuple of (torch.Tensor, list of tuple of torch.Tensor)
            ``[B, T, vocab]`` logits, and each block's keys and values of all ``S`` positions.
        """
        t, s = ids.shape[1], valid.shape[1]
        causal = torch.ones(t, s, dtype=torch.bool, device=ids.device).tril(diagonal=s - t)
        allowed = causal[None, None] & valid[:, None, None, :]
        dtype = self.tok.weight.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=ids.device).masked_fill(~allowed, torch.finfo(dtype).min)
        x = self.tok(ids) + self.pos(positions)
        new = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if caches is None else caches[i], mask)
            new.append(kv)
        return self.head(self.ln_f(x)), new

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids: its UTF-8 bytes.

        Parameters
        ----------
        text : str
            The prompt.

        Returns
        -------
        list of int
        """
        return list(text.encode("utf-8"))

    def token(self, token_id: int) -> tuple[str, bytes]:
        """A token's text (U+FFFD for a byte that is not UTF-8 alone) and its bytes.

        Parameters
        ----------
        token_id : int
            The token (a byte, 0 to 255).

        Returns
        -------
        tuple of (str, bytes)
        """
        data = bytes([token_id])
        return data.decode("utf-8", errors="replace"), data


class HFModel:
    """A local Hugging Face causal LM behind the same call as :class:`TinyLM` (transformers, offline only)."""

    def __init__(self, path, dtype: torch.dtype, device: str) -> None:
        import inspect

        from transformers import AutoModelForCausalLM, AutoTokenizer

        # Any: transformers types PreTrainedModel.to as a functools wrapper, which mypy cannot call as a bound method
        loaded: Any = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype)
        self.model = loaded.to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        # transformers 5.x renamed past_key_values to cache; take whichever this version has
        self._cache = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    def parameters(self):
        return self.model.parameters()

    def __call__(self, ids, positions, valid, caches=None):
        out = self.model(
            input_ids=ids, position_ids=positions, attention_mask=valid.long(), use_cache=True, **{self._cache: caches}
        )
        return out.logits, out[self._cache]

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids, from the model's tokenizer (no special tokens added).

        Parameters
        ----------
        text : str
            The prompt.

        Returns
        -------
        list of int
        """
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def token(self, token_id: int) -> tuple[str, bytes]:
        """A token's text, from the model's tokenizer, and its UTF-8 bytes.

        Parameters
        ----------
        token_id : int
            The token.

        Returns
        -------
        tuple of (str, bytes)
        """
        text = cast(str, self.tokenizer.decode([token_id]))  # one sequence: one string
        return text, text.encode("utf-8")


def load_model(path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Load a model: weights saved by ``scripts/train_tiny_model.py`` (a ``.safetensors`` file with its
    ``.json``), or a local Hugging Face model directory (needs transformers; never downloads).

    Parameters
    ----------
    path : str or path
        The ``.safetensors`` file, or a Hugging Face model directory.
    dtype : torch.dtype, default torch.float32
        The weights' dtype.
    device : str, default "cpu"
        The torch device.

    Returns
    -------
    TinyLM or HFModel
        In eval mode.
    """
    import json
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        try:
            return HFModel(path, dtype, device)
        except ImportError:
            raise ValueError(
                f"{path}: a Hugging Face model directory needs transformers: pip install 'bia[hf]'"
            ) from None
    from safetensors.torch import load_file

    cfg = ModelConfig(**json.loads(path.with_suffix(".json").read_text())["config"])
    model = TinyLM(cfg)
    model.load_state_dict(load_file(str(path)))
    return model.to(device=device, dtype=dtype).eval()
