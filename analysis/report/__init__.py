"""The parity report: a parameterised notebook executed by papermill and exported as one
self-contained HTML file (no code, no network request).

The notebook stays thin: it calls the ``*_html`` functions here, which render escaped HTML
fragments with jinja2, and the ``plot_*`` functions of :mod:`analysis.plots`.
"""

from ..io._bundled import default_rl_pairs, default_runs, default_sources
from ..studies._modes import mode_comparison
from ..views._details import markers_html, negative_control, run_html, run_tables_html, table_html
from ._first_op import first_op_html, plot_first_ops
from ._figures import figures_html, run_curves, run_figures, show_figure, witness_figures
from ._notebook import DEFAULT_TITLE, ReportError, execute_to_html, export_html
from ._parity_report import (admission_html, answer_section_html, bands_html, engines_html, header_html, judge_report, heading_html, mode_comparison_html, notebook_path, provenance_html,
                             render_report, rounded, reviews_html, run_details_html, verdicts_html, witness_details_html)
from ._rl_mismatch import (largest_k3, mismatch_summaries, mismatch_tokens, rl_mismatch_figures, rl_mismatch_html, stale_pairs,
                           trainer_pairs)

__all__ = ["DEFAULT_TITLE", "ReportError", "admission_html", "answer_section_html", "bands_html", "default_rl_pairs", "default_runs", "default_sources", "engines_html", "figures_html", "judge_report",
           "execute_to_html", "export_html", "first_op_html", "header_html", "heading_html", "largest_k3", "markers_html",
           "mismatch_summaries", "mismatch_tokens", "mode_comparison", "mode_comparison_html", "negative_control", "notebook_path",
           "plot_first_ops", "provenance_html", "render_report", "reviews_html", "rl_mismatch_figures", "rl_mismatch_html", "rounded",
           "run_curves", "run_details_html", "run_figures", "run_html", "run_tables_html", "show_figure", "stale_pairs", "table_html",
           "trainer_pairs", "verdicts_html", "witness_details_html", "witness_figures"]
