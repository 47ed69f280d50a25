"""Write the notebooks (notebooks/parity_report.ipynb, notebooks/probe_walkthrough.ipynb, notebooks/trend_report.ipynb) from the cell
sources below (run after editing them).

Keeping the notebook's source here makes its diffs readable; the .ipynb is committed
unexecuted, with no outputs.
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    (
        "parameters",
        '# bia parity report: run it with `bia report` or papermill. The verdict cards come first, then the figures, then the detail.\n'
        '# Witness and marker sources: files, folders, glob patterns or http(s) URLs.\n'
        '# With no sources and no runs, the embedded default: real perf041 witnesses from host "lambda", the CPU torch experiment and a llama.cpp server.\n'
        "sources: list = []\n"
        "# Run directories (manifest.json + captures/), as bia's probe and experiment write them.\n"
        "runs: list = []\n"
        "# The near-tie epsilon for the runs' margins (a margin explains a divergence iff 0 <= margin < epsilon).\n"
        "epsilon: float = 0.05\n"
        '# What batched requests are compared with: "ref1", "ref2" (the run\'s m=1 references), or another run directory.\n'
        'reference: str = "ref1"\n'
        "# The report's title.\n"
        'title: str = "Batch-parity report"\n'
        '# Overrides of aprender\'s V3 policy constants, e.g. {"model_prefix": "llama-3.1-8b"}; empty is aprender\'s.\n'
        "policy: dict = {}\n"
        "# Also judge every run by aprender's V3 release gate (always so when policy is given; witnesses are always judged).\n"
        "admission: bool = False",
    ),
    (
        "code",
        "import matplotlib.pyplot as plt\n"
        "from IPython.display import HTML, display\n\n"
        "import analysis\n"
        "from analysis import report\n"
        "from analysis.run import read_run\n\n"
        "v3_policy = analysis.V3Policy.from_mapping(policy)\n"
        "judge_runs = admission or bool(policy)\n"
        "default = not sources and not runs\n"
        "witness_sources = sources or ([] if runs else analysis.default_sources())\n"
        "run_paths = runs or ([] if sources else report.default_runs())\n"
        "ws = analysis.read_witnesses(witness_sources, progress=False)\n"
        "run_objects = [read_run(path) for path in run_paths]\n"
        'against = reference if reference in ("ref1", "ref2") else read_run(reference)\n'
        "display(HTML(report.header_html(title, ws, run_objects, default=default, admission=bool(ws.sources) or judge_runs)))\n"
        "display(HTML(report.reviews_html(ws, run_objects, epsilon=epsilon, reference=against)))\n"
        "if len(run_objects) > 1:\n"
        '    display(HTML("<h2>Runs side by side</h2><p>Per run and batch size: the share of requests whose float32 logprobs are bit-identical to '
        "the reference, token flips, the largest ULP distance, the median decode rate and that rate over the default mode's in the same folder: "
        "the parity a kernel mode buys and what it costs.</p>\"))\n"
        "    display(HTML(report.mode_comparison_html(run_objects, reference=against)))",
    ),
    (
        "code",
        'display(HTML("<h2>Figures</h2>"))\n'
        "if ws.sources:\n"
        '    display(HTML("<h3>Witnesses</h3>"))\n'
        "    for fig, alt in report.witness_figures(ws):\n"
        "        report.show_figure(fig, alt)\n"
        "for run in run_objects:\n"
        '    display(HTML(report.heading_html("Run", str(run.path))))\n'
        "    for fig, alt in report.run_figures(run, epsilon=epsilon, reference=against):\n"
        "        report.show_figure(fig, alt)",
    ),
    (
        "code",
        'display(HTML("<h2>Detail</h2><p>Each run\'s provenance, negative control, forks and per-prompt tables, and each witness set\'s '
        'bands and markers; long tables show their worst rows and count the rest.</p>"))\n'
        "for run in run_objects:\n"
        "    display(HTML(report.run_details_html(run, epsilon=epsilon, reference=against)))\n"
        "if ws.sources:\n"
        "    display(HTML(report.witness_details_html(ws)))",
    ),
    (
        "code",
        "if ws.sources or judge_runs:\n"
        "    display(HTML(report.admission_html(ws, ws.shape_checks(v3_policy), run_objects if judge_runs else [], v3_policy)))\n"
        'parameters = {"sources": witness_sources, "runs": run_paths, "epsilon": epsilon, "reference": reference, "policy": policy,\n'
        '              "admission": judge_runs}\n'
        "display(HTML(report.provenance_html(parameters, ws, v3_policy, run_objects, default=default)))",
    ),
]


WALKTHROUGH = [
    ("markdown", "*Probe a server across batch sizes.* The same greedy request alone and in batches of c, every token with its logprobs, "
                 "candidates and arrival time, the batch widths the server really formed, and what parted from the m=1 reference. "
                 "With no `url`, this notebook starts `bia serve` (the repository's tiny model on CPU) inside its own kernel."),
    (
        "parameters",
        "# An OpenAI-compatible server (vLLM, SGLang, llama.cpp, apr serve, ...); empty starts bia serve in this kernel.\n"
        'url: str = ""\n'
        '# bia serve\'s kernel mode when url is empty: "default", "one-by-one" or "fixed-tiles".\n'
        'mode: str = "default"\n'
        "# The server's log, for the batch width of every decode step (bia serve started here writes one next to the run).\n"
        'server_log: str = ""\n'
        "# The prompts, the batch sizes, and the tokens per request.\n"
        'prompts: list = ["If the argument is"]\n'
        "ladder: list = [1, 4, 8]\n"
        "max_tokens: int = 24\n"
        "# Fire each band again without logprobs and compare the texts (the observer effect).\n"
        "observer: bool = False\n"
        "# The run directory to write; empty picks a new one under runs/.\n"
        'output: str = ""',
    ),
    (
        "code",
        "import time\n"
        "from pathlib import Path\n\n"
        "import matplotlib.pyplot as plt\n"
        "from IPython.display import display\n\n"
        "from analysis import plots\n"
        "from analysis.probe import probe\n"
        "from analysis.run import band_table, observer_table, read_run, slot_table, width_table\n\n"
        'output = output or f"runs/walkthrough-{time.strftime(\'%Y%m%d-%H%M%S\')}"\n'
        "server = None\n"
        "if not url:  # bia serve in this kernel, logging each decode step's batch width\n"
        "    from analysis.serve import BackgroundServer\n\n"
        "    Path(output).parent.mkdir(parents=True, exist_ok=True)\n"
        '    server_log = server_log or f"{output}.serve.log"\n'
        "    server = BackgroundServer(mode, log_file=server_log)\n"
        "    url = server.url\n"
        "try:\n"
        "    run_dir = await probe(url, output, prompts=prompts, ladder=ladder, max_tokens=max_tokens, server_log=server_log or None,\n"
        "                          observer=observer, progress=False, say=print)\n"
        "finally:\n"
        "    if server is not None:\n"
        "        server.stop()\n"
        "run = read_run(run_dir)\n"
        'print(f"wrote {run_dir}: {run.dump.requests.height} requests; missing: {len(run.missing())}")',
    ),
    ("markdown", "Per band: the widths the server formed, how far the slots agree with the m=1 reference, and the median decode rate."),
    ("code", "bands = band_table(run)\n"
             'bands.select("prompt_id", "band_c", "repeat", "widths_seen", "divergence_min", "divergence_max", "diverged_slots", "decode_tok_s",\n'
             '             "s_per_1000_seq")'),
    ("markdown", "Per request: the first divergence, the bitwise-equal float32 prefix and the largest ULP distance before it, the "
                 "reference's margin where the streams parted, and the request's own decode rate."),
    ("code", "slots = slot_table(run)\n"
             'slots.select("prompt_id", "band_c", "slot", "agree_to", "divergence_at", "bitwise_prefix", "max_ulp", "reference_margin",\n'
             '             "k3_max", "decode_tok_s")'),
    (
        "code",
        "fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))\n"
        "plots.plot_band_widths(width_table(run), ax=axes[0])\n"
        "plots.plot_run_divergence(slots, declared_min=run.declared_min, ax=axes[1])\n"
        "plots.plot_run_decode_rate(bands, ax=axes[2])\n"
        "fig.tight_layout()\n"
        "plt.show()",
    ),
    ("code", "if observer:\n    display(observer_table(run))"),
    ("markdown", "The whole parity report of this run, as one offline HTML file: `bia report RUN_DIR -o report.html`."),
]

TREND = [
    ("markdown", "*bia trend report.* Run it with `bia trend` or papermill: a history of runs, witnesses and release markers over time."),
    (
        "parameters",
        "# History folders, run directories, witness and marker files or URLs; empty: the embedded history.\n"
        "history: list = []\n"
        "# The report's title.\n"
        'title: str = "Batch-invariance trend"',
    ),
    (
        "code",
        "import matplotlib.pyplot as plt\n"
        "from IPython.display import HTML, display\n\n"
        "import analysis\n"
        "from analysis import report, trend\n\n"
        "sources = history or trend.default_history_sources()\n"
        "past = analysis.read_history(sources)\n"
        "display(HTML(trend.header_html(title, history, past)))\n"
        "display(HTML(trend.regressions_html(past)))",
    ),
    (
        "code",
        "for key in trend.series_keys(past):\n"
        "    display(HTML(f\"<h2>{' / '.join(analysis._show.cell(k) for k in key)}</h2>\"))\n"
        "    for metric, label, words in trend.METRICS:\n"
        "        fig, ax = plt.subplots(figsize=(8, 3.2))\n"
        "        trend.plot_trend(past, key, metric, ax=ax)\n"
        "        if ax.get_lines() and any(line.get_label().startswith('c=') for line in ax.get_lines()):\n"
        "            report.show_figure(fig, trend.figure_alt(key, metric))\n"
        "        else:\n"
        "            plt.close(fig)",
    ),
    ("code", "display(HTML(trend.entries_html(past)))"),
]

NOTEBOOKS = {
    "parity_report.ipynb": ("Batch-parity report", CELLS),
    "probe_walkthrough.ipynb": ("Probe a server across batch sizes", WALKTHROUGH),
    "trend_report.ipynb": ("Batch-invariance trend", TREND),
}


def build(cells_source=CELLS, title: str = "Batch-parity report") -> nbformat.NotebookNode:
    cells = []
    for index, (kind, source) in enumerate(cells_source):
        if kind == "markdown":
            cells.append(new_markdown_cell(source))
        else:
            cell = new_code_cell(source)
            if kind == "parameters":
                cell.metadata["tags"] = ["parameters"]
            cells.append(cell)
        cells[-1].id = f"cell-{index}"  # stable ids: regenerating gives the same file
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["title"] = title
    return nb


if __name__ == "__main__":
    for name, (title, cells_source) in NOTEBOOKS.items():
        target = Path(__file__).resolve().parent.parent / "notebooks" / name
        nbformat.write(build(cells_source, title), target)
        print(f"wrote {target}")
