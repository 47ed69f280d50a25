"""Every HTML fragment bia shows: the reports' headers, the answer's section, the verdict cards, the tables and details, the
sections on attribution, first ops and the sampler-trainer mismatch, the trend's regressions and entries, figures as PNGs, and
the card Jupyter shows for each of bia's objects (:mod:`.cards`, bound by the package face).

Every value is formatted for people (:mod:`analysis.core._cells`) and escaped by the templates (``templates/``, rendered by
:mod:`.blocks`, the one jinja2 environment); the reports' notebooks only display these (:mod:`analysis.report`).
"""

from .admission import admission_html, rounded, run_admission, verdicts_html
from .answer import CSS, answer_html, judgement_html
from .attribution import attribution_html
from .blocks import Section, frame_html, render, scroll_box, summary_html
from .cards import count_notes, dump_card, history_card, run_card, shape_verdict_card, study_card, witness_card
from .engines import engines_html, mode_comparison_html
from .figures import figures_html, png_base64, show_figure
from .first_ops import first_op_html
from .headers import header_html, heading_html, series_heading_html
from .mismatch import rl_mismatch_html
from .parity import (
    answer_section_html,
    bands_html,
    judge_report,
    provenance_html,
    reviews_html,
    run_details_html,
    witness_details_html,
)
from .review import run_review
from .run_provenance import negative_control, run_html
from .run_tables import run_tables_html
from .tables import markers_html, table_html, witness_bands_html, worst_html
from .trend import entries_html, regressions_html
from .verdict_card import Review
from .witness_review import witness_reviews

__all__ = [
    "CSS",
    "Review",
    "Section",
    "admission_html",
    "answer_html",
    "answer_section_html",
    "attribution_html",
    "bands_html",
    "count_notes",
    "dump_card",
    "engines_html",
    "entries_html",
    "figures_html",
    "first_op_html",
    "frame_html",
    "header_html",
    "heading_html",
    "history_card",
    "judge_report",
    "judgement_html",
    "markers_html",
    "mode_comparison_html",
    "negative_control",
    "png_base64",
    "provenance_html",
    "regressions_html",
    "render",
    "reviews_html",
    "rl_mismatch_html",
    "rounded",
    "run_admission",
    "run_card",
    "run_details_html",
    "run_html",
    "run_review",
    "run_tables_html",
    "scroll_box",
    "series_heading_html",
    "shape_verdict_card",
    "show_figure",
    "study_card",
    "summary_html",
    "table_html",
    "verdicts_html",
    "witness_bands_html",
    "witness_card",
    "witness_details_html",
    "witness_reviews",
    "worst_html",
]
