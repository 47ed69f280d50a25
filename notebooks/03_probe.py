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
#   title: Probe a server across batch sizes
# ---

# %% [markdown]
# # 3. Probe a server across batch sizes
#
# The same greedy request alone and in batches of c, every token with its logprobs,
# candidates and arrival time, the batch widths the server really formed, and what parted from the m=1 reference.
# With no `url`, this notebook starts `bia serve` (the repository's tiny model on CPU) inside its own kernel.
#
# You will learn to:
#
# - probe a server with `analysis.probe.probe` and open the run it writes with `read_run`;
# - read the band table, with the share of requests bit-identical and token-identical to m=1 added from the
#   request table, and the run's verdict and its reason from `analysis.judge`, as `bia certify` gives them;
# - plot the batch widths formed, the divergences and the decode rates.
#
# Give `url` (and `server_log`) to probe your own server; papermill takes the same parameters
# (`-p url http://gpu-box:8000 -y 'ladder: [1, 4, 8, 16]'`). About 10 seconds with the defaults.

# %% tags=["parameters"]
# An OpenAI-compatible server (vLLM, SGLang, llama.cpp, apr serve, ...); empty starts bia serve in this kernel.
url: str = ""
# bia serve's kernel mode when url is empty: "default", "one-by-one", "fixed-tiles" or "row-invariant".
mode: str = "default"
# The server's log, for the batch width of every decode step (bia serve started here writes one next to the run).
server_log: str = ""
# The prompts, the batch sizes, and the tokens per request.
prompts: list = ["If the argument is"]
ladder: list = [1, 4, 8]
max_tokens: int = 24
# Fire each band again without logprobs and compare the texts (the observer effect).
observer: bool = False
# The run directory to write; empty picks a new one under runs/.
output: str = ""

# %%
import time
from pathlib import Path

import matplotlib.pyplot as plt
import polars as pl
from IPython.display import display

import analysis
from analysis import plots, report
from analysis.probe import probe
from analysis.run import band_table, observer_table, read_run, slot_table, width_table

output = output or f"runs/walkthrough-{time.strftime('%Y%m%d-%H%M%S')}"
server = None
if not url:  # bia serve in this kernel, logging each decode step's batch width
    from analysis.serve import BackgroundServer

    Path(output).parent.mkdir(parents=True, exist_ok=True)
    server_log = server_log or f"{output}.serve.log"
    server = BackgroundServer(mode, log_file=server_log)
    url = server.url
try:
    run_dir = await probe(url, output, prompts=prompts, ladder=ladder, max_tokens=max_tokens, server_log=server_log or None,
                          observer=observer, progress=False, say=print)
finally:
    if server is not None:
        server.stop()
run = read_run(run_dir)
print(f"wrote {run_dir}: {run.dump.requests.height} requests; missing: {len(run.missing())}")

# %% [markdown]
# Per request: the first divergence, the bitwise-equal float32 prefix (`bitwise_prefix`: a request is
# bit-identical to m=1 when it covers its whole `length`) and the largest ULP distance before it, the reference's
# margin where the streams parted, and the request's own decode rate.

# %%
slots = slot_table(run)
slots.select("prompt_id", "c", "slot", "length", "divergence_at", "bitwise_prefix", "max_ulp",
             "reference_margin", "k3_max", "decode_tok_s")

# %% [markdown]
# Per band: the widths the server formed, the share of its requests bit-identical and token-identical to the m=1
# reference (from the request table above), how far the slots agree with it, and the median decode rate.

# %%
identical = slots.group_by("prompt_id", "c", "repeat").agg(
    bit_identical_share=(pl.col("bitwise_prefix") == pl.col("length")).mean(),
    token_identical_share=(~pl.col("diverged")).mean())
bands = band_table(run).join(identical, on=["prompt_id", "c", "repeat"], how="left")
bands.select("prompt_id", "c", "repeat", "widths_seen", "bit_identical_share", "token_identical_share", "divergence_min",
             "diverged_slots", "decode_tok_s", "s_per_1000_seq")

# %%
per_c = slots.group_by("c").agg(
    requests=pl.len(), bits=(pl.col("bitwise_prefix") == pl.col("length")).sum(), tokens=(~pl.col("diverged")).sum()
).sort("c")
# the verdict is analysis.judge's, as bia certify and assert_batch_invariant give it: all requests bit-identical is
# AMBER, not GREEN, until enough distinct batch contexts bound the divergence rate below 1%
server_name = f"bia serve --mode {mode}" if server is not None else url
for verdict in analysis.judge(run):
    cause = f" ({verdict['cause']})" if verdict["cause"] else ""
    print(f"Verdict for {server_name} ({verdict['arm']}): {verdict['verdict']}{cause}: {verdict['reason']}")
    print(f"  next: {verdict['next_step']}")
print("Per c, against the m=1 reference:")
for row in per_c.iter_rows(named=True):
    print(f"  c={row['c']}: {row['bits']} of {row['requests']} bit-identical, {row['tokens']} token-identical")

# %% [markdown]
# The same verdict as the parity report's card for this run, one section of the report (`analysis.report.runs`). With the default
# kernel mode, torch sums a batch's rows together, so expect logprobs that differ in their last bits from c = 4 on;
# run the notebook again with `-p mode fixed-tiles` to see a server none of whose requests part: AMBER, since 12
# batched requests are too few to bound the divergence rate below 1% (GREEN takes 299 distinct batch contexts).

# %%
report.runs(run)

# %%
# three panels wrap onto two rows rather than shrink; given the run, the divergence and decode-rate panels restate its
# judgement (its batched requests, c > 1, and the c=1 baseline its cost is over)
fig, axes = plots.panel_grid(3)
plots.plot_band_widths(width_table(run), ax=axes[0])
plots.plot_divergence(run, ax=axes[1])
plots.plot_decode_rate(run, ax=axes[2])
plt.show()

# %%
if observer:
    display(observer_table(run))

# %% [markdown]
# The whole parity report of this run, as one offline HTML file: `bia report RUN_DIR -o report.html` (see `05_report.ipynb`).
