"""The parity report: papermill runs the notebook on the real witnesses; the HTML is checked as
text and, in real headless Chromium, as a reader opening the file offline would see it."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import LAMBDA, ROOT, V2_WITNESS, write_json

from analysis import render_report
from analysis.report import ReportError

EVIL_HOST = "<script>window.__pwned = 1</script>"
EVIL_MODEL = "<img src=x onerror=\"window.__pwned = 2\">.gguf"


def visible_text(page_html: str) -> str:
    """The page's text: block ends become line breaks, inline tags vanish."""
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", page_html, flags=re.S | re.I)
    body = re.sub(r"<(br|/p|/td|/th|/li|/div|/tr|/h\d|/pre|/summary)\b[^>]*>", "\n", body, flags=re.I)
    return html.unescape(re.sub(r"<[^>]+>", "", body))


@pytest.fixture(scope="module")
def default_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    cwd = os.getcwd()
    os.chdir(ROOT)  # the embedded default is named relative to the working folder
    try:
        path = render_report(output=out / "report.html", executed_notebook=out / "executed.ipynb")
    finally:
        os.chdir(cwd)
    return path, out / "executed.ipynb"


@pytest.fixture(scope="module")
def evil_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("evil")
    data = json.loads(V2_WITNESS.read_text())
    data["host"] = EVIL_HOST
    data["model"]["path"] = EVIL_MODEL
    data["env"]["FP8_DECODE"] = "<b>1</b>"
    witness = write_json(out / "evil.json", data)
    return render_report([witness, LAMBDA / "witness-v3.0-rule.json"], out / "evil.html", title="<i>t</i>")


def test_report_shows_every_verdict_and_reason(default_report):
    page = default_report[0].read_text()
    text = visible_text(page)
    for name in ("witness@464c168e62.json", "witness-v3.0-rule.json", "witness-variant-batched-prefill-0.json"):
        assert f"V3 shape check data/aprender-lambda/{name}: NOT ADMISSIBLE" in " ".join(text.split())
    assert text.count("NOT ADMISSIBLE") >= 3
    assert 'model "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" is not the blessed Qwen3.5-4B' in text
    assert "S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at c=1 and c=4" in text
    assert "Recorded run verdict: PASS" in " ".join(text.split())
    assert "None: every recorded band result" in text
    assert "marker@7e1b6e213b.json" in text


def test_report_shows_parameters_and_provenance_first(default_report):
    text = " ".join(visible_text(default_report[0].read_text()).split())
    order = [text.index(s) for s in ("Parameters", "Provenance", "Witness verdicts", "Witness bands", "Divergence from m=1", "Decode rate", "Release markers")]
    assert order == sorted(order)
    assert "(none given: the embedded default)" in text
    assert all(f"Run data/experiment-cpu/{mode}" in text for mode in ("default", "batch-invariant", "fixed-tiles"))
    assert "Run data/llamacpp-cpu/cache-prompt" in text and "Run data/llamacpp-cpu/no-cache-prompt" in text
    assert text.index("Runs side by side") < text.index("Run data/experiment-cpu/")
    assert "Real perf041 batch-parity witnesses" in text  # the provenance README travels with the data


def test_report_plots_are_embedded_images(default_report):
    page = default_report[0].read_text()
    images = re.findall(r"<img\b[^>]*>", page)
    assert all(re.search(r'src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}"', img) for img in images)
    alts = [re.search(r'alt="([^"]*)"', img).group(1) for img in images]
    runs = ("experiment-cpu/default", "experiment-cpu/batch-invariant", "experiment-cpu/fixed-tiles", "llamacpp-cpu/cache-prompt",
            "llamacpp-cpu/no-cache-prompt")
    assert len(alts) == 3 + 4 * len(runs)  # the witness plots, then four figures for each embedded run
    assert [sum(f"data/{run}:" in a for a in alts) for run in runs] == [4] * len(runs)
    assert sum("the batch widths the server formed" in a for a in alts) == len(runs)
    assert alts[:3] == [
        "divergence_at against batch size c for each witness, with declared_min marked",
        "per-request decode rate against batch size c, with the 50%-of-c=1 line",
        "kernel env knobs that differ between witnesses",
    ]


def test_report_is_offline_and_hides_code(default_report):
    page = default_report[0].read_text()
    assert "http://" not in page and "https://" not in page
    assert "<script src" not in page
    assert "read_witnesses(" not in page, "code cells must be hidden"


def test_executed_notebook_holds_no_widgets_or_errors(default_report):
    nb = nbformat.read(default_report[1], as_version=4)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert output.get("output_type") != "error"
            assert "application/vnd.jupyter.widget-view+json" not in output.get("data", {})
    tags = [cell.metadata.get("tags", []) for cell in nb.cells]
    assert ["parameters"] in tags and ["injected-parameters"] in tags


def test_untrusted_text_is_escaped(evil_report):
    page = evil_report.read_text()
    assert EVIL_HOST not in page and "<img src=x" not in page and "<b>1</b>" not in page
    text = visible_text(page)
    assert EVIL_HOST in text and "<b>1</b>" in text and "<i>t</i>" in text


def test_bad_policy_or_source_fails_clearly(tmp_path):
    with pytest.raises(Exception, match="unknown policy fields"):
        render_report([V2_WITNESS], tmp_path / "r.html", policy={"epsilon": 1})
    bad = tmp_path / "bad.json"
    bad.write_text('{"witness_version": 2, "bands": [{"c": "4"}]}')
    with pytest.raises(ReportError, match="WitnessError"):
        render_report([bad], tmp_path / "r.html")


def test_cli_report_with_sources_and_policy(tmp_path):
    out = tmp_path / "r.html"
    run = subprocess.run(
        [sys.executable, "-m", "analysis", "report", str(V2_WITNESS), "-o", str(out), "--model-prefix", "qwen2.5-coder", "--title", "Lambda"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    text = " ".join(visible_text(out.read_text()).split())
    assert "model_prefix = qwen2.5-coder" in text
    assert "is not the blessed" not in text  # the team's own model is blessed under its policy
    assert "Lambda" in text


def test_cli_report_names_a_malformed_file(tmp_path):
    bad = write_json(tmp_path / "bad.json", {"witness_version": 2, "bands": [{"c": 4, "m_formed": "4"}]})
    run = subprocess.run([sys.executable, "-m", "analysis", "report", str(bad), "-o", str(tmp_path / "r.html")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 4
    assert f"{bad}: $.bands[0] (c=4).m_formed: expected an integer" in run.stderr
    assert not (tmp_path / "r.html").exists()


# --- in a real browser ------------------------------------------------------------------------


def _chromium() -> str:
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium for the browser tests")
        pytest.skip("chromium is not installed here")
    return path


def open_offline(report: Path):
    """Open ``report`` from a file URL with every non-file request blocked; collect what went wrong."""
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=_chromium(),
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        context.route(lambda url: not url.startswith(("file:", "data:")), lambda route: route.abort())
        page = context.new_page()
        page.on("request", lambda r: requests.append(r.url))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(report.as_uri(), wait_until="load")
        page.wait_for_timeout(300)
        state = page.evaluate(
            """() => ({
                pwned: window.__pwned === undefined ? null : window.__pwned,
                images: Array.from(document.images).map(i => ({ok: i.complete && i.naturalWidth > 0,
                    visible: i.getBoundingClientRect().width > 100})),
                text: document.body.innerText,
            })"""
        )
        verdicts = page.get_by_text("NOT ADMISSIBLE", exact=False)
        state["verdict_visible"] = verdicts.count() > 0 and verdicts.first.is_visible()
        browser.close()
    return state, problems, requests


@pytest.mark.browser
def test_report_in_chromium_offline(default_report):
    state, problems, requests = open_offline(default_report[0])
    assert problems == []
    assert all(url.startswith(("file:", "data:")) for url in requests)
    assert state["verdict_visible"]
    assert len(state["images"]) == 3 + 4 * 5 and all(i["ok"] and i["visible"] for i in state["images"])  # five embedded runs
    assert "c=4: diverges from m=1 at 3 < 64 with no near-tie margin recorded" in state["text"]
    assert "a divergence planted at step 32 of ref #1 was detected at step 32" in state["text"]


@pytest.mark.browser
def test_untrusted_text_runs_nothing_in_chromium(evil_report):
    state, problems, _ = open_offline(evil_report)
    assert state["pwned"] is None, "a witness field ran as script"
    assert problems == []
    assert EVIL_HOST in state["text"]
    assert EVIL_MODEL in state["text"]


# --- runs in the report -----------------------------------------------------------------------------

SCRIPT_TOKEN = "<script>window.__pwned = 3</script>"
IMG_TOKEN = '<img src=x onerror="window.__pwned = 4">'


def _text_response(tokens):
    content = [{"id": i, "token": text, "logprob": lp, "top_logprobs": [{"id": ci, "token": ct, "logprob": cv} for ci, ct, cv in top]}
               for i, text, lp, top in tokens]
    return {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": ""}, "finish_reason": "length", "logprobs": {"content": content}}],
            "usage": {"completion_tokens": len(tokens)}}


@pytest.fixture(scope="module")
def evil_run_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("evilrun") / "run"
    (folder / "captures").mkdir(parents=True)
    a = (1, "Hello", -0.1, [(1, "Hello", -0.1), (2, "Hi", -2.5)])
    fork_x = (3, SCRIPT_TOKEN, -0.70, [(3, SCRIPT_TOKEN, -0.70), (4, IMG_TOKEN, -0.71)])
    fork_y = (4, IMG_TOKEN, -0.69, [(4, IMG_TOKEN, -0.69), (3, SCRIPT_TOKEN, -0.70)])
    end = (5, " end", -0.2, [(5, " end", -0.2), (6, " stop", -1.9)])
    write_json(folder / "manifest.json", {"run_version": 1, "identity": {"host": "<b>box</b>", "model": {"path": "tiny.gguf"}},
                                          "sampler": {"max_tokens": 3}, "ladder": [1, 2], "declared_min": 2,
                                          "requested": {"batch_invariant": True}, "effective": {"batch_invariant": False},
                                          "m_formed": [{"prompt_id": "p", "band_c": 1, "widths": [1]}, {"prompt_id": "p", "band_c": 2, "widths": [2]}]})
    lines = [{"response": _text_response([a, fork_x, end]), "prompt_id": "p", "role": "reference", "slot": i} for i in range(2)]
    lines.append({"response": _text_response([a, fork_x, end]), "prompt_id": "p", "role": "band", "band_c": 1, "slot": 0})
    lines.append({"response": _text_response([a, fork_x, end]), "prompt_id": "p", "role": "band", "band_c": 2, "slot": 0})
    lines.append({"response": _text_response([a, fork_y, end]), "prompt_id": "p", "role": "band", "band_c": 2, "slot": 1})
    (folder / "captures" / "p.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = folder.parent / "run.html"
    run = subprocess.run([sys.executable, "-m", "analysis", "report", str(folder), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return out


def test_run_report_shows_the_run(evil_run_report):
    page = evil_run_report.read_text()
    text = " ".join(visible_text(page).split())
    assert "a divergence planted at step 1 of ref #1 was detected at step 1" in text
    assert "the band parts at step 1" in text
    assert "batch_invariant True False" in text  # requested and effective settings side by side
    assert "reference ref1" in text and "Prompts: the reference's tie density" in text
    assert "Requests: each batched request against ref1" in text
    assert len(re.findall(r"<img\b", page)) == 4  # four figures for the run, no witness section without witnesses
    assert "Witness verdicts" not in text
    assert "http://" not in page and "https://" not in page
    assert SCRIPT_TOKEN not in page and IMG_TOKEN not in page


@pytest.mark.browser
def test_run_report_in_chromium_runs_no_token(evil_run_report):
    state, problems, requests = open_offline(evil_run_report)
    assert problems == []
    assert state["pwned"] is None, "a token's text ran as code"
    assert SCRIPT_TOKEN in state["text"] and IMG_TOKEN in state["text"]
    assert all(i["ok"] and i["visible"] for i in state["images"]) and len(state["images"]) == 4
    assert "NOT ADMISSIBLE" in state["text"]
