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

from IPython.display import display

import analysis
from analysis import report
from analysis.run import CapturesCutShort, read_run
from analysis.studies import open_runs

# bia report said each capture cut short on stderr; the page lists them with what each run lacks
warnings.simplefilter("ignore", CapturesCutShort)
v3_policy = analysis.V3Policy.from_mapping(policy)
judge_runs = admission or bool(policy)
default = not sources and not runs
witness_sources = sources or ([] if runs else analysis.default_sources())
run_paths = runs or ([] if sources else analysis.default_runs())
ws = analysis.read_witnesses(witness_sources, progress=False)
run_objects = open_runs(run_paths)  # run directories and studies, their tables computed a piece at a time
against = reference if reference in ("ref1", "ref2") else read_run(reference)
display(report.header(title, run_objects, ws, default=default, admission=bool(ws.sources) or judge_runs))
# One judgement (analysis.judge): the answer table, the cards and the sections below all render its rows.
judgement = analysis.judge([*run_objects, *([ws] if ws.sources else [])])
display(report.answer(run_objects, ws, judgement=judgement))
display(report.runs(run_objects, ws, epsilon=epsilon, reference=against, judgement=judgement))

# %%
# The sampler-trainer pairs bia experiment --trainer writes beside the runs (and, in the embedded default, a real vLLM
# sampler's rollouts recomputed by transformers): every RL framework's mismatch metrics.
display(report.mismatch([*analysis.trainer_pairs(run_paths), *(analysis.default_rl_pairs() if default else [])]))

# %%
display(report.figures(run_objects, ws, epsilon=epsilon, reference=against, judgement=judgement))

# %%
display(report.detail(run_objects, ws, epsilon=epsilon, reference=against))

# %%
if ws.sources or judge_runs:
    display(report.gate(run_objects if judge_runs else [], ws, policy=v3_policy, judgement=judgement))
# a run is named by its label: a run bia report assembled from dumps, by what was given, not its scratch folder
parameters = {"sources": witness_sources, "runs": [run.label for run in run_objects], "epsilon": epsilon,
              "reference": reference, "policy": policy, "admission": judge_runs}
display(report.provenance(run_objects, ws, parameters=parameters, policy=v3_policy, default=default))
