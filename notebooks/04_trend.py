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
#   title: 4. History and trend
# ---

# %% [markdown]
# # 4. History and trend: bands over time, regressions flagged
#
# A parity study is not one run: a night's probe is compared with the nights before it. This notebook builds a
# history of witnesses and runs, adds to a history folder, and lets bia's regression rules find the night
# a band that used to be bit-identical to m=1 stopped being so.
#
# You will learn to:
#
# - read a history with `analysis.read_history` and find your way in `History.entries`, `bands` and `markers`;
# - keep a history folder with `analysis.append_history` (append-only: the same bytes are never added twice);
# - find regressions with `History.regressions()` and the rules in `analysis.REGRESSION_RULES`;
# - draw a metric over time with `analysis.plot_trend`.
#
# Everything is written to a temporary folder; the embedded data is only read.

# %%
import json
import shutil
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import polars as pl

import analysis

LAMBDA = Path(analysis.default_sources()[0])  # data/aprender-lambda
RUNS = {Path(path).name: Path(path) for path in analysis.default_runs()}
past = analysis.read_history(LAMBDA)
past

# %% [markdown]
# `entries` has one row per witness or run, keyed by time, host, engine, model, server commit and settings. A
# witness carries no date of its own: it is dated by the release marker of its server commit
# (`time_origin`). `series_settings` names the settings that change results (a run's kernel mode, dtype, device,
# layout, prompt cache; a witness's environment switches): a series is a host, engine and model with one set of
# them, so the `BATCHED_PREFILL=0` variant is a series of its own and a change of setting is never a regression.
# `bands` has one row per entry and c with the measures a trend needs.

# %%
past.entries.select("kind", "time", "time_origin", "host", "engine", "model", "series_settings", pl.col("commit").str.slice(0, 10), "verdict",
                    pl.col("source").map_elements(lambda s: Path(s).name, return_dtype=pl.String))

# %%
past.bands.select(pl.col("entry").str.slice(0, 8), "c", "requests", "earliest_divergence", "bit_identical_share",
                  "token_identical_share", "decode_ratio", "result")

# %%
found = past.regressions()
print(f"Finding: the embedded history holds {past.entries.height} witnesses, dated "
      f"{', '.join(past.entries['time'].dt.strftime('%Y-%m-%d %H:%M').unique())} by the marker of server commit "
      f"{', '.join(past.entries['commit'].unique().str.slice(0, 7))}; {found.height} regressions "
      f"(witnesses of one moment have no order to regress in).")

# %% [markdown]
# ## A history folder
#
# `append_history(sources, folder)` (the CLI's `bia history`) adds witnesses, markers and run directories to a
# folder: `history.json`, the originals, each run's manifest, and append-only Parquet parts. Appending the same
# sources again adds nothing, so a nightly job may append everything every night.

# %%
work = Path(tempfile.mkdtemp(prefix="bia-trend-"))
folder = work / "history"
history = analysis.append_history([LAMBDA], folder)
history = analysis.append_history([RUNS["default"], RUNS["fixed-tiles"]], folder)
again = analysis.append_history([LAMBDA, RUNS["default"]], folder)
print(sorted(p.name for p in folder.iterdir()))
print(f"{history.entries.height} entries after adding the witnesses, then two runs; appending the witnesses and a run "
      f"again left {again.entries.height}")


# %% [markdown]
# ## Two nights, and a regression
#
# To see a regression, make two nights from the embedded llama.cpp runs: night 1 is the run without the
# prompt cache (a request alone is bit-identical to m=1), night 2 the run with it, each copied and dated in its
# manifest (`started`) and given a server commit, as a nightly probe of a changed server would write them.

# %%
def night(source: Path, name: str, started: str, commit: str) -> Path:
    """A copy of an embedded run, dated and from a given server commit."""
    copy = work / "runs" / name
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("derived"))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["started"] = started
    manifest["identity"]["commit"] = commit
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


nights = work / "nights"
analysis.append_history([night(RUNS["no-cache-prompt"], "2026-11-01", "2026-11-01T02:00:00Z", "a" * 40)], nights)
history = analysis.append_history([night(RUNS["cache-prompt"], "2026-11-02", "2026-11-02T02:00:00Z", "c" * 40)], nights)
history.bands.select("time", "c", "earliest_divergence", "bit_identical_share", "token_identical_share", "decode_ratio").sort("c", "time")

# %% [markdown]
# The rules are data (`analysis.Rule`); `History.regressions()` applies `analysis.REGRESSION_RULES` by default.

# %%
pl.DataFrame([{"rule": rule.name, "what it flags": rule.words} for rule in analysis.REGRESSION_RULES])

# %%
found = history.regressions()
print(f"Finding: {found.height} regression(s).")
for row in found.iter_rows(named=True):
    print(f"  {row['rule']} at c={row['c']}: {row['words']} ({row['before']:g} -> {row['after']:g}); last good "
          f"{row['last_good_time']:%Y-%m-%d} (commit {row['last_good_commit'][:7]}), first bad {row['first_bad_time']:%Y-%m-%d} "
          f"(commit {row['first_bad_commit'][:7]})")
found.select("rule", "c", "before", "after", "last_good_time", "first_bad_time")

# %% [markdown]
# `plot_trend` draws one metric of one series (`analysis.trend.series_keys`: host, engine, model and settings) over
# time: a line per c, release markers as labelled lines, each regression's first bad entry circled.

# %%
key = analysis.trend.series_keys(history)[0]
fig, axes = plt.subplots(1, 2, figsize=(14, 3.8))
analysis.plot_trend(history, key, "bit_identical_share", ax=axes[0])
analysis.plot_trend(history, key, "token_identical_share", ax=axes[1])
fig.tight_layout()
plt.show()

# %% [markdown]
# The trend report (`bia trend history/ -o trend.html`, or `analysis.render_trend`) puts the regressions first and
# then these figures for every series; `05_report.ipynb` shows how bia renders such a report.

# %%
shutil.rmtree(work)
