"""The verdict card (:class:`Review`) and the lines every card shares: the judgement's headline and lines, the table per
batch size c, the bits, tokens and near-tie lines, and a recorded witness verdict beside bia's. Runs' cards are
:mod:`analysis.views.html.review`, witnesses' :mod:`analysis.views.html.witness_review`; every value is formatted for
people here, and the templates escape it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ...core import MISSING, cell, share

NOT_RECORDED = "the logprob bits are not recorded"  # why a card has no bits to judge, unless it says another reason


@dataclass
class Review:
    """One card: a headline, a small table per batch size c, and one line per question.

    Attributes
    ----------
    kind : str
        ``"run"`` or ``"witness"``.
    name : str
        The run folder or the witness file.
    about : list of (str, str)
        What served it (engine, model, host, ...), formatted.
    headline : str
        The answer in one sentence.
    css : str
        ``pass``, ``warn`` or ``fail``: how the headline is coloured.
    per_c : pl.DataFrame
        One row per c, every cell a string.
    lines : list of (str, str, str or None)
        (question, answer, css): the judgement's cause, next step, cost and evidence, then bits, tokens, near-tie and
        completeness.
    verdict : str
        The judgement's verdict (:func:`analysis.judge`), the worst of the card's arms: the card's ``data-verdict``.
    repro_href : str or None
        The ``REPORT.md`` of a repro written beside the run (``analysis.studies.repro_folder``): its ``repro`` line
        links it.
    """

    kind: str
    name: str
    about: list[tuple[str, str]]
    headline: str
    css: str
    per_c: pl.DataFrame
    lines: list[tuple[str, str, str | None]] = field(default_factory=list)
    verdict: str = "UNVERIFIED"
    repro_href: str | None = None


def _judged(rows: list[dict[str, Any]]) -> tuple[str, str, str, list[tuple[str, str, str | None]]]:
    """The card's verdict, headline, colour and judgement lines from its judgement rows (one per arm): the worst arm heads it."""
    from ...studies import VERDICTS
    from .answer import CSS

    if not rows:
        return "UNVERIFIED", "UNVERIFIED: nothing to judge.", "warn", []
    head = max(rows, key=lambda row: VERDICTS.index(row["verdict"]))
    cause = f" ({head['cause']})" if head["cause"] else ""
    headline = f"{head['verdict']}{cause}: {head['reason']}."
    lines: list[tuple[str, str, str | None]] = []
    for row in rows:
        arm = f" ({row['arm']})" if len(rows) > 1 else ""
        if len(rows) > 1:
            lines.append((f"verdict{arm}", f"{row['verdict']}: {row['reason']}.", CSS[row["verdict"]]))
        lines.append((f"next step{arm}", row["next_step"], None))
        if row.get("repro"):  # a RED row: the command that makes a bug report of it
            lines.append((f"repro{arm}", row["repro"], None))
        lines.append(
            (
                f"decode cost{arm}",
                row["cost"] or "unmeasured: no decode rate timed the same way at c=1 and at a batched c.",
                None,
            )
        )
        lines.append((f"evidence{arm}", row["evidence"], None))
    return head["verdict"], headline, CSS[head["verdict"]], lines


def _per_c_table(counts: pl.DataFrame, no_bits: str = NOT_RECORDED) -> pl.DataFrame:
    """The card's table: one row per c, in words."""
    unknown = "not recorded" if no_bits == NOT_RECORDED else "not judged"
    rows = [
        {
            "c": str(r["c"]),
            "requests": str(r["requests"]),
            "bit-identical to m=1": share(r["bitwise"], r["bits_known"]) if r["bits_known"] else unknown,
            "token-identical": share(r["same"], r["requests"]),
            "first divergence": f"token {r['first']} ({r['first_where']})" if r["parted"] else MISSING,
            "near-tie explains": _explained(r),
        }
        for r in counts.iter_rows(named=True)
    ]
    columns = ["c", "requests", "bit-identical to m=1", "token-identical", "first divergence", "near-tie explains"]
    return pl.DataFrame(rows, schema=dict.fromkeys(columns, pl.String), orient="row")


def _explained(row: dict[str, Any]) -> str:
    """How many of a c's divergences a near-tie explains, in words."""
    if not row["parted"]:
        return MISSING
    if row["no_margin"] == row["parted"]:
        return "no margin recorded"
    return f"{row['near_tie']} of {row['parted']}"


def _bits_line(counts: pl.DataFrame, max_ulp: int | None, no_bits: str = NOT_RECORDED) -> tuple[str, str, str | None]:
    known = int(counts["bits_known"].sum())
    if not known and no_bits == NOT_RECORDED:
        return "bits", "not recorded: only tokens were kept, not their float32 logprobs.", None
    if not known:
        return "bits", f"not judged: {no_bits}.", "warn"
    same = int(counts["bitwise"].sum())
    ulp = f"; the largest logprob distance is {max_ulp:,} ULP" if max_ulp else ""
    return (
        "bits",
        f"{share(same, known)} of the requests bit-identical to m=1{ulp}.",
        "pass" if same == known else "warn",
    )


def _tokens_line(counts: pl.DataFrame) -> tuple[str, str, str | None]:
    requests, same = int(counts["requests"].sum()), int(counts["same"].sum())
    if same == requests:
        return "tokens", f"{share(same, requests)} token-identical: no request parted from m=1.", "pass"
    parted = counts.filter(pl.col("parted") > 0)
    if parted.is_empty():  # none parted: the others were not compared (a prompt without its reference, an empty answer)
        return "tokens", f"{share(same, requests)} token-identical; the others not compared (see the verdict).", "warn"
    first = parted.sort("first").row(0, named=True)
    return (
        "tokens",
        (
            f"{share(same, requests)} token-identical; the earliest divergence is at token {first['first']} "
            f"(c={first['c']}, {first['first_where']})."
        ),
        "fail",
    )


def _near_tie_line(counts: pl.DataFrame, epsilon: float) -> tuple[str, str, str | None]:
    parted, explained, unknown = (int(counts[n].sum()) for n in ("parted", "near_tie", "no_margin"))
    if not parted:
        return "near-tie", "nothing to explain: no request parted.", None
    if unknown == parted:
        return "near-tie", f"unknown: no reference margin was recorded at any of the {parted} divergence(s).", "warn"
    words = f"explains {explained} of {parted} divergence(s) (the reference's top-1/top-2 margin below {epsilon:g})"
    words += f"; {unknown} with no margin recorded" if unknown else ""
    return "near-tie", words + ".", "pass" if explained == parted else "fail"


def recorded_words(witness: dict[str, Any], bands: pl.DataFrame, row: dict[str, Any] | None) -> tuple[str, bool]:
    """aprender's recorded run verdict beside bia's: short where they agree, else both and why they differ, in one phrase.

    Parameters
    ----------
    witness : dict
        The witness's row of ``WitnessSet.witnesses`` (``recorded_verdict``, ``witness_version``).
    bands : polars.DataFrame
        Its bands (``c``, and ``intra_agree_to`` and ``declared_min`` where its version records them).
    row : dict or None
        bia's judgement row of the witness (``verdict``, ``cause``); None when it was not judged.

    Returns
    -------
    tuple of (str, bool)
        The words, and whether the two differ (a recorded PASS that bia judges RED; a recorded FAIL it does not).

    Examples
    --------
    >>> bands = pl.DataFrame({"c": [1, 4], "intra_agree_to": [128, 128], "declared_min": [64, 64]})
    >>> recorded_words({"recorded_verdict": "PASS", "witness_version": 2}, bands, {"verdict": "RED", "cause": "run-to-run"})[0]
    "recorded PASS; bia's rule: RED, run-to-run: witness_version 2 passes a batch whose requests agree with each other (here to token 128, declared_min 64) without comparing them with m=1, where bia compares every request with m=1"
    >>> recorded_words({"recorded_verdict": "FAIL", "witness_version": 1}, bands, {"verdict": "RED", "cause": "co-batching"})
    ('FAIL', False)
    """
    recorded, version = witness["recorded_verdict"], witness["witness_version"]
    if row is None or recorded not in ("PASS", "FAIL") or (recorded == "PASS") == (row["verdict"] != "RED"):
        return recorded or "not recorded", False
    bia = f"{row['verdict']}, {row['cause']}" if row.get("cause") else row["verdict"]
    if recorded == "PASS" and version in (2, 3):
        batched = bands.filter(pl.col("c") > 1)
        agree = batched["intra_agree_to"].min() if "intra_agree_to" in batched.columns else None
        declared = batched["declared_min"].min() if "declared_min" in batched.columns else None
        why = (
            f"witness_version {version} passes a batch whose requests agree with each other (here to token {cell(agree)}, "
            f"declared_min {cell(declared)}) without comparing them with m=1, where bia compares every request with m=1"
        )
    else:
        why = (
            f"witness_version {version}'s rules pass a band that agrees with m=1 to declared_min, where bia asks whether "
            "every request matches m=1 over its whole length"
        )
    return f"recorded {recorded}; bia's rule: {bia}: {why}", True
