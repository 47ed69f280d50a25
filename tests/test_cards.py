"""What the cards, the report and the CLI lines show a person (issue 32 item 10, a new user in JupyterLab): times in one
format, a run's kernel mode as it was asked, the arm a run without arms is judged as in words, and wide tables that scroll
inside their card, every value escaped."""

from __future__ import annotations

import re

from conftest import LAMBDA, ROOT

from analysis import read_history, read_run
from analysis.views.html import first_op_html, mode_comparison_html, run_details_html
from analysis.views.html import run_review

# --- times in one format: analysis.core._cells.duration ---------------------------------------------------------------


def test_no_surface_formats_a_duration_by_hand():
    """Durations were written four ways ("2 s" from :g, "0.05 s" from %.2f, "{timeout} s" as given, a card's raw seconds):
    every one now goes through duration(). The one left is aprender's PMAT-044 batch line, which bia serve writes as aprender
    does because bia probe --server-log parses it."""
    by_hand = re.compile(r"\{[^{}]*:[^{}]*[fgde]\} ?(s|ms|sec|seconds|min)\b|%[-0-9.]*[fgd] ?(s|ms|sec|seconds)\b"
                         r"|\{[a-z_]*(_s|timeout|deadline|seconds|elapsed)\} ?s\b")
    found = [(str(path.relative_to(ROOT)), line.strip()) for path in sorted((ROOT / "analysis").rglob("*.py"))
             if path.name != "_cells.py" for line in path.read_text().splitlines() if by_hand.search(line)]
    assert found == [("analysis/serve/_engine.py", '"[PMAT-044] Batch m=%d done in %.2f ms (%.1f tok/s/slot)",')]


def test_the_report_shows_a_band_s_time_per_1000_sequences_as_a_duration():
    """The detail tables showed seconds per 1000 sequences as a bare 653.1 under "median s per 1000 seq"."""
    html = run_details_html(read_run(ROOT / "data" / "vllm-cpu" / "prefix-cache"), epsilon=0.05)
    header = re.search(r"<tr>(<th>.*?median time per 1000 seq</th>)</tr>\s*<tr>(.*?)</tr>", html, flags=re.S)
    assert header, "the per-c table has no time per 1000 sequences"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", header.group(2))
    assert re.fullmatch(r"\d+ min \d\d s|\d+(\.\d+)? s", cells[-1]), cells[-1]
    assert "s per 1000 seq" not in html


def test_the_history_card_shows_its_times_as_every_other_time():
    """The History card said "from 2026-09-02T14:59:58+00:00" where its own table said "2026-09-02 14:59 UTC"."""
    card = read_history(LAMBDA)._repr_html_()
    assert re.search(r"<th[^>]*>from</th><td[^>]*>2026-09-02 14:59 UTC</td>", card)
    assert "T14:59:58" not in card


# --- a run's kernel mode as it was asked ---------------------------------------------------------------------------------

ASKED = "batch-invariant (runs as one-by-one)"  # data/experiment-cpu/batch-invariant: requested batch-invariant, effective one-by-one


def test_every_surface_names_the_kernel_mode_as_it_was_asked():
    """The bundled batch-invariant run was asked for as batch-invariant (one-by-one's other name); its card, its Run card, the
    report's runs side by side and its first-op section called it one-by-one, a name the user never gave."""
    run = read_run(ROOT / "data" / "experiment-cpu" / "batch-invariant")
    assert dict(run_review(run, epsilon=0.05).about)["kernel mode"] == ASKED
    assert f"<th style=\"text-align:left\">kernel mode</th><td style=\"text-align:left\">{ASKED}</td>" in run._repr_html_()
    side_by_side = mode_comparison_html([read_run(ROOT / "data" / "experiment-cpu" / "default"), run])
    assert re.search(rf"<td[^>]*>{re.escape(ASKED)}</td>", side_by_side) and "<td>default</td>" in side_by_side
    assert f"In kernel mode {ASKED}, no batched decode step" in first_op_html(run)


def test_a_kernel_mode_that_ran_as_asked_is_named_once():
    run = read_run(ROOT / "data" / "experiment-cpu" / "fixed-tiles")
    assert dict(run_review(run, epsilon=0.05).about)["kernel mode"] == "fixed-tiles"
    assert "runs as" not in run._repr_html_() + first_op_html(run)


# --- the arm a judgement row names, in words ------------------------------------------------------------------------------


def test_a_judgement_row_says_what_its_arm_sent():
    """A run without arms is judged as one arm named after its layout; Jupyter's card of a run, and of its certificate, said
    "data/experiment-cpu/default (copies)", a word that alone does not say every slot held a copy of the prompt."""
    from analysis import certificate, judge
    from analysis.views.html import answer_section_html

    run = read_run(ROOT / "data" / "experiment-cpu" / "default")
    for card in (run._repr_html_(), certificate(run)._repr_html_()):
        assert "<code>data/experiment-cpu/default</code> (copies: every slot a copy of the prompt)</td>" in card.replace(str(ROOT) + "/", "")
    answer = answer_section_html(judge(run))  # the report's answer must fit a screen: the words are the arm's tooltip, and said below
    assert '(<span title="every slot a copy of the prompt">copies</span>)</td>' in answer
    assert answer.endswith("named after its layout): copies, every slot a copy of the prompt.</p>")


# --- wide tables in a notebook's cards ------------------------------------------------------------------------------------


def _jupyter_cards() -> dict[str, str]:
    """The HTML each bia object shows in Jupyter, and the report's fragments a notebook displays (03_probe shows the cards)."""
    from analysis import certificate, read_dump, read_witnesses
    from analysis.views.html import reviews_html

    run = read_run(ROOT / "data" / "experiment-cpu" / "batch-invariant")
    ws = read_witnesses(LAMBDA, progress=False)
    return {"history": read_history(LAMBDA)._repr_html_(), "run": run._repr_html_(), "certificate": certificate(run)._repr_html_(),
            "witnesses": ws._repr_html_(), "dump": read_dump(ROOT / "data" / "vllm-cpu" / "prefix-cache" / "captures" / "requests.jsonl")._repr_html_(),
            "reviews": reviews_html(ws, [run], epsilon=0.05), "details": run_details_html(run, epsilon=0.05)}


def test_the_history_card_shows_a_commit_in_10_characters_and_the_whole_hash_as_its_tooltip():
    """The History card's table gave a 40-character hash per row, most of the width a notebook's output has."""
    card = read_history(LAMBDA)._repr_html_()
    assert card.count('<td title="a765c86a5f5437c01bb327848787bbcda15249c7">a765c86a5f</td>') == 3
    assert ">a765c86a5f5437c01bb327848787bbcda15249c7<" not in card
    # its dates keep to one line (JupyterLab squeezed them into four): the table scrolls in its box instead
    assert card.count('<td style="white-space:nowrap">2026-09-02 14:59 UTC</td>') == 3


def test_every_table_box_of_a_card_scrolls_where_no_report_stylesheet_is_loaded():
    """.bia-scroll is the report stylesheet's class: a notebook loads no such stylesheet, so each box says so itself."""
    boxes = {name: re.findall(r'<div class="bia-scroll"[^>]*>', html) for name, html in _jupyter_cards().items()}
    assert all(boxes[name] for name in ("history", "witnesses", "dump", "reviews", "details")), boxes
    assert {box for found in boxes.values() for box in found} == {'<div class="bia-scroll" style="max-width:100%;overflow-x:auto">'}


def test_cards_in_a_narrow_notebook_keep_wide_tables_in_their_own_box(tmp_path):
    """In Chromium at a narrow notebook's width (480 px), with none of the report's CSS: nothing a card shows reaches past the
    page but inside a box that scrolls sideways."""
    import shutil

    import pytest

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not __import__("pathlib").Path(chromium).exists():
        pytest.skip("chromium is not installed here")
    from playwright.sync_api import sync_playwright

    page_html = "<!doctype html><meta charset=utf-8><body style='margin:0'>" + "".join(
        f"<section id='{name}'>{html}</section>" for name, html in _jupyter_cards().items()) + "</body>"
    (tmp_path / "cards.html").write_text(page_html, encoding="utf-8")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_context(viewport={"width": 480, "height": 800}).new_page()
        page.goto((tmp_path / "cards.html").as_uri())
        outside = page.evaluate("""() => {
            const right = document.body.getBoundingClientRect().right, found = [];
            const scrolls = e => { for (let p = e.parentElement; p; p = p.parentElement) {
                if (['auto', 'scroll'].includes(getComputedStyle(p).overflowX)) return true; } return false; };
            for (const e of document.querySelectorAll('body *')) {
                const r = e.getBoundingClientRect();
                if (r.right > right + 0.5 && !scrolls(e)) found.push(e.closest('section').id + ': ' + e.tagName.toLowerCase() + ' ' + Math.round(r.width) + 'px');
            }
            return found;
        }""")
        browser.close()
    assert outside == [], outside


def test_a_shortened_cell_keeps_untrusted_text_escaped_in_its_text_and_its_tooltip():
    from analysis.views.html import frame_html

    evil = '"><img src=x onerror="window.__pwned=1">' + "a" * 40  # a commit field is the witness file's, untrusted
    html = frame_html(__import__("polars").DataFrame({"commit": [evil]}), shorten={"commit": 10})
    assert "<img" not in html and 'onerror="' not in html
    assert '<td title="&#34;&gt;&lt;img src=x onerror=&#34;window.__pwned=1&#34;&gt;' + "a" * 40 + '">&#34;&gt;&lt;img src</td>' in html
