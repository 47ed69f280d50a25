"""Loaded by CLI child processes during a mutation run only (tests/conftest.py puts this folder on PYTHONPATH).

While mutmut collects which tests reach which function ("stats" mode), a ``bia`` child process records
its hits in its own memory, which the parent never sees. This writes them, at exit, to a file in
``BIA_MUTMUT_HITS`` so the parent can count them for the test that started the child.

mutmut reads its configuration from the working folder the first time a mutated function runs; a child started in a
test's temporary folder loads it here first, from the mutation run's root (the folder above this one's parent).
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


def _load_config_from_the_run_root() -> None:
    try:
        from mutmut.configuration import config
    except ImportError:
        return
    here = os.getcwd()
    os.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        config()
    finally:
        os.chdir(here)


if os.environ.get("MUTANT_UNDER_TEST"):
    _load_config_from_the_run_root()
if os.environ.get("MUTANT_UNDER_TEST") == "stats" and os.environ.get("BIA_MUTMUT_HITS"):
    atexit.register(_write_hits)
