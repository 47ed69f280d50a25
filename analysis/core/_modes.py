"""Kernel mode names and their aliases, at the bottom so that the report can read a manifest's settings
without importing the experiment (:mod:`analysis.experiment.modes` describes each mode)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KERNEL_MODES = ("default", "one-by-one", "fixed-tiles", "row-invariant")
MODE_ALIASES = {"batch-invariant": "one-by-one"}  # the one-by-one mode's name before fixed-tiles existed
#: The modes that claim batch invariance: a row's bits do not depend on the rows computed with it.
INVARIANT_MODES = ("one-by-one", "fixed-tiles", "row-invariant")
#: The invariant modes that also claim prefill == decode: a token's logprob from one forward pass over the whole
#: sequence (an RL trainer's recompute) has the bits its decode step gave (fixed-tiles meets a prefill's queries one
#: at a time, as a decode step's; row-invariant computes every token alike). one-by-one does not: a lone row's
#: matmuls still take the sequence's length as their shape, so a prompt's pass and a decode step sum differently.
PREFILL_DECODE_MODES = ("fixed-tiles", "row-invariant")

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
