"""The parity report: a parameterised notebook executed by papermill and exported as one self-contained HTML file (no
code, no network request), and its sections, each one call in any notebook.

:func:`render_report` runs the whole report (``bia report``). The report notebook is a few section calls in order, and a
notebook of your own can show any of them: :func:`header`, :func:`answer`, :func:`runs` (the verdict cards, and the runs
and engines side by side), :func:`figures`, :func:`detail`, :func:`gate` (aprender's V3 admission), :func:`mismatch` (the
sampler-trainer pairs) and :func:`provenance`. Each takes runs and/or witnesses and returns a :class:`Section` Jupyter
displays; the HTML fragments below them live in ``analysis.views`` and are not this package's surface.

Examples
--------
>>> import analysis
>>> section = analysis.report.answer(analysis.read_run("data/experiment-cpu/default"))
>>> section.name, 'data-verdict="RED"' in section._repr_html_()
('answer', True)
"""

from ._inputs import ACCEPTS as ACCEPTS  # for the commands (analysis.cli, analysis.testing): by name, not in __all__
from ._inputs import REPORT_READS as REPORT_READS
from ._inputs import is_lone as is_lone
from ._inputs import run_directories as run_directories
from ._inputs import run_directory_problem as run_directory_problem
from ._inputs import sort_sources as sort_sources
from ._notebook import ReportError, export_html
from ._parity import render_report
from ._sections import Section, answer, detail, figures, gate, header, mismatch, provenance, runs

__all__ = [
    "ReportError",
    "Section",
    "answer",
    "detail",
    "export_html",
    "figures",
    "gate",
    "header",
    "mismatch",
    "provenance",
    "render_report",
    "runs",
]
