"""aprender's V3 release gate for people: each witness's recorded, re-derived and V3 verdicts with every discrepancy,
and each run judged one witness per prompt, the reasons' long decimals rounded."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl

from ...core import MISSING, cell
from ...verdicts import ShapeVerdict, V3Policy
from .answer import CSS
from .blocks import render
from .verdict_card import recorded_words


def _short(commit: str | None) -> str:
    return commit[:10] if commit else MISSING


def run_admission(run, policy) -> list[dict[str, Any]]:
    """aprender's V3 verdict of each prompt's witness, prompts with the same verdict and reasons grouped.

    Parameters
    ----------
    run : Run
        The run.
    policy : V3Policy
        The policy the witnesses are judged by.

    Returns
    -------
    list of dict
    """
    from ...run import RunError, to_witness
    from ...verdicts import ShapeVerdict, shape_check_data

    groups: dict[tuple, dict[str, Any]] = {}
    for prompt in run.prompts:
        source = f"{run.label} prompt {prompt}"
        try:
            witness = to_witness(run, prompt)
        except (
            RunError
        ) as exc:  # no witness to judge (a run assembled from dumps records no max_tokens): red, saying why
            verdict, result = ShapeVerdict("RED", (f"RED: no witness: {exc}",), source, policy), "UNMEASURABLE"
        else:
            verdict, result = shape_check_data(witness, source=source, policy=policy), witness["result"]
        key = (verdict.status, verdict.reasons, result)
        group = groups.setdefault(key, {"verdict": verdict, "result": result, "prompts": []})
        group["prompts"].append(prompt)
    return list(groups.values())


_LONG_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d{5,}(?:[eE][-+]?\d+)?(?![\w.])")


def rounded(text: str) -> str:
    """A reason with its long decimals rounded for people; V3's own text keeps every digit.

    Parameters
    ----------
    text : str
        A verdict's reason.

    Returns
    -------
    str

    Examples
    --------
    >>> rounded("per-request decode at c=4 is 102.92960513109377 tok/s, 3.5% of c=1's 2940.1234567 tok/s")
    "per-request decode at c=4 is 102.9 tok/s, 3.5% of c=1's 2,940 tok/s"
    """
    return _LONG_DECIMAL.sub(lambda m: cell(float(m.group(0))), text)


def _for_people(verdict: ShapeVerdict) -> dict[str, Any]:
    """A V3 verdict as the report shows it: its status and exit code, the reasons' numbers rounded."""
    return {
        "status": verdict.status,
        "exit_code": verdict.exit_code,
        "source": verdict.source,
        "reasons": [rounded(r) for r in verdict.reasons],
    }


def verdicts_html(ws, verdicts: Mapping[str, ShapeVerdict], judgement: Any = None) -> str:
    """Each witness's recorded and re-derived run verdict, its V3 verdict, and every discrepancy.

    A recorded verdict that bia's judgement does not share says so in its own words, with bia's verdict and why they
    differ (``recorded_words``), coloured by bia's verdict, not by the recorded one.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.
    verdicts : mapping of str to ShapeVerdict
        Each witness's V3 verdict, by source.
    judgement : Judgement, optional
        bia's judgement holding each witness's row (the report's); judged here when not given.

    Returns
    -------
    str
        HTML.
    """
    from ...studies import judge_witnesses

    polars_set = ws.to_backend("polars")
    judged = (judge_witnesses(ws) if judgement is None else judgement).frame
    witnesses = []
    for row in polars_set.witnesses.iter_rows(named=True):
        mine = judged.filter(pl.col("run") == row["source"]).to_dicts()
        bands = polars_set.bands.filter(pl.col("source") == row["source"])
        words, differs = recorded_words(row, bands, mine[0] if mine else None)
        witnesses.append(
            {
                "source": row["source"],
                "version": cell(row["witness_version"]),
                "host": cell(row["host"]),
                "commit": _short(row["commit"]),
                "model": cell(row["model_path"]),
                "recorded": row["recorded_verdict"],
                "recorded_words": words,
                "bia_css": CSS[mine[0]["verdict"]] if differs else None,
                "derived": cell(row["derived_verdict"]),
                "agrees": row["verdict_agrees"],
                "verdict": _for_people(verdicts[row["source"]]),
            }
        )
    discrepancies = [{k: cell(v) for k, v in row.items()} for row in polars_set.discrepancies.iter_rows(named=True)]
    return render("verdicts.html.j2", witnesses=witnesses, discrepancies=discrepancies)


def admission_html(
    ws, verdicts: Mapping[str, ShapeVerdict], runs: Iterable[Any], policy: V3Policy, judgement: Any = None
) -> str:
    """aprender's V3 release gate as its own section.

    Parameters
    ----------
    ws : WitnessSet
        The witnesses, each with its recorded and re-derived verdict and its V3 verdict.
    verdicts : mapping of str to ShapeVerdict
        Each witness's V3 verdict by source.
    runs : iterable of Run
        The runs to judge too, one witness per prompt (empty unless the reader asked).
    policy : V3Policy
        The policy in force, described in the section's opening words.
    judgement : Judgement, optional
        bia's judgement of the witnesses (the report's), named beside a recorded verdict it does not share; judged here
        when not given.

    Returns
    -------
    str
        Escaped HTML; the reasons' long decimals rounded for people (see ``rounded``).
    """
    judged = []
    for run in runs:
        groups = run_admission(run, policy)
        judged.append({"path": run.label, "groups": [_group(run, g) for g in groups]})
    return render(
        "admission.html.j2",
        policy=policy,
        bands=cell(list(policy.bands)),
        ratio=f"{policy.s7_ratio:.0%}",
        witnesses=verdicts_html(ws, verdicts, judgement) if ws.sources else "",
        runs=judged,
    )


def _group(run, group: Mapping[str, Any]) -> dict[str, Any]:
    """Prompts with one V3 verdict, the verdict named after all of them."""
    names = _names(group["prompts"])
    verdict = {
        **_for_people(group["verdict"]),
        "source": f"{run.label}, prompt{'s' if len(group['prompts']) > 1 else ''} {names}",
    }
    return {**group, "verdict": verdict, "names": names}


def _names(items: list[str], n: int = 8) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")
