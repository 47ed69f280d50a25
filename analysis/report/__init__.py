"""The parity report: a parameterised notebook executed by papermill and exported as one
self-contained HTML file (no code, no network request).

The notebook stays thin: it displays the ``*_html`` fragments of ``analysis.views.html`` and the
``plot_*`` figures of ``analysis.views.plots``, which this module names too; what lives here is
the notebook's running (:func:`render_report`, :func:`execute_to_html`).
"""

from ..io import default_rl_pairs, default_runs, default_sources
from ..studies import largest_k3, mismatch_summaries, mismatch_tokens, mode_comparison, stale_pairs, trainer_pairs
from ..views.html import (
    admission_html,
    answer_section_html,
    bands_html,
    engines_html,
    figures_html,
    first_op_html,
    header_html,
    heading_html,
    judge_report,
    markers_html,
    mode_comparison_html,
    negative_control,
    provenance_html,
    reviews_html,
    rl_mismatch_html,
    rounded,
    run_details_html,
    run_html,
    run_tables_html,
    show_figure,
    table_html,
    verdicts_html,
    witness_details_html,
)
from ..views.plots import plot_first_ops, rl_mismatch_figures, run_curves, run_figures, witness_figures

# For the commands (analysis.cli), not the API reference: re-exported by name, kept out of __all__.
from ._inputs import ACCEPTS as ACCEPTS
from ._inputs import REPORT_READS as REPORT_READS
from ._inputs import is_lone as is_lone
from ._inputs import run_directories as run_directories
from ._inputs import run_directory_problem as run_directory_problem
from ._inputs import sort_sources as sort_sources
from ._notebook import DEFAULT_TITLE, ReportError, execute_to_html, export_html
from ._parity import notebook_path, render_report

__all__ = [
    "DEFAULT_TITLE",
    "ReportError",
    "admission_html",
    "answer_section_html",
    "bands_html",
    "default_rl_pairs",
    "default_runs",
    "default_sources",
    "engines_html",
    "execute_to_html",
    "export_html",
    "figures_html",
    "first_op_html",
    "header_html",
    "heading_html",
    "judge_report",
    "largest_k3",
    "markers_html",
    "mismatch_summaries",
    "mismatch_tokens",
    "mode_comparison",
    "mode_comparison_html",
    "negative_control",
    "notebook_path",
    "plot_first_ops",
    "provenance_html",
    "render_report",
    "reviews_html",
    "rl_mismatch_figures",
    "rl_mismatch_html",
    "rounded",
    "run_curves",
    "run_details_html",
    "run_figures",
    "run_html",
    "run_tables_html",
    "show_figure",
    "stale_pairs",
    "table_html",
    "trainer_pairs",
    "verdicts_html",
    "witness_details_html",
    "witness_figures",
]
