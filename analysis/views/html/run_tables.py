"""A run's tables: its prompts, its bands (per c, then the worst), its requests (the worst), and the observer-effect
and accuracy checks when the run has them; every long table cut to its worst rows with a count of the rest."""

from __future__ import annotations

from typing import Any

import polars as pl

from ...core import MISSING, duration
from .tables import table_html, worst_html


def run_tables_html(run, *, epsilon: float, reference: Any = "ref1") -> str:
    """The run's prompts, bands (per c, then the worst bands) and requests (the worst), then the observer
    and accuracy checks when the run has them.

    Parameters
    ----------
    run : Run
        The run.
    epsilon : float
        The near-tie epsilon.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with.

    Returns
    -------
    str
        HTML.
    """
    from ...run import accuracy_table, observer_table

    against = reference if isinstance(reference, str) else f"ref #1 of {reference.label}"
    return (
        _prompts_html(run, reference)
        + _bands_html(run, epsilon, reference, against)
        + _requests_html(run, epsilon, reference, against)
        + _observer_html(observer_table(run))
        + _accuracy_html(*accuracy_table(run))
    )


def _prompts_html(run, reference: Any) -> str:
    from ...run import prompt_table

    prompts = prompt_table(run, reference=reference).select(
        prompt="prompt_id",
        **{
            "Div_Index (first divergence across configurations)": "div_index",
            "ties < 1e-3": "tie_density_1e-3",
            "ties < 1e-2": "tie_density_1e-2",
            "ties < 1e-1": "tie_density_1e-1",
            "Avg_Std@top1_prob": "avg_std_top1_prob",
            "std of output length": "std_output_length",
        },
        **{"S7 c=4/c=1 rate": "s7_ratio"},
        **{"S7 interval": _interval("s7_low", "s7_high")},
    )
    return worst_html(
        prompts,
        by=["Div_Index (first divergence across configurations)", "ties < 1e-2"],
        descending=[False, True],
        what="prompts",
        caption="Prompts: the reference's tie density (share of steps whose top-1/top-2 margin is below each bound), "
        "Div_Index and Avg_Std@top1_prob across configurations, and S7's c=4/c=1 decode-rate ratio with "
        "a bootstrap interval; the prompts that part earliest first.",
    )


def _interval(low: str, high: str) -> pl.Expr:
    """``low–high`` rounded, or missing."""
    return (
        pl.when(pl.col(low).is_not_null() & pl.col(high).is_not_null())
        .then(pl.format("{}–{}", pl.col(low).round(3), pl.col(high).round(3)))
        .otherwise(pl.lit(MISSING))
    )


def _bands_html(run, epsilon: float, reference: Any, against: str) -> str:
    from ...run import band_table

    bands = band_table(run, epsilon=epsilon, reference=reference)
    arms = ["arm"] if run.manifest.get("arms") is not None else []  # a run with control arms: each arm's bands apart
    per_c = (
        bands.group_by(*arms, "c")
        .agg(
            bands=pl.len(),
            requests=pl.col("n_slots").sum(),
            widths_formed=pl.col("widths_seen").drop_nulls().unique().sort().str.join("; "),
            parted=pl.col("diverged_slots").sum(),
            near_tie=pl.col("near_tie_slots").sum(),
            earliest=pl.col("divergence_min").min(),
            most_completions=pl.col("unique_completions").max(),
            rate=pl.col("decode_tok_s").median(),
            per_1000=pl.col("s_per_1000_seq").median(),
        )
        .sort(*arms, "c")
        .select(
            *arms,
            c="c",
            bands="bands",
            **{
                "batch widths formed": "widths_formed",
                "requests": "requests",
                "parted from m=1": "parted",
                "at a near-tie": "near_tie",
                "earliest divergence": "earliest",
                "most unique completions": "most_completions",
                "median decode tok/s": "rate",
                "median time per 1000 seq": "per_1000",
            },
        )
    )
    worst_columns: dict[str, str | pl.Expr] = {
        "m formed": "m_formed",
        "widths formed": "widths_seen",
        "width evidence": "width_evidence",
        "earliest divergence": "divergence_min",
        "parted": pl.format("{} of {}", "diverged_slots", "n_slots"),
        "near-tie": "near_tie_slots",
        "slots agree to": "intra_agree_to",
        "unique completions": "unique_completions",
        "modal share": "modal_share",
        "decode tok/s": "decode_tok_s",
        "time per 1000 seq": "s_per_1000_seq",
        "prefix cache": "prefix_cache",
    }
    worst = bands.select(*arms, prompt="prompt_id", c="c", repeat="repeat", **worst_columns)
    if worst["prefix cache"].null_count() == worst.height:
        worst = worst.drop("prefix cache")
    per_c, worst = _as_durations(per_c, "median time per 1000 seq"), _as_durations(worst, "time per 1000 seq")
    return table_html(
        per_c,
        caption=f"Bands per c: divergence from {against} over every prompt and repeat, the batch widths the server "
        "formed, completions and the median decode rate.",
        empty="No bands in the run.",
    ) + worst_html(
        worst,
        by=["earliest divergence", "slots agree to", "unique completions"],
        descending=[False, False, True],
        what="bands",
        caption="Bands that part earliest: one row per prompt, c and repeat.",
        empty="No bands in the run.",
    )


def _as_durations(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """The frame with a column of seconds written as every duration bia shows (:func:`analysis.core._cells.duration`)."""
    return frame.with_columns(pl.Series(column, [duration(s) for s in frame[column]], dtype=pl.String))


def _requests_html(run, epsilon: float, reference: Any, against: str) -> str:
    from ...run import slot_table

    arms = ["arm"] if run.manifest.get("arms") is not None else []  # a run with control arms names each request's arm
    shown = {
        "prompt": "prompt_id",
        "c": "c",
        "repeat": "repeat",
        "slot": "slot",
        "divergence at": "divergence_at",
        "bit-identical prefix": "bitwise_prefix",
        "max ULP": "max_ulp",
        "reference margin": "reference_margin",
        "own margin": "own_margin",
        "near-tie": "near_tie",
        "KL top-k max": "kl_topk_max",
        "length": "length",
        "decode tok/s": "decode_tok_s",
    }
    # scanned: only the worst rows are held, not these columns of every batched request
    slots = slot_table(run, epsilon=epsilon, reference=reference, columns=[*arms, *shown.values()], lazy=True)
    slots = slots.select(*arms, **shown)
    return worst_html(
        slots,
        by=["divergence at", "bit-identical prefix", "max ULP"],
        descending=[False, False, True],
        what="requests",
        caption=f"Requests: each batched request against {against} (positions 0-based); those that part earliest, then those "
        "whose bits part earliest, first.",
        empty="No batched requests in the run.",
    )


def _accuracy_html(table: pl.DataFrame, std: float | None) -> str:
    """Accuracy per configuration and Std@Acc, when the run's prompts carry answers."""
    if table.is_empty():
        return ""
    return table_html(
        table,
        caption=f"Accuracy against the prompts' answers per configuration (ref #1, and slot 0 of each band); "
        f"Std@Acc across them = {std:.4g}.",
    )


def _observer_html(observed: pl.DataFrame) -> str:
    """The observer-effect check, when the run fired each band a second time without logprobs."""
    if observed.is_empty():
        return ""
    changed = observed.filter(pl.col("texts_equal").not_())
    summary = (
        f"{changed.height} of {observed.height} request(s) fired without logprobs gave a different text: asking for logprobs changed the output."
        if changed.height
        else f"All {observed.height} request(s) fired without logprobs gave the same text as with them."
    )
    return worst_html(
        observed,
        by=["texts_equal"],
        descending=[False],
        what="requests",
        caption=f"Observer effect: each band fired again without logprobs, texts compared slot by slot. {summary}",
    )
