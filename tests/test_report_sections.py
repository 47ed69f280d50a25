"""analysis.report's face (issue 44, item 6): a handful of documented sections, each one call in a user's notebook, that
the report notebook calls in order and that render one judgement's rows; the HTML helpers below them are not its surface."""

from __future__ import annotations

import ast
import inspect
import re

import pytest
from conftest import ROOT
from IPython.core.formatters import format_display_data
from numpydoc.docscrape import NumpyDocString

import analysis
from analysis import report
from analysis.report import _sections
from analysis.views.html import answer_section_html

SECTIONS = ["answer", "detail", "figures", "gate", "header", "mismatch", "provenance", "runs"]
DEFAULT = "data/experiment-cpu/default"


def test_the_face_is_the_sections_and_render_report():
    assert report.__all__ == sorted([*SECTIONS, "ReportError", "Section", "export_html", "render_report"])
    # the 43 names of old are gone from analysis.report (they live in analysis.views, their home)
    for old in ("answer_section_html", "bands_html", "run_details_html", "reviews_html", "judge_report", "figures_html",
                "show_figure", "run_figures", "trainer_pairs", "default_runs", "table_html"):
        assert not hasattr(report, old), old
    for name in SECTIONS:
        doc = NumpyDocString(inspect.getdoc(getattr(report, name)))
        assert doc["Parameters"] and doc["Returns"][0].type == "Section" and "report." in "\n".join(doc["Examples"]), name


def test_the_docs_show_one_section_with_one_call():
    """docs/report.md's snippet, run as a notebook runs it: its last line is the section Jupyter displays."""
    text = (ROOT / "docs" / "report.md").read_text(encoding="utf-8")
    block = re.search(r"## One section in your own notebook\n.*?```python\n(.*?)```", text, flags=re.S).group(1)
    *body, last = ast.parse(block).body
    assert isinstance(last, ast.Expr) and len([node for node in ast.walk(last) if isinstance(node, ast.Call)]) == 2  # one call, one read
    namespace: dict = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), "report.md", "exec"), namespace)
    shown = eval(compile(ast.Expression(last.value), "report.md", "eval"), namespace)
    formats, _ = format_display_data(shown)
    assert formats["text/plain"].startswith("Section('answer', ")
    html = formats["text/html"]
    assert html == answer_section_html(analysis.judge(DEFAULT))  # the report's own answer, for this run
    assert '<table id="answer"' in html and 'data-verdict="RED"' in html


def test_a_section_takes_runs_as_objects_or_directories():
    run = analysis.read_run(DEFAULT)
    assert report.answer(run) == report.answer(DEFAULT) == report.answer([DEFAULT])
    one, two = report.runs(run)._repr_html_(), report.runs([run, "data/experiment-cpu/fixed-tiles"])._repr_html_()
    assert one.count('<article class="bia-card bia-review') == 1 and "Runs side by side" not in one
    assert two.count('<article class="bia-card bia-review') == 2 and "Runs side by side" in two
    assert report.mismatch([]) == report.Section("mismatch", "")
    assert "Nothing to judge" in report.answer()._repr_html_()


def test_sections_given_a_judgement_render_it_and_judge_nothing(monkeypatch):
    import analysis.studies

    run, ws = analysis.read_run(DEFAULT), analysis.read_witnesses("data/aprender-lambda", progress=False)
    judgement = analysis.judge([run, ws])
    calls = []
    real = analysis.studies.judge
    monkeypatch.setattr(analysis.studies, "judge", lambda *a, **k: calls.append(a) or real(*a, **k))  # what every view calls
    answer = report.answer(run, ws, judgement=judgement)._repr_html_()
    cards = report.runs(run, ws, judgement=judgement)._repr_html_()
    report.gate([], ws, judgement=judgement)
    assert calls == []  # no section judged again
    # the answer's rows are the judgement's: one per run and arm and per witness file, in its order
    rows = judgement.frame.select("arm", "verdict").rows()
    assert re.findall(r'<tr data-run="[^"]*" data-arm="([^"]*)" data-verdict="(\w+)"', answer) == rows
    assert 'data-verdict="RED"' in cards
    report.answer(run, ws)
    assert len(calls) == 1  # judged here, once, when no judgement is given


def test_the_report_notebook_calls_the_sections_and_opens_runs_in_one_statement():
    source = (ROOT / "notebooks" / "parity_report.py").read_text(encoding="utf-8")
    called = {node.attr for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "report"}
    assert called == set(SECTIONS)
    # the run directories and studies opened a piece at a time, in one statement of their own
    assert source.count("\nrun_objects = open_runs(run_paths)") == 1


@pytest.mark.slow
def test_every_section_displays_in_jupyter():
    run, ws = analysis.read_run(DEFAULT), analysis.read_witnesses("data/aprender-lambda", progress=False)
    shown = [report.header("t", run, ws), report.answer(run, ws), report.runs(run, ws), report.figures(run, ws),
             report.detail(run, ws), report.gate(run, ws), report.provenance(run, ws),
             report.mismatch(analysis.trainer_pairs([DEFAULT]))]
    assert [section.name for section in shown] == ["header", "answer", "runs", "figures", "detail", "gate", "provenance", "mismatch"]
    for section in shown:
        formats, _ = format_display_data(section)
        assert formats["text/html"] == section.html and section.html.strip(), section.name
        assert "<script" not in section.html
