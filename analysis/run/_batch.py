"""Which prompt sits in which row of a band's batch, and how a capture envelope names each row (:func:`batch_id`): the
``copies`` and ``needle`` layouts, shared by the
probe of a callable (:func:`analysis.probe.probe_callable`) and the torch experiment
(:func:`analysis.run_experiment`), and by the experiment's replay with taps, which must rebuild the very
batches the run decoded."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
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


#: The layout ``bia certify URL`` fires: per band, c - 1 copies of the prompt and one companion whose row and text change from
#: repeat to repeat, so that every repeat of a band is a new batch context (see :func:`rotating_batch`). The probe's alone.
ROTATING = "rotating"


def filler_text(pool: Sequence[str], k: int) -> str:
    """The ``k``-th companion text: ``pool``'s, then made up past its end (``Count from k to k + 9.``), each distinct.

    Parameters
    ----------
    pool : sequence of str
        The fillers given (or the set's other prompts, or bia's).
    k : int
        Which companion, from 0.

    Returns
    -------
    str

    Examples
    --------
    >>> filler_text(["List three prime numbers."], 0), filler_text(["List three prime numbers."], 3)
    ('List three prime numbers.', 'Count from 3 to 12.')
    """
    return pool[k] if k < len(pool) else f"Count from {k} to {k + 9}."


def rotating_batch(prompt: str, pool: Sequence[str], c: int, repeat: int) -> tuple[list[str], list[int]]:
    """The batch of one band of the ``rotating`` layout and the rows of its target requests, in slot order.

    A band of c > 1 holds c - 1 copies of ``prompt`` and one companion, at row ``repeat % c``, whose text is
    :func:`filler_text` ``(pool, repeat // c)``: no two repeats of a band put the same companion at the same row, so each
    repeat is a new batch context for every copy. A band of 1 is the prompt alone.

    Parameters
    ----------
    prompt : str
        The band's prompt.
    pool : sequence of str
        The companions' texts (see :func:`filler_text`).
    c : int
        The band's width.
    repeat : int
        The repeat of the band, from 0.

    Returns
    -------
    tuple of (list of str, list of int)
        The batch's rows, and the rows of the prompt's copies (slot 0 first).

    Examples
    --------
    >>> rotating_batch("a", ["x", "y"], 3, 0)
    (['x', 'a', 'a'], [1, 2])
    >>> rotating_batch("a", ["x", "y"], 3, 4)  # repeat 4: row 1, the pool's second text
    (['a', 'y', 'a'], [0, 2])
    >>> rotating_batch("a", ["x"], 1, 5)
    (['a'], [0])
    """
    if c < 2:
        return [prompt], [0]
    row = repeat % c
    batch = [prompt] * c
    batch[row] = filler_text(pool, repeat // c)
    return batch, [r for r in range(c) if r != row]


def batch_id(text: str, ids: Mapping[str, str]) -> str:
    """A row of a batch as its requests' envelopes name it: the prompt id of a prompt of the set, else ``filler:`` and the
    first 12 hex digits of the SHA-256 of the text.

    Parameters
    ----------
    text : str
        The row's prompt text.
    ids : mapping of str to str
        The set's prompt ids by text.

    Returns
    -------
    str

    Examples
    --------
    >>> batch_id("If the argument is", {"If the argument is": "p0"}), batch_id("List three prime numbers.", {})
    ('p0', 'filler:c981f016eaff')
    """
    if text in ids:
        return ids[text]
    return "filler:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
