#!/usr/bin/env python3
"""Write a tiny Llama-architecture GGUF model with deterministic random weights.

The model is meant only for exercising a real llama.cpp server (llama-server)
in bia's tests and studies: it produces gibberish, but its logits are fixed by
the seed, so two writes with the same arguments give byte-identical files.

Architecture: `llama`, 2 layers, n_embd 64, 4 heads (2 KV heads, GQA), FFN 128,
context 512, f32 weights (``--dtype f16`` for half-precision matrices).

Tokenizer: SentencePiece-style (``tokenizer.ggml.model = "llama"``) with
<unk>=0, <s>=1, </s>=2, the 256 byte-fallback tokens <0x00>..<0xFF>, "▁",
printable ASCII characters and a handful of short words, so any UTF-8 text
tokenizes (unknown characters fall back to bytes).  A ChatML chat template is
included so /v1/chat/completions works.

Needs the ``gguf`` package (tested with gguf==0.19.0) and numpy.

Usage:
    python scripts/write_tiny_gguf.py tiny.gguf [--seed 0] [--dtype f32|f16]
"""

from __future__ import annotations

import argparse
import string
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("write_tiny_gguf.py needs the gguf package: pip install gguf==0.19.0")

N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_CTX = 512
RMS_EPS = 1e-5
ROPE_BASE = 10000.0

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

WORDS = [
    "the", "and", "of", "to", "in", "is", "it", "that", "for", "on",
    "with", "as", "was", "at", "by", "be", "this", "are", "or", "an",
    "hello", "world", "batch", "token", "model", "test", "one", "two", "three",
]


def build_vocab() -> tuple[list[str], list[float], list[int]]:
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []

    def add(text: str, score: float, ttype: int) -> None:
        tokens.append(text)
        scores.append(score)
        types.append(ttype)

    add("<unk>", 0.0, gguf.TokenType.UNKNOWN)
    add("<s>", 0.0, gguf.TokenType.CONTROL)
    add("</s>", 0.0, gguf.TokenType.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, gguf.TokenType.BYTE)
    add("<|im_start|>", 0.0, gguf.TokenType.CONTROL)
    add("<|im_end|>", 0.0, gguf.TokenType.CONTROL)

    # Single-character pieces (SentencePiece merges pieces by score; longer
    # pieces get higher scores so words are preferred to letters).
    seen = set(tokens)
    singles = ["\u2581"] + [c for c in string.ascii_letters + string.digits + string.punctuation]
    for c in singles:
        if c not in seen:
            add(c, -1000.0, gguf.TokenType.NORMAL)
            seen.add(c)
    # "▁x" pieces for every letter, then whole words with and without "▁".
    for c in string.ascii_lowercase:
        piece = "\u2581" + c
        add(piece, -100.0, gguf.TokenType.NORMAL)
        seen.add(piece)
    for i, w in enumerate(WORDS):
        for piece in ("\u2581" + w, w):
            if piece not in seen:
                add(piece, -10.0 - 0.01 * i, gguf.TokenType.NORMAL)
                seen.add(piece)
    # Every prefix of a word must be reachable by pairwise merges; add the
    # intermediate prefixes the SPM bigram merge needs.
    extra = []
    for w in WORDS:
        for pre in ("\u2581" + w, w):
            for k in range(2, len(pre)):
                p = pre[:k]
                if p not in seen:
                    extra.append(p)
                    seen.add(p)
    for p in extra:
        add(p, -50.0 + len(p), gguf.TokenType.NORMAL)
    return tokens, scores, types


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="path of the .gguf file to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32",
                    help="dtype of the 2-D weight matrices (norms stay f32)")
    args = ap.parse_args(argv)

    tokens, scores, types = build_vocab()
    n_vocab = len(tokens)
    head_dim = N_EMBD // N_HEAD
    rng = np.random.default_rng(args.seed)
    mat_dtype = np.float32 if args.dtype == "f32" else np.float16

    def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        # numpy shape (rows=out, cols=in) -> GGUF ne = [in, out]
        w = rng.standard_normal((rows, cols), dtype=np.float32) * (scale / np.sqrt(cols))
        return w.astype(mat_dtype)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name(f"bia-tiny-llama-seed{args.seed}")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if args.dtype == "f32"
                    else gguf.LlamaFileType.MOSTLY_F16)

    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML)

    # Embeddings with unit-ish rows; output head scaled up so the next-token
    # distribution is peaked enough for top-k logprobs to be informative.
    emb = rng.standard_normal((n_vocab, N_EMBD), dtype=np.float32).astype(mat_dtype)
    w.add_tensor("token_embd.weight", emb)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "attn_q.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(p + "attn_k.weight", mat(N_HEAD_KV * head_dim, N_EMBD))
        w.add_tensor(p + "attn_v.weight", mat(N_HEAD_KV * head_dim, N_EMBD))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(p + "ffn_norm.weight", norm(N_EMBD))
        w.add_tensor(p + "ffn_gate.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF))
    w.add_tensor("output_norm.weight", norm(N_EMBD))
    w.add_tensor("output.weight", mat(n_vocab, N_EMBD, scale=4.0))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}: llama, {N_LAYER} layers, n_embd {N_EMBD}, "
          f"vocab {n_vocab}, {args.dtype}, seed {args.seed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
