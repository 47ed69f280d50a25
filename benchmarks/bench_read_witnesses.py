"""How much bia's witness reader costs over the bare JSON parse, measured in one run.

Writes N copies of the real v2 witness (29 slots each) to a temporary folder, then times, best of
``--repeat``:
  bare   read every file and json.loads it (the floor for any JSON reader);
  bia    analysis.read_witnesses(folder): strict parse, typed fields, version rules, frames;
  v3     analysis.shape_check on every file.
Prints the ratios against the bare parse. Run: .venv/bin/python benchmarks/bench_read_witnesses.py
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import analysis

SOURCE = Path(__file__).resolve().parent.parent / "data" / "aprender-lambda" / "witness@464c168e62.json"


def best_of(repeat: int, work) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    text = SOURCE.read_text()
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for i in range(args.files):
            path = Path(folder) / f"w{i:05d}.json"
            path.write_text(text.replace('"host": "lambda"', f'"host": "host-{i}"'))
            paths.append(path)
        bare = best_of(args.repeat, lambda: [json.loads(p.read_bytes()) for p in paths])
        ws = analysis.read_witnesses(folder)
        assert ws.witnesses.height == args.files and ws.slots.height == 29 * args.files
        bia = best_of(args.repeat, lambda: analysis.read_witnesses(folder))
        v3 = best_of(args.repeat, lambda: [analysis.shape_check(p) for p in paths])
    print(f"{args.files} witnesses, {29 * args.files} slot rows, best of {args.repeat}")
    print(f"  bare read + json.loads : {bare:8.3f} s  ({1e3 * bare / args.files:.3f} ms/file)")
    print(f"  bia read_witnesses     : {bia:8.3f} s  ({1e3 * bia / args.files:.3f} ms/file)  {bia / bare:5.1f}x bare")
    print(f"  bia shape_check (V3)   : {v3:8.3f} s  ({1e3 * v3 / args.files:.3f} ms/file)  {v3 / bare:5.1f}x bare")


if __name__ == "__main__":
    main()
