"""Which prompt sits in which row of a band's batch: the ``copies`` and ``needle`` layouts, shared by the
probe of a callable (:func:`analysis.probe.probe_callable`) and the torch experiment
(:func:`analysis.run_experiment`), and by the experiment's replay with taps, which must rebuild the very
batches the run decoded."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

LAYOUTS = ("copies", "needle")

T = TypeVar("T")


def band_batch(prompt: T, others: Sequence[T], c: int, layout: str, rng: random.Random) -> tuple[list[T], int]:
    """The batch of one band of width ``c`` and the row of its target request.

    ``copies``: ``c`` copies of ``prompt``, target row 0 (every row is the target's twin). ``needle``:
    ``prompt`` at a row drawn from ``rng`` (one draw per band, so a seeded ``rng`` gives the same rows
    band after band), every other row filled with ``others`` in turn. Which prompts count as others is
    the caller's: the probe takes the other positions of its list, the experiment the other token lists
    (or the prompt reversed when there is none).

    Parameters
    ----------
    prompt : object
        The target request's prompt (text, or token ids).
    others : sequence
        The prompts that fill the other rows in the needle layout.
    c : int
        The band's width.
    layout : {"copies", "needle"}
        How the batch is laid out.
    rng : random.Random
        Draws the target's row in the needle layout (unused with copies).

    Returns
    -------
    tuple of (list, int)
        The batch's rows and the target's row.

    Examples
    --------
    >>> band_batch("a", ["b", "c"], 3, "copies", random.Random(0))
    (['a', 'a', 'a'], 0)
    >>> band_batch("a", ["b", "c"], 4, "needle", random.Random(0))
    (['b', 'c', 'b', 'a'], 3)
    """
    if layout == "copies":
        return [prompt] * c, 0
    target = rng.randrange(c)
    batch = [others[k % len(others)] for k in range(c)]
    batch[target] = prompt
    return batch, target
