"""trim_heap hands the C heap's free pages back: the command that reads a run before its kernel does keeps no more
than it needs while the kernel runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from analysis.core import _heap, trim_heap

_FRAGMENTED = """
import gc, os
from analysis.core import trim_heap

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

gc.disable()  # nothing else frees while the heap is measured
blocks = [bytes(4000) for _ in range(50_000)]  # 200 MB, each block from malloc (over 512 bytes)
kept = blocks[::64]  # one block in 64 lives on, so the freed pages sit between live ones, not at the heap's top
del blocks
before = resident()
trim_heap()
after = resident()
print(before - after)
"""


@pytest.mark.skipif(_heap._malloc_trim() is None, reason="no malloc_trim in this C library")
def test_the_pages_freed_between_live_blocks_go_back_to_the_system():
    out = subprocess.run([sys.executable, "-c", _FRAGMENTED], capture_output=True, text=True, check=True)
    assert int(out.stdout) > 100 * 2**20  # most of the 197 MB freed


def test_without_malloc_trim_it_says_so(monkeypatch):
    monkeypatch.setattr(_heap, "_malloc_trim", lambda: None)
    assert trim_heap() is False
