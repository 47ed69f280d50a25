"""How fast bia reads an MLPerf Inference pair of accuracy logs, against the bare JSON parse, in one run.

Generates two ``mlperf_log_accuracy.json`` files as loadgen writes them (SAMPLES entries of TOKENS token ids each,
int64 as the reference SUTs' ``.tobytes()``, hex in upper case, one entry a line), the performance log the
accuracy log with one sample's tail changed (every sample, or LOGGED of them as TEST01's sampling leaves), then runs
each step in a fresh child process:

  bare      orjson.loads of both files, nothing else (the floor for any reader of them)
  evaluate  json.load of both files and np.frombuffer(bytes.fromhex(data)) per entry, a dict by qsl_idx:
            what MLPerf's evaluation scripts do before they compare or score anything
  bia       analysis.read_mlperf_pair(accuracy, performance): both logs checked, decoded and built into a Run
  judge     read_mlperf_pair, then analysis.judge of the run (optional: --judge)

Run: .venv/bin/python benchmarks/bench_mlperf.py [--samples 24576] [--tokens 1024] [--logged N] [--folder DIR --reuse] [--judge]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
from _measure import measure


def _write_log(path: Path, outputs: np.ndarray, samples: np.ndarray | None = None) -> None:
    """One entry a line, as loadgen's LogAccuracy writes them ({ "seq_id" : 0, "qsl_idx" : 0, "data" : "0A00..." })."""
    samples = np.arange(len(outputs)) if samples is None else samples
    with path.open("w") as out:
        out.write("[\n")
        for k, (sample, ids) in enumerate(zip(samples.tolist(), outputs)):
            out.write(("," if k else "") + f'{{ "seq_id" : {k}, "qsl_idx" : {sample}, "data" : "{ids.tobytes().hex().upper()}" }}\n')
        out.write("]\n")


def generate(folder: Path, samples: int, tokens: int, logged: int | None) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    outputs = rng.integers(0, 32_000, size=(samples, tokens), dtype=np.int64)
    accuracy, performance = folder / "accuracy.json", folder / "performance.json"
    _write_log(accuracy, outputs)
    outputs[samples // 2, tokens // 2:] += 1  # one sample parts from its reference halfway
    kept = np.arange(samples) if logged is None else np.sort(rng.choice(samples, size=logged, replace=False))
    _write_log(performance, outputs[kept], kept)
    return accuracy, performance


def bare(paths: tuple[str, str]) -> dict:
    import orjson

    entries = 0
    for path in paths:
        with open(path, "rb") as handle:
            entries += len(orjson.loads(handle.read()))
    return {"entries": entries}


def evaluate(paths: tuple[str, str]) -> dict:
    import json

    logs = []
    for path in paths:
        with open(path) as handle:
            logs.append({e["qsl_idx"]: np.frombuffer(bytes.fromhex(e["data"]), np.int64) for e in json.load(handle)})
    return {"entries": sum(map(len, logs))}


def bia(paths: tuple[str, str]) -> dict:
    import analysis

    run = analysis.read_mlperf_pair(*paths, batch_size=8)
    return {"entries": run.dump.requests.height, "tokens": run.dump.tokens.height, "frame_bytes": run.dump.tokens.estimated_size()}


def judge(paths: tuple[str, str]) -> dict:
    import analysis

    run = analysis.read_mlperf_pair(*paths, batch_size=8)
    row = analysis.judge(run).frame.row(0, named=True)
    return {"entries": run.dump.requests.height, "verdict": row["verdict"], "first": row["first"]}


_IMPORTS = {"bare": "orjson", "evaluate": "numpy", "bia": "analysis", "judge": "analysis"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=24_576)
    parser.add_argument("--tokens", type=int, default=1_024)
    parser.add_argument("--logged", type=int, help="performance-mode samples logged (loadgen's accuracy_log_sampling_target; "
                        "TEST01 asks gpt-j for 4096); all by default, with the one that parts among them only by chance")
    parser.add_argument("--folder", type=Path, help="keep the generated logs here")
    parser.add_argument("--reuse", action="store_true", help="measure the logs already in --folder instead of generating them")
    parser.add_argument("--judge", action="store_true", help="also time analysis.judge of the run")
    args = parser.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="bia-bench-mlperf-"))
    folder.mkdir(parents=True, exist_ok=True)
    accuracy, performance = folder / "accuracy.json", folder / "performance.json"
    if args.reuse and accuracy.exists() and performance.exists():
        print(f"the logs in {folder}:", end=" ")
    else:
        accuracy, performance = generate(folder, args.samples, args.tokens, args.logged)
        print(f"{args.samples} samples x {args.tokens} tokens, int64, {args.logged or args.samples} of them logged in performance mode:", end=" ")
    print(f"{accuracy.stat().st_size / 1e6:.0f} MB and {performance.stat().st_size / 1e6:.0f} MB")
    steps = ("bare", "evaluate", "bia", "judge") if args.judge else ("bare", "evaluate", "bia")
    results = {name: measure(globals()[name], (str(accuracy), str(performance)), imports=_IMPORTS[name]) for name in steps}
    floor = results["bare"]["seconds"]
    for name, r in results.items():
        extra = f"  {r['verdict']}: {r['first']}" if "verdict" in r else ""
        extra += f"  ({r['tokens']:,} token rows, frame {r['frame_bytes'] / 1e6:.0f} MB)" if "frame_bytes" in r else ""
        print(f"  {name:8s} {r['seconds']:7.2f} s  {r['seconds'] / floor:5.2f}x bare  cpu {r['cpu_seconds']:6.2f} s  "
              f"peak RSS {r['peak_rss'] / 1e6:6.0f} MB{extra}")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
