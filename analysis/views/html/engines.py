"""Runs side by side for people: kernel modes (:func:`analysis.mode_comparison`) and engines
(:func:`analysis.engine_table`), each row headed by the run's verdict from the report's judgement."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import polars as pl

from ...core import MISSING, cell, kernel_mode_words, percent
from ...run import RunError
from ...studies import (
    RATIO_HEADING,
    default_engine_reference,
    engine_label,
    engine_table,
    mode_comparison,
    ratio_cell,
    run_decode_cost,
)
from .tables import table_html


def _verdicts(judgement: Any, runs: list[Any]) -> dict[str, dict[str, Any]]:
    """Each run's judgement in one row: the worst arm's verdict and cause, and the run's one ULP figure (batched against m=1)."""
    from ...studies import judge

    judgement = judge(runs) if judgement is None else judgement
    out: dict[str, dict[str, Any]] = {}
    for row in judgement:
        held = out.get(row["run"])
        if held is None or _WORSE.index(row["verdict"]) > _WORSE.index(held["verdict"]):
            out[row["run"]] = {
                **row,
                "max_ulp": max(
                    [u for u in (row["max_ulp"], (held or {}).get("max_ulp")) if u is not None], default=None
                ),
            }
    return out


_WORSE = ("GREEN", "AMBER", "UNVERIFIED", "RED")


def mode_comparison_html(runs: Iterable[Any], *, reference: Any = "ref1", judgement: Any = None) -> str:
    """:func:`mode_comparison` for people: one row per run, its verdict and its one ULP figure (:func:`analysis.judge`'s),
    then each measure listed over the ladder's c.

    Parameters
    ----------
    runs : iterable of Run
        The runs.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with, as :func:`analysis.mode_comparison` takes it.
    judgement : Judgement, optional
        The report's judgement (:func:`judge_report`), whose verdicts the rows show; by default the runs are judged
        here.

    Returns
    -------
    str
        HTML.
    """
    runs = list(runs)
    verdicts = _verdicts(judgement, runs)
    frame = mode_comparison(runs, reference=reference)
    if frame.is_empty():
        return table_html(frame, empty="No batched requests in the runs.")
    rows = []
    asked = {
        run.label: kernel_mode_words(run.manifest) for run in runs
    }  # a mode as asked, with the one that ran when they differ
    for (run, mode), group in frame.sort("c").group_by(["run", "kernel_mode"], maintain_order=True):
        judged = verdicts.get(run) or {}
        rows.append(
            {
                "run": run,
                "verdict": judged.get("verdict", MISSING),
                "kernel mode or engine": asked.get(run) or mode,
                "c": " / ".join(str(c) for c in group["c"]),
                "bit-identical to m=1": " / ".join(
                    percent(round(f * n), n) for f, n in group.select("bit_identical_share", "requests").rows()
                ),
                "token flips": int(group["token_flips"].sum()),
                "max ULP, batched against m=1": cell(judged.get("max_ulp")),
                "median decode tok/s per request": " / ".join(
                    cell(None if r is None else round(r)) for r in group["median_decode_tok_s"]
                ),
                RATIO_HEADING: _ratios(group.select("c", "decode_vs_c1").rows()),
                "rate over the default mode's": _rate_vs_default(group["rate_vs_default"]),
            }
        )
    caption = (
        "The verdict and max ULP are the run's judgement (the answer above): the largest ULP distance of a batched request's "
        "logprob from its m=1 reference. Each measure is listed in the order of the c column. The per-request decode rate vs c=1 "
        "is the answer's, for the run's first arm there (copies where it has one): each c's median decode rate per request over "
        "the c=1 baseline, the median at c=1, both timed one way (the answer says how). The rate over the default mode's is that median over the default-mode run's "
        "in the same folder at the same c: it needs such a run beside it, which a run that names no kernel mode (llama.cpp's, "
        "for one) does not have."
    )
    return table_html(pl.DataFrame(rows).sort("run"), caption=caption)


def engines_html(runs: Iterable[Any], *, judgement: Any = None) -> str:
    """:func:`analysis.engine_table` for people, when the runs come from more than one engine: one row per run, against
    the reference engine (torch in its default kernel mode where there is one), and whether each is batch invariant by itself.
    Empty when the runs come from one engine or hold no prompt in common.

    Parameters
    ----------
    runs : iterable of Run
        The runs.
    judgement : Judgement, optional
        The report's judgement (:func:`judge_report`), whose verdicts the rows show; by default the runs are judged
        here.

    Returns
    -------
    str
        HTML.
    """
    runs = list(runs)
    if len({(r.manifest.get("identity") or {}).get("engine") for r in runs}) < 2:
        return ""
    reference = runs[default_engine_reference(runs)]
    try:
        table = engine_table(runs, reference=reference)
    except RunError as exc:  # runs of other prompts: nothing to put side by side, and the reason is said
        return table_html(pl.DataFrame(), empty=f"The engines cannot be compared: {exc}")
    verdicts = _verdicts(judgement, runs)
    ratios = {r.label: dict(run_decode_cost(r).select("c", "ratio").rows()) for r in runs}
    rows = []
    for (engine, run), group in table.group_by(["engine", "run"], maintain_order=True):
        alone = group.filter(pl.col("role") == "m=1").row(0, named=True)
        bands = group.filter(pl.col("role") == "band").sort("c")
        judged = verdicts.get(run) or {}
        rows.append(
            {
                "engine (run)": f"{engine}: {run}",
                "verdict (its own m=1)": judged.get("verdict", MISSING),
                "m=1 against the reference engine's m=1": _against_reference(alone),
                "c": " / ".join(str(c) for c in bands["c"]),
                "token-identical to the reference's m=1": " / ".join(
                    f"{s} of {n}" for s, n in bands.select("token_identical", "requests").rows()
                ),
                "bits from token": " / ".join(cell(b) for b in bands["min_bitwise_prefix"]),
                RATIO_HEADING: _ratios([(c, ratios.get(run, {}).get(c)) for c in bands["c"]]),
                # against its own m=1: from which c batching changes this engine's bits (padded batching, a kernel mode...)
                "bit-identical to its own m=1": " / ".join(
                    MISSING if v is None else f"{v:.0%}" for v in bands["own_m1_bit_identical"]
                ),
            }
        )
    caption = (
        f"The reference engine is {engine_label(reference)} ({reference.label}): each run's m=1 stream and its batched requests "
        "are compared with the reference's m=1 stream of the same prompt. 'Bits from token' is the shortest prefix of float32 "
        "logprobs bit-identical to it (the length of the stream when every bit matches); its ULP figures are engine against "
        "engine, not the run's own. The verdict is the run's judgement against its own m=1 (the answer above), and the last column the "
        "share of each c's requests bit-identical to the run's own m=1: where batching starts to change that engine's bits. "
        "The per-request decode rate vs c=1 is the answer's, for the run's first arm there (see the answer for its baseline)."
    )
    return table_html(pl.DataFrame(rows), caption=caption)


def _against_reference(row: dict[str, Any]) -> str:
    """One engine's m=1 streams against the reference engine's, in words."""
    tokens = (
        f"{row['token_identical']} of {row['requests']} token-identical"
        if row["earliest_divergence"] is None
        else f"{row['token_identical']} of {row['requests']} token-identical, the first parting at token {row['earliest_divergence']}"
    )
    if not row["max_ulp"]:
        return tokens + "; every logprob bit-identical"
    return (
        f"{tokens}; bits from token {row['min_bitwise_prefix']}, up to {row['max_ulp']:,} ULP against the reference engine "
        f"(|delta logprob| up to {cell(row['max_abs_delta'])})"
    )


def _ratios(by_c: list[tuple[int, float | None]]) -> str:
    """Each c's ratio to the c=1 baseline in the order of the c column, c=1 named as the baseline it is.

    Examples
    --------
    >>> _ratios([(1, 1.0), (4, 3.2999), (8, None)])
    'baseline / 3.30× / —'
    """
    return " / ".join("baseline" if c == 1 else ratio_cell(r) for c, r in by_c)


def _rate_vs_default(rates: pl.Series) -> str:
    """Each c's rate over the default mode's, or why there is none: no default-mode run beside the run.

    Examples
    --------
    >>> _rate_vs_default(pl.Series([1.0, 0.4567, None])), _rate_vs_default(pl.Series([None, None], dtype=pl.Float64))
    ('1 / 0.46 / —', 'no default-mode run in its folder')
    """
    if rates.is_null().all():
        return "no default-mode run in its folder"
    return " / ".join(cell(None if r is None else round(r, 2)) for r in rates)
