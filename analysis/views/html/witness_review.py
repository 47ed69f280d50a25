"""The report's verdict card of a witness: the questions of :mod:`analysis.views.html.review` asked of one witness file,
which keeps tokens, not logprobs, and says where aprender's recorded verdict and bia's disagree, and why
(:func:`~analysis.views.html.verdict_card.recorded_words`, which aprender's gate section says too)."""

from __future__ import annotations

from typing import Any

import polars as pl

from ...core import MISSING, cell
from ...metrics import per_c_counts
from .verdict_card import Review, _bits_line, _judged, _near_tie_line, _per_c_table, _tokens_line, recorded_words


def witness_reviews(ws, *, epsilon: float, judgement: Any = None) -> list[Review]:
    """One card per witness file of a witness set (markers have none).

    A witness keeps tokens, not logprobs: its bits are "not recorded", its near-tie comes from
    the band's recorded margin, its decode cost from slot rates (else band rates).

    Parameters
    ----------
    ws : WitnessSet
        The witnesses.
    epsilon : float
        The near-tie epsilon.
    judgement : Judgement, optional
        The judgement holding each witness's row (:func:`analysis.judge` of the set); judged here when not given.

    Returns
    -------
    list of Review
        In the order the witnesses were read, each headed by its judgement's verdict.
    """
    from ...studies import judge_witnesses
    from ..plots.witness import witness_label

    if judgement is None:
        judgement = judge_witnesses(ws)

    out = []
    for row, slots, bands in ws.each_witness():
        rows = judgement.frame.filter(pl.col("run") == row["source"]).to_dicts()
        out.append(
            _witness_review(witness_label(row["source"], row["witness_version"]), row, slots, bands, epsilon, rows)
        )
    return out


def _witness_review(
    name: str,
    witness: dict[str, Any],
    slots: pl.DataFrame,
    bands: pl.DataFrame,
    epsilon: float,
    judged: list[dict[str, Any]],
) -> Review:
    margins = bands.select("band_index", margin="top2_margin_at_divergence")
    reference = pl.lit(
        witness["reference_tokens"], pl.Int64
    )  # a literal: fill_null(None) raises for a witness with no reference length
    length = pl.min_horizontal(pl.col("completion_tokens").fill_null(reference), reference)
    span = _witness_span(witness)
    parted = (pl.col("agree_to") < length).fill_null(False)
    batching = parted & (pl.col("agree_to") < span) if span is not None else parted
    rows = slots.join(margins, on="band_index", how="left").select(
        "c",
        bitwise=pl.lit(None, dtype=pl.Boolean),
        diverged=batching,
        divergence_at="agree_to",
        near_tie=((pl.col("margin") >= 0) & (pl.col("margin") < epsilon)).fill_null(False),
        margin_known=pl.col("margin").is_not_null(),
        where=pl.format("slot {}", "i"),
    )
    counts = per_c_counts(rows)
    verdict, headline, css, judgement_lines = _judged(judged)
    lines = [
        *judgement_lines,
        _bits_line(counts, None),
        _tokens_line(counts) if counts.height else ("tokens", MISSING, None),
        _near_tie_line(counts, epsilon),
        _witness_completeness(witness, slots, bands),
    ]
    if span is not None:
        late = slots.filter(parted & (pl.col("agree_to") >= span)).select("c").to_series().to_list()
        left = (
            f"; {len(late)} request(s) parting at or after it (c={', '.join(str(c) for c in sorted(set(late)))}) count as run-to-run, not batching"
            if late
            else ""
        )
        lines.insert(
            len(judgement_lines) + 1,
            (
                "run-to-run",
                f"the two m=1 references agree only to token {span} of {witness['reference_tokens']}: the server is not "
                f"deterministic even alone. Batching is judged on the tokens before {span}{left}.",
                "warn",
            ),
        )
    words, differs = recorded_words(witness, bands, judged[0] if judged else None)
    if differs:
        lines.append(("aprender", words, None))
    about = [
        ("source", witness["source"]),
        ("witness_version", cell(witness["witness_version"])),
        ("host", cell(witness["host"])),
        ("server commit", cell((witness["commit"] or "")[:10] or None)),
        ("model", cell(witness["model_path"])),
    ]
    return Review("witness", name, about, headline, css, _per_c_table(counts), lines, verdict)


def _witness_span(witness: dict[str, Any]) -> int | None:
    """The token the witness's two m=1 references part at, when they part before its reference length; else None."""
    at, tokens = witness["reference_self_divergence_at"], witness["reference_tokens"]
    return at if at is not None and tokens is not None and at < tokens else None


def _witness_completeness(
    witness: dict[str, Any], slots: pl.DataFrame, bands: pl.DataFrame
) -> tuple[str, str, str | None]:
    expected = int(bands["c"].sum()) if bands.height else 0
    refused = int(slots["refused"].is_not_null().sum())
    gaps = [
        f"{expected - slots.height} slot(s) absent" if slots.height < expected else "",
        f"{refused} refused" if refused else "",
    ]
    if (
        witness["reference_stable"] is False and _witness_span(witness) is None
    ):  # a parting with no token: the run-to-run line has none to give
        gaps.append("the two m=1 references are recorded as unstable")
    gaps = [g for g in gaps if g]
    have = f"{slots.height} of {expected} slot(s) across {bands.height} band(s)"
    if not gaps:
        return "completeness", f"complete: {have}, none refused.", "pass"
    return "completeness", f"{have}; " + "; ".join(gaps) + ".", "fail" if slots.height < expected or refused else "warn"
