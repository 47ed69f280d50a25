"""The answer: one row per run and arm of a :class:`analysis.Judgement`, as the report's first table and Jupyter's view."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from ...run import ARM_WORDS, arm_words
from ...studies import RATIO_HEADING, Judgement, baseline_words, rate_words, ratio_cell
from .blocks import jupyter_card, scroll_box

CSS = {
    "GREEN": "pass",
    "AMBER": "warn",
    "UNVERIFIED": "warn",
    "RED": "fail",
}  # a verdict's colour class in bia's style sheet

__all__ = ["CSS", "answer_html", "judgement_html"]


def _short_cost(cost: list[Mapping[str, Any]] | None) -> str:
    """Each c's per-request decode rate over the c=1 baseline, in a few characters: ``0.80× / 0.59× at c=4 / 8``."""
    if not cost:
        return "unmeasured"
    ratios = " / ".join(ratio_cell(c["ratio"]) for c in cost)
    return f"{ratios} at c={' / '.join(str(c['c']) for c in cost)}"


def _cost_cell(cost: list[Mapping[str, Any]] | None, full: bool = True) -> str:
    """The cost's cell: the ratios, and the baseline they are over (:func:`analysis.studies.baseline_words`), in words a
    reader sees (a run timed at c=1 more than once says which rate it is measured against); in the report's answer, which
    must fit a screen, the baseline is the cell's tooltip and its card's cost line.

    Examples
    --------
    >>> _cost_cell([{"c": 4, "ratio": 0.5, "base_median": 159.5, "base_rates": 2, "origin": "streams"}])
    '<td>0.50× at c=4 <span class="bia-muted">(over baseline 160 tok/s: the median of 2 c=1 requests, streams’ timings)</span></td>'
    """
    if not cost:
        return "<td>unmeasured</td>"
    baseline = escape(baseline_words(cost[0]))
    if not full:
        return f'<td title="{baseline}">{escape(_short_cost(cost))}</td>'
    return f'<td>{escape(_short_cost(cost))} <span class="bia-muted">(over {baseline})</span></td>'


def _full_why(row: Mapping[str, Any]) -> str:
    return f"{row['cause']}: {row['reason']}" if row["cause"] else row["reason"]


def _short_why(row: Mapping[str, Any]) -> str:
    """The answer table's why: the cause and the first request that parts, or what the evidence lacks, in a line."""
    first = row["first_request"]
    if row["verdict"] == "RED" and first:
        how = (
            f"tokens at {first['position']}" if first["parted"] == "tokens" else f"bits from token {first['position']}"
        )
        who = (
            f"{first['prompt_id'] or ''} ref #2 alone"
            if first["role"] == "ref #2"
            else f"{first['prompt_id'] or ''} alone (c=1)"
            if first["c"] == 1
            else f"{first['prompt_id'] or ''} c={first['c']} slot {first['slot']}"
        )
        share = (
            f"{row['alone_parted']}/{row['alone']} alone part"
            if row["alone_parted"]
            else f"{row['divergent']}/{row['requests']} batched part"
        )
        return f"{row['cause']}: {share}; first {who.strip()}, {how}"
    if row["verdict"] == "UNVERIFIED":
        return row["reason"].removeprefix("no request parts from m=1, but ")
    return f"0/{row['requests']} batched part; bound {rate_words(row['upper_bound'])} {'<' if row['verdict'] == 'GREEN' else '≥'} {rate_words(row['target_rate'])}"


def _step_cell(step: str, full: bool, repro: str | None = None) -> str:
    """The next step's cell: whole in Jupyter's view; in the report's answer, which must fit a screen, the command alone, with
    what was measured beside it (``_with_measured_fix``) as the cell's tooltip and in its card. A RED row's ``repro`` (the
    ``bia repro`` command) follows on a line of its own in Jupyter's view, and in the report's answer joins the tooltip (its
    card names it in full).

    Examples
    --------
    >>> _step_cell("batch-invariant kernels: X (measured beside it, its decode rate over this run's: 1.07× at c=1)", False)
    '<td title="batch-invariant kernels: X (measured beside it, its decode rate over this run&#x27;s: 1.07× at c=1)">batch-invariant kernels: X …</td>'
    >>> _step_cell("batch-invariant kernels: X", True, "bia repro r -o r-repro")
    '<td>batch-invariant kernels: X<br>repro: <code>bia repro r -o r-repro</code></td>'
    >>> _step_cell("batch-invariant kernels: X", False, "bia repro r -o r-repro")
    '<td title="batch-invariant kernels: X; repro: bia repro r -o r-repro">batch-invariant kernels: X …</td>'
    """
    if full:
        return f"<td>{escape(step)}{f'<br>repro: <code>{escape(repro)}</code>' if repro else ''}</td>"
    command, measured, _ = step.partition(" (measured beside it")
    if not measured and not repro:
        return f"<td>{escape(step)}</td>"
    return f'<td title="{escape(step + (f"; repro: {repro}" if repro else ""))}">{escape(command)} …</td>'


def _arm_html(arm: str, full: bool) -> str:
    """A row's arm: with what it sent (:func:`analysis.run.arm_words`), in full or as the name's tooltip."""
    if full or arm not in ARM_WORDS:
        return escape(arm_words(arm))
    return f'<span title="{escape(ARM_WORDS[arm])}">{escape(arm)}</span>'


def answer_html(judgement: Judgement, *, table_id: str | None = "answer", full: bool = False) -> str:
    """The answer: one row per run and arm, its verdict, why (cause and first request), the cost of batching, the evidence and
    the next step; the full reason is each row's tooltip and its card's headline.

    Each row carries ``data-run``, ``data-arm`` and ``data-verdict``; every value is escaped. ``full``: the why column holds the
    cause and the whole reason, and the arm what it sent (``copies: every slot a copy of the prompt``: Jupyter's view of a
    :class:`Judgement`), not their one-line summary and the arm's name with its words as a tooltip (the report's answer, which
    must fit a screen, and says what its arms sent below it).

    Parameters
    ----------
    judgement : Judgement
        The judgement, one row per run and arm.
    table_id : str or None, default "answer"
        The table's HTML ``id``; none when None.
    full : bool, default False
        Whole reasons and arm descriptions in the cells, as described above.

    Returns
    -------
    str

    Examples
    --------
    >>> from analysis.studies import judge
    >>> html = answer_html(judge("data/experiment-cpu/default"))
    >>> html.count('data-verdict="RED"'), html.startswith('<table id="answer"')
    (1, True)
    """
    head = "".join(f"<th>{h}</th>" for h in ("verdict", "run (arm)", "why", RATIO_HEADING, "evidence", "next step"))
    rows = []
    for row in judgement:
        evidence = f"{row['requests']} batched, {row['bands'] - row['bands_unformed']}/{row['bands']} bands formed"
        rows.append(
            f'<tr data-run="{escape(row["run"])}" data-arm="{escape(row["arm"])}" data-verdict="{row["verdict"]}" '
            f'title="{escape(row["reason"])}"><td class="bia-{CSS[row["verdict"]]}" data-verdict-cell><b>{row["verdict"]}</b></td>'
            f"<td><code>{escape(row['run'])}</code> ({_arm_html(row['arm'], full)})</td><td>{escape(_full_why(row) if full else _short_why(row))}</td>"
            f"{_cost_cell(row['cost_by_c'], full)}<td>{escape(evidence)}</td>{_step_cell(row['next_step'] or '', full, row.get('repro'))}</tr>"
        )
    ident = f' id="{escape(table_id)}"' if table_id else ""
    return f'<table{ident} class="bia-table bia-answer"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def judgement_html(judgement: Judgement) -> str:
    """Jupyter's view of a :class:`analysis.Judgement`: the answer with whole reasons, in a box that scrolls sideways.

    Parameters
    ----------
    judgement : Judgement
        The judgement to show.

    Returns
    -------
    str
        The HTML fragment.

    Examples
    --------
    >>> from analysis.studies import judge
    >>> judgement_html(judge("data/experiment-cpu/default")).count('data-verdict="RED"')
    1
    """
    return jupyter_card(
        scroll_box(answer_html(judgement, table_id=None, full=True))
    )  # six columns: wider than a narrow notebook
