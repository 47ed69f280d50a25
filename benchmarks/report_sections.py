"""Where a warm report's memory goes: each section of the report notebook run in one process, with the process's RSS
before it and its peak while it runs (sampled every 3 ms). Issue 42's per-section measure.

Run it on a run directory whose ``derived/`` a report or ``judge`` has written (a warm run), with jemalloc returning
freed pages at once, so that what is measured is what lives and not what the allocator keeps::

    _RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 .venv/bin/python benchmarks/report_sections.py RUN

The sections are called as ``notebooks/parity_report.py`` calls them, with no witness.
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

_PROCESS = psutil.Process()
_MB = 2**20


class _Peak:
    """The process's highest RSS since the last ``reset``, sampled on a thread."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            with self._lock:  # a reset between reading the value and writing it back would keep the last peak
                self.value = max(self.value, _PROCESS.memory_info().rss)
            time.sleep(0.003)

    def reset(self) -> int:
        with self._lock:
            self.value = _PROCESS.memory_info().rss
            return self.value


def _measured(peak: _Peak, name: str, step: Callable[[], Any]) -> Any:
    gc.collect()
    before = peak.reset()
    started = time.perf_counter()
    out = step()
    took = time.perf_counter() - started
    time.sleep(0.01)  # a last sample
    print(f"{name:<11} {took:6.1f} s   before {before / _MB:6.0f} MB   peak {peak.value / _MB:6.0f} MB", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a run directory (or a study) the report reads")
    args = parser.parse_args()
    peak = _Peak()
    analysis = _measured(peak, "import", lambda: __import__("analysis"))
    from analysis import report
    from analysis.studies import open_runs

    ws = analysis.read_witnesses([], progress=False)
    runs = _measured(peak, "open", lambda: open_runs([args.run]))
    judgement = _measured(peak, "judge", lambda: analysis.judge(runs))
    for name, section in (
        ("answer", lambda: report.answer(runs, ws, judgement=judgement)),
        ("runs", lambda: report.runs(runs, ws, judgement=judgement)),
        ("figures", lambda: report.figures(runs, ws, judgement=judgement)),
        ("detail", lambda: report.detail(runs, ws)),
        ("provenance", lambda: report.provenance(runs, ws, parameters={})),
    ):
        _measured(peak, name, lambda section=section: section().html)


if __name__ == "__main__":
    main()
