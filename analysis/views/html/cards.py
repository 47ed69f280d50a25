"""The cards Jupyter shows for bia's objects, where they need the judgement (computed above the objects' own floors)."""

from __future__ import annotations

from typing import Any

import polars as pl

from ...core import few, kernel_mode_words, scroll_box, summary_html
from ...metrics import run_counts
from ...run import Run, run_arms, slot_table
from ...studies import judge_runs
from .answer import answer_html


def run_card(run: Any) -> str:
    """A :class:`~analysis.Run`'s card in Jupyter: its verdict first (the answer table's row of :func:`analysis.judge`), then
    what served it, its plan, what it lacks, and per c how much of it matched m=1.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    str
        HTML.

    Examples
    --------
    >>> from analysis import read_run
    >>> html = run_card(read_run("data/experiment-cpu/default"))
    >>> html.index('data-verdict="RED"') < html.index("bia run")
    True
    """
    return scroll_box(answer_html(judge_runs(run), table_id=None, full=True)) + _facts(
        run
    )  # six columns: wider than a narrow notebook


def _facts(run: Run) -> str:
    """A run's card: what served it, its plan, what it lacks, and per c how much of it matched m=1."""
    manifest = run.manifest
    identity = manifest.get("identity") or {}
    facts = [
        ("engine", identity.get("engine") or manifest.get("producer")),
        ("model", (identity.get("model") or {}).get("path")),
        ("prompts", few(run.prompts)),
        ("ladder", run.ladder),
        ("requests", len(run.dump.requests)),
        ("complete", manifest.get("complete", True)),
        ("missing", len(run.missing())),
        ("refused", len(manifest.get("refused") or [])),
        ("capture records left out", len(run.dump.skipped)),
    ]
    mode = kernel_mode_words(manifest)
    if mode:  # as the verdict card says it: as asked, and the mode that ran when it differs, after what served it
        facts.insert(1, ("kernel mode", mode))
    if manifest.get("arms") is not None:
        facts.insert(3, ("arms", ", ".join(manifest["arms"])))
    lines = []
    slots = slot_table(run)
    # a run with control arms is counted arm by arm: a warm cache's c=1 is not the copies' c=1
    for arm in run_arms(manifest) if manifest.get("arms") is not None else [None]:
        counts = run_counts(slots if arm is None else slots.filter(pl.col("arm") == arm))
        for c, requests, bitwise, known, same, earliest in counts.select(
            "c", "requests", "bitwise", "bits_known", "same", "first"
        ).iter_rows():
            words = f"{arm + ' ' if arm else ''}c={c}: " + _bits_words(requests, bitwise, known, same)
            words += f"; the earliest parts at token {earliest}" if earliest is not None else ""
            lines.append((words, "pass" if bitwise == requests else "fail" if same < requests else None))
    return summary_html("bia run", run.label, facts, lines)


def _bits_words(requests: int, bitwise: int, known: int, same: int) -> str:
    """How many of a c's requests matched ref #1 in bits and in tokens, and how many have bits no one can know (tokens that
    all match ref #1's with no logprobs to compare: a request that parts in tokens is known not to be bit-identical).

    Examples
    --------
    >>> _bits_words(4, 3, 4, 4)
    '3 of 4 requests bit-identical to ref #1, 4 token-identical'
    >>> _bits_words(4, 0, 1, 3)
    '0 of 4 requests bit-identical to ref #1, 3 with bits unknown (no logprobs), 3 token-identical'
    """
    unknown = f", {requests - known} with bits unknown (no logprobs)" if known < requests else ""
    return f"{bitwise} of {requests} requests bit-identical to ref #1{unknown}, {same} token-identical"
