"""``bia repro``: from a RED run to a bug report. The first request that parts, shrunk against the live server while it
still parts (the smallest c, copies for companions, the fewest tokens, the shortest prompt prefix), each candidate tried a
bounded number of times as small probe runs judged like any run; written as ``repro.py`` (standalone), ``REPORT.md`` and the
minimal run. The code lives in private modules: ``_case`` (what is sent), ``_shrink`` (the search and its budget),
``_script`` and ``_report`` (what is written), ``_repro`` (the function)."""

from __future__ import annotations

from ._case import ReproError
from ._repro import Repro, command_line, repro

__all__ = ["Repro", "ReproError", "command_line", "repro"]
