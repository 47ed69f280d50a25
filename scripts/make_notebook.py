"""Write notebooks/parity_report.ipynb from the cell sources below (run after editing them).

Keeping the notebook's source here makes its diffs readable; the .ipynb is committed
unexecuted, with no outputs.
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    ("markdown", "*bia parity report.* Run it with `bia report` or papermill; the parameters and provenance come first, then the verdicts, the bands and the plots."),
    (
        "parameters",
        '# Witness and marker sources: files, folders, glob patterns or http(s) URLs.\n'
        '# Empty means the embedded default: real perf041 witnesses from host "lambda".\n'
        "sources: list = []\n"
        "# The report's title.\n"
        'title: str = "Batch-parity report"\n'
        '# Overrides of the V3 policy\'s constants, e.g. {"model_prefix": "llama-3.1-8b"}; empty is aprender\'s.\n'
        "policy: dict = {}",
    ),
    (
        "code",
        "import matplotlib.pyplot as plt\n"
        "from IPython.display import HTML, display\n\n"
        "import analysis\n"
        "from analysis import plots, report\n\n"
        "v3_policy = analysis.V3Policy.from_mapping(policy)\n"
        "ws = analysis.read_witnesses(sources or analysis.default_sources(), progress=False)\n"
        "verdicts = ws.shape_checks(v3_policy)\n"
        'display(HTML(report.header_html(title, {"sources": sources, "policy": policy}, ws, v3_policy)))',
    ),
    ("markdown", "## Verdicts\n\nEach witness's run verdict as recorded and as re-derived by the rules of its own `witness_version`, and aprender's V3 serving-shape verdict with its reasons."),
    ("code", "display(HTML(report.verdicts_html(ws, verdicts)))"),
    ("markdown", "## Bands\n\nOne row per band: the batch width the server formed (`m_formed`), where the band parted from the m=1 reference (`divergence_at`), the reference's top-2 margin there, the per-request decode rate, and the band result as recorded and as re-derived."),
    ("code", "display(HTML(report.bands_html(ws)))"),
    ("markdown", "## Divergence from m=1 against batch size"),
    (
        "code",
        "fig, ax = plt.subplots(figsize=(8, 4.5))\n"
        "plots.plot_divergence(ws.bands, ax=ax)\n"
        'report.show_figure(fig, "divergence_at against batch size c for each witness, with declared_min marked")',
    ),
    ("markdown", "## Decode rate against batch size\n\nS7 asks that the per-request rate at c=4 be at least 50% of c=1's; the dotted line is that bar."),
    (
        "code",
        "fig, ax = plt.subplots(figsize=(8, 4.5))\n"
        "plots.plot_decode_rate(ws.bands, ax=ax)\n"
        'report.show_figure(fig, "per-request decode rate against batch size c, with the 50%-of-c=1 line")',
    ),
    ("markdown", "## Environment knobs that differ between witnesses"),
    (
        "code",
        "display(HTML(report.table_html(plots.differing_env_knobs(ws.witnesses), empty='No env knob differs between the witnesses.')))\n"
        "fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * max(1, ws.witnesses.height)))\n"
        "plots.plot_env_knobs(ws.witnesses, ax=ax)\n"
        'report.show_figure(fig, "kernel env knobs that differ between witnesses")',
    ),
    ("markdown", "## Release markers"),
    ("code", "display(HTML(report.markers_html(ws)))"),
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
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["title"] = "Batch-parity report"
    return nb


if __name__ == "__main__":
    target = Path(__file__).resolve().parent.parent / "notebooks" / "parity_report.ipynb"
    nbformat.write(build(), target)
    print(f"wrote {target}")
