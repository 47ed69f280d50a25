"""The columnar kit over two streams: ``parity.agreement``, ``parity.compare`` and ``parity.topk_kl`` for every pair of
requests at once, as joins of each request to its reference on the step index (frames in ``_columnar``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from ._columnar_steps import _PACK, Steps

REST_FLOOR = 1e-12  # parity.topk_kl floors its rest-of-vocabulary buckets here

COMPARISON_SCHEMA = {
    "pair": pl.Int64,
    "agree_to": pl.Int64,
    "diverged": pl.Boolean,
    "divergence_at": pl.Int64,
    "bitwise_prefix": pl.Int64,
    "max_abs_delta": pl.Float64,
    "max_ulp": pl.Int64,
    "topk_order_changes": pl.Int64,
    "topk_set_changes": pl.Int64,
    "reference_margin": pl.Float64,
    "own_margin": pl.Float64,
    "in_reference_topk": pl.Boolean,
    "near_tie": pl.Boolean,
    "length": pl.Int64,
    "reference_length": pl.Int64,
    "k3_mean": pl.Float64,
    "k3_max": pl.Float64,
    "kl_topk_mean": pl.Float64,
    "kl_topk_max": pl.Float64,
}


def _aligned(steps: Steps, pairs: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
    """Each pair's steps side by side on ``idx`` (the steps both streams have), ``_r`` the reference's and ``_o`` the other's."""
    ref = steps.steps.select(pl.col("req").alias("ref"), "idx", *[pl.col(c).alias(f"{c}_r") for c in columns])
    other = steps.steps.select(pl.col("req").alias("other"), "idx", *[pl.col(c).alias(f"{c}_o") for c in columns])
    return pairs.select("pair", "ref", "other").join(ref, on="ref").join(other, on=["other", "idx"])


def _with_lengths(steps: Steps, pairs: pl.DataFrame) -> pl.DataFrame:
    lengths = steps.requests.select("req", "length")
    return (
        pairs.join(lengths.rename({"req": "ref", "length": "reference_length"}), on="ref", how="left")
        .join(lengths.rename({"req": "other"}), on="other", how="left")
        .with_columns(pl.col("reference_length", "length").fill_null(0))
    )


def agreements(steps: Steps, pairs: pl.DataFrame) -> pl.DataFrame:
    """``parity.agreement`` for every pair: ``pair``, ``agree_to`` (leading steps with one identity).

    Parameters
    ----------
    steps : Steps
        The requests' steps.
    pairs : polars.DataFrame
        ``pair``, ``ref`` and ``other`` (requests' ``req``).

    Returns
    -------
    polars.DataFrame
    """
    parted = (
        _aligned(steps, pairs, ["ident"])
        .filter(pl.col("ident_r") != pl.col("ident_o"))
        .group_by("pair")
        .agg(first_difference=pl.col("idx").min())
    )
    return (
        _with_lengths(steps, pairs)
        .join(parted, on="pair", how="left")
        .select("pair", agree_to=pl.coalesce("first_difference", pl.min_horizontal("reference_length", "length")))
    )


def compare_pairs(steps: Steps, pairs: pl.DataFrame, *, epsilon: float) -> pl.DataFrame:
    """``parity.compare`` for every pair, one row each (the columns of :class:`~analysis.parity.Comparison`).

    Parameters
    ----------
    steps : Steps
        The requests' steps.
    pairs : polars.DataFrame
        ``pair``, ``ref`` and ``other`` (requests' ``req``).
    epsilon : float
        The near-tie epsilon.

    Returns
    -------
    polars.DataFrame
    """
    if pairs.height == 0:
        return pl.DataFrame(schema=COMPARISON_SCHEMA)
    base = _with_lengths(steps, pairs).join(agreements(steps, pairs), on="pair")
    base = base.with_columns(diverged=pl.col("agree_to") < pl.min_horizontal("reference_length", "length"))
    prefix = (
        _aligned(steps, pairs, ["logprob", "bits", "ordered", "n_cands", "cand_list"])
        .join(base.select("pair", "agree_to"), on="pair")
        .filter(pl.col("idx") < pl.col("agree_to"))
    )
    both = pl.col("logprob_r").is_not_null() & pl.col("logprob_o").is_not_null()
    d = pl.col("logprob_o") - pl.col("logprob_r")
    listed = (pl.col("n_cands_r") > 0) & (pl.col("n_cands_o") > 0)
    # Means add their terms in step order (the joins' row order varies from call to call), so that the bits of a mean
    # are the same every time, and the same for a piece of a run as for the whole run.
    prefix = prefix.sort("pair", "idx").with_columns(
        k3=_expm1(d) - d,  # elementwise here: a Python function inside agg would run once per pair
        reordered=listed & (pl.col("cand_list_r") != pl.col("cand_list_o")),
    )
    prefix_stats = prefix.group_by("pair").agg(
        bits_differ=pl.col("idx").filter(~pl.col("bits_r").eq_missing(pl.col("bits_o"))).min(),
        max_abs_delta=d.abs().filter(both).max(),
        max_ulp=(pl.col("ordered_r") - pl.col("ordered_o")).abs().filter(both).max(),
        topk_order_changes=pl.col("reordered").sum().cast(pl.Int64),
        k3_mean=pl.col("k3").filter(both).mean(),
        k3_max=pl.col("k3").filter(both).max(),
    )
    # Lists in the same order hold the same set: only the steps whose order changed can change their set.
    as_set = {side: pl.col(f"cand_list_{side}").list.unique().list.sort() for side in ("r", "o")}
    set_changes = (
        prefix.filter("reordered")
        .group_by("pair")
        .agg(topk_set_changes=(as_set["r"] != as_set["o"]).sum().cast(pl.Int64))
    )
    kl = (
        _topk_kl(steps, prefix.select("pair", "ref", "other", "idx"))
        .group_by("pair")
        .agg(kl_topk_mean=pl.col("kl").mean(), kl_topk_max=pl.col("kl").max())
    )
    at_fork = _at_divergence(steps, base.filter(pl.col("diverged")))
    out = (
        base.join(prefix_stats, on="pair", how="left")
        .join(set_changes, on="pair", how="left")
        .join(kl, on="pair", how="left")
        .join(at_fork, on="pair", how="left")
        .with_columns(
            divergence_at=pl.when(pl.col("diverged")).then(pl.col("agree_to")),
            bitwise_prefix=pl.coalesce("bits_differ", "agree_to"),
            topk_order_changes=pl.col("topk_order_changes").fill_null(0),
            topk_set_changes=pl.col("topk_set_changes").fill_null(0),
            near_tie=((pl.col("reference_margin") >= 0.0) & (pl.col("reference_margin") < epsilon)).fill_null(False),
        )
    )
    return out.select([pl.col(name).cast(dtype) for name, dtype in COMPARISON_SCHEMA.items()]).sort("pair")


EVIDENCE_SCHEMA = {
    "pair": pl.Int64,
    "parted_at": pl.Int64,
    "token_unknown_at": pl.Int64,
    "tokens_by": pl.String,
    "bits_known": pl.Int64,
    "bits_differ_at": pl.Int64,
    "bits_unknown_at": pl.Int64,
}


def evidence_pairs(steps: Steps, pairs: pl.DataFrame) -> pl.DataFrame:
    """What each pair's steps show, as evidence a verdict can count: where the tokens part as recorded, where they cannot
    be told apart, and, over the steps before that, where the recorded logprobs differ or are unknown.

    A step's tokens are compared by id where both sides have one, else by text and bytes where both sides have them
    (``tokens_by`` says "token text" when any step was); a step with nothing in common is unknown, never equal. Before the
    first step that parts or is unknown, every recorded value of a step is compared at the precision it was recorded in
    (:func:`recorded_bits`): the sampled token's logprob and, where both sides listed alternatives, every finite
    alternative's (token, logprob) pair. A logprob that is null or not finite on either side (the sampled token's, or one
    in a list of alternatives), or alternatives listed on one side only, make that step's bits unknown: not equal, and not
    different either.

    Parameters
    ----------
    steps : Steps
        The requests' steps.
    pairs : polars.DataFrame
        ``pair``, ``ref`` and ``other`` (requests' ``req``).

    Returns
    -------
    polars.DataFrame
        One row per pair with a step on both sides: ``pair``, ``parted_at`` and ``token_unknown_at`` (the first step whose
        tokens differ, or cannot be compared; null when none), ``tokens_by``, ``bits_known`` (steps before those whose
        logprobs are recorded on both sides), ``bits_differ_at`` and ``bits_unknown_at`` (the first such step whose
        recorded values differ, or are unknown).
    """
    columns = ["token_id", "token_text", "token_bytes", "bits64"]
    columns += ["n_cands", "cand_sig", "cand_sig_text", "cand_ids", "cand_unknown"]
    aligned = _aligned(steps, pairs, columns)
    r, o = (lambda c: pl.col(f"{c}_r")), (lambda c: pl.col(f"{c}_o"))
    ids = r("token_id").is_not_null() & o("token_id").is_not_null()
    texts = r("token_text").is_not_null() & o("token_text").is_not_null()
    data = r("token_bytes").is_not_null() & o("token_bytes").is_not_null()
    by_text = (~texts | (r("token_text") == o("token_text"))) & (~data | (r("token_bytes") == o("token_bytes")))
    same = pl.when(ids).then(r("token_id") == o("token_id")).when(texts | data).then(by_text)
    aligned = aligned.with_columns(same=same, by_id=ids)
    stop = pl.col("idx").filter(~pl.col("same").fill_null(False)).min().over("pair")
    before = aligned.with_columns(stop=stop).filter(pl.col("stop").is_null() | (pl.col("idx") < pl.col("stop")))
    known = r("bits64").is_not_null() & o("bits64").is_not_null()
    listed_r, listed_o = r("n_cands") > 0, o("n_cands") > 0
    lists_unknown = (listed_r != listed_o) | r("cand_unknown").fill_null(False) | o("cand_unknown").fill_null(False)
    same_list = (
        pl.when(r("cand_ids") & o("cand_ids"))
        .then(r("cand_sig") == o("cand_sig"))
        .otherwise(r("cand_sig_text") == o("cand_sig_text"))
    )
    differ = (known & (r("bits64") != o("bits64"))) | (listed_r & listed_o & ~lists_unknown & ~same_list)
    unknown = ~known | lists_unknown
    tokens = aligned.group_by("pair").agg(
        parted_at=pl.col("idx").filter(~pl.col("same")).min(),
        token_unknown_at=pl.col("idx").filter(pl.col("same").is_null()).min(),
    )
    bits = before.group_by("pair").agg(
        by_text=(~pl.col("by_id")).any(),
        bits_known=known.sum().cast(pl.Int64),
        bits_differ_at=pl.col("idx").filter(differ).min(),
        bits_unknown_at=pl.col("idx").filter(unknown).min(),
    )
    out = tokens.join(bits, on="pair", how="left").with_columns(
        tokens_by=pl.when(pl.col("by_text")).then(pl.lit("token text")).otherwise(pl.lit("token ids")),
        bits_known=pl.col("bits_known").fill_null(0),
    )
    return out.select([pl.col(n).cast(t) for n, t in EVIDENCE_SCHEMA.items()]).sort("pair")


def _expm1(d: pl.Expr) -> pl.Expr:
    """``exp(d) - 1`` without the cancellation of ``exp(d) - 1`` for small d (k3 is second order in d); inf past float range."""
    return d.map_batches(_quiet_expm1, return_dtype=pl.Float64)


def _quiet_expm1(values: pl.Series) -> pl.Series:
    with np.errstate(over="ignore"):  # parity.k3 gives inf there too
        return pl.Series(values.name, np.expm1(values.cast(pl.Float64).to_numpy()))


def _topk_kl(steps: Steps, at: pl.DataFrame) -> pl.DataFrame:
    """``parity.topk_kl`` of the reference's list against the other's at each (pair, idx) of ``at``: ``pair``, ``idx``, ``kl``."""
    firsts = steps.firsts
    if steps.packed:  # packed keys: each candidate of the other's list found by one integer
        at = at.join(steps.steps.select(ref="req", idx="idx", ref_step="step"), on=["ref", "idx"]).join(
            steps.steps.select(other="req", idx="idx", other_step="step"), on=["other", "idx"]
        )
        # only the columns the sums need travel through the joins of every candidate (a few rows per step of every pair)
        joined = (
            at.select("pair", "idx", "ref_step", "other_step")
            .join(firsts.select(ref_step="step", ident="ident", p="prob"), on="ref_step", maintain_order="left_right")
            .select("pair", "idx", "p", key=pl.col("other_step") * _PACK + pl.col("ident"))
            .join(firsts.select("key", q="prob"), on="key", how="left", maintain_order="left")
        )  # each step's candidates in the reference's list order, so that their sums add in one order every time
    else:
        joined = at.join(
            firsts.select(ref="req", idx="idx", ident="ident", p="prob"), on=["ref", "idx"], maintain_order="left_right"
        ).join(
            firsts.select(other="req", idx="idx", ident="ident", q="prob"),
            on=["other", "idx", "ident"],
            how="left",
            maintain_order="left",
        )
    counted = (pl.col("p") > REST_FLOOR) & (pl.col("q") > 0.0)
    per_step = joined.group_by("pair", "idx").agg(
        missing=pl.col("q").null_count(),
        p_sum=pl.col("p").sum(),
        q_sum=pl.col("q").sum(),
        listed=(pl.col("p") * (pl.col("p") / pl.col("q")).log()).filter(counted).sum(),
        underflow=((pl.col("p") > REST_FLOOR) & (pl.col("q") <= 0.0)).any(),
    )
    p_rest = pl.max_horizontal(1.0 - pl.col("p_sum"), pl.lit(REST_FLOOR))
    q_rest = pl.max_horizontal(1.0 - pl.col("q_sum"), pl.lit(REST_FLOOR))
    rest = pl.when(p_rest > REST_FLOOR).then(p_rest * (p_rest / q_rest).log()).otherwise(0.0)
    return (
        per_step.filter(pl.col("missing") == 0)
        .sort("pair", "idx")
        .select(
            "pair",
            "idx",
            kl=pl.when(pl.col("underflow"))
            .then(float("inf"))
            .otherwise(pl.max_horizontal(pl.col("listed") + rest, pl.lit(0.0))),
        )
    )


def _at_divergence(steps: Steps, diverged: pl.DataFrame) -> pl.DataFrame:
    """Both margins and whether the other's token is in the reference's list, at each diverged pair's fork."""
    fork = diverged.select("pair", "ref", "other", idx=pl.col("agree_to"))
    ref = steps.steps.select(ref="req", idx="idx", reference_margin="margin", ref_n="n_cands", ref_list="cand_list")
    other = steps.steps.select(other="req", idx="idx", own_margin="margin", own_ident="ident")
    joined = fork.join(ref, on=["ref", "idx"], how="left").join(other, on=["other", "idx"], how="left")
    return joined.select(
        "pair",
        "reference_margin",
        "own_margin",
        in_reference_topk=pl.when(pl.col("ref_n") > 0).then(pl.col("ref_list").list.contains(pl.col("own_ident"))),
    )
