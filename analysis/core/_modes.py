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

SETTING_ALIASES: Mapping[str, Mapping[str, str]] = {
    "kernel_mode": MODE_ALIASES
}  # per setting: requested name -> canonical name


def canonical_setting(name: str, value: Any) -> Any:
    """The value a server takes a requested setting for: an alias gives its canonical name, anything else is itself.

    Parameters
    ----------
    name : str
        The setting, e.g. ``kernel_mode``.
    value : Any
        The value requested.

    Returns
    -------
    Any

    Examples
    --------
    >>> canonical_setting("kernel_mode", "batch-invariant")
    'one-by-one'
    >>> canonical_setting("kernel_mode", "default"), canonical_setting("dtype", "batch-invariant")
    ('default', 'batch-invariant')
    """
    aliases = SETTING_ALIASES.get(name) or {}
    return aliases.get(value, value) if isinstance(value, str) else value


def mode_as_asked(asked: str | None, ran: str | None) -> str | None:
    """A kernel mode named as it was asked for, with the mode that ran beside it when the two differ.

    Parameters
    ----------
    asked : str or None
        The mode requested; None when not named.
    ran : str or None
        The mode the server reports running; None when not known.

    Returns
    -------
    str or None
        None when neither is known.

    Examples
    --------
    >>> mode_as_asked("batch-invariant", "one-by-one")  # an alias: the mode it names ran
    'batch-invariant (runs as one-by-one)'
    >>> mode_as_asked("fixed-tiles", "default")  # not honoured
    'fixed-tiles (the server reports default)'
    >>> mode_as_asked("default", "default"), mode_as_asked(None, "default"), mode_as_asked("fixed-tiles", None), mode_as_asked(None, None)
    ('default', 'default', 'fixed-tiles', None)
    """
    if asked is None or ran is None or asked == ran:
        return asked if asked is not None else ran
    how = "runs as" if canonical_setting("kernel_mode", asked) == ran else "the server reports"
    return f"{asked} ({how} {ran})"


def kernel_mode_words(manifest: Mapping[str, Any]) -> str | None:
    """A run's kernel mode as its manifest says it was asked for (``requested``), with the one it ran (``effective``) beside it
    when they differ: what every card, the report and the CLI name it. None when the run names no kernel mode (a server's).

    Parameters
    ----------
    manifest : Mapping of str to Any
        A run's manifest, with optional ``requested`` and ``effective`` settings.

    Returns
    -------
    str or None

    Examples
    --------
    >>> kernel_mode_words({"requested": {"kernel_mode": "batch-invariant"}, "effective": {"kernel_mode": "one-by-one"}})
    'batch-invariant (runs as one-by-one)'
    >>> kernel_mode_words({"effective": {"kernel_mode": "default"}}), kernel_mode_words({"requested": {"layout": "copies"}})
    ('default', None)
    """
    return mode_as_asked(
        (manifest.get("requested") or {}).get("kernel_mode"), (manifest.get("effective") or {}).get("kernel_mode")
    )
