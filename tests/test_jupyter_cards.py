"""Issue 44 item 2 and its minor items: every card leads with bia's verdict, in the report's colours, in Jupyter too.

Tried in JupyterLab, the witness card showed "witness@464c168e62.json: recorded PASS, re-derived PASS" while ``judge``
said RED (run-to-run); the verdict words were plain black and the reason column right-aligned (Jupyter loads no report
stylesheet); the vLLM card's cost named no baseline; "UNVERIFIED" broke as "UNVERIFIE / D" in the report's answer.
"""

from __future__ import annotations

import re

from conftest import LAMBDA, ROOT

import analysis
from analysis.views.html import blocks

REPORT_CSS = (ROOT / "analysis" / "report" / "nbconvert" / "bia" / "report.css").read_text()


def _text(html: str) -> str:
    html = re.sub(r"<style>.*?</style>", " ", html, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_the_witness_card_leads_with_bias_verdict_and_shows_the_recorded_one_as_recorded():
    ws = analysis.read_witnesses(LAMBDA, progress=False)
    html = ws._repr_html_()
    rows = {r["run"].rsplit("/", 1)[-1]: r for r in analysis.judge(ws)}
    text = _text(html)
    assert text.startswith("verdict run (arm)")  # the answer table comes first
    first_verdict = html.index('data-verdict="')
    assert first_verdict < html.index("bia witnesses") < html.index("as recorded in the file")
    assert html.count('data-verdict="RED"') == len(rows) == 3
    line = "witness@464c168e62.json: bia RED (run-to-run); as recorded in the file PASS, re-derived by its rules PASS"
    assert line in text
    assert re.search(r'<li class="bia-fail">[^<]*witness@464c168e62\.json: bia RED', html)


def test_every_card_carries_the_reports_verdict_colours_into_jupyter_light_and_dark():
    # the report's colours are the ones the card carries for a light theme
    for name, (light, dark) in blocks.VERDICT_COLOURS.items():
        assert re.search(rf"\.bia-{name} {{ color: {light};", REPORT_CSS), name
        assert light != dark
    run = analysis.read_run(ROOT / "data" / "vllm-cpu" / "prefix-cache")
    cards = [run._repr_html_(), analysis.judge(run)._repr_html_(), analysis.read_witnesses(LAMBDA, progress=False)._repr_html_()]
    for html in cards:
        assert html.startswith('<div class="bia-jupyter"><style>')
        style = re.search(r"<style>(.*?)</style>", html, flags=re.S).group(1)
        assert ".bia-jupyter .bia-warn{color:#9a6700" in style and ".bia-jupyter .bia-fail{color:#cf222e" in style
        assert 'body[data-jp-theme-light="false"] .bia-jupyter .bia-fail' in style  # JupyterLab's dark theme
        # JupyterLab aligns table cells right; the reason column reads from the left, as in the report
        assert ".jp-RenderedHTMLCommon .bia-jupyter td" in style and "text-align:left" in style
        assert "td[data-verdict-cell]{white-space:nowrap" in style


def test_unverified_never_breaks_inside_its_word_in_the_reports_answer():
    html = analysis.views.html.answer_html(analysis.judge(ROOT / "data" / "vllm-cpu" / "prefix-cache"))
    assert re.search(r'<td class="bia-warn" data-verdict-cell><b>UNVERIFIED</b></td>', html)
    assert re.search(r"\.bia-answer td\[data-verdict-cell\] \{ white-space: nowrap; overflow-wrap: normal; \}", REPORT_CSS)
    assert ".bia-answer th:nth-child(1) { width: max(9%, 7.6em); }" in REPORT_CSS  # "UNVERIFIED" in bold at .78rem fits 7.6em


def test_the_vllm_card_says_which_c1_baseline_its_cost_is_over():
    """vLLM's run timed its two c=1 requests at 228 and 91 tok/s: the cost is over their median, and the card says so."""
    run = analysis.read_run(ROOT / "data" / "vllm-cpu" / "prefix-cache")
    (row,) = analysis.judge(run).to_dicts()
    assert row["cost_by_c"][0]["base_rates"] == 2
    text = _text(run._repr_html_())
    assert "1.00× / 0.84× / 0.26× at c=4 / 8 / 16 (over baseline 160 tok/s: the median of 2 c=1 requests, streams’ timings)" in text
    # the report's answer, which must fit a screen, keeps the baseline in the cell's tooltip
    short = analysis.views.html.answer_html(analysis.judge(run))
    assert 'title="baseline 160 tok/s: the median of 2 c=1 requests, streams’ timings"' in short
