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
#   title: Batch-invariance trend
# ---

# %% [markdown]
# *bia trend report.* Run it with `bia trend` or papermill: a history of runs, witnesses and release markers over time.

# %% tags=["parameters"]
# History folders, run directories, witness and marker files or URLs; empty: the embedded history.
history: list = []
# The report's title.
title: str = "Batch-invariance trend"

# %%
import warnings

import matplotlib.pyplot as plt
from IPython.display import HTML, display

import analysis
from analysis import report, trend
from analysis.run import CapturesCutShort

# bia trend said each capture cut short on stderr, before the notebook ran
warnings.simplefilter("ignore", CapturesCutShort)
sources = history or trend.default_history_sources()
past = analysis.read_history(sources)
display(HTML(trend.header_html(title, history=past, sources=history)))
display(HTML(trend.regressions_html(past)))

# %%
for key in trend.series_keys(past):
    display(HTML(trend.series_heading_html(key)))
    for metric, _label, _words in trend.METRICS:
        fig, ax = plt.subplots(figsize=(8, 3.2))
        trend.plot_trend(past, key, metric, ax=ax)
        if ax.get_lines() and any(str(line.get_label()).startswith('c=') for line in ax.get_lines()):
            report.show_figure(fig, trend.figure_alt(key, metric))
        else:
            plt.close(fig)

# %%
display(HTML(trend.entries_html(past)))
