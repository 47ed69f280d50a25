"""Write the bundled byte-level model as a GGUF file that a real llama.cpp server loads.

The model of :mod:`analysis.experiment.model` is GPT-2's architecture at a small size: learned
position embeddings, pre-norm LayerNorm blocks with biases, one fused QKV matrix, a GELU MLP and an
untied output head. llama.cpp's ``gpt2`` architecture has exactly these tensors, so the weights go
across unchanged (only renamed); the vocabulary is the 256 bytes, written as GPT-2's byte-level
BPE tokens with no merges, so every byte is one token as it is in torch.

Byte 0 (NUL) is the end-of-sequence token: the training corpus holds none, so the model never
predicts it and a greedy stream runs to ``max_tokens``. The chat template joins the messages'
contents, so a chat request continues its prompt as the torch experiment does.

Needs the ``gguf`` package (``pip install 'bia[test]'`` pins it).
"""

from __future__ import annotations

import json
from pathlib import Path

from ...core import claim_output

CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"

# torch name of each block's tensor -> llama.cpp gpt2 name
_BLOCK_NAMES = {
    "ln1.weight": "attn_norm.weight",
    "ln1.bias": "attn_norm.bias",
    "qkv.weight": "attn_qkv.weight",
    "qkv.bias": "attn_qkv.bias",
    "out.weight": "attn_output.weight",
    "out.bias": "attn_output.bias",
    "ln2.weight": "ffn_norm.weight",
    "ln2.bias": "ffn_norm.bias",
    "fc.weight": "ffn_up.weight",
    "fc.bias": "ffn_up.bias",
    "proj.weight": "ffn_down.weight",
    "proj.bias": "ffn_down.bias",
}
_TOP_NAMES = {
    "tok.weight": "token_embd.weight",
    "pos.weight": "position_embd.weight",
    "ln_f.weight": "output_norm.weight",
    "ln_f.bias": "output_norm.bias",
    "head.weight": "output.weight",
}


def byte_tokens() -> list[str]:
    """GPT-2's printable stand-in for each byte, in byte order (token id = byte value).

    Examples
    --------
    >>> tokens = byte_tokens()
    >>> len(tokens), tokens[ord("a")], tokens[ord(" ")], tokens[ord("\\n")]
    (256, 'a', 'Ġ', 'Ċ')
    """
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    stand_in, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            stand_in[byte] = chr(byte)
        else:
            stand_in[byte] = chr(256 + extra)
            extra += 1
    return [stand_in[byte] for byte in range(256)]


def gguf_tensor_names(state_keys) -> dict[str, str]:
    """llama.cpp's name for each torch tensor of the model; an unknown name is an error.

    Parameters
    ----------
    state_keys : iterable of str
        The model's state dict keys.

    Returns
    -------
    dict of str to str

    Examples
    --------
    >>> gguf_tensor_names(["blocks.2.qkv.bias", "head.weight"])
    {'blocks.2.qkv.bias': 'blk.2.attn_qkv.bias', 'head.weight': 'output.weight'}
    """
    names = {}
    for key in state_keys:
        if key in _TOP_NAMES:
            names[key] = _TOP_NAMES[key]
            continue
        head, _, rest = key.partition(".")
        layer, _, part = rest.partition(".")
        if head != "blocks" or not layer.isdigit() or part not in _BLOCK_NAMES:
            raise ValueError(f"tensor {key!r} has no place in llama.cpp's gpt2 architecture")
        names[key] = f"blk.{layer}.{_BLOCK_NAMES[part]}"
    return names


def write_gguf(weights, out, *, dtype: str = "f32", force: bool = False) -> Path:
    """Write the byte-level model saved at ``weights`` (a ``.safetensors`` file beside its ``.json``) as GGUF.

    Parameters
    ----------
    weights : path
        The model's ``.safetensors`` file, as ``scripts/train_tiny_model.py`` writes it.
    out : path
        The ``.gguf`` file to write.
    dtype : {"f32", "f16"}
        Storage of the 2-D matrices; norms, biases and embeddings stay float32.
    force : bool
        Overwrite ``out`` when it exists (refused otherwise).

    Returns
    -------
    Path
        ``out``.

    Examples
    --------
    >>> import tempfile, analysis.experiment as ex
    >>> path = write_gguf(ex.bundled_model(), Path(tempfile.mkdtemp()) / "tiny.gguf")
    >>> path.stat().st_size > 2_000_000
    True
    """
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    weights, out = Path(weights), claim_output(out, force=force, what="the GGUF file")
    if dtype not in ("f32", "f16"):
        raise ValueError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    meta = json.loads(weights.with_suffix(".json").read_text(encoding="utf-8"))
    cfg = meta["config"]
    if cfg["vocab"] != 256:
        raise ValueError(
            f"{weights}: vocab {cfg['vocab']} is not the 256 bytes this writer maps onto GPT-2's byte tokens"
        )
    state = load_file(str(weights))
    names = gguf_tensor_names(state)

    writer = gguf.GGUFWriter(str(out), "gpt2")
    writer.add_name("bia-tiny-byte-lm")
    writer.add_description(f"bia's byte-level model, trained by: {meta.get('command', 'scripts/train_tiny_model.py')}")
    writer.add_context_length(cfg["context"])
    writer.add_embedding_length(cfg["d_model"])
    writer.add_block_count(cfg["n_layers"])
    writer.add_feed_forward_length(4 * cfg["d_model"])
    writer.add_head_count(cfg["n_heads"])
    writer.add_head_count_kv(cfg["n_heads"])
    writer.add_layer_norm_eps(1e-5)  # torch's LayerNorm default, which the model uses
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(byte_tokens())
    writer.add_token_types([gguf.TokenType.NORMAL] * 256)
    writer.add_token_merges(
        ["Ġ Ġ"]
    )  # llama.cpp needs the key; this merge makes a token the vocabulary lacks, so it never applies
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    for key in sorted(state):
        array = np.ascontiguousarray(state[key], dtype=np.float32)
        if dtype == "f16" and array.ndim == 2 and key not in ("tok.weight", "pos.weight"):
            array = array.astype(np.float16)
        writer.add_tensor(names[key], array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
