"""What ``analysis.judge`` and ``bia report`` cost on a large probe run, against the run's own tables (issue 31).

Generates (or reuses with ``--folder DIR --reuse``) a synthetic probe run with benchmarks/bench_study.py's generator:
by default 1,024 prompts x (2 references + bands at c = 1, 4, 8, 16) = 31,744 requests x 32 tokens x top-5. The run is
opened once first (``open``: parsing the captures and writing ``derived/``), so every measured step below reopens it
from ``derived/`` as a second ``bia report`` would. Each step runs in a fresh child process (its peak RSS is its own,
its imports happen before its clock), and prints wall and CPU seconds, peak RSS and the ratios:

  tables   read_run + slot_table + band_table: the baseline
  judged   the same, then analysis.judge(run) in the same process: judge's incremental cost, once the slot comparisons
           it shares with the tables are cached on the run (target <= 0.5x the tables, in this process)
  judge    read_run, then analysis.judge(run) alone: judge from a fresh read, computing every table it needs itself
           (against the tables step's time)
  report   ``python -m analysis report RUN -o X.html`` (bia report, the run as its source: papermill runs the notebook in a Jupyter
           kernel): wall time, the largest process's peak RSS (wait4's rusage, which takes in the reaped kernel) and the
           process tree's peak (psutil, every 0.2 s) (targets <= 60 s and <= 3 GB)

``--profile DIR`` also writes a cProfile of judge (after the tables) and of the report notebook's calls, run in one
process without papermill, to DIR (``judge.prof``, ``report.prof`` and their top functions as text).

Run: .venv/bin/python benchmarks/bench_judge.py [--prompts 1024] [--tokens 32] [--top 5] [--folder DIR --reuse]
       [--steps open,tables,judged,judge,report] [--skip-report] [--profile DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
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

from _measure import measure, watch  # noqa: E402
from bench_study import _describe_data, _described, _load_average, generate_run  # noqa: E402

# --- the measured steps: each runs in a fresh child process (module-level, for spawn) ------------------------


def _timed(out: dict[str, float], name: str, function, *args: Any) -> Any:
    start = time.perf_counter()
    value = function(*args)
    out[name] = time.perf_counter() - start
    return value


def step_open(run_dir: str) -> dict:
    """The first open: parse the captures, hash them, write derived/."""
    from analysis.run import read_run

    shutil.rmtree(Path(run_dir) / "derived", ignore_errors=True)
    out: dict[str, Any] = {}
    run = _timed(out, "read_run", read_run, run_dir)
    out["rows"] = f"{len(run.dump.tokens):,} tokens, {len(run.dump.candidates):,} candidates, {len(run.dump.requests):,} requests"
    return out


def _tables(run_dir: str) -> tuple[dict, Any]:
    from analysis.run import band_table, read_run, slot_table

    out: dict[str, Any] = {}
    run = _timed(out, "read_run", read_run, run_dir)
    _timed(out, "slot_table", slot_table, run)
    _timed(out, "band_table", band_table, run)
    out["tables"] = out["read_run"] + out["slot_table"] + out["band_table"]
    return out, run


def step_tables(run_dir: str) -> dict:
    """The baseline: read_run (from derived/) + slot_table + band_table."""
    return _tables(run_dir)[0]


def step_judged(run_dir: str) -> dict:
    """The baseline, then judge(run) in the same process: judge's incremental cost."""
    import analysis

    out, run = _tables(run_dir)
    judgement = _timed(out, "judge", analysis.judge, run)
    out["verdicts"] = ", ".join(f"{row['arm']} {row['verdict']} ({row['cause']})" for row in judgement)
    return out


def step_judge(run_dir: str) -> dict:
    """read_run, then judge(run) with nothing computed before it."""
    import analysis
    from analysis.run import read_run

    out: dict[str, Any] = {}
    run = _timed(out, "read_run", read_run, run_dir)
    _timed(out, "judge", analysis.judge, run)
    return out


def step_report(arguments: tuple[str, str]) -> dict:
    """bia report --runs RUN -o OUT, as a child process: its wall time, its largest process's peak RSS and the tree's."""
    run_dir, html = arguments
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "analysis", "report", run_dir, "-o", html]  # a run directory is a source: bia report RUN
    Path(html).unlink(missing_ok=True)
    r = watch(command, cwd=str(REPO), env=env)  # the tree every 0.2 s, each process's own peak (the kernel's included)
    out = {"max_process_rss": r["max_process_rss"], "tree_peak": r["tree_peak"], "rc": r["rc"],
           "html_bytes": Path(html).stat().st_size if Path(html).exists() else 0, "child_cpu": r["cpu_seconds"]}
    if r["rc"]:
        out["error"] = r["output"].strip().splitlines()[-1:]
    return out


def step_profile(arguments: tuple[str, str]) -> dict:
    """cProfile of judge after the tables, and of the report notebook's calls on the run (no papermill), to a folder."""
    import cProfile

    import analysis
    from analysis import report
    from analysis.run import band_table, read_run, slot_table

    run_dir, folder = arguments
    out: dict[str, Any] = {}
    run = read_run(run_dir)
    slot_table(run)
    band_table(run)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.runcall(analysis.judge, run)
    out["judge"] = time.perf_counter() - start
    _dump(profile, Path(folder) / "judge")

    def notebook() -> None:  # the notebook's calls for one run and no witness sources, as bia report --runs RUN makes them
        import matplotlib

        matplotlib.use("Agg")
        ws = analysis.read_witnesses([], progress=False)
        runs = [read_run(run_dir)]
        report.header_html("t", ws, runs)
        judgement = report.judge_report(ws, runs)
        report.answer_section_html(judgement)
        report.reviews_html(ws, runs, epsilon=0.05, reference="ref1", judgement=judgement)
        report.engines_html(runs, judgement=judgement)
        report.trainer_pairs([run_dir])
        for one in runs:
            report.figures_html(report.run_figures(one, epsilon=0.05, reference="ref1"), "Run")
            report.run_details_html(one, epsilon=0.05, reference="ref1")
        report.provenance_html({"runs": [run_dir]}, ws, analysis.V3Policy.from_mapping({}), runs)

    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.runcall(notebook)
    out["report_calls"] = time.perf_counter() - start
    _dump(profile, Path(folder) / "report")
    return out


def _dump(profile, stem: Path) -> None:
    import io
    import pstats

    profile.dump_stats(str(stem) + ".prof")
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text).strip_dirs()
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(30)
    stem.with_suffix(".txt").write_text(text.getvalue(), encoding="utf-8")


# --- the harness ----------------------------------------------------------------------------------------------


def _prepare(folder: Path, args) -> Path:
    run_dir = folder / "run"
    want = {"prompts": args.prompts, "tokens": args.tokens, "top": args.top, "ladder": list(args.ladder), "kind": args.kind, "seed": args.seed}
    if args.reuse and _described(run_dir) == want:
        print(f"reusing {run_dir}")
    else:
        start = time.perf_counter()
        generate_run(run_dir, prompts=args.prompts, tokens=args.tokens, top=args.top, ladder=args.ladder, seed=args.seed, kind=args.kind)
        print(f"generated {run_dir} in {time.perf_counter() - start:.1f} s")
    return run_dir


def _gb(n: float | None) -> str:
    return "-" if not n else f"{n / 1e9:.2f} GB"


def _line(label: str, r: dict[str, Any], ratio: str = "", note: str = "") -> str:
    seconds = f"{r['seconds']:.2f} s" if "seconds" in r else "-"
    cpu = f"{r['cpu_seconds']:.2f} s" if "cpu_seconds" in r else "-"
    return f"  {label:8s} {seconds:>9s} {cpu:>9s}  {_gb(r.get('peak_rss')):>8s}  {ratio:>26s}  {r.get('error') or note} [{_load_average()}]"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--ladder", type=lambda s: tuple(int(c) for c in s.split(",")), default=(1, 4, 8, 16), help="comma-separated, e.g. 1,4,8,16")
    parser.add_argument("--kind", choices=("response", "sse"), default="response")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--folder", type=Path, help="keep the generated run here (run/, report.html)")
    parser.add_argument("--reuse", action="store_true", help="measure the run already in --folder when it matches the settings")
    parser.add_argument("--steps", type=lambda s: s.split(","), default=["open", "tables", "judged", "judge", "report"],
                        help="comma-separated, of open,tables,judged,judge,report (default all; open writes derived/ first)")
    parser.add_argument("--skip-report", action="store_true")
    parser.add_argument("--profile", type=Path, help="also write cProfile output of judge and of the report's calls here")
    args = parser.parse_args(argv)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="bia-bench-judge-"))
    folder.mkdir(parents=True, exist_ok=True)
    import analysis

    print("$ " + " ".join([Path(sys.executable).name, *sys.argv]))
    print(f"{platform.node()}: {os.cpu_count()} cores, {_load_average()}, Python {platform.python_version()}, "
          f"analysis from {Path(analysis.__file__).parent}")
    run_dir = _prepare(folder, args)
    print(f"run: {args.prompts} prompts x (2 + {' + '.join(map(str, args.ladder))}) requests x {args.tokens} tokens x top-{args.top} "
          f"({args.kind}): {_describe_data(run_dir)}")
    print(f"{'step':10s} {'wall':>9s} {'CPU':>9s}  {'peak RSS':>8s}  {'ratio':>26s}")
    tables: dict[str, Any] = {}
    if "open" in args.steps:
        r = measure(step_open, str(run_dir), imports="analysis.run")
        print(_line("open", r, "", f"first read_run, derived/ written; {r.get('rows', '')}"))
    if "tables" in args.steps:
        tables = measure(step_tables, str(run_dir), imports="analysis.run")
        parts = ", ".join(f"{n} {tables[n]:.2f} s" for n in ("read_run", "slot_table", "band_table"))
        print(_line("tables", tables, "1.00x", parts))
    if "judged" in args.steps:
        judged = measure(step_judged, str(run_dir), imports=("analysis", "analysis.run"))
        ratio = f"judge {judged['judge']:.2f} s = {judged['judge'] / judged['tables']:.2f}x"
        print(_line("judged", judged, ratio, f"its tables {judged['tables']:.2f} s; incremental, same process (<= 0.5x); {judged['verdicts']}"))
    if "judge" in args.steps:
        fresh = measure(step_judge, str(run_dir), imports=("analysis", "analysis.run"))
        ratio = f"judge {fresh['judge']:.2f} s = {fresh['judge'] / tables['tables']:.2f}x" if tables else f"judge {fresh['judge']:.2f} s"
        print(_line("judge", fresh, ratio, f"from a fresh read (read_run {fresh['read_run']:.2f} s), against the tables step"))
    if "report" in args.steps and not args.skip_report:
        html = folder / "report.html"
        r = measure(step_report, (str(run_dir), str(html)), imports="psutil")
        r["peak_rss"] = r.get("max_process_rss")
        verdict = (f"{'<=' if r['seconds'] <= 60 else '>'} 60 s, {'<=' if r['max_process_rss'] <= 3e9 else '>'} 3 GB"
                   if not r.get("rc") else f"exit {r.get('rc')}")
        print(_line("report", r, verdict, f"bia report (CPU of the tree {r['child_cpu']:.1f} s), tree peak {_gb(r.get('tree_peak'))}, "
                                          f"HTML {r.get('html_bytes', 0) / 1e6:.1f} MB"))
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        r = measure(step_profile, (str(run_dir), str(args.profile)), imports=("analysis", "analysis.report", "matplotlib"))
        print(_line("profile", r, "", f"judge {r['judge']:.2f} s, the report's calls {r['report_calls']:.2f} s (under cProfile): {args.profile}"))


if __name__ == "__main__":
    main()
