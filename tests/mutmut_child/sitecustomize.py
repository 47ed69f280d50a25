"""Loaded by CLI child processes during a mutation run only (tests/conftest.py puts this folder on PYTHONPATH).

While mutmut collects which tests reach which function ("stats" mode), a ``bia`` child process records
its hits in its own memory, which the parent never sees. This writes them, at exit, to a file in
``BIA_MUTMUT_HITS`` so the parent can count them for the test that started the child.
"""

import atexit
import os


def _write_hits() -> None:
    try:
        from mutmut.state import state
    except ImportError:
        return
    hits = sorted(state()._stats)
    if hits:
        path = os.path.join(os.environ["BIA_MUTMUT_HITS"], f"{os.getpid()}.txt")
        with open(path, "w", encoding="utf-8") as out:
            out.write("\n".join(hits))


if os.environ.get("MUTANT_UNDER_TEST") == "stats" and os.environ.get("BIA_MUTMUT_HITS"):
    atexit.register(_write_hits)
