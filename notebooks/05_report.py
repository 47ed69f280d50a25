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
#   title: 5. The parity report
# ---

# %% [markdown]
# # 5. The parity report: one offline HTML file
#
# `bia report` (in Python `analysis.render_report`) executes the report notebook `notebooks/parity_report.ipynb`
# with papermill, passing the sources and runs as parameters, then exports the executed notebook with nbconvert
# as one self-contained HTML file: code hidden, figures inlined as PNG with alt text, nothing loaded from the network.
#
# You will learn to render the report from Python, to look at it here and open it in a browser, and what a reader
# finds in it. With no sources and no runs it shows the embedded default: the real witnesses of notebook 1, the runs
# of notebook 2 and two of a real vLLM server (`analysis.default_runs()`). Rendering takes about 20 seconds: a second
# Jupyter kernel runs the report notebook. The page is written to `reports/` in the folder the notebook runs in, and
# kept: beside this notebook when JupyterLab opens it; where papermill runs it (its `--cwd`), or wherever `-p output
# PATH` says, under papermill.

# %% tags=["parameters"]
# Where to write the report, from the folder the kernel runs in (this notebook's in JupyterLab, papermill's --cwd),
# kept so that you can open it (running the notebook again replaces it).
output: str = "reports/parity-report.html"

# %%
import html
import re
from pathlib import Path

from IPython.display import FileLink, IFrame, display

import analysis

target = Path(output).resolve()  # said in full: the folder the kernel runs in is not always the notebook's
target.parent.mkdir(parents=True, exist_ok=True)
path = analysis.render_report(output=target, title="Batch-parity report (tutorial)", force=True)  # force: this notebook's own report
page = path.read_text(encoding="utf-8")
print(f"{path}: {len(page) / 1e6:.1f} MB")

# %% [markdown]
# Here it is as a browser shows it (scroll inside the frame), and a link that opens it in a tab of its own. The file
# stays where `output` put it.

# %%
display(FileLink(str(path)))
display(IFrame(str(path), width="100%", height=640))


# %% [markdown]
# The page opens offline: no script or stylesheet comes from the network, and every figure is inlined. Its
# sections are in the order a reviewer reads: the answer first (one row per run and witness, from
# `analysis.judge`), then the verdict cards, the figures and detail (collapsed), aprender's V3 release gate, and
# parameters and provenance.

# %%
def text(fragment: str) -> str:
    """The words of an HTML fragment."""
    return html.unescape(" ".join(re.sub(r"<[^>]+>", " ", fragment).split()))


sections = [text(h) for h in re.findall(r"<h2[^>]*>(.*?)</h2>", page, flags=re.S)]
figures = len(re.findall(r'<img\b[^>]*src="data:image/png;base64,', page))
collapsed = [text(s) for s in re.findall(r"<summary[^>]*>(.*?)</summary>", page, flags=re.S)]
remote = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(?:https?:)?//', page)
print(f"title: {text(re.findall(r'<title>(.*?)</title>', page, flags=re.S)[0])}")
print(f"sections: {' | '.join(sections)}")
print(f"collapsed parts: {len(collapsed)}")
print(f"{figures} figures inlined as PNG; {len(remote)} scripts or stylesheets from the network")

# %% [markdown]
# The answer table opens the page: each row carries its run, arm and verdict as `data-` attributes, the same
# verdict `bia certify` exits with. Each run and each witness file then gets a card whose headline is that
# verdict and its reason.

# %%
rows = re.findall(r"<tr ([^>]*data-verdict[^>]*)>", page)
answer = [dict(re.findall(r'([\w-]+)="([^"]*)"', attributes)) for attributes in rows]
print("Finding: the answer says " + ", ".join(f"{Path(row['data-run']).name} {row['data-verdict']}" for row in answer))

# %%
cards = re.findall(r'<article class="bia-card bia-review.*?<code>(.*?)</code>.*?<p class="bia-headline[^"]*">(.*?)</p>', page, flags=re.S)
print(f"Finding: the report's {len(cards)} verdict cards say")
for name, headline in cards:
    print(f"  {Path(text(name)).name}: {text(headline)}")

# %% [markdown]
# The same from a shell: `bia report -o parity-report.html` (the embedded default), `bia report RUN_DIR... -o
# report.html` for your runs, or `papermill notebooks/parity_report.ipynb out.ipynb -p title ...` to keep the
# executed notebook. This notebook's `output` parameter puts the page elsewhere.
