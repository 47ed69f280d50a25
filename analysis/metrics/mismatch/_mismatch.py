"""Sampler-trainer mismatch as the RL frameworks log it: each framework's own formula, averaging and constants.

Three stages, none with a Python loop per token or per sequence:

1. ``_mismatch_blocks.partials``: one streamed pass over the tokens giving mergeable per-sequence
   sums and counts, and batch-wide sums, extremes and second moments (pieces of one sequence cut
   across blocks, batches or Parquet pieces merge with :func:`merge_sequences`, batch-wide rows with
   :func:`merge_globals`);
2. :func:`sequence_table`: the per-sequence view, polars expressions over the merged sums;
3. :func:`summary`: one row, a column per ``framework:logged name``, polars expressions over them.

Notation per token (docs/rl.md): ``r`` the rollout logprob, ``t`` the trainer's, ``m`` the loss mask,
``δ = t − r``, ``ρ = exp(δ)``; K1 ``= r − t``, K3 ``= ρ − 1 − δ``. Sources (repository @ commit, path):

- verl-project/verl @ 1dda039b: ``verl/utils/debug/metrics.py::calculate_debug_metrics``,
  ``verl/trainer/ppo/rollout_corr_helper.py::compute_offpolicy_metrics``, ``compute_rollout_correction_weights``,
  ``compute_is_metrics``; ``verl/utils/torch_functional.py::masked_mean`` divides by ``Σm + 1e-8``.
- THUDM/slime @ 624b824a: ``slime/backends/megatron_utils/loss.py::policy_loss_function``, ``vanilla_tis_function``,
  ``cp_utils.py::get_sum_of_sample_mean`` (``Σ x·m / max(Σm, 1)`` per rollout, then over rollouts),
  ``examples/train_infer_mismatch_helper/mis.py::add_ppl_metrics``.
- radixark/miles @ 31f1ca96: ``miles/backends/training_utils/loss_hub/losses.py`` (``train_rollout_kl``),
  ``math_utils.py::compute_approx_kl`` (``low_var_kl``).
- PrimeIntellect-ai/prime-rl @ 559b4477: ``src/prime_rl/trainer/rl/loss.py::compute_importance_ratio_and_mismatch_kl``,
  ``default_loss_fn`` (``_safe_mean``: 0 over an empty mask), ``src/prime_rl/trainer/rl/train.py`` (``mismatch_kl/all``).
- OpenRLHF/OpenRLHF @ 3c3be623: ``openrlhf/models/loss.py::PolicyLoss.forward`` (``vllm_kl``).
- NovaSky-AI/SkyRL @ a9564572: ``skyrl/train/trainer.py``,
  ``skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import polars as pl

#: verl's ``masked_mean`` denominator guard (``Σm + 1e-8``), also its ESS guard.
VERL_EPS = 1e-8


@dataclass(frozen=True)
class Constants:
    """The frameworks' constants, each with its framework's default.

    Examples
    --------
    >>> Constants().verl_is_threshold, Constants().prime_rl_dppo_mask_high
    (2.0, 0.2)
    """

    verl_is_threshold: float = 2.0  # rollout_is_threshold (TIS upper bound C)
    verl_rollout_is: Literal["token", "sequence"] = "sequence"  # RolloutCorrectionConfig.rollout_is
    safety_bound: float = 20.0  # verl's SAFETY_BOUND; slime's, SkyRL's and miles' clip of the log-ratio
    slime_tis_clip: float = 2.0  # --tis-clip
    slime_tis_clip_low: float = 0.0  # --tis-clip-low
    slime_per_token_loss: bool = False  # --calculate-per-token-loss
    miles_kl_clamp: float = 10.0  # low_var_kl clamp
    prime_rl_dppo_mask_low: float = 0.2
    prime_rl_dppo_mask_high: float = 0.2
    skyrl_token_tis_ratio_clip_high: float = 2.0

    def __post_init__(self):
        if self.verl_rollout_is not in ("token", "sequence"):
            raise ValueError(f"verl_rollout_is must be 'token' or 'sequence', got {self.verl_rollout_is!r}")
        if not self.verl_is_threshold > 0:
            raise ValueError(f"verl_is_threshold must be positive, got {self.verl_is_threshold!r}")


#: The per-sequence sums every per-sequence metric is built from (a count, or Σ over the loss-masked tokens).
SEQ_SUMS = (
    "n_rows",
    "n",
    "n_support",
    "s_r",
    "s_t",
    "s_d",
    "s_absd",
    "s_k3",
    "s_miles",
    "s_rho2",
    "s_tis",
    "n_tisclip",
    "s_tisabs",
)
#: prime-rl's per-sample counts and sums, which need the advantage.
ADV_SUMS = ("n_pm", "n_ph", "n_pl", "s_k3m", "s_k3k")
#: Batch-wide values: sums (``s_w``, ``s_w2``, ``n_hi``, ``n_lo``: NaN unless ``verl_rollout_is="token"``, the only mode
#: that reads them), second moments with the sum they are centred on, and the co-moment of ``p = exp t`` and ``q = exp r``.
GLOBAL_SUMS = ("n", "s_w", "s_w2", "n_hi", "n_lo", "n_sky", "s_rho_c")
GLOBAL_M2 = {"absd": "absd", "k3": "k3", "x": "x", "p": "p", "q": "q"}
GLOBAL_MAX = ("absd", "k3", "x")


def merge_sequences(parts: pl.DataFrame) -> pl.DataFrame:
    """One row per sequence, in first-seen order: the runs' sums added.

    Parameters
    ----------
    parts : polars.DataFrame
        Per-run sums with a ``sequence`` column; every other column is summed.

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> merge_sequences(pl.DataFrame({"sequence": [3, 1, 3], "n": [2, 1, 4]})).rows()
    [(3, 6), (1, 1)]
    """
    return parts.group_by("sequence", maintain_order=True).agg(pl.exclude("sequence").sum())


def merge_globals(rows: pl.DataFrame) -> pl.DataFrame:
    """One batch-wide row from several: sums add, extremes take the extreme, (co-)moments merge by Chan's formula.

    Parameters
    ----------
    rows : polars.DataFrame
        Batch-wide rows, as the second frame of ``_mismatch_blocks.partials`` gives them.

    Returns
    -------
    polars.DataFrame
        One row, of the same columns.

    Examples
    --------
    >>> from analysis.metrics.mismatch._mismatch_blocks import partials
    >>> tokens = pl.LazyFrame({"sequence": [0, 0, 0], "rollout_logprob": [-0.1, -2.0, -0.5],
    ...                        "trainer_logprob": [-0.12, -1.9, -0.5], "mask": [True, True, True]})
    >>> whole = partials(tokens)[1]
    >>> cut = merge_globals(pl.concat([partials(tokens.slice(i, j - i))[1] for i, j in ((0, 1), (1, 3))]))
    >>> abs(cut["m2_absd"].item() - whole["m2_absd"].item()) < 1e-15, cut["n"].item(), cut["max_absd"].item()
    (True, 3, 0.10000000000000009)
    """
    n = pl.col("n").cast(pl.Float64)
    total = n.sum()

    def shift(name: str) -> pl.Expr:  # a row's mean less the merged mean (null for a row without a masked token)
        g = pl.col(f"g_{name}")
        return g / pl.when(n > 0).then(n) - g.sum() / total

    m2 = [
        (pl.col(f"m2_{name}").sum() + (n * shift(name) ** 2).fill_null(0.0).sum()).alias(f"m2_{name}")
        for name in GLOBAL_M2
    ]
    c2 = (pl.col("c2_pq").sum() + (n * shift("p") * shift("q")).fill_null(0.0).sum()).alias("c2_pq")
    return rows.select(
        *(pl.col(name).sum() for name in GLOBAL_SUMS),
        *(pl.col(f"g_{name}").sum() for name in GLOBAL_M2),
        *m2,
        c2,
        *(pl.col(f"max_{name}").max() for name in GLOBAL_MAX),
        pl.col("min_absd").min(),
    )


def _per_seq(total: pl.Expr, count: pl.Expr) -> pl.Expr:
    """A per-sequence mean over masked tokens, null where the sequence has none."""
    return total / pl.when(count > 0).then(count)


def sequence_table(parts: pl.DataFrame, c: Constants = Constants(), *, advantage: bool = False) -> pl.DataFrame:
    """The per-sequence view: plain means over each sequence's masked tokens (null where it has none).

    Columns: ``sequence``, ``tokens``, ``masked_tokens``, ``support_tokens`` (tokens whose trainer
    logprob was replayed on the sampler's support), ``k1`` and ``k3`` (mean K1, K3), ``abs_diff``
    (mean ``|t − r|``), ``log_ratio_sum`` (Σδ), ``log_ppl_diff`` (mean ``r`` − mean ``t``),
    ``ppl_ratio`` (its exp), ``chi2_token`` (mean ``exp(2·clip(δ))`` − 1), ``chi2_seq``
    (``exp(2·clip(Σδ))`` − 1), ``tis`` (slime's mean ``ρ``), and with an advantage, prime-rl's
    ``is_masked`` share.

    Parameters
    ----------
    parts : polars.DataFrame
        The merged per-sequence sums.
    c : Constants, default Constants()
        The frameworks' constants (the safety bound clips ``chi2_seq``).
    advantage : bool, default False
        The sums include the advantage's (``is_masked`` is added).

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> tokens = pl.LazyFrame({"sequence": ["a", "a"], "rollout_logprob": [-0.1, -2.0],
    ...                        "trainer_logprob": [-0.12, -1.9], "mask": [True, True]})
    >>> from analysis.metrics.mismatch._mismatch_blocks import partials
    >>> t = sequence_table(partials(tokens)[0])
    >>> round(t["k1"].item(), 6), round(t["ppl_ratio"].item(), 6)
    (-0.04, 0.960789)
    """
    n, bound = pl.col("n"), c.safety_bound
    k = _per_seq
    cols = [
        pl.col("sequence"),
        pl.col("n_rows").alias("tokens"),
        n.alias("masked_tokens"),
        pl.col("n_support").alias("support_tokens"),
        k(-pl.col("s_d"), n).alias("k1"),
        k(pl.col("s_k3"), n).alias("k3"),
        k(pl.col("s_absd"), n).alias("abs_diff"),
        pl.when(n > 0).then(pl.col("s_d")).alias("log_ratio_sum"),
        (k(pl.col("s_r"), n) - k(pl.col("s_t"), n)).alias("log_ppl_diff"),
        (k(pl.col("s_r"), n) - k(pl.col("s_t"), n)).exp().alias("ppl_ratio"),
        (k(pl.col("s_rho2"), n) - 1.0).alias("chi2_token"),
        pl.when(n > 0).then((2.0 * pl.col("s_d").clip(-bound, bound)).exp() - 1.0).alias("chi2_seq"),
        k(pl.col("s_tis"), n).alias("tis"),
    ]
    if advantage:
        cols.append(k(pl.col("n_pm").cast(pl.Float64), n).alias("is_masked"))
    return parts.select(cols)


def summary(
    parts: pl.DataFrame, glob: pl.DataFrame, c: Constants = Constants(), *, advantage: bool = False
) -> pl.DataFrame:
    """One row: every framework's metric, named ``framework:logged name``, from the merged partials (``_mismatch_blocks.partials``).

    A metric is null where its framework would divide by zero or refuse (verl and SkyRL with no
    masked token, a standard deviation of fewer than two tokens); prime-rl's per-sample metrics
    need the advantage and are left out without it.

    Parameters
    ----------
    parts : polars.DataFrame
        The merged per-sequence sums.
    glob : polars.DataFrame
        The merged batch-wide row.
    c : Constants, default Constants()
        The frameworks' constants.
    advantage : bool, default False
        The sums include the advantage's (prime-rl's per-sample metrics are given).

    Returns
    -------
    polars.DataFrame
        One row.

    Examples
    --------
    >>> tokens = pl.LazyFrame({"sequence": [0, 0], "rollout_logprob": [-0.1, -2.0],
    ...                        "trainer_logprob": [-0.12, -1.9], "mask": [True, True]})
    >>> from analysis.metrics.mismatch._mismatch_blocks import partials
    >>> s = summary(*partials(tokens))
    >>> round(s["verl:rollout_corr/k3_kl"].item(), 7), round(s["slime:train/tis_abs"].item(), 7)
    (0.0026848, 0.0624861)
    """
    g = {name: pl.lit(glob[name].item(), pl.Float64) for name in glob.columns}
    n, N, B = pl.col("n"), pl.col("n").sum(), pl.len()
    nf = n.cast(pl.Float64)
    some = pl.when(N > 0)  # verl asserts a masked token, SkyRL skips its metrics without one
    verl_n = N.cast(pl.Float64) + VERL_EPS
    log_c = math.log(c.verl_is_threshold)

    # verl: per-sequence masked means over Σm + 1e-8 (0 for a sequence with no masked token, still averaged in)
    mean_r, mean_t = pl.col("s_r") / (nf + VERL_EPS), pl.col("s_t") / (nf + VERL_EPS)
    lpd = mean_r - mean_t
    seq_log_w = pl.col("s_d").clip(-c.safety_bound, c.safety_bound)
    if c.verl_rollout_is == "token":
        s_w, s_w2 = g["s_w"], g["s_w2"]
        frac_hi, frac_lo = g["n_hi"] / verl_n, g["n_lo"] / verl_n
    else:  # the sequence's weight exp(clip(Σδ)) on each of its masked tokens; the shares are over sequences
        w_seq = pl.min_horizontal(seq_log_w.exp(), pl.lit(c.verl_is_threshold))
        s_w, s_w2 = (nf * w_seq).sum(), (nf * w_seq * w_seq).sum()
        frac_hi = (pl.col("s_d") > log_c).cast(pl.Float64).mean()
        frac_lo = (pl.col("s_d") < math.log(1.0 / c.verl_is_threshold)).cast(pl.Float64).mean()
    w_mean = s_w / verl_n
    m2_p, m2_q = g["m2_p"], g["m2_q"]
    cov = g["c2_pq"]  # Σ (p − mean p)(q − mean q), as m2_p and m2_q, so the 1/N cancels
    unbiased = pl.when(N > 1)

    # slime and miles: Σ x·m / max(Σm, 1) per rollout (a sequence here), then the mean over rollouts;
    # with --calculate-per-token-loss, Σ x·m over the batch / Σ max(Σm, 1)
    n1 = pl.max_horizontal(nf, pl.lit(1.0))
    if c.slime_per_token_loss:

        def slime(total: pl.Expr) -> pl.Expr:
            return total.sum() / n1.sum()
    else:

        def slime(total: pl.Expr) -> pl.Expr:
            return (total / n1).mean()

    s_mean_r, s_mean_t = pl.col("s_r") / n1, pl.col("s_t") / n1  # mis.py's masked_mean: clamp_min(Σm, 1)
    s_lpd = s_mean_r - s_mean_t

    def slime_seq(value: pl.Expr) -> pl.Expr:  # a sequence-level value expanded over its tokens, then reduced
        return slime(value * nf)

    cols = {
        "bia:sequences": B.cast(pl.Int64),
        "bia:tokens": pl.col("n_rows").sum(),
        "bia:masked_tokens": N,
        "bia:support_tokens": pl.col("n_support").sum(),
        # verl debug metrics: |exp t − exp r| over the flattened masked tokens; std unbiased; Pearson of exp t, exp r
        "verl:training/rollout_probs_diff_max": g["max_x"],
        "verl:training/rollout_probs_diff_mean": some.then(g["g_x"] / N),
        "verl:training/rollout_probs_diff_std": unbiased.then((g["m2_x"] / (N - 1)).sqrt()),
        "verl:training/rollout_actor_probs_pearson_corr": some.then(
            (cov / (m2_p * m2_q).sqrt()).clip(-1.0, 1.0)
        ),  # torch.corrcoef clips
        # verl rollout_corr: off-policy metrics
        "verl:rollout_corr/kl": some.then(-pl.col("s_d").sum() / verl_n),
        "verl:rollout_corr/k3_kl": some.then(pl.col("s_k3").sum() / verl_n),
        "verl:rollout_corr/training_ppl": some.then((-mean_t).exp().mean()),
        "verl:rollout_corr/rollout_ppl": some.then((-mean_r).exp().mean()),
        "verl:rollout_corr/log_ppl_diff": some.then(lpd.mean()),
        "verl:rollout_corr/log_ppl_abs_diff": some.then(lpd.abs().mean()),
        "verl:rollout_corr/log_ppl_diff_max": some.then(lpd.max()),
        "verl:rollout_corr/log_ppl_diff_min": some.then(lpd.min()),
        "verl:rollout_corr/ppl_ratio": some.then(lpd.exp().mean()),
        "verl:rollout_corr/chi2_token": some.then(pl.col("s_rho2").sum() / verl_n - 1.0),
        "verl:rollout_corr/chi2_seq": some.then((2.0 * seq_log_w).exp().mean() - 1.0),
        "verl:rollout_corr/rollout_is_mean": some.then(w_mean),
        "verl:rollout_corr/rollout_is_ratio_fraction_high": some.then(frac_hi),
        "verl:rollout_corr/rollout_is_ratio_fraction_low": some.then(frac_lo),
        "verl:rollout_corr/rollout_is_eff_sample_size": some.then((w_mean + VERL_EPS) ** 2 * verl_n / s_w2),
        # slime
        "slime:train/train_rollout_logprob_abs_diff": slime(pl.col("s_absd")),
        "slime:train/tis": slime(pl.col("s_tis")),
        "slime:train/tis_clipfrac": slime(pl.col("n_tisclip").cast(pl.Float64)),
        "slime:train/tis_abs": slime(pl.col("s_tisabs")),
        "slime:train/mis_kl": slime(-pl.col("s_d")),
        "slime:train/mis_k3_kl": slime(pl.col("s_k3")),
        "slime:train/mis_log_ppl_abs_diff": slime_seq(s_lpd.abs()),
        "slime:train/mis_ppl_ratio": slime_seq(s_lpd.exp()),
        "slime:train/mis_chi2_token": slime_seq(pl.col("s_rho2") / n1 - 1.0),
        "slime:train/mis_chi2_seq": slime_seq((2.0 * seq_log_w).exp() - 1.0),
        # miles (slime fork)
        "miles:train/train_rollout_kl": slime(pl.col("s_miles")),
        # prime-rl: K3 over every loss-masked token of the step; std unbiased
        "prime-rl:mismatch_kl/all/mean": some.then(pl.col("s_k3").sum() / N),
        "prime-rl:mismatch_kl/all/std": unbiased.then((g["m2_k3"] / (N - 1)).sqrt()),
        "prime-rl:mismatch_kl/all/max": g["max_k3"],
        # OpenRLHF
        "openrlhf:vllm_kl": some.then(-pl.col("s_d").sum() / N),
        # SkyRL: over the flattened loss-masked tokens
        "skyrl:policy/rollout_train_logprobs_abs_diff_mean": some.then(pl.col("s_absd").sum() / N),
        "skyrl:policy/rollout_train_logprobs_abs_diff_std": unbiased.then((g["m2_absd"] / (N - 1)).sqrt()),
        "skyrl:policy/rollout_train_logprobs_abs_diff_max": g["max_absd"],
        "skyrl:policy/rollout_train_logprobs_abs_diff_min": g["min_absd"],
        "skyrl:is_ratio_mean": g["s_rho_c"] / pl.max_horizontal(N, pl.lit(1)),
        "skyrl:tis_token_clip_high_ratio": g["n_sky"] / pl.max_horizontal(N, pl.lit(1)),
    }
    if advantage:  # prime-rl: per sample (_safe_mean: 0 over an empty mask), then mean and max over samples

        def safe(total: str, count: pl.Expr) -> pl.Expr:
            return pl.col(total).cast(pl.Float64) / pl.max_horizontal(count, pl.lit(1)).cast(pl.Float64)

        per_sample = {
            "is_masked": safe("n_pm", n),
            "is_masked_high": safe("n_ph", n),
            "is_masked_low": safe("n_pl", n),
            "masked_mismatch_kl": safe("s_k3m", pl.col("n_pm")),
            "unmasked_mismatch_kl": safe("s_k3k", n - pl.col("n_pm")),
        }
        for name, value in per_sample.items():
            cols[f"prime-rl:{name}/mean"] = value.mean()
            cols[f"prime-rl:{name}/max"] = value.max()
    return parts.select(
        **{k: v.cast(pl.Float64) if not k.startswith("bia:") else v.cast(pl.Int64) for k, v in cols.items()}
    )
