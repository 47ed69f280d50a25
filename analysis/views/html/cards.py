"""The cards Jupyter shows for bia's objects, where they need the judgement (computed above the objects' own floors)."""

from __future__ import annotations

from typing import Any

from ...core._cells import scroll_box
from ...studies._judgement import answer_html, judge_runs


def run_card(run: Any) -> str:
    """A :class:`~analysis.Run`'s card in Jupyter: its verdict first (the answer table's row of :func:`analysis.judge`), then
    what served it, its plan, what it lacks, and per c how much of it matched m=1.

    Examples
    --------
    >>> from analysis import read_run
    >>> html = run_card(read_run("data/experiment-cpu/default"))
    >>> html.index('data-verdict="RED"') < html.index("bia run")
    True
    """
    from ...run._model import _card

    return scroll_box(answer_html(judge_runs(run), table_id=None, full=True)) + _card(run)  # six columns: wider than a narrow notebook
