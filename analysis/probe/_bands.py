"""What a band sends, row by row (the layouts), how each row is named in its capture envelope (``row``, ``batch``), and
whether the batch it formed was as wide as its c (a band that formed narrower is fired again)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, cast

from ..run import ROTATING, Unit, band_widths, batch_id, rotating_batch

# Fillers for the needle and rotating layouts when none are given and the prompt set holds a single prompt.
DEFAULT_FILLERS = (
    "Write one sentence about the sea.",
    "List three prime numbers.",
    "What does a compiler do?",
    "Describe a quiet morning.",
)
#: How many times a band whose width evidence shows it formed narrower than its c is fired again (``bia probe --refire``).
REFIRE = 2
#: No band is fired again once its attempts have taken this many seconds (``ProbeSettings.refire_s``).
REFIRE_S = 60.0


def band_rows(
    unit: Unit, manifest: Mapping[str, Any], body: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[tuple[str, int]], list[int], list[str]]:
    """A band's request bodies, row by row, with each row's (role, slot), the rows in slot order of the band's own requests
    first, and the batch as the envelopes name it (``analysis.run.batch_id``).

    ``copies`` (and the copies and serial arms): c copies, slot = row. ``needle`` (and the mixed arm): the prompt at a row
    drawn from the run's seed and the band's key, the fillers in turn after it, starting one further each repeat.
    ``rotating``: see ``analysis.run.rotating_batch``. Fillers are the run's ``fillers``, else the set's other prompts,
    else :data:`DEFAULT_FILLERS`.

    Parameters
    ----------
    unit : Unit
        The band.
    manifest : mapping
        The run's manifest (its prompts, fillers, seed and layout).
    body : dict
        The band's prompt's request body.

    Returns
    -------
    bodies : list of dict
        One request body per row.
    roles : list of (str, int)
        Each row's role and slot (``filler`` for a companion, its slot its row).
    rows : list of int
        The row of each of the band's own requests, in slot order.
    batch : list of str
        Each row's id (see ``analysis.run.batch_id``).
    """
    c = cast(int, unit.c)
    texts = {p["prompt_id"]: p["text"] for p in manifest["prompts"]}
    ids = {text: pid for pid, text in texts.items()}
    prompt = texts[unit.prompt_id]
    others = [p["text"] for p in manifest["prompts"] if p["prompt_id"] != unit.prompt_id]
    fillers = list(manifest.get("fillers") or others or DEFAULT_FILLERS)  # given, else the set's other prompts
    layout = (manifest.get("requested") or {}).get("layout")
    if unit.arm == "mixed" or (unit.arm is None and layout == "needle"):
        rng = random.Random(
            f"{manifest['sampler']['seed']}/{unit.key}"
        )  # the same position when a resume fires the band again
        target = rng.randrange(c)
        rows_text = [
            prompt if row == target else fillers[(row - (row > target) + unit.repeat) % len(fillers)]
            for row in range(c)
        ]
        own = [target]
    elif unit.arm is None and layout == ROTATING:
        rows_text, own = rotating_batch(prompt, fillers, c, unit.repeat)
    else:
        rows_text, own = [prompt] * c, list(range(c))
    slot_of = {row: slot for slot, row in enumerate(own)}
    bodies = [
        body if text == prompt and row in slot_of else _with_prompt(body, text) for row, text in enumerate(rows_text)
    ]
    roles = [(unit.role, slot_of[row]) if row in slot_of else ("filler", row) for row in range(c)]
    return bodies, roles, own, [batch_id(text, ids) for text in rows_text]


def _with_prompt(body: dict[str, Any], text: str) -> dict[str, Any]:
    return {**body, "messages": [{"role": "user", "content": text}]}


def widest_seen(entry: Mapping[str, Any]) -> int | None:
    """The widest batch a band's strongest width evidence shows, as the judgement reads it: the server log's per-step
    widths when there are any, else the gauge's or the engine counters', else the streams' co-residency (see
    :func:`analysis.run.band_widths`); None when none shows a width. A weaker kind that shows more does not count.

    Parameters
    ----------
    entry : mapping
        The band's ``m_formed`` entry.

    Returns
    -------
    int or None

    Examples
    --------
    >>> widest_seen({"prompt_id": "p0", "c": 4, "repeat": 0, "widths": [3, 3], "running": [0, 4]})  # the log says 3
    3
    >>> widest_seen({"prompt_id": "p0", "c": 4, "repeat": 0, "running": [0, 4], "streams": {"co_resident": 2}})
    4
    >>> widest_seen({"prompt_id": "p0", "c": 4, "repeat": 0, "running": [0]}) is None
    True
    """
    widths, _ = band_widths(
        {"m_formed": [dict(entry)]},
        entry["prompt_id"],
        entry["c"],
        entry.get("repeat"),
        entry.get("role", "band"),
        entry.get("arm"),
    )
    return max(widths) if widths else None


def fire_again(c: int, widest: int | None, fired: int, refire: int, spent_s: float, refire_s: float) -> bool:
    """Whether a band is fired once more: its evidence shows a batch narrower than its c (a band nothing shows a width of is
    not: firing it again would show nothing more), it has been fired again fewer than ``refire`` times, and its attempts
    have taken less than ``refire_s`` seconds.

    Parameters
    ----------
    c : int
        The band's width asked for.
    widest : int or None
        The widest batch its last attempt's evidence shows (:func:`widest_seen`).
    fired : int
        How many times it has been fired.
    refire : int
        The most times a band is fired again.
    spent_s : float
        Seconds its attempts have taken so far.
    refire_s : float
        The time bound.

    Returns
    -------
    bool

    Examples
    --------
    >>> fire_again(16, 14, 1, 2, 3.0, 60.0), fire_again(16, 16, 1, 2, 3.0, 60.0), fire_again(16, 14, 3, 2, 3.0, 60.0)
    (True, False, False)
    """
    return c > 1 and widest is not None and widest < c and fired <= refire and spent_s < refire_s


def attempt_record(entry: Mapping[str, Any], widest: int | None, seconds: float) -> dict[str, Any]:
    """One fire of a band as its entry's ``attempts`` lists it: the widest batch seen, the evidence, the log's widths and
    the gauge's samples, and how long it took.

    Parameters
    ----------
    entry : mapping
        The attempt's ``m_formed`` entry.
    widest : int or None
        The widest batch its evidence shows (:func:`widest_seen`).
    seconds : float
        How long the attempt took.

    Returns
    -------
    dict

    Examples
    --------
    >>> attempt_record({"widths": [3, 2], "running": [0, 3]}, 3, 0.41234)
    {'widest': 3, 'widths': [3, 2], 'running': [0, 3], 's': 0.412}
    """
    record: dict[str, Any] = {"widest": widest, "widths": list(entry.get("widths") or [])}
    if "running" in entry:
        record["running"] = list(entry["running"])
    if "streams" in entry:
        record["co_resident"] = entry["streams"]["co_resident"]
    record["s"] = round(seconds, 3)
    return record


def distinct_contexts(manifest: Mapping[str, Any], units: Sequence[Unit]) -> int:
    """How many distinct batch contexts (prompt, c, row, batch, arm) a plan's batched requests (c > 1) sit in.

    Parameters
    ----------
    manifest : mapping
        The run's manifest (prompts, fillers, seed, layout).
    units : sequence of Unit
        The plan (see :func:`analysis.run.plan`).

    Returns
    -------
    int
    """
    seen: set[tuple] = set()
    for unit in units:
        if unit.role != "band" or not unit.c or unit.c < 2:
            continue
        _, _, rows, batch = band_rows(unit, manifest, {"messages": []})
        seen.update((unit.arm, unit.c, unit.prompt_id, row, tuple(batch)) for row in rows)
    return len(seen)
