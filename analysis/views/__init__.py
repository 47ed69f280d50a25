"""Views for people: every figure (:mod:`analysis.views.plots`), every HTML fragment and card (:mod:`analysis.views.html`),
and the terminal tables."""

from . import html, plots
from ._terminal import print_witness_tables
from .html import dump_card, history_card, run_card, shape_verdict_card, study_card, witness_card

__all__ = [
    "dump_card",
    "history_card",
    "html",
    "plots",
    "print_witness_tables",
    "run_card",
    "shape_verdict_card",
    "study_card",
    "witness_card",
]
