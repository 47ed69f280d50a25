"""The benchmarks' shared harness: run one step in a fresh child process and measure it there.

A fresh interpreter (``spawn``) makes the step's peak RSS its own, not the parent's or an earlier
step's; the step's imports happen before the clock starts, so the time is the work's alone. CPU
time (user + system, every thread of the child) is reported beside the wall time: on a shared
machine the wall time stretches with other jobs' load, the CPU time much less. Work a step hands to
other processes (Ray's workers) counts in its wall time only.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import time
from typing import Any, Callable


def _child(step: Callable[[Any], dict], argument: Any, imports: str | tuple[str, ...], queue) -> None:
    for module in (imports,) if isinstance(imports, str) else imports:
        __import__(module)  # time the work, not the interpreter's imports
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    out = step(argument)
    after = resource.getrusage(resource.RUSAGE_SELF)
    out["seconds"] = time.perf_counter() - start
    out["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out["peak_rss"] = after.ru_maxrss * 1024
    queue.put(out)


def measure(step: Callable[[Any], dict], argument: Any, *, imports: str | tuple[str, ...]) -> dict:
    """Run ``step(argument)`` (a module-level function returning a dict) in a fresh child process.

    Returns its dict with ``seconds`` (wall), ``cpu_seconds`` and ``peak_rss`` (bytes) added;
    ``imports`` names the module (or modules) to import before the clock starts.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(step, argument, imports, queue))
    proc.start()
    out = queue.get()
    proc.join()
    return out
