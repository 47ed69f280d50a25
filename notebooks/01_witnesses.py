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
#   title: 1. Parity witnesses
# ---

# %% [markdown]
# # 1. Parity witnesses: what aprender's probe recorded, and what it means
#
# aprender's perf041 probe sends the same greedy request alone (m=1) and in batches of c, and writes a *witness*:
# per batch size c, where the batched streams first part from the m=1 reference, and a PASS/FAIL result.
# This notebook reads the three real witnesses embedded in `data/aprender-lambda/` (`apr serve` on an RTX 4090).
#
# You will learn to:
#
# - read witnesses into polars frames with `analysis.read_witnesses` and find your way in its five frames;
# - see why the same measurement is FAIL in one file and PASS in another (each file's own witness version);
# - run aprender's V3 serving-shape check (`shape_checks`, `shape_check`, `V3Policy`) and read its reasons;
# - plot the divergence against c, and see what a witness cannot tell you (margins, decode rates).
#
# Run it in JupyterLab (`make lab`) or with papermill, from the repository root or from `notebooks/`.

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import polars as pl
from IPython.display import display

import analysis

LAMBDA = Path(analysis.default_sources()[0])  # data/aprender-lambda, found wherever this notebook runs
ws = analysis.read_witnesses(LAMBDA, progress=False)
ws


# %% [markdown]
# `read_witnesses` takes files, folders, glob patterns or URLs and returns a `WitnessSet` of five frames:
# `witnesses` (one row per file), `bands` (one per c), `slots` (one per request of a band), `markers`
# (release markers) and `discrepancies` (recorded values that disagree with their version's rules).
# Every row carries its `source`; below, `short` keeps only the file name so the tables stay narrow.

# %%
def short(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame with each source shown as its file name."""
    return frame.with_columns(pl.col("source").map_elements(lambda s: Path(s).name, return_dtype=pl.String))


short(ws.witnesses).select("source", "witness_version", "model_path", "declared_min", "env_BATCHED_PREFILL",
                           "reference_self_divergence_at", "recorded_verdict", "derived_verdict")

# %% [markdown]
# Per band: `divergence_at` is the first token where the batched streams part from the m=1 reference,
# `result` what the file recorded and `derived_result` what bia re-derives with the rules of the file's own
# `witness_version` (version 1 passes a band only if `divergence_at >= declared_min`; version 2 gates on the
# batch formed, refused and frozen slots and the agreement inside the batch, not on agreement with m=1).

# %%
short(ws.bands).select("source", "witness_version", "c", "m_formed", "divergence_at", "declared_min", "result",
                       "derived_result", "result_agrees")

# %%
batched = ws.bands.filter(pl.col("c") > 1)
parts = batched["divergence_at"].unique().sort().to_list()
print(f"Finding: in all {ws.witnesses.height} witness files, every band with c > 1 parts from m=1 at token "
      f"{', '.join(map(str, parts))} (declared_min is {batched['declared_min'].max()}).")
for (version,), group in batched.sort("witness_version").group_by(["witness_version"], maintain_order=True):
    files = group["source"].n_unique()
    print(f"  witness_version {version} ({files} file{'s' if files > 1 else ''}): those bands are "
          f"{'/'.join(group['derived_result'].unique().sort())} under that version's rules.")
alone = ws.bands.filter(pl.col("c") == 1).join(ws.witnesses.select("source", "reference_self_divergence_at"), on="source")
for row in short(alone).sort("source").iter_rows(named=True):
    print(f"  c=1 (a request alone) in {row['source']}: parts at token {row['divergence_at']}; "
          f"its two m=1 references agree up to token {row['reference_self_divergence_at']}")
print(f"Recorded and re-derived results agree in {ws.bands['result_agrees'].sum()} of {ws.bands.height} bands; "
      f"{ws.discrepancies.height} discrepancies.")

# %% [markdown]
# So the *same measurement*, batched streams parting from m=1 at token 3, is FAIL in the version-1 files and
# PASS in the version-2 file: a reader must apply each file's own rules rather than mix them. Even a request
# alone is not a fixed point here: where the two m=1 references part at token 100, so does the c=1 band. bia records
# whether each recorded value agrees with the rules of its version; `ws.discrepancies` would list any that do not.
#
# The `slots` frame shows every request of a band: `agree_to` (aprender's word) is how far it agrees with m=1, and (version 2)
# `intra_agree_to` how far the requests of one batch agree with each other.

# %%
per_band = (ws.slots.filter(pl.col("c") > 1)
            .group_by("source", "witness_version", "c", maintain_order=True)
            .agg(requests=pl.len(), agree_to_min=pl.col("agree_to").min(), agree_to_max=pl.col("agree_to").max(),
                 intra_agree_to_min=pl.col("intra_agree_to").min()))
short(per_band)

# %%
v2 = per_band.filter(pl.col("witness_version") == 2)
print(f"Finding: in the version-2 witness every batched request agrees with m=1 up to token "
      f"{v2['agree_to_max'].max()} only, yet the requests of each batch agree with each other up to token "
      f"{v2['intra_agree_to_min'].min()}: the batched path is consistent with itself and differs from the single-request path.")

# %% [markdown]
# ## aprender's V3 serving-shape check
#
# `ws.shape_checks()` judges every witness with aprender's V3 release gate (`apr test llm shape-check`): the
# blessed model, the bands, the declared minimum, divergences not explained by a near-tie, and the S7 decode-rate
# ratio. Each verdict prints as aprender's CLI does.

# %%
verdicts = ws.shape_checks()
for verdict in verdicts.values():
    print(verdict, end="\n\n")

# %%
statuses = sorted({v.status for v in verdicts.values()})
first = next(iter(verdicts.values()))
shared = [reason for reason in first.reasons if all(reason in v.reasons for v in verdicts.values())]
print(f"Finding: V3 says {' / '.join(statuses)} for {len(verdicts)} of {len(verdicts)} witnesses; "
      f"the reasons all of them share:")
for reason in shared:
    print(f"  - {reason}")

# %% [markdown]
# The policy's constants are data (`analysis.V3Policy`). Bless this witness's model and the divergences remain:
# the gate would excuse an early divergence only where the reference's top-1/top-2 margin was below the
# near-tie epsilon, and a perf041 witness records no margin at all.

# %%
policy = analysis.V3Policy.from_mapping({"model_prefix": "qwen2.5-coder-1.5b", "model_label": "Qwen2.5-Coder-1.5B"})
v2_file = LAMBDA / "witness@464c168e62.json"
verdict = analysis.shape_check(v2_file, policy=policy)
print(verdict)
margins = ws.bands["top2_margin_at_divergence"].drop_nulls().len()
print(f"\nFinding: with the model blessed, {v2_file.name} is still {verdict.status} (exit code {verdict.exit_code}); "
      f"{margins} of {ws.bands.height} bands record a margin at their divergence, so no divergence can be excused as a near-tie.")
with pl.Config(fmt_str_lengths=400):  # each reason whole: polars cuts a string at 30 characters by default
    display(verdict.to_frame())

# %% [markdown]
# ## Figures
#
# `plot_divergence` draws each witness's `divergence_at` against c with `declared_min` marked, `plot_decode_rate`
# the per-request decode rate (these witnesses record none, so the panel says so rather than drawing an
# empty box), and `plot_env_knobs` the kernel environment knobs that differ between the files.

# %%
fig, axes = analysis.plots.panel_grid(2)  # two panels a row, as wide as a notebook's output: legible, not shrunk
analysis.plot_divergence(ws, ax=axes[0])
analysis.plot_decode_rate(ws, ax=axes[1])
plt.show()

fig, ax = plt.subplots(figsize=(8, 2.5))
analysis.plot_env_knobs(ws.witnesses, ax=ax)
plt.show()

# %% [markdown]
# A witness keeps tokens only: it can say *where* the streams parted, not how close the model's call was there
# (the margin) or how far the float32 logprobs drifted before. Runs with per-token logprob dumps answer that:
# see `02_dumps_and_runs.ipynb`.
