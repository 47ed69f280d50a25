# ---
# jupyter:
#   jupytext:
#     notebook_metadata_filter: title,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
#   title: Sampler vs trainer
# ---

# %% [markdown]
# # Sampler vs trainer: every RL framework's mismatch metrics, and KL exactly 0
#
# An RL loop samples with an inference engine and scores the same tokens again in the trainer, in one forward pass
# over prompt and completion. Batch variance is one reason the two logprobs disagree; a trainer's one pass against a
# sampler's token-by-token decode is another. `bia experiment --trainer` recomputes every sequence of the bundled
# experiment runs as a trainer does, in each kernel mode, and writes the pairs as prime-rl token exports
# (`data/experiment-cpu/trainer/`). This notebook reads them.
#
# You will learn to:
#
# - read sampler-trainer pairs with `analysis.read_dump` and score them with `analysis.mismatch_summary`: one
#   column per `framework:logged name` (verl, slime, miles, prime-rl, OpenRLHF, SkyRL), each with its own averaging;
# - check "KL exactly 0": every metric at its value for no mismatch at all, in the kernel mode whose one-pass
#   forward gives the decode's bits, and not in the others;
# - look at the per-token `delta = trainer - rollout` logprob: its distribution, against position and against the
#   sampler's top-1/top-2 margin, and the sequences with the largest K3.
#
# Run it in JupyterLab or with papermill (`-y 'pairs: [runs/exp/trainer/default.jsonl]'` for your own pairs).

# %% tags=["parameters"]
# Sampler-trainer pairs (prime-rl token exports); empty: the bundled experiment runs' pairs and the vLLM-transformers pair.
pairs: list = []

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import polars as pl

import analysis
from analysis import report

PAIRS = [Path(p) for p in pairs] or [*report.trainer_pairs(analysis.default_runs()), *map(Path, report.default_rl_pairs())]  # bundled
name_of = lambda path: path.stem if path.parent.name == "trainer" else f"{path.parent.name}/{path.stem}"  # noqa: E731
summaries = {name_of(path): analysis.mismatch_summary(analysis.read_dump(path)) for path in PAIRS}
pl.concat([s.select("bia:sequences", "bia:masked_tokens", "verl:rollout_corr/k3_kl", "prime-rl:mismatch_kl/all/max",
                    "slime:train/train_rollout_logprob_abs_diff", "openrlhf:vllm_kl").with_columns(run=pl.lit(name))
           for name, s in summaries.items()]).select("run", pl.exclude("run"))

# %% [markdown]
# Each file is one run's sequences (its two m=1 references and every batched request), scored by the trainer
# eight to a forward pass. `report.mismatch_summaries` puts every metric of every run side by side, one row
# per framework and logged name.

# %%
table = report.mismatch_summaries(PAIRS)
table


# %% [markdown]
# "Exactly 0" means every metric is at the value it takes when the trainer's logprob *is* the sampler's: a KL or a
# difference 0, a ratio or a correlation 1, and verl's `chi2_token` a hair below 0 (verl divides token means by the
# count + 1e-8). So the check compares each run's summary with the summary of the same tokens with the trainer's
# logprob set to the sampler's.

# %%
def no_mismatch(path) -> pl.DataFrame:
    """The same tokens scored as if the trainer had returned the sampler's logprobs."""
    tokens = analysis.read_dump(path).tokens
    return analysis.mismatch_summary(tokens.select(sequence="record", position="position", rollout_logprob="logprob",
                                                   trainer_logprob="logprob", mask=pl.lit(True)))


for path in PAIRS:
    name, summary = name_of(path), summaries[name_of(path)]
    exact = summary.drop("bia:sequences").rows() == no_mismatch(path).drop("bia:sequences").rows()
    k3 = summary["verl:rollout_corr/k3_kl"].item()
    print(f"Finding: {name}: " + ("every metric exactly at its no-mismatch value (K3 0.0)" if exact
                                  else f"not zero: verl's K3 {k3:.3g}, SkyRL's max |delta| "
                                       f"{summary['skyrl:policy/rollout_train_logprobs_abs_diff_max'].item():.3g}"))

# %% [markdown]
# `fixed-tiles` reaches 0 because its prefill computes every query the way a decode step does; `default` parts by
# batching and by prefill against decode; `batch-invariant` (the `one-by-one` mode) is batch invariant, yet its
# prompt pass runs matmuls of another shape than its decode steps, so it parts too: batch invariance alone is not
# enough for an RL trainer. Below, every token's `delta`, with the sampler's margin from the run beside the pairs.

# %%
tokens = report.mismatch_tokens(PAIRS)
parted = tokens.filter(pl.col("delta") != 0)
by_run = tokens.group_by("run", maintain_order=True).agg(tokens=pl.len(), parted=(pl.col("delta") != 0).sum(),
                                                         max_abs_delta=pl.col("delta").abs().max())
for row in by_run.iter_rows(named=True):
    print(f"{row['run']}: {row['parted']} of {row['tokens']} tokens part, by up to {row['max_abs_delta']:.2g} nats")
if parted.height:
    print(f"the smallest sampler margin where a token parts is {parted['margin'].min():.3g} nats: "
          f"far above any |delta|, so no sampled token would change")
by_run

# %%
for fig, alt in report.rl_mismatch_figures(PAIRS):
    fig.suptitle(alt, fontsize="small")
plt.show()

# %% [markdown]
# The sequences with the largest K3 (token mean) in each run, and where their tokens first part:

# %%
report.largest_k3(PAIRS, n=3)

# %% [markdown]
# To make pairs of your own: `bia experiment -o runs/exp --trainer` decodes and recomputes (`--trainer-batch` sets
# the trainer's micro-batch), or `bia experiment -o runs/exp --trainer --recompute runs/exp/default` recomputes a run
# already decoded. Any prime-rl token export (`inference_logprobs`, `trainer_logprobs`, `loss_mask`) reads the same
# way, and `analysis.mismatch_table` gives the per-sequence view.
