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
#   title: 2. Logprob dumps and run directories
# ---

# %% [markdown]
# # 2. Logprob dumps and run directories: bits, tokens and kernel modes
#
# A *run directory* is what bia's probe or its torch experiment writes: a `manifest.json` and raw captures of
# every request, each token with its float32 logprob and top-k candidates. This notebook reads the embedded runs:
# the CPU torch experiment in its four kernel modes (`data/experiment-cpu/`) and a real llama.cpp server with and
# without its prompt cache (`data/llamacpp-cpu/`).
#
# You will learn to:
#
# - open a run with `analysis.read_run` and its captures with `analysis.read_dumps`;
# - compare every batched request with the m=1 reference: `slot_table`, `band_table`, `drift_table`;
# - plot where requests parted, the reference margins and the logprob drift;
# - compare kernel modes with `analysis.mode_comparison` and say which one is batch invariant, and at what cost.

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import polars as pl
from IPython.display import display

import analysis

RUNS = {Path(path).name: Path(path) for path in analysis.default_runs()}  # the embedded runs, found wherever this notebook runs
sorted(RUNS)

# %%
run = analysis.read_run(RUNS["default"])
manifest = run.manifest
print(f"engine {manifest['identity']['engine']}, kernel mode {manifest['effective']['kernel_mode']}, "
      f"{manifest['effective']['dtype']} on {manifest['effective']['device']}; ladder {run.ladder}; "
      f"{manifest['sampler']['max_tokens']} tokens per request, top-{manifest['sampler']['top_logprobs']}")
print("determinism:", manifest["determinism"]["what"], "->", manifest["determinism"]["identical"])
run

# %% [markdown]
# A `Run` holds the three frames of its dump: `requests` (one row per request, with its `role`: two m=1
# `reference`s per prompt, then the `band` requests, by `c` and `slot`), `tokens` (one per scored
# position) and `candidates` (the top-k alternatives at each position).

# %%
run.requests.group_by("role", "c").agg(requests=pl.len(), tokens=pl.col("completion_tokens").sum()).sort("role", "c")

# %%
run.tokens.select("record", "position", "token_text", "logprob", "value_status", "n_candidates", "t_arrival").head(5)

# %% [markdown]
# The captures are ordinary dumps: `analysis.read_dumps` reads them (or any vLLM, SGLang, llama.cpp, TGI or
# OpenAI capture) into the same frames, detecting the format per file. Sentinels never reach `logprob`;
# `value_status` says what each value was.

# %%
dump = analysis.read_dumps(RUNS["default"] / "captures", progress=False)
print({Path(source).name: formats for source, formats in dump.formats.items()})
print(f"{dump.tokens.height} tokens, the same as the run's: {dump.tokens.height == run.tokens.height}")
dump.tokens.group_by("value_status").len()

# %% [markdown]
# ## Each batched request against the m=1 reference
#
# `slot_table` compares every request of every band with ref #1 of its prompt: `divergence_at` (the first
# differing token, or null when it never parts), `bitwise_prefix` (how many leading float32 logprobs
# are bit-identical), `max_ulp` and `max_abs_delta` (the largest drift before any divergence), and the
# reference's top-1/top-2 margin where it parted.

# %%
slots = analysis.slot_table(run)
with pl.Config(fmt_float="full"):  # max_abs_delta's drift of a few 1e-6 whole, not rounded to 0.000003
    display(slots.select("prompt_id", "c", "slot", "length", "divergence_at", "bitwise_prefix", "max_ulp",
                         "max_abs_delta").head(6))


# %% [markdown]
# A small helper says, per c, how many requests are token-identical and bit-identical to m=1; it is used for every run below.

# %%
def parity_by_c(slots: pl.DataFrame) -> pl.DataFrame:
    """Per batch size c: requests token-identical and bit-identical (every float32 logprob) to the m=1 reference."""
    differs = pl.col("bitwise_prefix") < pl.col("length")
    return (slots.group_by("c").agg(
        requests=pl.len(), token_identical=(~pl.col("diverged")).sum(), bit_identical=(~differs).sum(),
        first_token_flip=pl.col("divergence_at").min(), first_bit_difference=pl.col("bitwise_prefix").filter(differs).min(),
        max_ulp=pl.col("max_ulp").max(), max_abs_delta=pl.col("max_abs_delta").max()).sort("c"))


def say(name: str, slots: pl.DataFrame) -> None:
    """One line per c: the parity found."""
    for row in parity_by_c(slots).iter_rows(named=True):
        bits = ("bit-identical" if row["bit_identical"] == row["requests"] else
                f"{row['bit_identical']} bit-identical; logprobs first differ at token {row['first_bit_difference']}, "
                f"by up to {row['max_ulp']} ULP ({row['max_abs_delta']:.1e})")
        print(f"  {name} c={row['c']}: {row['token_identical']} of {row['requests']} token-identical, {bits}")


parity_by_c(slots)

# %%
print("Finding (torch, default kernel mode):")
say("default", slots)

# %% [markdown]
# In the default mode torch runs the whole batch through each matmul, so a row's sums depend on how many rows
# share them: from c = 4 on the float32 logprobs part from m=1 (positions are 0-based, so token 1 is the second),
# while no token flips. `band_table` sums each band up (widths formed, divergences, intra-batch agreement,
# unique completions, decode rate), and `drift_table` gives |delta logprob| per step before any fork.

# %%
analysis.band_table(run).select("prompt_id", "c", "m_formed", "divergence_min", "diverged_slots", "intra_agree_to",
                                "unique_completions", "decode_tok_s")

# %%
drift = analysis.drift_table(run)
# drift_table names c inside its label ("p0 c=4 slot 2"); plot_delta_before_fork draws one line per c given a c column
drift = drift.with_columns(c=pl.col("label").str.extract(r"c=(\d+) slot \d+$", 1).cast(pl.Int64))
margins = analysis.reference_margins(run)  # per prompt: ref #1's top-1 minus top-2 logprob at every step
parted = {prompt: group["divergence_at"].drop_nulls().to_list() for (prompt,), group in slots.group_by(["prompt_id"])}

# three panels wrap onto two rows rather than shrink; given the run, the divergence panel restates its judgement
fig, axes = analysis.plots.panel_grid(3)
analysis.plot_divergence(run, ax=axes[0])
analysis.plot_margin_trace(margins, parted, ax=axes[1])
analysis.plot_delta_before_fork(drift, ax=axes[2])
plt.show()

# %%
smallest = min(m for trace in margins.values() for m in trace if m is not None)
print(f"Finding: the smallest top-1/top-2 margin along the references is {smallest:.3f}, the largest drift before any fork "
      f"{drift['abs_delta'].max():.1e}: the drift is far too small to flip a token, so no token flips.")

# %% [markdown]
# ## A real server: llama.cpp on CPU
#
# The same tables apply to any run, here two `bia probe` runs against `llama-server` (`-np 16`) serving the same
# tiny model as GGUF, once with `--no-cache-prompt` and once with its prompt cache (llama.cpp's default).

# %%
print("Finding (llama.cpp):")
for name in ("no-cache-prompt", "cache-prompt"):
    say(name, analysis.slot_table(analysis.read_run(RUNS[name])))

# %% [markdown]
# Without the prompt cache a request alone repeats its reference bit for bit, while every request at c >= 4
# differs from its first token on, by the same maximum at every c: the batched path differs from the
# single-request one, not one batch size from another. With the cache on, even a request alone differs: each
# repeat reuses the cached prompt but its last token, evaluated alone, at another shape.
#
# ## Kernel modes: which one is batch invariant, and what it costs
#
# `analysis.mode_comparison` puts runs side by side: per run and c, the share of requests bit-identical to m=1,
# token flips, the largest ULP distance, the median decode rate and that rate over the `default` mode's.

# %%
modes = [analysis.read_run(RUNS[name]) for name in ("default", "batch-invariant", "fixed-tiles")]  # batch-invariant/ holds the one-by-one mode
table = analysis.mode_comparison(modes)
table.select("kernel_mode", "c", "requests", "bit_identical_share", "token_flips", "max_ulp", "median_decode_tok_s",
             "rate_vs_default")

# %%
by_mode = {mode: group.sort("c") for (mode,), group in table.group_by(["kernel_mode"], maintain_order=True)}
invariant = [mode for mode, group in by_mode.items() if (group["bit_identical_share"] == 1).all()]
not_invariant = [mode for mode in by_mode if mode not in invariant]
largest = table["c"].max()
print(f"Finding: batch invariant (every request at every c bit-identical to m=1): {', '.join(invariant)}; "
      f"not: {', '.join(not_invariant)}.")
for mode in not_invariant:
    group = by_mode[mode]
    print(f"  {mode}: bit-identical share per c {dict(zip(group['c'], group['bit_identical_share']))}, "
          f"{group['token_flips'].sum()} token flips, up to {group['max_ulp'].max()} ULP")
for mode in invariant:
    row = by_mode[mode].filter(pl.col("c") == largest).row(0, named=True)
    print(f"  {mode} at c={largest}: {row['median_decode_tok_s']:.0f} tok/s per request, "
          f"{row['rate_vs_default']:.2f} of the default mode's rate")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for mode, group in by_mode.items():
    ax.plot(group["c"], group["median_decode_tok_s"], marker="o", label=mode)
ax.set_xscale("log", base=2)
ax.set_xticks(run.ladder, [str(c) for c in run.ladder])
ax.set_xlabel("batch size c")
ax.set_ylabel("median decode rate per request (tok/s)")
ax.set_title("What each kernel mode costs")
ax.legend()
plt.show()

# %% [markdown]
# `one-by-one` buys parity by throwing batching away (each request steps alone), so its per-request rate falls
# as c grows; `fixed-tiles` keeps the batch and makes every reduction's shape independent of it, so it pays
# at c = 1 (a request alone fills a whole tile of 16) and little at c = 16. These runs time one band per c on a
# shared machine; `benchmarks/bench_kernels.py` takes the best of several rounds.
