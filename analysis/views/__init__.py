"""Views for people: every figure (:mod:`analysis.views.plots`), every HTML fragment and card (:mod:`analysis.views.html`),
and the terminal tables."""

from . import html, plots
from ._terminal import print_witness_tables
from .html import run_card

__all__ = ["html", "plots", "print_witness_tables", "run_card"]
