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


def watch(command: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None, timeout: float | None = None,
          max_rss: float | None = None, min_available: float | None = None, poll: float = 0.2) -> dict:
    """Run ``command`` as a child process and measure its whole process tree, stopping it past a limit.

    For a step that starts processes of its own (``bia report`` runs its notebook in a Jupyter kernel, which
    jupyter_client starts in a session of its own): psutil samples the RSS of the child and every descendant every
    ``poll`` seconds, with each one's own high-water mark (``VmHWM`` in /proc/PID/status); wait4's rusage gives the
    CPU time of the child and the descendants it waited for. Not wait4's ``ru_maxrss``: Linux carries the parent's
    high-water mark into a child at its exec (fork or vfork alike), so a large parent would set a floor under every
    child's figure. Past ``timeout`` seconds, or when the tree's RSS goes over ``max_rss`` bytes, or the machine's
    available memory under ``min_available`` bytes, every process seen in the tree is killed (by its id) and
    ``stopped`` says why. Returns ``seconds`` (wall), ``cpu_seconds``, ``tree_peak`` (the largest sampled sum, or the
    largest process's peak when that is larger), ``max_process_rss`` (the largest process's own peak, as last
    sampled), ``rc``, ``stopped`` (None, "timeout", "rss" or "memory"), ``stopped_at`` (seconds), ``load_max`` (the
    highest 1-minute load average seen), ``samples`` ((seconds, tree RSS, largest process RSS) per poll) and
    ``output`` (stdout and stderr together, decoded).
    """
    import contextlib
    import os
    import subprocess
    import tempfile
    import threading

    import psutil

    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        state: dict = {"tree_peak": 0, "stopped": None, "stopped_at": None, "load_max": os.getloadavg()[0], "samples": []}
        seen: dict[int, psutil.Process] = {}
        hwm: dict[int, int] = {}
        done = threading.Event()

        def kill() -> None:
            for p in list(seen.values()):
                with contextlib.suppress(psutil.Error):
                    p.kill()  # psutil checks the process's creation time: a reused id is left alone

        def stop(reason: str) -> None:
            state["stopped"], state["stopped_at"] = reason, time.perf_counter() - start
            kill()

        def sample() -> None:
            try:
                root = psutil.Process(proc.pid)
                seen[proc.pid] = root
            except psutil.Error:
                return
            while not done.wait(poll):
                try:
                    for child in root.children(recursive=True):
                        seen.setdefault(child.pid, child)
                except psutil.Error:
                    pass
                sizes = []
                for pid, p in list(seen.items()):
                    try:
                        sizes.append(p.memory_info().rss)
                        hwm[pid] = max(hwm.get(pid, 0), _high_water(pid))
                    except (psutil.Error, OSError):
                        pass
                total = sum(sizes)
                elapsed = time.perf_counter() - start
                state["tree_peak"] = max(state["tree_peak"], total)
                state["load_max"] = max(state["load_max"], os.getloadavg()[0])
                state["samples"].append((round(elapsed, 2), total, max(sizes, default=0)))
                if state["stopped"]:
                    continue
                if timeout is not None and elapsed > timeout:
                    stop("timeout")
                elif max_rss is not None and total > max_rss:
                    stop("rss")
                elif min_available is not None and psutil.virtual_memory().available < min_available:
                    stop("memory")

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        sampler.join()
        if state["stopped"]:
            kill()  # anything the child left behind (the kernel, in its own session)
        log.seek(0)
        output = log.read().decode(errors="replace")
    largest = max(hwm.values(), default=0)
    return {"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime, "max_process_rss": largest,
            "tree_peak": max(state["tree_peak"], largest), "rc": proc.returncode, "stopped": state["stopped"],
            "stopped_at": state["stopped_at"], "load_max": state["load_max"], "samples": state["samples"], "output": output}


def _high_water(pid: int) -> int:
    """A process's peak RSS so far, in bytes (VmHWM: its own, from its exec on)."""
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def own_high_water() -> int:
    """This process's own peak RSS in bytes: ``VmHWM``, not ``ru_maxrss`` (which carries the parent's from the exec)."""
    import os

    return _high_water(os.getpid())
