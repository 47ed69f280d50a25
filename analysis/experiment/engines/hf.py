"""Write the bundled byte-level model as a Hugging Face checkpoint that vLLM (and transformers) load.

The model of :mod:`analysis.experiment.model` is GPT-2's architecture at a small size (learned
positions, pre-norm LayerNorm with biases, one fused QKV matrix, exact GELU, an untied head), so it
goes across to transformers' ``GPT2LMHeadModel`` unchanged, only renamed: GPT-2 keeps its linear
layers as ``Conv1D`` (weights stored ``[in, out]``), so those four matrices are written transposed,
and the config says ``activation_function: "gelu"`` (exact GELU, as torch's ``F.gelu``) and
``tie_word_embeddings: false`` (the head is the model's own ``head.weight``). vLLM 0.32's
``GPT2LMHeadModel`` (``vllm/model_executor/models/gpt2.py``) reads both: its MLP takes
``get_act_fn(config.activation_function)``, where ``"gelu"`` is ``nn.GELU()``, and it ties the head
only when ``tie_word_embeddings`` is set, loading ``lm_head.weight`` otherwise.

The tokenizer is GPT-2's byte-level BPE over the 256 bytes with no merges (``tokenizer.json``, built
with ``tokenizers``), so every byte is one token as it is in torch and in the GGUF
(:func:`~analysis.experiment.engines.gguf.byte_tokens`); byte 0 (NUL) is the end-of-sequence token, and the
chat template joins the messages' contents, as the GGUF's does. All three engines serve one model.

Nothing here imports torch: the weights are read and written with ``safetensors.numpy``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...core import claim_output
from .gguf import CHAT_TEMPLATE, byte_tokens

SERVED_NAME = "bia-tiny-byte-lm"

# torch name of each block's tensor -> (GPT-2 name, transposed: GPT-2's Conv1D stores [in, out])
_BLOCK_NAMES = {
    "ln1.weight": ("ln_1.weight", False),
    "ln1.bias": ("ln_1.bias", False),
    "qkv.weight": ("attn.c_attn.weight", True),
    "qkv.bias": ("attn.c_attn.bias", False),
    "out.weight": ("attn.c_proj.weight", True),
    "out.bias": ("attn.c_proj.bias", False),
    "ln2.weight": ("ln_2.weight", False),
    "ln2.bias": ("ln_2.bias", False),
    "fc.weight": ("mlp.c_fc.weight", True),
    "fc.bias": ("mlp.c_fc.bias", False),
    "proj.weight": ("mlp.c_proj.weight", True),
    "proj.bias": ("mlp.c_proj.bias", False),
}
_TOP_NAMES = {
    "tok.weight": "transformer.wte.weight",
    "pos.weight": "transformer.wpe.weight",
    "ln_f.weight": "transformer.ln_f.weight",
    "ln_f.bias": "transformer.ln_f.bias",
    "head.weight": "lm_head.weight",
}


def hf_tensor_names(state_keys) -> dict[str, tuple[str, bool]]:
    """GPT-2's name for each torch tensor of the model, and whether it is written transposed; an unknown name is an error.

    Parameters
    ----------
    state_keys : iterable of str
        The model's state dict keys.

    Returns
    -------
    dict of str to tuple of (str, bool)

    Examples
    --------
    >>> hf_tensor_names(["blocks.1.qkv.weight", "blocks.1.qkv.bias", "head.weight"])  # doctest: +NORMALIZE_WHITESPACE
    {'blocks.1.qkv.weight': ('transformer.h.1.attn.c_attn.weight', True), 'blocks.1.qkv.bias': ('transformer.h.1.attn.c_attn.bias', False),
     'head.weight': ('lm_head.weight', False)}
    """
    names = {}
    for key in state_keys:
        if key in _TOP_NAMES:
            names[key] = (_TOP_NAMES[key], False)
            continue
        head, _, rest = key.partition(".")
        layer, _, part = rest.partition(".")
        if head != "blocks" or not layer.isdigit() or part not in _BLOCK_NAMES:
            raise ValueError(f"tensor {key!r} has no place in GPT-2's architecture")
        name, transposed = _BLOCK_NAMES[part]
        names[key] = (f"transformer.h.{layer}.{name}", transposed)
    return names


def gpt2_config(cfg: dict) -> dict:
    """transformers' ``GPT2Config`` (as ``config.json``) for the model's config (``vocab``, ``d_model``, ...).

    Parameters
    ----------
    cfg : dict
        The model's config (``vocab``, ``d_model``, ``n_heads``, ``n_layers``, ``context``).

    Returns
    -------
    dict

    Examples
    --------
    >>> config = gpt2_config({"vocab": 256, "d_model": 128, "n_heads": 4, "n_layers": 3, "context": 256})
    >>> config["architectures"], config["activation_function"], config["tie_word_embeddings"], config["n_inner"]
    (['GPT2LMHeadModel'], 'gelu', False, 512)
    """
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg["vocab"],
        "n_positions": cfg["context"],
        "n_ctx": cfg["context"],
        "n_embd": cfg["d_model"],
        "n_layer": cfg["n_layers"],
        "n_head": cfg["n_heads"],
        "n_inner": 4 * cfg["d_model"],
        "activation_function": "gelu",  # exact GELU, torch's F.gelu default (GPT-2's own is "gelu_new", the tanh approximation)
        "layer_norm_epsilon": 1e-5,  # torch's LayerNorm default, which the model uses
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": False,  # the model's head is its own matrix, not the token embedding
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def byte_tokenizer_json() -> str:
    """``tokenizer.json``: GPT-2's byte-level BPE over the 256 bytes, no merges, NUL the end-of-sequence token.

    Examples
    --------
    >>> from tokenizers import Tokenizer
    >>> tokenizer = Tokenizer.from_str(byte_tokenizer_json())
    >>> ids = tokenizer.encode("héllo\\n").ids
    >>> ids == list("héllo\\n".encode()), tokenizer.decode(ids)
    (True, 'héllo\\n')
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = byte_tokens()
    tokenizer = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(tokens[0], special=True, normalized=False)])
    return tokenizer.to_str()


def write_hf_checkpoint(weights, folder, *, force: bool = False) -> Path:
    """Write the byte-level model saved at ``weights`` (a ``.safetensors`` file beside its ``.json``) as a
    Hugging Face checkpoint folder: ``config.json``, ``model.safetensors``, ``tokenizer.json``,
    ``tokenizer_config.json`` (with the chat template), ``special_tokens_map.json`` and ``generation_config.json``.

    Parameters
    ----------
    weights : path
        The model's ``.safetensors`` file, as ``scripts/train_tiny_model.py`` writes it.
    folder : path
        The folder to write (refused when it exists, unless ``force``).
    force : bool
        Replace ``folder`` when it exists.

    Returns
    -------
    Path
        ``folder``.

    Examples
    --------
    >>> import tempfile, analysis.experiment as ex
    >>> folder = write_hf_checkpoint(ex.bundled_model(), Path(tempfile.mkdtemp()) / "tiny")
    >>> sorted(p.name for p in folder.iterdir())  # doctest: +NORMALIZE_WHITESPACE
    ['config.json', 'generation_config.json', 'model.safetensors', 'special_tokens_map.json', 'tokenizer.json',
     'tokenizer_config.json']
    """
    import numpy as np
    from safetensors.numpy import load_file, save_file

    weights = Path(weights)
    meta = json.loads(weights.with_suffix(".json").read_text(encoding="utf-8"))
    cfg = meta["config"]
    if cfg["vocab"] != 256:
        raise ValueError(
            f"{weights}: vocab {cfg['vocab']} is not the 256 bytes this writer maps onto GPT-2's byte tokens"
        )
    state = load_file(str(weights))
    names = hf_tensor_names(state)
    folder = claim_output(folder, force=force, what="the checkpoint folder", folder=True)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for key, array in state.items():
        name, transposed = names[key]
        array = np.asarray(array, dtype=np.float32)
        tensors[name] = np.ascontiguousarray(array.T if transposed else array)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})

    eos = byte_tokens()[0]
    config = gpt2_config(cfg) | {"bia": {"source": weights.name, "command": meta.get("command")}}
    files = {
        "config.json": config,
        "generation_config.json": {"bos_token_id": 0, "eos_token_id": 0, "do_sample": False},
        "special_tokens_map.json": {"bos_token": eos, "eos_token": eos, "unk_token": eos},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": cfg["context"],
            "add_bos_token": False,
            "add_eos_token": False,
            "bos_token": eos,
            "eos_token": eos,
            "unk_token": eos,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    }
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / "tokenizer.json").write_text(byte_tokenizer_json(), encoding="utf-8")
    return folder
