"""The run's tables per prompt and per step: tie density, Div_Index and S7 per prompt (:func:`prompt_table`), flips
by margin (:func:`flip_table`), the reference's margins
(:func:`reference_margins`), the observer-effect check (:func:`observer_table`) and accuracy against the prompts'
answers (:func:`accuracy_table`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import polars as pl

from ..metrics import columnar as _columnar
from ..metrics import parity
from ._arms import main_arm
from ._layout import RunError
from ._piecewise import piecewise
from ._slot_tables import _slot_comparisons
from ._steps import numbered_steps

if TYPE_CHECKING:  # the tables take any object shaped like a Run (RunLike); only type hints name the class
    from ._model import Run

_PROMPT_SCHEMA = {
    "prompt_id": pl.String,
    "tie_density_1e-3": pl.Float64,
    "tie_density_1e-2": pl.Float64,
    "tie_density_1e-1": pl.Float64,
    "div_index": pl.Int64,
    "avg_std_top1_prob": pl.Float64,
    "std_output_length": pl.Float64,
    "s7_ratio": pl.Float64,
    "s7_low": pl.Float64,
    "s7_high": pl.Float64,
}


@piecewise("prompts")
def prompt_table(run: Run, *, reference: str | Run = "ref1") -> pl.DataFrame:
    """One row per prompt: the reference's tie density, Yuan et al.'s Div_Index, Avg_Std@top1_prob and
    the std of output lengths (averaged over prompts, their Avg_Std@Output_Length) across the
    reference and each band's slot 0 (the configurations), and S7's c=4/c=1 decode-rate
    ratio with a bootstrap interval over the bands' repeats (null where rates are missing).

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with: ref #1 or ref #2 of its prompt in this run, or ref #1 of the same
        prompt in another run.

    Returns
    -------
    polars.DataFrame
    """
    steps, requests, refs = numbered_steps(run, reference)
    bands = requests.filter(
        (pl.col("role") == "band") & (pl.col("arm") == main_arm(run.manifest))
    )  # one layout's configurations
    firsts = (
        bands.filter(pl.col("slot") == 0)
        .sort("c", "repeat")
        .join(refs, on="prompt_id", maintain_order="left")
        .select("prompt_id", "ref", other="req")
        .with_row_index("pair")
        .with_columns(pl.col("pair").cast(pl.Int64))
    )
    lengths = steps.requests.select("req", "length")
    configurations = pl.concat([refs.select("prompt_id", req="ref"), firsts.select("prompt_id", req="other")]).join(
        lengths, on="req", how="left"
    )
    thresholds = {"1e-3": 1e-3, "1e-2": 1e-2, "1e-1": 1e-1}
    margins = (
        steps.steps.join(refs, left_on="req", right_on="ref")
        .group_by("prompt_id")
        .agg(
            (pl.col("margin") < t).sum().truediv(pl.col("margin").count()).alias(f"tie_density_{name}")
            for name, t in thresholds.items()
        )
    )
    parted = (
        _columnar.agreements(steps, firsts)
        .join(firsts.select("pair", "prompt_id"), on="pair")
        .group_by("prompt_id")
        .agg(first_part=pl.col("agree_to").min())
    )
    per_prompt = (
        configurations.group_by("prompt_id")
        .agg(
            n=pl.len(), shortest=pl.col("length").min(), std_output_length=pl.col("length").cast(pl.Float64).std(ddof=0)
        )
        .join(refs.join(lengths.rename({"req": "ref", "length": "ref_length"}), on="ref"), on="prompt_id")
        .join(parted, on="prompt_id", how="left")
        .with_columns(div_index=pl.coalesce("first_part", "ref_length"))
    )
    top1 = (
        configurations.join(steps.steps.select("req", "idx", p=pl.coalesce("top1", "logprob").exp()), on="req")
        .join(
            per_prompt.select("prompt_id", "n", limit=pl.min_horizontal(pl.col("div_index") + 1, "shortest")),
            on="prompt_id",
        )
        .filter(pl.col("idx") < pl.col("limit"))
        .sort("prompt_id", "idx", "req")  # std and mean add their terms in one order: the same bits every time
        .group_by("prompt_id", "idx", maintain_order=True)
        .agg(pl.col("n").first(), known=pl.col("p").count(), std=pl.col("p").std(ddof=0))
        .filter(pl.col("known") == pl.col("n"))
        .group_by("prompt_id", maintain_order=True)
        .agg(avg_std_top1_prob=pl.col("std").mean())
    )
    table = (
        refs.select("prompt_id")
        .join(margins, on="prompt_id", how="left", maintain_order="left")
        .join(per_prompt, on="prompt_id", how="left", maintain_order="left")
        .join(top1, on="prompt_id", how="left", maintain_order="left")
        .join(_s7(bands), on="prompt_id", how="left", maintain_order="left")
    )
    # a reference without margins has no tie density: NaN, as parity.tie_density gives
    table = table.with_columns(pl.col(f"tie_density_{name}").fill_null(float("nan")) for name in thresholds)
    return table.select([pl.col(n).cast(t) for n, t in _PROMPT_SCHEMA.items()])


def _s7(bands: pl.DataFrame) -> pl.DataFrame:
    """S7's c=4 / c=1 decode-rate ratio per prompt, with its bootstrap interval over each band's repeats."""
    rates = (
        bands.filter(pl.col("c").is_in([1, 4]))
        .group_by("prompt_id", "c", "repeat")
        .agg(rate=_columnar.band_rate(pl.col("decode_tok_s")))
        .sort("prompt_id", "c", "repeat")
    )
    sides = rates.group_by("prompt_id", maintain_order=True).agg(  # each prompt's c=1 and c=4 rates, in repeat order
        base=pl.col("rate").filter(pl.col("c") == 1), batched=pl.col("rate").filter(pl.col("c") == 4)
    )
    rows = []
    for prompt, base, batched in sides.rows():  # one bootstrap per prompt
        if base and batched and None not in base and None not in batched:
            ratio, low, high = parity.ratio_interval(base, batched)
            rows.append({"prompt_id": prompt, "s7_ratio": ratio, "s7_low": low, "s7_high": high})
    return pl.DataFrame(
        rows,
        schema={"prompt_id": pl.String, "s7_ratio": pl.Float64, "s7_low": pl.Float64, "s7_high": pl.Float64},
        orient="row",
    )


def flip_table(run: Run, *, reference: str | Run = "ref1", edges: Sequence[float] = parity.FLIP_EDGES) -> pl.DataFrame:
    """:func:`analysis.parity.flip_curve` over every batched request of the run against its reference.

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with: ref #1 or ref #2 of its prompt in this run, or ref #1 of the same
        prompt in another run.
    edges : sequence of float, default analysis.parity.FLIP_EDGES
        The bin edges of the reference's top-1 margin, in nats, ascending.

    Returns
    -------
    polars.DataFrame
        One row per margin bin: the steps at risk in it and how many of them flipped.

    Examples
    --------
    >>> from analysis import Run, read_dumps
    >>> flip_table(Run({"ladder": [1]}, read_dumps([]))).select("steps").to_series().sum()
    0
    """
    if tuple(edges) == tuple(parity.FLIP_EDGES):
        return _flip_counts(run, reference=reference)
    return _columnar.flip_bins(_flip_steps(run, reference=reference), edges)


def _merge_flip_counts(bins: pl.DataFrame) -> pl.DataFrame:
    """The pieces' flip bins as the run's: each bin's steps and flips added up, its P(flip) from the sums."""
    return (
        bins.group_by("margin_low", "margin_high", maintain_order=True)
        .agg(pl.col("steps").sum(), pl.col("flips").sum())
        .with_columns(p_flip=pl.when(pl.col("steps") > 0).then(pl.col("flips") / pl.col("steps")))
    )


@piecewise("flips", merge=_merge_flip_counts)
def _flip_counts(run: Run, *, reference: str | Run = "ref1") -> pl.DataFrame:
    """:func:`flip_table` on ``analysis.parity.FLIP_EDGES``: a row per bin, whatever the run's size."""
    return _columnar.flip_bins(_flip_steps(run, reference=reference), parity.FLIP_EDGES)


@piecewise("flip_steps", eager=False)
def _flip_steps(run: Run, *, reference: str | Run = "ref1") -> pl.DataFrame:
    """Every step of a batched request at risk of a flip, up to its fork: the reference's margin there and whether it flipped."""
    slots = _slot_comparisons(run, parity.NEAR_TIE_EPSILON, reference)
    steps = numbered_steps(run, reference)[0]
    return (
        slots.select(
            "pair",
            "ref",
            "diverged",
            "divergence_at",
            last=pl.when(pl.col("diverged"))
            .then("divergence_at")
            .otherwise(pl.min_horizontal("length", "reference_length") - 1),
        )
        .join(steps.steps.select(ref="req", idx="idx", margin="margin"), on="ref")
        .filter((pl.col("idx") <= pl.col("last")) & pl.col("margin").is_not_null())
        .select("margin", flip=pl.col("diverged") & (pl.col("idx") == pl.col("divergence_at")))
    )


def reference_margins(run: Run, *, reference: str | Run = "ref1") -> dict[str, list[float | None]]:
    """Each prompt's reference margin (top-1 minus top-2) at every step, for :func:`analysis.plots.plot_margin_trace`.

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with: ref #1 or ref #2 of its prompt in this run, or ref #1 of the same
        prompt in another run.

    Returns
    -------
    dict of str to list of float or None
        Prompt id to its margins in nats by step; None where a step has no margin.

    Examples
    --------
    >>> from analysis import read_run
    >>> margins = reference_margins(read_run("data/experiment-cpu/default"))
    >>> {prompt: [round(m, 4) for m in steps[:2]] for prompt, steps in margins.items()}
    {'p0': [2.5141, 0.3024], 'p1': [1.9879, 1.3107]}
    """
    lists = _margin_lists(run, reference=reference)
    return dict(zip(lists["prompt_id"].to_list(), lists["margin"].to_list()))


@piecewise("margins")
def _margin_lists(run: Run, *, reference: str | Run = "ref1") -> pl.DataFrame:
    """Each prompt's reference margins by step (``prompt_id``, ``margin``: a list), in the references' order."""
    steps, _, refs = numbered_steps(run, reference)
    lists = (
        steps.steps.join(refs, left_on="req", right_on="ref")
        .group_by("prompt_id", maintain_order=True)
        .agg(pl.col("margin").sort_by("idx"))
    )
    return (
        refs.select("prompt_id")
        .join(lists, on="prompt_id", how="left", maintain_order="left")
        .with_columns(pl.col("margin").fill_null(pl.lit([], pl.List(pl.Float64))))
    )


_OBSERVED = ["prompt_id", "arm", "c", "repeat", "slot"]  # what pairs an observer request with its band's slot


@piecewise("observers", merge=lambda frame: frame.sort(_OBSERVED, maintain_order=True))
def observer_table(run: Run) -> pl.DataFrame:
    """The observer-effect check: each band's text with logprobs against its twin fired without them.

    One row per observer request: whether its completion text equals the same slot's text in the
    band that asked for logprobs, and the first character where they part (null when equal).
    Empty when the run was probed without ``observer``.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    polars.DataFrame
        The observer requests' keys with ``text_with_logprobs``, ``text_without_logprobs``, ``texts_equal``
        and ``first_difference``.

    Examples
    --------
    >>> from analysis import Run, read_dumps
    >>> observer_table(Run({"ladder": [1]}, read_dumps([]))).height
    0
    """
    requests = run.dump.requests
    scored = requests.filter(pl.col("role") == "band").select(
        *_OBSERVED, pl.col("completion_text").alias("text_with_logprobs")
    )
    bare = requests.filter(pl.col("role") == "observer").select(
        *_OBSERVED, pl.col("completion_text").alias("text_without_logprobs")
    )
    joined = bare.join(scored, on=_OBSERVED, how="left", nulls_equal=True).sort(_OBSERVED, maintain_order=True)
    parts = [
        _first_difference(a, b)
        for a, b in zip(joined["text_with_logprobs"].to_list(), joined["text_without_logprobs"].to_list())
    ]
    return joined.with_columns(
        pl.Series("texts_equal", [None if p == -2 else p == -1 for p in parts], dtype=pl.Boolean),
        pl.Series("first_difference", [None if p < 0 else p for p in parts], dtype=pl.Int64),
    )


def _first_difference(a: str | None, b: str | None) -> int:
    """-2 when a text is missing, -1 when equal, else the first index where they part."""
    if a is None or b is None:
        return -2
    if a == b:
        return -1
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def accuracy_table(run: Run, *, match: str = "contains") -> tuple[pl.DataFrame, float | None]:
    """Accuracy per configuration against the prompts' answers, and Yuan et al.'s Std@Acc across them.

    A configuration is the m=1 reference (ref #1) or one band's slot 0 at each (c, repeat). A
    prompt counts when the manifest gives it an ``answer`` (``bia probe --prompts FILE.jsonl`` with
    ``{"text": ..., "answer": ...}`` lines); a completion is correct when it contains the answer
    (``match="contains"``) or equals it after trimming (``"exact"``).

    Parameters
    ----------
    run : Run
        The run.
    match : {"contains", "exact"}, default "contains"
        How a completion is scored against its prompt's answer.

    Returns
    -------
    table : polars.DataFrame
        One row per configuration: ``configuration``, ``prompts``, ``correct`` and ``accuracy``.
    std_at_acc : float or None
        Std@Acc across the configurations; None when no prompt has an answer.

    Raises
    ------
    RunError
        Another ``match``.

    Examples
    --------
    >>> from analysis import Run, read_dumps
    >>> table, std = accuracy_table(Run({"prompts": [{"prompt_id": "p0", "text": "1+1="}]}, read_dumps([])))
    >>> table.height, std
    (0, None)
    """
    if match not in ("contains", "exact"):
        raise RunError(f"match must be 'contains' or 'exact', got {match!r}")
    answers = _answers(run)
    correct: dict[str, list[bool]] = {}
    for row in _answered(run).sort("c", "repeat", "prompt_id", maintain_order=True).iter_rows(named=True):
        config = "m=1 reference" if row["role"] == "reference" else f"c={row['c']} repeat {row['repeat']}"
        text, answer = row["completion_text"] or "", answers[row["prompt_id"]]
        correct.setdefault(config, []).append(answer in text if match == "contains" else text.strip() == answer.strip())
    rows = [
        {"configuration": config, "prompts": len(hits), "correct": sum(hits), "accuracy": sum(hits) / len(hits)}
        for config, hits in correct.items()
    ]
    schema = {"configuration": pl.String, "prompts": pl.Int64, "correct": pl.Int64, "accuracy": pl.Float64}
    table = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    return table, parity.std_at_acc(table["accuracy"].to_list())


def _answers(run: Run) -> dict[str, str]:
    """Each prompt's answer, where the manifest gives one."""
    prompts = run.manifest.get("prompts", [])
    return {str(p.get("prompt_id")): str(p["answer"]) for p in prompts if p.get("answer") is not None}


@piecewise("answered")
def _answered(run: Run) -> pl.DataFrame:
    """The completions :func:`accuracy_table` scores: slot 0 of each reference and band of a prompt with an answer."""
    return run.dump.requests.filter(
        pl.col("prompt_id").is_in(list(_answers(run)))
        & (pl.col("slot") == 0)
        & pl.col("role").is_in(["reference", "band"])
    ).select("prompt_id", "role", "c", "repeat", "completion_text")
