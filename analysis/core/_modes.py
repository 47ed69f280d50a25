"""Kernel mode names and their aliases, at the bottom so that the report can read a manifest's settings
without importing the experiment (:mod:`analysis.experiment.modes` describes each mode)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KERNEL_MODES = ("default", "one-by-one", "fixed-tiles", "row-invariant")
INVARIANT_MODES = ("one-by-one", "fixed-tiles", "row-invariant")  # the modes that claim every row's bits independent of its batch
# of those, the modes whose one-pass forward over prompt and completion (prefill) claims the decode steps' bits: one-by-one
# runs a prompt as one [1, T] forward and fixed-tiles its queries in tiles of 16, where a decode step runs one row or query
PREFILL_INVARIANT_MODES = ("row-invariant",)
MODE_ALIASES = {"batch-invariant": "one-by-one"}  # the one-by-one mode's name before fixed-tiles existed

SETTING_ALIASES: Mapping[str, Mapping[str, str]] = {"kernel_mode": MODE_ALIASES}  # per setting: requested name -> canonical name


def canonical_setting(name: str, value: Any) -> Any:
    """The value a server takes a requested setting for: an alias gives its canonical name, anything else is itself.

    Examples
    --------
    >>> canonical_setting("kernel_mode", "batch-invariant")
    'one-by-one'
    >>> canonical_setting("kernel_mode", "default"), canonical_setting("dtype", "batch-invariant")
    ('default', 'batch-invariant')
    """
    aliases = SETTING_ALIASES.get(name) or {}
    return aliases.get(value, value) if isinstance(value, str) else value
