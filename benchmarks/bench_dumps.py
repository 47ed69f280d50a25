"""How fast bia loads big logprob dumps, against the bare JSON parse, in one run.

Generates an OpenAI chat JSONL dump (REQUESTS x TOKENS x top-K candidates; the defaults,
500 x 1000 x 20, make about 1 GB) and the same tokens as vLLM compact logprobs, then runs each
loader in a fresh child process (so peak memory is its own) and reports wall time, peak RSS and
the ratio to the bare parse:

  bare    orjson.loads of every line, nothing else (the floor for a JSON loader)
  naive   json.loads + a dict per token and per candidate + pandas.DataFrame (what a script does)
  bia     analysis.read_dump(path): tokens, candidates and requests frames, validated

Run: .venv/bin/python benchmarks/bench_dumps.py [--requests 20] [--tokens 1000] [--top 20]
"""

from __future__ import annotations

import argparse
import base64
import json
import struct
import tempfile
from pathlib import Path

import numpy as np
from _measure import measure


def _entry(rng, token_id: int, top: int) -> dict:
    ids = rng.choice(50_000, size=top, replace=False).tolist()
    ids[0] = token_id
    values = np.sort(rng.uniform(-12.0, 0.0, size=top))[::-1].astype(np.float32).astype(float).tolist()
    cands = [{"token": f"token_id:{i}", "logprob": v, "bytes": [116, 111, 107]} for i, v in zip(ids, values)]
    return {"token": f"token_id:{token_id}", "logprob": values[0], "bytes": [116, 111, 107], "top_logprobs": cands}


def generate(folder: Path, requests: int, tokens: int, top: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    chat, compact = folder / "chat.jsonl", folder / "compact.jsonl"
    with chat.open("w") as chat_out, compact.open("w") as compact_out:
        for r in range(requests):
            entries = [_entry(rng, int(rng.integers(0, 50_000)), top) for _ in range(tokens)]
            chat_out.write(json.dumps({"id": f"req-{r}", "object": "chat.completion", "model": "bench", "choices": [
                {"index": 0, "message": {"content": "x"}, "finish_reason": "length", "logprobs": {"content": entries}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": tokens}}) + "\n")
            ids = [int(c["token"][9:]) for e in entries for c in e["top_logprobs"]]
            values = [c["logprob"] for e in entries for c in e["top_logprobs"]]
            data = struct.pack(f"<{len(ids)}I", *ids) + struct.pack(f"<{len(values)}f", *values)
            compact_out.write(json.dumps({"request_id": f"req-{r}", "choices": [{"index": 0, "finish_reason": "length", "logprobs": None,
                "token_ids": [int(e["token"][9:]) for e in entries],
                "compact_logprobs": {"format": "u32-f32-le-v1", "data": base64.b64encode(data).decode(), "offsets": list(range(0, top * tokens + 1, top)),
                                     "num_top_logprobs": top}}]}) + "\n")
    return chat, compact


def bare(path: str) -> dict:
    import orjson

    with open(path, "rb") as handle:
        n = sum(1 for line in handle if orjson.loads(line))
    return {"rows": n}


def naive(path: str) -> dict:
    import pandas as pd

    tokens, candidates = [], []
    with open(path) as handle:
        for r, line in enumerate(handle):
            doc = json.loads(line)
            for j, e in enumerate(doc["choices"][0]["logprobs"]["content"]):
                tokens.append({"request": r, "position": j, "token": e["token"], "logprob": e["logprob"]})
                for k, c in enumerate(e["top_logprobs"]):
                    candidates.append({"request": r, "position": j, "rank": k, "token": c["token"], "logprob": c["logprob"]})
    t, c = pd.DataFrame(tokens), pd.DataFrame(candidates)
    return {"rows": len(t) + len(c)}


def bia(path: str) -> dict:
    import analysis

    dump = analysis.read_dump(path)
    size = sum(f.estimated_size() for f in (dump.tokens, dump.candidates, dump.requests))
    return {"rows": len(dump.tokens) + len(dump.candidates), "frame_bytes": size}


_IMPORTS = {"bare": "orjson", "naive": "pandas", "bia": "analysis"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--folder", type=Path, help="keep the generated files here")
    parser.add_argument("--reuse", action="store_true", help="measure the files already in --folder instead of generating them")
    args = parser.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="bia-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.reuse and (folder / "chat.jsonl").exists() and (folder / "compact.jsonl").exists():
        chat, compact = folder / "chat.jsonl", folder / "compact.jsonl"
    else:
        chat, compact = generate(folder, args.requests, args.tokens, args.top)
    print(f"{args.requests} requests x {args.tokens} tokens x top-{args.top}: chat {chat.stat().st_size / 1e6:.0f} MB, compact {compact.stat().st_size / 1e6:.0f} MB")
    for label, path, loaders in (("chat JSONL", chat, ("bare", "naive", "bia")), ("compact JSONL", compact, ("bare", "bia"))):
        results = {name: measure(globals()[name], str(path), imports=_IMPORTS[name]) for name in loaders}
        floor = results["bare"]["seconds"]
        print(f"{label}:")
        for name, r in results.items():
            frames = f", frames {r['frame_bytes'] / 1e6:.0f} MB, peak/frames {r['peak_rss'] / r['frame_bytes']:.1f}x" if "frame_bytes" in r else ""
            print(f"  {name:6s} {r['seconds']:8.2f} s  {r['seconds'] / floor:5.2f}x bare  peak RSS {r['peak_rss'] / 1e6:7.0f} MB{frames}")


if __name__ == "__main__":
    main()
