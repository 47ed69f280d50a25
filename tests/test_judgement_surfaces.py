"""One judgement, every surface: for every bundled run and arm (and witness), the verdict of analysis.judge is the one
certificate.json and bia certify's exit code give, the answer table and the run's card carry, the probe's closing line
begins with, the trend's entry holds and Jupyter's views show. Then the cases issue 31 found disagreeing, as regressions."""

from __future__ import annotations

import json
import re
import shutil

import polars as pl
import pytest
from _cli import bia
from conftest import ROOT

from analysis import judge, read_history, read_run, read_witnesses
from analysis.probe._summary import result_line
from analysis.views.html import answer_section_html, judge_report, reviews_html
from analysis.studies._judgement_frame import EXIT_CODES

pytestmark = pytest.mark.slow

DATA = ROOT / "data"
RUNS = sorted(str(p.parent.relative_to(ROOT)) for p in DATA.glob("*/*/manifest.json"))


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """Every bundled run read once, judged once, with its witnesses."""
    runs = [read_run(ROOT / run) for run in RUNS]
    ws = read_witnesses(DATA / "aprender-lambda", progress=False)
    return runs, ws, judge_report(ws, runs)


def _verdicts(html: str, tag: str) -> dict[str, str]:
    return {run: verdict for run, verdict in re.findall(rf'<{tag}[^>]* data-run="([^"]+)"[^>]* data-verdict="(\w+)"', html)}


def test_every_bundled_run_has_one_verdict_on_every_surface(bundled, tmp_path):
    runs, ws, judgement = bundled
    frame = judgement.frame
    assert len(RUNS) == 10 and frame.height == 10 + 3  # one arm a run, and each witness
    per_run = dict(frame.group_by("run", maintain_order=True).agg(pl.col("verdict").first()).iter_rows())
    # the answer table and the cards
    answer = answer_section_html(judgement)
    assert {run: verdict for run, verdict in re.findall(r'<tr data-run="([^"]+)" data-arm="\w+" data-verdict="(\w+)"', answer)} == per_run
    cards = reviews_html(ws, runs, epsilon=0.05, judgement=judgement)
    assert _verdicts(cards, "article") == {run.label: per_run[run.label] for run in runs} | {
        name: per_run[source] for name, source in _witness_names(ws).items()}
    for card_run, verdict in _verdicts(cards, "article").items():  # each card's headline begins with its verdict word
        article = cards.split(f'data-run="{card_run}"')[1].split("</article>")[0]
        assert re.search(rf'class="bia-headline bia-\w+">{verdict}\b', article)
    for run in runs:
        verdict = per_run[run.label]
        # the probe's closing line and the run's own card in Jupyter
        assert result_line(run.path).startswith(verdict)
        assert f'data-verdict="{verdict}"' in run._repr_html_()
        # bia certify, its file and its exit code
        out = tmp_path / f"{run.path.name}.json"
        done = bia("certify", str(run.path), "-o", str(out))  # bia's 300 s limit; it had none
        document = json.loads(out.read_text())
        assert [arm["verdict"] for arm in document["arms"]] == frame.filter(pl.col("run") == run.label)["verdict"].to_list()
        assert done.returncode == document["exit_code"] == EXIT_CODES[verdict], done.stdout + done.stderr
        assert done.stdout.startswith(verdict)
    # the trend's entries: runs and witnesses
    history = read_history([*[run.path for run in runs], *ws.sources]).entries
    assert dict(history.filter(pl.col("kind") == "run").select(pl.col("source"), "verdict").iter_rows()) == {
        str(run.path): per_run[run.label] for run in runs}
    assert dict(history.filter(pl.col("kind") == "witness").select("source", "verdict").iter_rows()) == {
        source: per_run[source] for source in _witness_names(ws).values()}


def _witness_names(ws) -> dict[str, str]:
    """A witness card's data-run is its label (the file and its version), its judgement row's run its source."""
    from analysis.views.plots import witness_label

    return {witness_label(row["source"], row["witness_version"]): row["source"] for row in ws.to_backend("polars").witnesses.iter_rows(named=True)}


def test_the_judgement_shows_in_jupyter_as_the_answer_with_its_reason_in_full(bundled):
    _, _, judgement = bundled
    import html

    page = judgement._repr_html_()
    shown = html.unescape(re.sub(r"<[^>]+>", " ", page))
    for row in judgement:  # every reason whole, in its row's why, beside its verdict, as a table of one row per run and arm
        assert row["reason"] in shown and row["next_step"] in shown
    assert page.count("<tr data-run=") == len(judgement) and "<th>why</th>" in page
    assert repr(judgement).splitlines()[0].startswith(judgement.frame["verdict"][0])


# --- the cases issue 31 found, each with one verdict now -------------------------------------------


def test_the_cache_prompt_run_is_red_for_its_prompt_cache_not_for_c1():
    row = judge(DATA / "llamacpp-cpu" / "cache-prompt").frame.row(0, named=True)
    assert (row["verdict"], row["cause"]) == ("RED", "prompt cache")
    assert row["first_request"]["role"] == "ref #2" and row["first_request"]["c"] is None
    assert "c=1" not in row["first"] and "--no-cache-prompt" in row["next_step"]
    # the one ULP figure of the run: its batched requests against m=1, on every surface that names it
    runs = [read_run(DATA / "llamacpp-cpu" / name) for name in ("cache-prompt", "no-cache-prompt")]
    from analysis.views.html import mode_comparison_html

    side = mode_comparison_html(runs, judgement=judge(runs))
    assert f"{row['max_ulp']:,}" in side or str(row["max_ulp"]) in side
    assert "max ULP, batched against m=1" in side and "against the reference engine" not in side


def test_the_vllm_run_is_unverified_everywhere():
    row = judge(DATA / "vllm-cpu" / "no-prefix-cache").frame.row(0, named=True)
    assert row["verdict"] == "UNVERIFIED" and row["bands_unformed"] == 4  # c=16: the engine counters (the strongest evidence here) show m>=13, the streams 16
    assert result_line(DATA / "vllm-cpu" / "no-prefix-cache").startswith("UNVERIFIED")
    assert "--max-num-seqs 16" in row["next_step"]
    # its cost compares like with like: every rate on both sides of each ratio from one origin
    assert {c["origin"] for c in row["cost_by_c"]} == {"streams"}


def _cut(src, dst, keep) -> None:
    """A copy of a bundled run keeping only the capture lines ``keep`` accepts (by envelope)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("derived"))
    for capture in (dst / "captures").glob("*.jsonl"):
        lines = [line for line in capture.read_text().splitlines() if keep(json.loads(line))]
        capture.write_text("".join(line + "\n" for line in lines))


@pytest.mark.parametrize("cut", ["c1-only", "no-batched-bands"])
def test_a_run_without_batched_requests_is_never_green(tmp_path, cut):
    src = DATA / "experiment-cpu" / "batch-invariant"
    dst = tmp_path / cut
    _cut(src, dst, lambda envelope: envelope.get("role") == "reference" or envelope.get("c") == 1)
    if cut == "c1-only":  # the ladder cut to its c=1 band too
        manifest = json.loads((dst / "manifest.json").read_text())
        manifest["ladder"] = [1]
        manifest["m_formed"] = [m for m in manifest.get("m_formed", []) if m.get("c") == 1]
        (dst / "manifest.json").write_text(json.dumps(manifest))
    for target in ("0.9", "0.01"):
        done = bia("certify", str(dst), "-o", str(tmp_path / f"{cut}{target}.json"), "--target-rate", target)  # bia's 300 s limit; it had none
        assert done.returncode == EXIT_CODES["UNVERIFIED"], done.stdout + done.stderr
    assert judge(dst, target_rate=0.9).verdict == "UNVERIFIED"
