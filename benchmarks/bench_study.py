"""How fast bia opens a probe run and computes its tables, and how a 10x study scales, in one run.

Generates a realistic synthetic run directory, laid out as ``bia probe`` writes it against vLLM
(manifest.json and captures/requests.jsonl, one capture envelope per request: per prompt two m=1
references, then per c of the ladder a band of c requests), then measures each step in a fresh
child process (so its peak RSS is its own) and prints seconds, peak RSS and the ratios:

  bare     orjson.loads of every line of the captures files (the floor for any JSON reader)
  parse    analysis.read_dumps(captures, torn_tail=True): the parse read_run does (target <= 2.0x bare)
  load     analysis.run.read_run(run_dir), derived/ deleted first: the first open, which also hashes
           the captures and writes derived/
  reopen   read_run again, opening derived/ (target <= 0.1x load)
  metrics  slot_table, band_table, prompt_table on the loaded run; ratio to load (target <= 0.5x)
  study    analysis.write_dataset + analysis.study_tables(engine="polars") on a 10x study folder
           (several run directories); peak RSS target <= 8 GB. Skipped while analysis.studies._study is absent
  ray      the same with engine="ray" (ray.init(num_cpus=2)): its overhead against polars, and
           whether the tables are equal

The data is made for parity analysis: per prompt a fixed reference stream (greedy: the sampled
token is the top-1 candidate; about 4% of steps are near-ties, top-2 margin < 0.05); ref #2 and
the c=1 band are bit-identical to it; batched slots copy it with float32 noise of a few ULP (more
slots and more ULP for larger c, some slots bit-identical), and some diverge at a near-tie (top-1
and top-2 swap), after which they continue along another stream (shared by every slot that forks
at the same step). Deterministic in ``seed``.

Run: .venv/bin/python benchmarks/bench_study.py [--prompts 4] [--tokens 1000] [--top 20]
       [--folder DIR --reuse] [--study-prompts 40] [--study-runs 10] [--skip-study] [--skip-ray]
       [--metrics-timeout 300] [--generate-only] [--kind response|sse]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import queue as _queue
import resource
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path[:1]:
    sys.path.insert(0, str(REPO))  # this checkout's analysis package, not whichever one the venv points at

# --- the synthetic run --------------------------------------------------------------------------

VOCAB_SIZE = 151_936  # a Qwen-sized vocabulary
MODEL = "synthetic/bia-bench-8B"
VLLM_VERSION = "0.11.0"
NEAR_TIE = 0.05  # analysis.parity.NEAR_TIE_EPSILON: the margins a fork is taken at
_TINY = np.float32(-1.1920929e-07)  # the largest logprob written: never 0 or positive
_PROMPTS = (
    "Explain why the sky is blue in two sentences.",
    "Write a short poem about a lighthouse keeper.",
    "What is the derivative of x^3 sin(x)? Show the steps.",
    "Summarize the causes of the French Revolution.",
    "Give three tips for writing readable Python code.",
    "Describe how a hash table handles collisions.",
    "Translate 'the cat sleeps on the warm stones' into French and explain the grammar.",
    "List the planets of the solar system with one fact each.",
    "Why does ice float on water?",
    "Write a function that reverses a linked list, and explain it.",
)


@functools.lru_cache(maxsize=1)
def _vocab() -> tuple[list[str], list[str], list[list[int]]]:
    """The synthetic tokenizer: per id its ``token_id:N`` placeholder (vLLM's return_tokens_as_token_ids),
    its text and its UTF-8 bytes; the same for every seed, as a model's tokenizer is."""
    rng = np.random.default_rng(151_936)
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", dtype=np.uint8)
    weights = 1.0 / np.arange(1, len(letters) + 1)
    lengths = rng.integers(1, 9, VOCAB_SIZE)
    chars = rng.choice(letters, size=int(lengths.sum()), p=weights / weights.sum()).tobytes().decode("ascii")
    ends = np.cumsum(lengths).tolist()
    space = (rng.random(VOCAB_SIZE) < 0.6).tolist()
    texts, start = [], 0
    for end, lead in zip(ends, space):
        texts.append((" " if lead else "") + chars[start:end])
        start = end
    for i, punct in enumerate(" .,\n:;!?()-'\"0123456789"):
        texts[i] = punct
    return [f"token_id:{i}" for i in range(VOCAB_SIZE)], texts, [list(t.encode()) for t in texts]


def _steps(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` greedy decode steps of ``k`` candidates: ids (int64) and float32 logprobs, sorted best first.

    The top-2 margin is a near-tie (< 0.05) on about 4% of steps and never under 2e-5, so a few ULP
    of noise never reorders the top two; the other candidates may swap among themselves.
    """
    u = rng.random(n)
    gap1 = np.where(u < 0.04, rng.uniform(2e-5, NEAR_TIE, n), np.where(u < 0.16, rng.uniform(NEAR_TIE, 0.8, n), 0.8 + rng.exponential(3.0, n)))
    gaps = np.concatenate([np.zeros((n, 1)), gap1[:, None], rng.exponential(0.35, (n, k - 2)) + 1e-6], axis=1)
    z = -np.cumsum(gaps, axis=1)
    rest = -(0.5 + rng.exponential(2.5, n) + 0.5 * np.minimum(gap1, 10.0))  # the other tokens' mass, in logits
    log_z = np.logaddexp(np.log(np.exp(z).sum(axis=1)), rest)
    logprobs = np.minimum((z - log_z[:, None]).astype(np.float32), _TINY)
    ids = np.empty((n, k), dtype=np.int64)
    ids[:, 0] = (VOCAB_SIZE * rng.random(n) ** 3).astype(np.int64)  # common tokens more often
    offsets = np.cumsum(rng.integers(1, VOCAB_SIZE // k, (n, k - 1)), axis=1)  # distinct: they sum to less than the vocabulary
    ids[:, 1:] = (ids[:, :1] + offsets) % VOCAB_SIZE
    return ids, logprobs


def _noisy(logprobs: np.ndarray, rng: np.random.Generator, c: int) -> np.ndarray:
    """Float32 noise of a batched kernel: a share of the values moved by 1 to ~c/2 ULP (more of them for larger c)."""
    level = max(1, int(np.log2(c)))
    bits = logprobs.view(np.int32).copy()
    moved = rng.random(bits.shape) < min(0.9, 0.15 + 0.15 * level)
    step = rng.integers(1, max(2, c // 2) + 1, bits.shape) * rng.choice(np.array([-1, 1], dtype=np.int32), bits.shape)
    bits += np.where(moved, step, 0).astype(np.int32)
    return np.minimum(bits.view(np.float32), _TINY)


def _sorted(ids: np.ndarray, logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-logprobs, axis=1, kind="stable")
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(logprobs, order, axis=1)


class _Prompt:
    """One prompt's reference stream and the streams that fork from it (shared by every slot forking at a step)."""

    def __init__(self, seed: int, index: int, tokens: int, k: int) -> None:
        self.seed, self.index, self.tokens, self.k = seed, index, tokens, k
        self.ids, self.logprobs = _steps(np.random.default_rng([seed, index, 0]), tokens, k)
        self.ties = np.flatnonzero(self.logprobs[:, 0] - self.logprobs[:, 1] < NEAR_TIE)
        self._forks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def forked(self, at: int) -> tuple[np.ndarray, np.ndarray]:
        """The stream that takes the reference's second candidate at step ``at`` and goes on from there."""
        if at not in self._forks:
            ids, logprobs = self.ids[: at + 1].copy(), self.logprobs[: at + 1].copy()
            ids[at, [0, 1]] = ids[at, [1, 0]]  # the near-tie flips: the runner-up is sampled
            margin = logprobs[at, 0] - logprobs[at, 1]
            logprobs[at, :2] = np.float32(logprobs[at, 0] - 0.4 * margin), np.float32(logprobs[at, 0] - 0.6 * margin)
            rest_ids, rest = _steps(np.random.default_rng([self.seed, self.index, 1, at]), self.tokens - at - 1, self.k)
            self._forks[at] = np.concatenate([ids, rest_ids]), np.concatenate([logprobs, rest])
        return self._forks[at]


def _entries(ids: np.ndarray, logprobs: np.ndarray, top: int) -> tuple[list[dict], str]:
    """``logprobs.content`` as vLLM writes it (token_id:N placeholders, bytes, top_logprobs) and the text."""
    names, texts, data = _vocab()
    rows, values = ids.tolist(), logprobs.astype(np.float64).tolist()
    content = [{"token": names[r[0]], "logprob": v[0], "bytes": data[r[0]],
                "top_logprobs": [{"token": names[i], "logprob": x, "bytes": data[i]} for i, x in zip(r[:top], v[:top])]}
               for r, v in zip(rows, values)]
    return content, "".join(texts[r[0]] for r in rows)


def _response(rid: str, created: int, content: list[dict], text: str, prompt_tokens: int) -> dict:
    """A non-streamed vLLM chat completion."""
    n = len(content)
    return {"id": rid, "object": "chat.completion", "created": created, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                                                 "function_call": None, "tool_calls": [], "reasoning_content": None},
                         "logprobs": {"content": content}, "finish_reason": "length", "stop_reason": None}],
            "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n, "completion_tokens": n, "prompt_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None}


def _sse(rid: str, created: int, content: list[dict], prompt_tokens: int) -> str:
    """The same completion streamed: a role chunk, one chunk per token (the last with finish_reason), usage, [DONE]."""
    _, texts, _ = _vocab()
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": MODEL}
    parts = [orjson.dumps({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})]
    last = len(content) - 1
    for j, entry in enumerate(content):
        text = texts[int(entry["token"][9:])]
        parts.append(orjson.dumps({**head, "choices": [{"index": 0, "delta": {"content": text}, "logprobs": {"content": [entry]},
                                                        "finish_reason": "length" if j == last else None, "stop_reason": None}]}))
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + len(content), "completion_tokens": len(content)}
    parts.append(orjson.dumps({**head, "choices": [], "usage": usage}))
    return "".join(f"data: {p.decode()}\n\n" for p in parts) + "data: [DONE]\n\n"


def _units(prompt_ids: Sequence[str], ladder: Sequence[int], repeats: int) -> Iterator[tuple[str, str, str, int | None, int, tuple[int, ...]]]:
    """The probe's plan (analysis.run.plan, copies layout, no observer): (key, prompt, role, c, repeat, slots)."""
    for pid in prompt_ids:
        for slot in (0, 1):
            yield f"{pid}/reference/s{slot}", pid, "reference", None, 0, (slot,)
        for repeat in range(repeats):
            for c in ladder:
                yield f"{pid}/band/c{c}/r{repeat}", pid, "band", c, repeat, tuple(range(c))


def generate_run(folder: str | os.PathLike[str], prompts: int = 4, tokens: int = 1000, top: int = 20, ladder: Sequence[int] = (1, 4, 8, 16),
                 repeats: int = 1, seed: int = 0, kind: str = "response", first_prompt: int = 0) -> Path:
    """Write a synthetic run directory as ``bia probe`` lays it out against vLLM; returns its path.

    ``kind`` "response": each capture holds a non-streamed ``chat.completion`` (``{"response": {...}}``);
    "sse": the streamed chunks as the probe keeps them (``{"sse": ..., "arrival_times": [...]}``).
    Prompt ids run from ``p{first_prompt}``, so the runs of a study can have distinct ones.
    """
    if kind not in ("response", "sse"):
        raise ValueError(f"kind must be 'response' or 'sse', got {kind!r}")
    if prompts < 1 or tokens < 1 or top < 0 or repeats < 1 or not ladder or min(ladder) < 1:
        raise ValueError("prompts, tokens, repeats and every c must be at least 1, top at least 0")
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "captures").mkdir(parents=True)
    (folder / "partial").mkdir()
    k = max(top, 2)
    prompt_ids = [f"p{first_prompt + i}" for i in range(prompts)]
    texts = {pid: _PROMPTS[(first_prompt + i) % len(_PROMPTS)] + ("" if first_prompt + i < len(_PROMPTS) else f" (variant {first_prompt + i})")
             for i, pid in enumerate(prompt_ids)}
    started = _dt.datetime(2025, 6, 1, 12, 0, tzinfo=_dt.UTC) + _dt.timedelta(hours=seed % 1000)
    manifest = _manifest(texts, tokens, top, ladder, repeats, seed, kind, started)
    clock = 0.5  # seconds since the probe started (its sent_at_s origin), after detection
    hits = queries = 0.0
    timing = np.random.default_rng([seed, 1 << 20])
    by_prompt = {pid: _Prompt(seed, first_prompt + i, tokens, k) for i, pid in enumerate(prompt_ids)}
    with (folder / "captures" / "requests.jsonl").open("wb") as out:
        for key, pid, role, c, repeat, slots in _units(prompt_ids, ladder, repeats):
            prompt = by_prompt[pid]
            prompt_tokens = 18 + 2 * len(texts[pid].split())
            width = c or 1
            band = np.random.default_rng([seed, prompt.index, 2, repeat, width])
            fork = int(band.choice(prompt.ties)) if len(prompt.ties) else None  # where this band's slots tend to part
            step_s, ttft_s = 0.011 * (1 + 0.04 * (width - 1)), 0.035 + 0.006 * width
            ends = []
            for slot in slots:
                ids, logprobs = prompt.ids, prompt.logprobs
                if role == "band" and c > 1 and band.random() < min(0.95, 0.35 + 0.15 * np.log2(c)):  # this slot's numbers moved
                    if fork is not None and band.random() < min(0.6, 0.1 * np.log2(c)):
                        ids, logprobs = prompt.forked(fork if band.random() < 0.7 else int(band.choice(prompt.ties)))
                    ids, logprobs = _sorted(ids, _noisy(logprobs, band, c))
                content, text = _entries(ids, logprobs, top)
                sent = float(clock + (slot * timing.uniform(1e-4, 6e-4) if role == "band" else 0.0))
                intervals = step_s * np.clip(1 + 0.15 * timing.standard_normal(tokens - 1), 0.3, None)
                first = float(ttft_s * (1 + 0.2 * timing.random()))
                token_times = first + np.concatenate([[0.0], np.cumsum(intervals)])
                ends.append(sent + float(token_times[-1]))
                rid = f"chatcmpl-{timing.bytes(16).hex()}"
                created = int(started.timestamp() + sent)
                if kind == "response":
                    result: dict[str, Any] = {"response": _response(rid, created, content, text, prompt_tokens), "t_sent": 0.0}
                else:
                    last = float(token_times[-1])
                    arrivals = [first, *token_times.tolist(), last + 2e-4, last + 3e-4]  # role, tokens, usage, [DONE]
                    result = {"sse": _sse(rid, created, content, prompt_tokens), "arrival_times": arrivals, "t_sent": 0.0}
                result["sent_at_s"] = sent
                where = {"unit": key, "prompt_id": pid, "role": role, "slot": slot}
                if role == "band":
                    where = {"unit": key, "prompt_id": pid, "role": role, "c": c, "slot": slot, "repeat": repeat, "batch_row": slot}
                out.write(orjson.dumps({**result, **where}) + b"\n")
            end = max(ends)
            if role == "band":
                before = {"hits": hits, "queries": queries}
                queries += c * prompt_tokens
                hits += (c - 1) * (prompt_tokens - prompt_tokens % 16)
                widths = [c] * tokens
                if c > 1 and band.random() < 0.3:
                    widths[0] = int(band.integers(1, c))  # a request joined one step late
                samples = max(1, int((end - clock) / 0.05))
                running = [c] * samples
                running[0] = int(band.integers(0, c + 1))
                manifest["m_formed"].append({
                    "unit": key, "prompt_id": pid, "role": "band", "c": c, "repeat": repeat, "widths": widths, "running": running,
                    "running_metric": "vllm:num_requests_running", "poll_interval_s": 0.05,
                    "cache": {"vllm:prefix_cache_hits_total": {"before": before["hits"], "after": hits},
                              "vllm:prefix_cache_queries_total": {"before": before["queries"], "after": queries}}})
            manifest["done"].append(key)
            clock = end + 0.05 + 0.02  # the probe waits for the server's last log line, then saves the manifest
    manifest["finished"] = (started + _dt.timedelta(seconds=clock)).isoformat(timespec="seconds")
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return folder


def _manifest(texts: dict[str, str], tokens: int, top: int, ladder: Sequence[int], repeats: int, seed: int, kind: str,
              started: _dt.datetime) -> dict[str, Any]:
    """What ``bia probe`` writes for a vLLM server (analysis.probe._manifest: _new_manifest and _apply_detection)."""
    evidence = ["GET /v1/models: owned_by 'vllm'", "GET /version: 200"]
    said = (f"engine: vLLM ({'; '.join(evidence)}); model {MODEL!r}; body adds ignore_eos, return_tokens_as_token_ids; "
            "widths also from /metrics vllm:num_requests_running")
    return {
        "run_version": 1, "producer": "bia probe", "url": "http://127.0.0.1:8000/v1/chat/completions", "started": started.isoformat(timespec="seconds"),
        "sampler": {"temperature": 0.0, "seed": 0, "max_tokens": tokens, "top_logprobs": top, "ignore_eos": True},
        "ladder": list(ladder), "repeats": repeats, "observer": False, "bands_anyway": False, "declared_min": min(64, tokens), "max_constant_run": 16,
        "prompts": [{"prompt_id": pid, "text": text} for pid, text in texts.items()], "fillers": [],
        "requested": {"layout": "copies", "stream": True, "engine": "auto", "log_pattern": r"Batch m=(\d+) done", "server_log": "vllm.log"},
        "expected": [],
        "environment": {"python": "3.11.7", "httpx": "0.28.1", "machine": "x86_64"},  # fixed: the same bytes on every machine
        "done": [], "m_formed": [], "refused": [], "complete": True,
        "identity": {"host": "bench-synthetic", "engine": "vLLM", "model": {"path": MODEL}},
        "engine": {"profile": "vllm", "evidence": evidence, "said": said, "running_metric": "vllm:num_requests_running"},
        "server": {"info_path": "/version", "info": {"version": VLLM_VERSION}},
        "effective": {"version": VLLM_VERSION},
        "synthetic": {"by": "benchmarks/bench_study.py", "seed": seed, "kind": kind,
                      "note": "generated, not measured: the numbers imitate a vLLM server, they say nothing about one"},
    }


def generate_study(folder: str | os.PathLike[str], prompts: int = 40, runs: int = 10, seed: int = 0, **options: Any) -> list[Path]:
    """A study: ``prompts`` prompts over ``runs`` run directories (``run-00`` ...), prompt ids distinct across them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sizes = [prompts // runs + (i < prompts % runs) for i in range(runs)]
    out, first = [], 0
    for i, n in enumerate(s for s in sizes if s):
        out.append(generate_run(folder / f"run-{i:02d}", prompts=n, seed=seed * 1000 + i, first_prompt=first, **options))
        first += n
    return out


def _size(path: Path) -> int:
    """Bytes under ``path``, leaving out derived/ (rebuildable, and written by whichever reader opened the run)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "derived" not in p.relative_to(path).parts)


def _described(folder: Path) -> dict[str, Any] | None:
    """The generator settings of an existing run directory (its manifest), or None."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest.get("synthetic") and {"prompts": len(manifest["prompts"]), "tokens": manifest["sampler"]["max_tokens"],
                                          "top": manifest["sampler"]["top_logprobs"], "ladder": manifest["ladder"],
                                          "kind": manifest["synthetic"]["kind"], "seed": manifest["synthetic"]["seed"]}


# --- the measured steps: each runs in a fresh child and yields what it measured -------------------


def step_bare(run_dir: str) -> Iterator[dict]:
    """orjson.loads of every capture line, and of every event inside a streamed capture (its JSON too)."""
    lines = events = 0
    start = time.perf_counter()
    for path in sorted(Path(run_dir, "captures").glob("*.jsonl")):
        with path.open("rb") as handle:
            for line in handle:
                if line.strip():
                    envelope = orjson.loads(line)
                    lines += 1
                    for event in envelope.get("sse", "").split("\n\n"):
                        if event.startswith("data: {"):
                            orjson.loads(event[6:])
                            events += 1
    yield {"seconds": time.perf_counter() - start, "rows": f"{lines} lines" + (f", {events:,} events" if events else "")}


def step_parse(run_dir: str) -> Iterator[dict]:
    from analysis.dumps import read_dumps

    start = time.perf_counter()
    dump = read_dumps(Path(run_dir) / "captures", torn_tail=True)  # what read_run parses, without hashing or writing derived/
    seconds = time.perf_counter() - start
    frames = (dump.tokens, dump.candidates, dump.requests)
    yield {"seconds": seconds, "rows": f"{len(frames[0]):,} tokens, {len(frames[1]):,} candidates, {len(frames[2])} requests",
           "frame_bytes": sum(f.estimated_size() for f in frames)}


def step_load(run_dir: str) -> Iterator[dict]:
    from analysis.run import read_run

    start = time.perf_counter()
    run = read_run(run_dir)
    seconds = time.perf_counter() - start
    frames = (run.dump.tokens, run.dump.candidates, run.dump.requests)
    yield {"seconds": seconds, "rows": f"{len(frames[0]):,} tokens, {len(frames[1]):,} candidates, {len(frames[2])} requests",
           "frame_bytes": sum(f.estimated_size() for f in frames), "derived_after": (Path(run_dir) / "derived").exists()}


def step_metrics(run_dir: str) -> Iterator[dict]:
    from analysis.run import band_table, prompt_table, read_run, slot_table

    run = read_run(run_dir)
    yield {"loaded": True}
    total = 0.0
    for name, table in (("slot_table", slot_table), ("band_table", band_table), ("prompt_table", prompt_table)):
        start = time.perf_counter()
        frame = table(run)
        seconds = time.perf_counter() - start
        total += seconds
        yield {name: seconds, f"{name}_rows": frame.height, "seconds": total}
        if name == "slot_table":
            yield {"slot_summary": _slot_summary(frame)}


def _slot_summary(slots) -> str:
    """What the generated data looks like through slot_table: a check that it exercises the parity analysis."""
    import polars as pl

    by_c = slots.group_by("c").agg(pl.len().alias("n"), pl.col("diverged").sum().alias("div"), (pl.col("max_ulp") == 0).sum().alias("bitwise"),
                                        pl.col("max_ulp").max().alias("ulp")).sort("c")
    return "; ".join(f"c={r['c']}: {r['div']}/{r['n']} diverged, {r['bitwise']} bit-identical, max {r['ulp']} ULP" for r in by_c.iter_rows(named=True))


def step_study(study_dir: str, dataset_dir: str, tables_dir: str) -> Iterator[dict]:
    import analysis as study

    runs = sorted(str(p.parent) for p in Path(study_dir).glob("*/manifest.json"))
    start = time.perf_counter()
    study.write_dataset(runs, dataset_dir, force=True)  # a measurement run again replaces the last one
    written = time.perf_counter() - start
    yield {"write_dataset": written}
    start = time.perf_counter()
    tables = study.study_tables(dataset_dir, engine="polars")
    computed = time.perf_counter() - start
    yield {"study_tables": computed, "seconds": written + computed, "rows": ", ".join(f"{len(t):,} {name}" for name, t in tables.items())}
    Path(tables_dir).mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        _polars(table).write_parquet(Path(tables_dir) / f"{name}.parquet")


def step_ray(dataset_dir: str, tables_dir: str) -> Iterator[dict]:
    import ray

    import analysis as study

    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    started = time.perf_counter() - start
    try:
        start = time.perf_counter()
        tables = study.study_tables(dataset_dir, engine="ray")
        computed = time.perf_counter() - start
        yield {"ray_init": started, "study_tables": computed, "seconds": started + computed}
        yield {"equal": _compare(tables, tables_dir)}
    finally:
        ray.shutdown()


def _polars(table):
    import polars as pl

    if isinstance(table, pl.DataFrame):
        return table
    if hasattr(table, "to_arrow") and not hasattr(table, "to_pandas"):
        return pl.from_arrow(table.to_arrow())
    return pl.from_pandas(table) if hasattr(table, "iloc") else pl.from_arrow(table)


def _compare(tables: dict, tables_dir: str) -> str:
    """Whether the Ray tables equal the polars ones saved by the study step: exactly, within 1e-9, or how they differ."""
    import polars as pl
    from polars.testing import assert_frame_equal

    words = []
    for name, table in tables.items():
        path = Path(tables_dir) / f"{name}.parquet"
        if not path.exists():
            words.append(f"{name}: no polars table to compare")
            continue
        left, right = pl.read_parquet(path), _polars(table)
        if sorted(left.columns) != sorted(right.columns):
            words.append(f"{name}: columns differ ({sorted(set(left.columns) ^ set(right.columns))})")
            continue
        right = right.select(left.columns)
        try:
            assert_frame_equal(left, right, check_row_order=False, check_exact=True)
            words.append(f"{name}: equal")
        except AssertionError:
            try:
                assert_frame_equal(left, right, check_row_order=False, check_exact=False, rel_tol=1e-9, abs_tol=1e-12)
                words.append(f"{name}: equal within 1e-9")
            except AssertionError as exc:
                words.append(f"{name}: differ ({str(exc).splitlines()[0][:160]})")
    return "; ".join(words)


STEPS = {"bare": (step_bare, "orjson"), "parse": (step_parse, "analysis.dumps"), "load": (step_load, "analysis.run"), "reopen": (step_load, "analysis.run"),
         "metrics": (step_metrics, "analysis.run"), "study": (step_study, "analysis.studies._study"), "ray": (step_ray, "analysis.studies._study")}


def _tree_rss(stop: threading.Event, peak: list[int]) -> None:
    """The peak RSS of this process and its descendants (Ray's workers), sampled every 0.2 s."""
    try:
        import psutil
    except ImportError:
        return
    me = psutil.Process()
    while not stop.wait(0.2):
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        peak[0] = max(peak[0], total)


def _child(name: str, args: tuple, messages) -> None:
    function, module = STEPS[name]
    try:
        __import__(module)  # time the work, not the interpreter's imports
        messages.put({"base_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
        stop, peak = threading.Event(), [0]
        sampler = threading.Thread(target=_tree_rss, args=(stop, peak), daemon=True)
        sampler.start()
        for message in function(*args):
            messages.put(message)
        stop.set()
        sampler.join()
        messages.put({"tree_peak": peak[0] or None})
    except BaseException:  # noqa: BLE001 - the parent reports it and goes on with the other steps
        messages.put({"error": traceback.format_exc(limit=4).strip().splitlines()[-1]})
    finally:
        messages.put({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "done": True})


def measure(name: str, *args: Any, timeout: float | None = None) -> dict[str, Any]:
    """Run one step in a fresh interpreter; what it reported, with ``aborted`` when it ran past ``timeout``
    (counted from its ``loaded`` report when it sends one: the metrics step's own time, not the load before it)."""
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    proc = ctx.Process(target=_child, args=(name, args, messages))
    started = time.monotonic()
    proc.start()
    out: dict[str, Any] = {}
    while True:
        left = None if timeout is None else timeout - (time.monotonic() - started)
        try:
            message = messages.get(timeout=1.0 if left is None else min(max(left, 0.01), 1.0))
        except _queue.Empty:
            if not proc.is_alive():
                try:  # what it sent just before it exited may still be on its way
                    message = messages.get(timeout=1.0)
                except _queue.Empty:
                    out.setdefault("error", f"the child exited with code {proc.exitcode} without a report (killed for memory?)")
                    break
            elif left is not None and left <= 0:
                proc.kill()
                out["aborted"] = f"stopped after {timeout:g} s"
                break
            else:
                continue
        if message.pop("done", False):
            out.update(message)
            break
        if message.get("loaded"):
            started = time.monotonic()
        out.update(message)
    proc.join()
    return out


# --- the harness --------------------------------------------------------------------------------


def _skipped(step: str, asked: bool, module: str) -> bool:
    """Whether a step is skipped (asked to, or its module is missing), saying why."""
    reason = f"--skip-{step}" if asked else (f"{module} not available" if importlib.util.find_spec(module) is None else None)
    if reason:
        print(f"  {step:8s} skipped: {reason}")
    return reason is not None


def _guarded(name: str, *args: Any, timeout: float | None = None) -> dict[str, Any]:
    """``measure``, with a failure reported as the step's result: one step failing must not stop the others."""
    try:
        return measure(name, *args, timeout=timeout)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"}


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.0f} MB"


def _load_average() -> str:
    """The machine's 1-minute load average against its cores: other work on a shared machine slows every step."""
    try:
        return f"load {os.getloadavg()[0]:.1f}/{os.cpu_count()}"
    except OSError:
        return "load ?"


def _line(label: str, r: dict[str, Any], ratio: str = "", note: str = "") -> str:
    seconds = "-" if r.get("seconds") is None else f"{r['seconds']:.2f} s"
    peak = _mb(r.get("peak_rss"))
    if r.get("tree_peak") and r["tree_peak"] > 1.05 * (r.get("peak_rss") or 0):
        peak += f" (tree {_mb(r['tree_peak'])})"
    trouble = r.get("error") or r.get("aborted")
    return f"  {label:8s} {seconds:>11s}  {peak:>22s}  {ratio:>22s}  {trouble or note} [{_load_average()}]"


def _prepare_run(folder: Path, args) -> Path:
    run_dir = folder / "run"
    want = {"prompts": args.prompts, "tokens": args.tokens, "top": args.top, "ladder": list(args.ladder), "kind": args.kind, "seed": args.seed}
    if args.reuse and _described(run_dir) == want:
        print(f"reusing {run_dir}")
    else:
        start = time.perf_counter()
        generate_run(run_dir, prompts=args.prompts, tokens=args.tokens, top=args.top, ladder=args.ladder, seed=args.seed, kind=args.kind)
        print(f"generated {run_dir} in {time.perf_counter() - start:.1f} s")
    return run_dir


def _prepare_study(folder: Path, args) -> Path:
    study_dir = folder / "study"
    runs = [_described(p.parent) or {} for p in sorted(study_dir.glob("*/manifest.json"))]
    have = sum(run.get("prompts", 0) for run in runs)
    settings = {"tokens": args.tokens, "top": args.top, "ladder": list(args.ladder), "kind": args.kind}
    same = all({key: run.get(key) for key in settings} == settings for run in runs)
    if args.reuse and runs and same and have == args.study_prompts:
        print(f"reusing {study_dir} ({len(runs)} runs, {have} prompts)")
    else:
        if study_dir.exists():
            shutil.rmtree(study_dir)
        start = time.perf_counter()
        generate_study(study_dir, prompts=args.study_prompts, runs=args.study_runs, seed=args.seed, tokens=args.tokens, top=args.top,
                       ladder=args.ladder, kind=args.kind)
        print(f"generated {study_dir} in {time.perf_counter() - start:.1f} s")
    return study_dir


def _describe_data(path: Path) -> str:
    captures = list(path.rglob("captures/*.jsonl"))
    lines = 0
    for capture in captures:
        with capture.open("rb") as handle:
            lines += sum(1 for _ in handle)
    return f"{lines} requests, captures {sum(p.stat().st_size for p in captures) / 1e6:,.0f} MB, on disk {_size(path) / 1e6:,.0f} MB"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--ladder", type=lambda s: tuple(int(c) for c in s.split(",")), default=(1, 4, 8, 16), help="comma-separated, e.g. 1,4,8,16")
    parser.add_argument("--kind", choices=("response", "sse"), default="response")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--folder", type=Path, help="keep the generated data here (run/, study/, study-dataset/)")
    parser.add_argument("--reuse", action="store_true", help="measure the data already in --folder when it matches the settings")
    parser.add_argument("--study-prompts", type=int, default=40)
    parser.add_argument("--study-runs", type=int, default=10, help="run directories the study's prompts are spread over")
    parser.add_argument("--skip-study", action="store_true")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--metrics-timeout", type=float, default=300.0, help="seconds before the metrics step is stopped")
    parser.add_argument("--generate-only", action="store_true", help="write the run (and the study unless --skip-study), measure nothing")
    args = parser.parse_args(argv)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="bia-bench-study-"))
    folder.mkdir(parents=True, exist_ok=True)
    import analysis

    print("$ " + " ".join([Path(sys.executable).name, *sys.argv]))
    print(f"{platform.node()}: {os.cpu_count()} cores, {_load_average()}, Python {platform.python_version()}, "
          f"analysis from {Path(analysis.__file__).parent}")
    run_dir = _prepare_run(folder, args)
    print(f"run: {args.prompts} prompts x (2 + {' + '.join(map(str, args.ladder))}) requests x {args.tokens} tokens x top-{args.top} "
          f"({args.kind}): {_describe_data(run_dir)}")
    study_wanted = not args.skip_study and (args.generate_only or importlib.util.find_spec("analysis.studies._study") is not None)
    if study_wanted:
        study_dir = _prepare_study(folder, args)
        print(f"study: {args.study_prompts} prompts over {args.study_runs} runs: {_describe_data(study_dir)}")
    if args.generate_only:
        return

    results: dict[str, dict[str, Any]] = {}
    print(f"{'step':10s} {'seconds':>11s}  {'peak RSS':>22s}  {'ratio':>22s}")
    guarded = [("bare", (str(run_dir),), None), ("parse", (str(run_dir),), None), ("load", (str(run_dir),), None), ("reopen", (str(run_dir),), None),
               ("metrics", (str(run_dir),), args.metrics_timeout)]
    for name, step_args, timeout in guarded:
        if name == "load":
            shutil.rmtree(run_dir / "derived", ignore_errors=True)
        results[name] = r = _guarded(name, *step_args, timeout=timeout)
        bare, load = results.get("bare", {}).get("seconds"), results.get("load", {}).get("seconds")
        if name == "bare":
            print(_line(name, r, "1.00x", str(r.get("rows", ""))))
        elif name == "parse":
            ratio = f"{r['seconds'] / bare:.2f}x bare (<= 2.0)" if bare and r.get("seconds") else ""
            print(_line(name, r, ratio, f"read_dumps(captures): {r.get('rows', '')}; frames {_mb(r.get('frame_bytes'))}" if "seconds" in r else ""))
        elif name in ("load", "reopen"):
            if name == "load":
                ratio = f"{r['seconds'] / bare:.2f}x bare" if bare and r.get("seconds") else ""
            else:
                ratio = f"{r['seconds'] / load:.2f}x load (<= 0.1)" if load and r.get("seconds") else ""
            note = f"{r.get('rows', '')}; frames {_mb(r.get('frame_bytes'))}; derived/ {'written' if r.get('derived_after') else 'not written'}"
            print(_line(name, r, ratio, note if "seconds" in r else ""))
        else:
            parts = [f"{t} {r[t]:.2f} s" for t in ("slot_table", "band_table", "prompt_table") if t in r]
            ratio = f"{r['seconds'] / load:.2f}x load (<= 0.5)" if load and r.get("seconds") and not r.get("aborted") else ""
            if r.get("aborted"):
                r["aborted"] += f" (finished: {', '.join(parts) or 'none of the three tables'})"
            print(_line(name, r, ratio, ", ".join(parts)))
            if r.get("slot_summary"):
                print(f"           data: {r['slot_summary']}")

    if _skipped("study", args.skip_study, "analysis.studies._study"):
        return
    dataset_dir, tables_dir = folder / "study-dataset", folder / "study-tables"
    shutil.rmtree(dataset_dir, ignore_errors=True)
    shutil.rmtree(tables_dir, ignore_errors=True)
    r = results["study"] = _guarded("study", str(study_dir), str(dataset_dir), str(tables_dir))
    peak = r.get("tree_peak") or r.get("peak_rss")
    verdict = f"peak {peak / 1e9:.2f} GB {'<=' if peak <= 8e9 else '>'} 8 GB" if peak else ""
    parts = [f"{t} {r[t]:.2f} s" for t in ("write_dataset", "study_tables") if t in r]
    print(_line("study", r, verdict, ", ".join(parts) + (f"; {r['rows']}" if r.get("rows") else "")))
    if _skipped("ray", args.skip_ray, "ray"):
        return
    r = results["ray"] = _guarded("ray", str(dataset_dir), str(tables_dir))
    polars_s = results["study"].get("study_tables")
    ratio = f"{r['study_tables'] / polars_s:.2f}x polars" if polars_s and r.get("study_tables") else ""
    note = f"ray.init {r['ray_init']:.1f} s; tables {r.get('equal', '?')}" if "ray_init" in r else ""
    print(_line("ray", r, ratio, note))


if __name__ == "__main__":
    main()
