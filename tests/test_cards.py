"""What the cards, the report and the CLI lines show a person (issue 32 item 10, a new user in JupyterLab): times in one
format, a run's kernel mode as it was asked, the arm a run without arms is judged as in words, and wide tables that scroll
inside their card, every value escaped."""

from __future__ import annotations

import re

from conftest import LAMBDA, ROOT

from analysis import read_history, read_run
from analysis.report import first_op_html, mode_comparison_html, run_details_html
from analysis.views._review import run_review

# --- times in one format: analysis.core._cells.duration ---------------------------------------------------------------


def test_no_surface_formats_a_duration_by_hand():
    """Durations were written four ways ("2 s" from :g, "0.05 s" from %.2f, "{timeout} s" as given, a card's raw seconds):
    every one now goes through duration(). The one left is aprender's PMAT-044 batch line, which bia serve writes as aprender
    does because bia probe --server-log parses it."""
    by_hand = re.compile(r"\{[^{}]*:[^{}]*[fgde]\} ?(s|ms|sec|seconds|min)\b|%[-0-9.]*[fgd] ?(s|ms|sec|seconds)\b"
                         r"|\{[a-z_]*(_s|timeout|deadline|seconds|elapsed)\} ?s\b")
    found = [(str(path.relative_to(ROOT)), line.strip()) for path in sorted((ROOT / "analysis").rglob("*.py"))
             if path.name != "_cells.py" for line in path.read_text().splitlines() if by_hand.search(line)]
    assert found == [("analysis/serve.py", 'LOG.info("[PMAT-044] Batch m=%d done in %.2f ms (%.1f tok/s/slot)", m, 1000 * elapsed, '
                                           '1 / elapsed if elapsed > 0 else 0.0)')]


def test_the_report_shows_a_band_s_time_per_1000_sequences_as_a_duration():
    """The detail tables showed seconds per 1000 sequences as a bare 653.1 under "median s per 1000 seq"."""
    html = run_details_html(read_run(ROOT / "data" / "vllm-cpu" / "prefix-cache"), epsilon=0.05)
    header = re.search(r"<tr>(<th>.*?median time per 1000 sequences</th>)</tr>\s*<tr>(.*?)</tr>", html, flags=re.S)
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
    from analysis.report import answer_section_html

    run = read_run(ROOT / "data" / "experiment-cpu" / "default")
    for card in (run._repr_html_(), certificate(run)._repr_html_()):
        assert "<code>data/experiment-cpu/default</code> (copies: every slot a copy of the prompt)</td>" in card.replace(str(ROOT) + "/", "")
    answer = answer_section_html(judge(run))  # the report's answer must fit a screen: the words are the arm's tooltip, and said below
    assert '(<span title="every slot a copy of the prompt">copies</span>)</td>' in answer
    assert answer.endswith("named after its layout): copies, every slot a copy of the prompt.</p>")
