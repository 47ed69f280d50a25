"""What a run costs bia as it grows: a bare parse, cold and warm ``bia report`` and ``judge``, each in its own process (issue 42).

Generates (or reuses with ``--folder DIR --reuse``) synthetic probe runs with benchmarks/bench_study.py's generator,
one per size in ``--sizes``, 32 tokens x top-5 by default. A size is its number of requests:

  31744    1,024 prompts x (2 references + bands at c = 1, 4, 8, 16)                 569 MB of captures
  129000   1,000 prompts x (2 references + bands at c = 1, 2, 4, 8, 16, 32, 64)      2.2 GB
  516000   4,000 prompts x the same                                                  8.8 GB

(any multiple of 129 is that many prompts on the long ladder, any other multiple of 31 on the short one). For each
size these steps run in turn, each in a fresh child process (``--steps``):

  parse        orjson.loads of every line of captures/requests.jsonl, line by line (bench_study.step_bare): the floor
  report-cold  ``python -m analysis report RUN -o X.html`` with derived/ deleted first: the first open of the run
  report-warm  the same with derived/ present (as report-cold left it)
  judge        analysis.judge(RUN) on the run directory, with its pieces (derived/pieces/) and without their merged
               tables (derived/pieces/tables/, deleted first): the tables computed a piece at a time
  certify-cold ``python -m analysis certify RUN -o X.json`` with derived/pieces/ deleted first: the run directory judged a
               piece at a time (analysis.run.run_pieces), its captures parsed a chunk at a time
  certify-warm the same with derived/pieces/ present

Each prints its wall seconds (parse and judge: the step's own work, after its imports; bia report: the whole command),
its CPU seconds (the child and the processes it waited for) and its peak RSS: the process tree's (psutil every 0.2 s,
and wait4's rusage for the largest process; the report's Jupyter kernel included), then the cold report against the
bare parse. A step that runs past ``--timeout`` seconds, or whose tree goes over ``--max-rss-gb``, or that leaves the
machine under ``--min-free-gb`` of available memory, is stopped (every process of its tree killed) and shown as
"over N s" / "over N GB" / "machine memory low". The 1-minute load average (the highest seen during the step) is
printed with each step: the machine's other work stretches the times.

Run: .venv/bin/python benchmarks/bench_scale.py [--sizes 31744,129000,516000]
       [--steps parse,report-cold,report-warm,judge,certify-cold,certify-warm]
       [--tokens 32] [--top 5] [--folder DIR --reuse] [--timeout 1800] [--max-rss-gb 20] [--markdown FILE]
       [--trace DIR] [--generate-only]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _path in (str(Path(__file__).resolve().parent), str(REPO)):
    if _path not in sys.path[:2]:
        sys.path.insert(0, _path)  # this checkout's analysis package and the benchmarks' helpers

from _measure import own_high_water, watch  # noqa: E402
from bench_study import _described, _load_average, generate_run  # noqa: E402

SHORT, LONG = (1, 4, 8, 16), (1, 2, 4, 8, 16, 32, 64)
STEPS = ("parse", "report-cold", "report-warm", "judge", "certify-cold", "certify-warm")
_VERDICT_EXITS = (0, 5, 7, 8)  # bia certify exits with its verdict: each is a step that finished
_RESULT = "bench_scale result: "


def shape(requests: int) -> tuple[int, tuple[int, ...]]:
    """(prompts, ladder) of a size: a multiple of 2 + 127 requests per prompt on the long ladder, else of 2 + 29 on the short."""
    for ladder in (LONG, SHORT):
        per_prompt = 2 + sum(ladder)
        if requests % per_prompt == 0:
            return requests // per_prompt, ladder
    raise argparse.ArgumentTypeError(f"{requests} requests: not a multiple of {2 + sum(LONG)} (c = 1..64) or {2 + sum(SHORT)} (c = 1, 4, 8, 16)")


# --- the child steps: python bench_scale.py --child STEP RUN, the result as one JSON line -----------------------


def _child(step: str, run_dir: str, options: str = "{}") -> None:
    if step == "generate":  # here, not in the parent: the parent stays small (see _measure.watch)
        generate_run(run_dir, **json.loads(options))
        return
    if step == "parse":
        import orjson  # noqa: F401 - time the work, not the import
        from bench_study import step_bare

        out = next(step_bare(run_dir))
    elif step == "judge":
        import analysis  # time the work, not the imports

        started = time.perf_counter()
        analysis.judge(run_dir)
        out = {"seconds": time.perf_counter() - started}
    else:
        raise SystemExit(f"no child step {step!r}")
    out["own_peak_rss"] = own_high_water()
    print(_RESULT + json.dumps(out), flush=True)


# --- the parent: one step in its own process tree --------------------------------------------------------------


def run_step(step: str, run_dir: Path, folder: Path, args) -> dict[str, Any]:
    """One step, watched: its numbers, or why it stopped."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    notes: list[str] = []
    derived = run_dir / "derived"
    if step == "report-cold":
        shutil.rmtree(derived, ignore_errors=True)
    if step == "report-warm" and not derived.exists():
        return {"skipped": "no derived/ (run report-cold first, or it did not finish)"}
    if step == "judge":
        shutil.rmtree(derived / "pieces" / "tables", ignore_errors=True)
        if not (derived / "pieces").exists():
            notes.append("no derived/pieces/: judge parses the captures into pieces first")
    if step == "certify-cold":
        shutil.rmtree(derived / "pieces", ignore_errors=True)
    if step.startswith("certify"):  # bia certify RUN: judge of the run directory, a piece at a time
        command = [sys.executable, "-m", "analysis", "certify", str(run_dir), "-o", str(folder / f"{step}.json")]
    elif step.startswith("report"):
        html = folder / f"report-{step}.html"
        html.unlink(missing_ok=True)
        command = [sys.executable, "-m", "analysis", "report", str(run_dir), "-o", str(html)]  # bia report RUN
    else:
        command = [sys.executable, str(Path(__file__).resolve()), "--child", step, str(run_dir)]
    load_before = os.getloadavg()[0]
    try:
        r = watch(command, cwd=str(REPO), env=env, timeout=args.timeout, max_rss=args.max_rss_gb * 1e9, min_available=args.min_free_gb * 1e9)
    except Exception as exc:  # one step failing must not stop the others
        return {"error": f"{type(exc).__name__}: {exc}"}
    log = folder / "logs" / f"{run_dir.name}-{step}.log"  # the step's stdout and stderr, for a failure's traceback
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(r["output"], encoding="utf-8")
    r["load"] = (load_before, max(r["load_max"], os.getloadavg()[0]))
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
        trace = args.trace / f"{run_dir.name}-{step}.csv"
        trace.write_text("seconds,tree_rss,largest_process_rss\n" + "".join(f"{t},{a},{b}\n" for t, a, b in r["samples"]), encoding="utf-8")
    r["peak"] = r["tree_peak"]
    if not r["stopped"] and (r["rc"] == 0 or (step.startswith("certify") and r["rc"] in _VERDICT_EXITS)):
        if step.startswith("certify"):
            notes.append(f"exit {r['rc']}; derived/pieces/ {_size(derived / 'pieces') / 1e6:,.0f} MB")
        elif step.startswith("report"):
            notes.append(f"largest process {_gb(r['max_process_rss'])}, HTML {html.stat().st_size / 1e6:.1f} MB")
            if derived.exists():
                notes.append(f"derived/ {_size(derived) / 1e6:,.0f} MB")
        else:
            lines = [line for line in r["output"].splitlines() if line.startswith(_RESULT)]
            if not lines:
                r["error"] = "the child printed no result"
            else:
                child = json.loads(lines[-1][len(_RESULT):])
                r["process_seconds"], r["seconds"] = r["seconds"], child["seconds"]  # the step's own work, after its imports
                r["peak"] = max(r["peak"], child["own_peak_rss"])  # exact, where the sampling may miss the last 0.2 s
                if step == "parse":
                    notes.append(child.get("rows", ""))
                else:
                    notes.append("derived/pieces/tables/ deleted first: the tables computed from the pieces")
                notes.append(f"process {r['process_seconds']:.1f} s with its imports")
    elif not r["stopped"]:
        tail = [line for line in r["output"].strip().splitlines() if line.strip()][-1:]
        r["error"] = f"exit {r['rc']}" + (f": {tail[0][:200]}" if tail else "") + f" (all of it in {log})"
    r["notes"] = "; ".join(n for n in notes if n)
    return r


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "absent"


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _gb(n: float | None) -> str:
    if not n:
        return "-"
    return f"{n / 1e6:,.0f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def cell(r: dict[str, Any] | None, args) -> str:
    """A step's table cell: "wall s, peak RSS", or why there is none."""
    if r is None:
        return "-"
    if r.get("skipped"):
        return "skipped"
    if r.get("stopped") == "rss":
        return f"over {args.max_rss_gb:g} GB (stopped at {r['stopped_at']:.0f} s)"
    if r.get("stopped") == "timeout":
        return f"over {args.timeout:g} s (peak {_gb(r['peak'])})"
    if r.get("stopped") == "memory":
        return f"machine memory low (stopped at {r['stopped_at']:.0f} s, tree {_gb(r['peak'])})"
    if r.get("error"):
        return "failed"
    return f"{r['seconds']:.1f} s, {_gb(r['peak'])}"


def _ratio(row: dict[str, Any]) -> str:
    parse, cold = row["steps"].get("parse"), row["steps"].get("report-cold")
    ok = all(r and "seconds" in r and not r.get("stopped") and not r.get("error") and not r.get("skipped") for r in (parse, cold))
    return f"{cold['seconds'] / parse['seconds']:.1f}x" if ok else "-"  # type: ignore[index]


def _loads(row: dict[str, Any]) -> str:
    loads = [x for r in row["steps"].values() if r and "load" in r for x in r["load"]]
    return f"{min(loads):.1f} to {max(loads):.1f}" if loads else "-"


def markdown(rows: list[dict[str, Any]], args, header: str) -> str:
    head = ("| requests | captures | bare parse | `bia report`, cold | `bia report`, warm | `judge(RUN)` | "
            "`bia certify RUN`, cold | `bia certify RUN`, warm | cold / parse | load average |")
    lines = [header, "", head, "|" + "---|" * head.count(" | ") + "---|"]
    for row in rows:
        cells = [f"{row['requests']:,}", _gb(row["captures"]), *(cell(row["steps"].get(s), args) for s in STEPS), _ratio(row), _loads(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _line(step: str, r: dict[str, Any], args) -> str:
    cpu = f"CPU {r['cpu_seconds']:.1f} s" if "cpu_seconds" in r else ""
    trouble = r.get("error") or r.get("skipped") or ""
    load = f"load {r['load'][0]:.1f} to {r['load'][1]:.1f}/{os.cpu_count()}" if "load" in r else ""
    return f"  {step:12s} {cell(r, args):>40s}  {cpu:>14s}  {trouble or r.get('notes', '')} [{load}]"


def _prepare(folder: Path, requests: int, args) -> Path:
    prompts, ladder = shape(requests)
    run_dir = folder / f"run-{requests}"
    want = {"prompts": prompts, "tokens": args.tokens, "top": args.top, "ladder": list(ladder), "kind": "response", "seed": args.seed}
    if args.reuse and _described(run_dir) == want:
        print(f"reusing {run_dir}")
    else:
        start = time.perf_counter()
        options = {"prompts": prompts, "tokens": args.tokens, "top": args.top, "ladder": list(ladder), "seed": args.seed, "kind": "response"}
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "generate", str(run_dir), json.dumps(options)], check=True)
        print(f"generated {run_dir} in {time.perf_counter() - start:.1f} s")
    return run_dir


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        _child(*argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=lambda s: [int(n) for n in s.split(",")], default=[31744, 129000, 516000],
                        help="comma-separated request counts (default 31744,129000,516000)")
    parser.add_argument("--steps", type=lambda s: s.split(","), default=list(STEPS), help=f"comma-separated, of {','.join(STEPS)}")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--folder", type=Path, help="keep the generated runs here (run-N/ per size, the reports, logs/ of each step's output)")
    parser.add_argument("--reuse", action="store_true", help="measure the runs already in --folder when they match the settings")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before a step is stopped (default 1800)")
    parser.add_argument("--max-rss-gb", type=float, default=20.0, help="stop a step whose process tree's RSS goes over this (default 20)")
    parser.add_argument("--min-free-gb", type=float, default=0.5, help="stop a step when the machine's available memory falls under this")
    parser.add_argument("--markdown", type=Path, help="also write the table here as Markdown")
    parser.add_argument("--trace", type=Path, help="write each step's sampled RSS (seconds, tree, largest process) here as CSV")
    parser.add_argument("--generate-only", action="store_true", help="write the runs, measure nothing")
    args = parser.parse_args(argv)
    for size in args.sizes:
        shape(size)
    unknown = [s for s in args.steps if s not in STEPS]
    if unknown:
        parser.error(f"unknown steps {unknown}: choose from {','.join(STEPS)}")
    folder = args.folder or Path(tempfile.mkdtemp(prefix="bia-bench-scale-"))
    folder.mkdir(parents=True, exist_ok=True)
    import importlib.util

    import psutil  # not analysis: the parent stays small, its children's figures are theirs (see _measure.watch)

    command = "$ " + " ".join([Path(sys.executable).name, *sys.argv])
    machine = (f"{platform.node()}: {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, {_load_average()}, "
               f"Python {platform.python_version()}, {', '.join(f'{m} {_version(m)}' for m in ('polars', 'pyarrow', 'orjson'))}, analysis from {Path(str(importlib.util.find_spec('analysis').origin)).parent}, {_dt.date.today().isoformat()}")
    print(command)
    print(machine)
    rows = []
    for size in args.sizes:
        run_dir = _prepare(folder, size, args)
        prompts, ladder = shape(size)
        captures = _size(run_dir / "captures")
        print(f"run {size:,}: {prompts:,} prompts x (2 + {' + '.join(map(str, ladder))}) requests x {args.tokens} tokens x top-{args.top}, "
              f"captures {_gb(captures)}")
        row: dict[str, Any] = {"requests": size, "captures": captures, "steps": {}}
        rows.append(row)
        if args.generate_only:
            continue
        for step in STEPS:
            if step in args.steps:
                r = row["steps"][step] = run_step(step, run_dir, folder, args)
                print(_line(step, r, args), flush=True)
        print(f"  cold report / bare parse: {_ratio(row)}")
    if args.generate_only:
        return
    table = markdown(rows, args, f"{command}\n\n{machine}")
    print()
    print(table)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table, encoding="utf-8")


if __name__ == "__main__":
    main()
