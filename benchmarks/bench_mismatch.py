"""How fast bia computes every framework's sampler-trainer mismatch metric of an RL step, against a bare scan, in one run.

Generates a Parquet dataset of SEQUENCES x TOKENS token rows (the defaults, 100,000 x 1,000, make
100 M rows, about 0.9 GB with zstd; one file per 10,000 sequences) with the columns
``analysis.mismatch_summary`` reads (sequence, position, rollout and trainer logprobs as float32, a
loss mask, a per-sequence advantage), then runs each step in a fresh child process (so peak memory
is its own) and reports wall time, peak RSS and the ratio to the bare scan. Each step's library
imports happen before its clock starts (polars for the bare scan; bia and numba for the summary),
as an interpreter's start-up is no part of the work; what a step loads from disk is counted.

  bare     polars' streaming engine summing the two logprob columns (the floor for reading them)
  cold     analysis.mismatch_summary(folder) in a process that compiles the per-token pass (numba,
           the 'fast' extra) into an empty cache: what the first run after an install pays
  summary  the same, every metric out of core (streamed batches), in a fresh process that loads the
           compiled pass from the disk cache the cold run wrote (numba's cache=True): what every
           later run pays, the cache load counted; its ratio is the headline
  ray      the same with engine="ray" on a local Ray instance (ray.init inside the timing); results compared

bare and summary run --rounds times, in turn, each in a fresh process; the fastest of each is the
headline (the others are printed), as a shared machine's load only ever makes a step slower.

Run: .venv/bin/python benchmarks/bench_mismatch.py [--sequences 100000] [--tokens 1000] [--folder DIR --reuse] [--rounds 3] [--skip-ray]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from _measure import measure

FILE_SEQUENCES = 10_000


def generate(folder: Path, sequences: int, tokens: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    for f, s0 in enumerate(range(0, sequences, FILE_SEQUENCES)):
        k = min(FILE_SEQUENCES, sequences - s0)
        with pq.ParquetWriter(folder / f"part-{f:04d}.parquet", pa.schema([
                ("sequence", pa.int64()), ("position", pa.int32()), ("rollout_logprob", pa.float32()), ("trainer_logprob", pa.float32()),
                ("mask", pa.bool_()), ("advantage", pa.float32())]), compression="zstd") as writer:
            for c0 in range(0, k, max(1, 2_000_000 // tokens)):
                c = min(max(1, 2_000_000 // tokens), k - c0)
                n = c * tokens
                r = -rng.exponential(0.7, n).astype(np.float32)
                # batch variance: most tokens a few ULP apart, a few far off
                noise = rng.normal(0.0, 1e-3, n) + (rng.random(n) < 0.001) * rng.normal(0.0, 0.5, n)
                t = np.minimum(r + noise, 0.0).astype(np.float32)
                prompt = np.tile(np.arange(tokens) < tokens // 10, c)  # the first tenth of each row is the prompt: not in the loss
                writer.write_table(pa.table({
                    "sequence": np.repeat(np.arange(s0 + c0, s0 + c0 + c, dtype=np.int64), tokens),
                    "position": np.tile(np.arange(tokens, dtype=np.int32), c), "rollout_logprob": r, "trainer_logprob": t, "mask": ~prompt,
                    "advantage": np.repeat(rng.normal(0.0, 1.0, c).astype(np.float32), tokens)}), row_group_size=1_000_000)


def bare(folder: str) -> dict:
    import polars as pl

    out = pl.scan_parquet(f"{folder}/*.parquet").select(pl.col("rollout_logprob").cast(pl.Float64).sum(),
                                                         pl.col("trainer_logprob").cast(pl.Float64).sum()).collect(engine="streaming")
    return {"result": out.row(0)}


def summary(folder: str) -> dict:
    import analysis

    return {"result": analysis.mismatch_summary(f"{folder}/*.parquet").row(0, named=True)}


def cold(folder: str) -> dict:
    return summary(folder)


def ray(folder: str) -> dict:
    import analysis

    return {"result": analysis.mismatch_summary(f"{folder}/*.parquet", engine="ray").row(0, named=True)}


# numba is imported before the clock as polars is for the bare scan; the compiled pass's cache load stays timed
_WITH_NUMBA = ("analysis", "analysis.metrics.mismatch._mismatch_kernel")
_IMPORTS = {"bare": "polars", "cold": _WITH_NUMBA, "summary": _WITH_NUMBA, "ray": "analysis"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=1_000)
    parser.add_argument("--folder", type=Path, help="keep the generated dataset here")
    parser.add_argument("--reuse", action="store_true", help="measure the dataset already in --folder instead of generating it")
    parser.add_argument("--rounds", type=int, default=3, help="fresh-process rounds of bare and summary; the fastest counts")
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="bia-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    if not (args.reuse and any(folder.glob("*.parquet"))):
        start = time.perf_counter()
        generate(folder, args.sequences, args.tokens)
        print(f"generated in {time.perf_counter() - start:.1f} s")
    size = sum(p.stat().st_size for p in folder.glob("*.parquet"))
    print(f"{args.sequences} sequences x {args.tokens} tokens: {size / 1e9:.2f} GB of Parquet in {folder}; load average {os.getloadavg()[0]:.1f}")
    # the children inherit an empty numba cache: the cold step compiles into it, the later ones load from it
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="bia-bench-numba-")
    results = {"cold": measure(cold, str(folder), imports=_IMPORTS["cold"])}
    rounds: dict[str, list[dict]] = {"bare": [], "summary": []}
    for _ in range(args.rounds):
        for name in rounds:
            rounds[name].append(measure(globals()[name], str(folder), imports=_IMPORTS[name]))
    for name, runs in rounds.items():
        results[name] = min(runs, key=lambda r: r["cpu_seconds"])
        print(f"  {name:8s} rounds: " + ", ".join(f"{r['seconds']:.2f} s wall / {r['cpu_seconds']:.2f} s CPU" for r in runs))
    if not args.skip_ray:
        results["ray"] = measure(ray, str(folder), imports=_IMPORTS["ray"])
    floor, cpu_floor = results["bare"]["seconds"], results["bare"]["cpu_seconds"]
    wall_floor = min(r["seconds"] for r in rounds["bare"])
    for name in ("bare", "cold", "summary", "ray"):
        if name not in results:
            continue
        r = results[name]
        print(f"  {name:8s} {r['seconds']:8.2f} s  {r['seconds'] / floor:5.2f}x bare  peak RSS {r['peak_rss'] / 1e9:5.2f} GB"
              f"  (CPU {r['cpu_seconds']:.2f} s = {r['cpu_seconds'] / cpu_floor:.2f}x bare's; Ray's workers not counted)")
    best_wall = min(r["seconds"] for r in rounds["summary"])
    print(f"  fastest of {args.rounds} rounds: summary {best_wall / wall_floor:.2f}x bare in wall time, "
          f"{results['summary']['cpu_seconds'] / cpu_floor:.2f}x in CPU time")
    if "ray" in results:
        same = results["ray"]["result"] == results["summary"]["result"]
        print(f"  ray results equal to the single-process summary: {same}")
    s = results["summary"]["result"]
    print("  " + ", ".join(f"{k} = {s[k]:.6g}" for k in ("verl:rollout_corr/k3_kl", "prime-rl:mismatch_kl/all/mean", "slime:train/train_rollout_logprob_abs_diff",
                                                        "openrlhf:vllm_kl", "skyrl:policy/rollout_train_logprobs_abs_diff_mean")))
    print(f"  load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
