"""Handing the C heap's free pages back to the system after a large transient (a manifest parsed into Python objects),
so that a long-lived process does not hold them while another process (a report's kernel) does the work."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def trim_heap() -> bool:
    """Collect garbage, then return the C heap's free pages to the system (glibc's ``malloc_trim(0)``).

    CPython allocates objects larger than 512 bytes (dicts and lists of a parsed JSON document) with ``malloc``; once
    freed, glibc keeps their pages for reuse, so a process that parsed a large manifest keeps its size while it waits.

    Returns
    -------
    bool
        Whether pages could be handed back (False where the C library has no ``malloc_trim``).

    Examples
    --------
    >>> trim_heap() in (True, False)  # True with glibc
    True
    """
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
