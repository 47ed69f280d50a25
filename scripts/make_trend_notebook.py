"""Write notebooks/trend_report.ipynb (the notebook `bia trend` executes) from the cell sources below.

Keeping the source here makes its diffs readable; the .ipynb is committed unexecuted, with no
outputs, and a test keeps it in step with this file.
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
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


def build() -> nbformat.NotebookNode:
    cells = []
    for kind, source in CELLS:
        if kind == "markdown":
            cells.append(new_markdown_cell(source))
        else:
            cell = new_code_cell(source)
            if kind == "parameters":
                cell.metadata["tags"] = ["parameters"]
            cells.append(cell)
    notebook = new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.metadata["language_info"] = {"name": "python"}
    return notebook


if __name__ == "__main__":
    target = Path(__file__).resolve().parent.parent / "notebooks" / "trend_report.ipynb"
    nbformat.write(build(), target)
    print(f"wrote {target}")
