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
#   title: Batch-parity report
# ---

# %% [markdown]
# *bia parity report.* Run it with `bia report` or papermill: verdicts first, then the figures, the detail, aprender's V3 gate and the provenance.

# %% tags=["parameters"]
# bia parity report: run it with `bia report` or papermill. The verdict cards come first, then the figures, then the detail.
# Witness and marker sources: files, folders, glob patterns or http(s) URLs.
# With no sources and no runs, the embedded default: real perf041 witnesses from host "lambda", the CPU torch experiment and a llama.cpp server.
sources: list = []
# Run directories (manifest.json + captures/), as bia's probe and experiment write them.
runs: list = []
# The near-tie epsilon for the runs' margins (a margin explains a divergence iff 0 <= margin < epsilon).
epsilon: float = 0.05
# What batched requests are compared with: "ref1", "ref2" (the run's m=1 references), or another run directory.
reference: str = "ref1"
# The report's title.
title: str = "Batch-parity report"
# Overrides of aprender's V3 policy constants, e.g. {"model_prefix": "llama-3.1-8b"}; empty is aprender's.
policy: dict = {}
# Also judge every run by aprender's V3 release gate (always so when policy is given; witnesses are always judged).
admission: bool = False

# %%
import warnings

from IPython.display import HTML, display

import analysis
from analysis import report
from analysis.run import CapturesCutShort, read_run

# bia report said each capture cut short on stderr; the page lists them with what each run lacks
warnings.simplefilter("ignore", CapturesCutShort)
v3_policy = analysis.V3Policy.from_mapping(policy)
judge_runs = admission or bool(policy)
default = not sources and not runs
witness_sources = sources or ([] if runs else analysis.default_sources())
run_paths = runs or ([] if sources else report.default_runs())
ws = analysis.read_witnesses(witness_sources, progress=False)
run_objects = [read_run(path) for path in run_paths]
against = reference if reference in ("ref1", "ref2") else read_run(reference)
display(HTML(report.header_html(title, ws, run_objects, default=default, admission=bool(ws.sources) or judge_runs)))
# One judgement (analysis.judge): the answer table, the cards and the sections below all render its rows.
judgement = report.judge_report(ws, run_objects)
display(HTML(report.answer_section_html(judgement)))
display(HTML(report.reviews_html(ws, run_objects, epsilon=epsilon, reference=against, judgement=judgement)))
if len(run_objects) > 1:
    display(HTML("<h2>Runs side by side</h2><p>Per run and batch size: the share of requests whose float32 logprobs are bit-identical to the reference, token flips, the run's verdict and its largest ULP distance from m=1, the median per-request decode rate, its ratio to the c=1 baseline (the answer's) and that rate over the default mode's in the same folder: the parity a kernel mode buys and what it costs.</p>"))
    display(HTML(report.mode_comparison_html(run_objects, reference=against, judgement=judgement)))
engines = report.engines_html(run_objects, judgement=judgement)
if engines:
    display(HTML("<h2>Engines side by side</h2><p>One model served by several engines: where each engine's streams part from the reference engine's m=1 stream of the same prompt, and each run's verdict against its own m=1 (the answer above).</p>"))
    display(HTML(engines))

# %%
# The sampler-trainer pairs bia experiment --trainer writes beside the runs (and, in the embedded default, a real vLLM
# sampler's rollouts recomputed by transformers): every RL framework's mismatch metrics.
pairs = report.trainer_pairs(run_paths) + (report.default_rl_pairs() if default else [])
if pairs:
    display(HTML(report.rl_mismatch_html(pairs)))
    display(HTML(report.figures_html(report.rl_mismatch_figures(pairs), "Sampler-trainer mismatch figures")))

# %%
display(HTML("<h2>Figures</h2><p>Each run's and the witnesses' figures, collapsed: open one to see where its requests part, the margins there, the widths formed and the decode rates.</p>"))
if ws.sources:
    display(HTML(report.figures_html(report.witness_figures(ws), "Witnesses: divergence and decode rate against c, and the env knobs that differ")))
for run in run_objects:
    display(HTML(report.figures_html(report.run_figures(run, epsilon=epsilon, reference=against), f"Run {run.label}")))

# %%
display(HTML("<h2>Detail</h2><p>Each run's provenance, negative control, forks and per-prompt tables, and each witness set's bands and markers; long tables show their worst rows and count the rest.</p>"))
for run in run_objects:
    display(HTML(report.run_details_html(run, epsilon=epsilon, reference=against)))
if ws.sources:
    display(HTML(report.witness_details_html(ws)))

# %%
if ws.sources or judge_runs:
    display(HTML(report.admission_html(ws, ws.shape_checks(v3_policy), run_objects if judge_runs else [], v3_policy, judgement)))
# a run is named by its label: a run bia report assembled from dumps, by what was given, not its scratch folder
parameters = {"sources": witness_sources, "runs": [run.label for run in run_objects], "epsilon": epsilon,
              "reference": reference, "policy": policy, "admission": judge_runs}
display(HTML(report.provenance_html(parameters, ws, v3_policy, run_objects, default=default)))
