"""The tutorial notebooks: every notebooks/*.ipynb that is not a report template runs top to bottom through papermill
on the embedded data, from notebooks/ as Jupyter starts it, and states the findings that data holds.

The report templates (the notebooks the wheel bundles, which bia report and bia trend execute) are tested by
test_report.py and test_trend.py. Part of the normal suite, marked ``tutorials`` (``pytest -m tutorials`` runs only these).
"""

from __future__ import annotations

import re
import time
import tomllib
from pathlib import Path

import nbformat
import polars as pl
import pytest
from conftest import ROOT

from analysis import judge
from analysis.run import read_run, slot_table

pytestmark = [pytest.mark.tutorials, pytest.mark.slow]

NOTEBOOKS = ROOT / "notebooks"
# The templates are what the wheel bundles for bia report and bia trend; every other notebook is a tutorial.
TEMPLATES = {Path(path).name for path in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
             ["force-include"] if path.startswith("notebooks/")}
TUTORIALS = sorted(path.name for path in NOTEBOOKS.glob("*.ipynb") if path.name not in TEMPLATES)
LIMIT_S = 90  # each runs in under a minute here (05_report, the slowest, in about 25 s); the margin is for a busy CI machine

# What each tutorial must print, in its own words, on the embedded data (probe_walkthrough's live run is checked against its run).
FINDINGS = {
    "01_witnesses.ipynb": [
        "Finding: in all 3 witness files, every band with c > 1 parts from m=1 at token 3 (declared_min is 64).",
        "witness_version 1 (2 files): those bands are FAIL under that version's rules.",
        "witness_version 2 (1 file): those bands are PASS under that version's rules.",
        "c=1 (a request alone) in witness@464c168e62.json: parts at token 100; its two m=1 references agree up to token 100",
        "Recorded and re-derived results agree in 12 of 12 bands; 0 discrepancies.",
        "agree with each other up to token 128",
        "Finding: V3 says NOT ADMISSIBLE for 3 of 3 witnesses",
        "  - c=4: diverges from m=1 at 3 < 64 with no near-tie margin recorded",
        "with the model blessed, witness@464c168e62.json is still NOT ADMISSIBLE (exit code 5); 0 of 12 bands record a margin",
    ],
    "02_dumps_and_runs.ipynb": [
        "3968 tokens, the same as the run's: True",
        "default c=1: 2 of 2 token-identical, bit-identical",
        "default c=4: 8 of 8 token-identical, 0 bit-identical; logprobs first differ at token 1, by up to 127 ULP",
        "the drift is far too small to flip a token, so no token flips.",
        "no-cache-prompt c=1: 2 of 2 token-identical, bit-identical",
        "no-cache-prompt c=4: 8 of 8 token-identical, 0 bit-identical; logprobs first differ at token 0, by up to 27615 ULP",
        "cache-prompt c=1: 2 of 2 token-identical, 0 bit-identical; logprobs first differ at token 0, by up to 26 ULP",
        "Finding: batch invariant (every request at every c bit-identical to m=1): one-by-one, fixed-tiles; not: default.",
        "0 token flips, up to 127 ULP",
    ],
    "04_trend.ipynb": [
        "Finding: the embedded history holds 3 witnesses, dated 2026-09-02 14:59 by the marker of server commit a765c86; 0 regressions",
        "5 entries after adding the witnesses, then two runs; appending the witnesses and a run again left 5",
        "Finding: 1 regression(s).",
        "bits differ at c=1: requests that were bit-identical to m=1 are not (1 -> 0); last good 2026-11-01 (commit aaaaaaa), "
        "first bad 2026-11-02 (commit ccccccc)",
    ],
    "05_report.ipynb": [
        "title: Batch-parity report (tutorial)",
        "sections: The answer | Verdicts | Runs side by side | Engines side by side | Sampler and trainer | Figures | Detail | "
        "aprender's V3 release gate",
        "0 scripts or stylesheets from the network",
        "Finding: the answer says batch-invariant AMBER, default RED, fixed-tiles AMBER, row-invariant AMBER, cache-prompt RED, "
        "no-cache-prompt RED, no-prefix-cache UNVERIFIED, prefix-cache UNVERIFIED, continuous RED, padded RED, "
        "witness-v3.0-rule.json RED, witness-variant-batched-prefill-0.json RED, witness@464c168e62.json RED",
        "Finding: the report's 13 verdict cards say",
        "  padded: RED (co-batching): 56 of 56 batched requests part from m=1 (0 in tokens, 56 only in bits); the first is "
        "p0 c=4 repeat 0 slot 0: its logprob bits differ from ref #1 from token 0 (up to 127 ULP)",
        "  default: RED (co-batching): 56 of 56 batched requests part from m=1 (0 in tokens, 56 only in bits)",
        "  cache-prompt: RED (prompt cache): not reproducible alone (its prompt cache)",
        "  row-invariant: AMBER: 0 of 56 batched requests part from m=1, every band seen formed",
        "  no-prefix-cache: UNVERIFIED (incomplete evidence): no request parts from m=1, but 4 of 6 batched bands never seen formed",
    ],
    "03_probe.ipynb": [],
    "rl_mismatch.ipynb": [
        "Finding: fixed-tiles: every metric exactly at its no-mismatch value (K3 0.0)",
        "Finding: row-invariant: every metric exactly at its no-mismatch value (K3 0.0)",
        "Finding: default: not zero: verl's K3 1.28e-13, SkyRL's max |delta| 2.32e-06",
        "Finding: batch-invariant: not zero: verl's K3 2.2e-13, SkyRL's max |delta| 2.32e-06",
        "Finding: vllm-hf-pair/pairs: not zero: verl's K3 2.51e-13, SkyRL's max |delta| 4.05e-06",
        "experiment-cpu/fixed-tiles: 0 of 3968 tokens part",
        "experiment-cpu/default: 2535 of 3968 tokens part, by up to 2.3e-06 nats",
        "the smallest sampler margin where a token parts is 0.0125 nats",
    ],
}


# What a cell that ends in a plot call shows under its figure: the returned Axes', Figure's or artists' repr as text.
ARTIST_REPR = re.compile(r"^\[?<(Axes|Figure|matplotlib)\b|^Text\(")


def _shows_an_artist_repr(outputs: list[dict]) -> list[str]:
    """The text outputs that are a matplotlib object's repr (a figure's own display_data carries one beside its PNG: not text shown)."""
    texts = [o.get("data", {}).get("text/plain", "") for o in outputs if o.get("output_type") == "execute_result"]
    texts += [o.get("text", "") for o in outputs if o.get("output_type") == "stream"]
    return [text for text in texts if any(ARTIST_REPR.match(line) for line in text.splitlines())]


def _ends_in_a_plot_call(source: str) -> bool:
    """A cell whose last statement is an expression calling a plot function or an Axes method: Jupyter prints what it returns."""
    import ast

    body = ast.parse(source).body
    if not body or not isinstance(body[-1], ast.Expr) or source.rstrip().endswith(";"):
        return False
    calls = [node for node in ast.walk(body[-1]) if isinstance(node, ast.Call)]
    names = [ast.unparse(call.func) for call in calls]
    return any(re.search(r"(^|\.)(plot_\w+|ax\w*(\[[^]]*\])?\.\w+|fig\w*\.\w+|plt\.(?!show\b)\w+)$", name) for name in names)


def test_no_cell_ends_in_a_plot_call_that_would_print_its_axes():
    """Issue 32 item 10: a plot function returns its Axes, which a cell ending in the call prints as <Axes: ...> under the
    figure; every notebook's plot cells end with plt.show() (or a ;)."""
    from nbformat import read

    ending = [(path.name, cell.source.splitlines()[-1]) for path in sorted(NOTEBOOKS.glob("*.ipynb"))
              for cell in read(path, as_version=4).cells if cell.cell_type == "code" and _ends_in_a_plot_call(cell.source)]
    assert ending == []


def _outputs(notebook) -> tuple[str, list[dict]]:
    """The executed notebook's printed text, and every output."""
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stdout"), outputs


def _execute(name: str, tmp_path: Path, cwd: Path, **parameters) -> tuple[nbformat.NotebookNode, float]:
    import papermill

    started = time.monotonic()
    papermill.execute_notebook(str(NOTEBOOKS / name), str(tmp_path / name), parameters=parameters, kernel_name="python3", progress_bar=False,
                               cwd=str(cwd), execution_timeout=300)
    return nbformat.read(tmp_path / name, as_version=4), time.monotonic() - started


def test_the_tutorials_and_the_templates():
    """Every notebook is a template or a tutorial with findings checked here, and each is a jupytext pair (its .py beside
    it is the source: tests/test_notebook_pairs.py holds the two in step)."""
    assert TEMPLATES == {"parity_report.ipynb", "trend_report.ipynb"}
    assert sorted(FINDINGS) == TUTORIALS
    assert {path.with_suffix(".ipynb").name for path in NOTEBOOKS.glob("*.py")} == TEMPLATES | set(TUTORIALS)


@pytest.mark.parametrize("name", TUTORIALS)
def test_a_tutorial_is_stored_clean_and_starts_by_saying_what_it_teaches(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    first = notebook.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ") and "You will learn" in first.source
    assert all(cell.get("id") for cell in notebook.cells)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)
    assert not re.search(r"analysis\._\w", "".join(cell.source for cell in code))
    assert sum(cell.cell_type == "markdown" for cell in notebook.cells) >= 4  # prose between the cells


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.engine) if name == "03_probe.ipynb" else name  # it starts bia serve
                                  for name in TUTORIALS])
def test_a_tutorial_runs_top_to_bottom_and_states_its_findings(name, tmp_path):
    # the probe's run goes to tmp_path: run as Jupyter runs it, it goes beside the notebook. The report notebook runs with
    # its own default, from a folder that is not the notebook's (issue 41: its words said "beside this notebook" there too)
    parameters = {"03_probe.ipynb": {"output": str(tmp_path / "run")}}.get(name, {})
    if name == "03_probe.ipynb":
        pytest.importorskip("torch")
    executed, took = _execute(name, tmp_path, tmp_path if name == "05_report.ipynb" else NOTEBOOKS, **parameters)
    text, outputs = _outputs(executed)
    assert [o for o in outputs if o.get("output_type") == "error"] == []
    assert all(cell.execution_count is not None for cell in executed.cells if cell.cell_type == "code")
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)  # no progress widgets
    assert any("image/png" in o.get("data", {}) for o in outputs) or name == "05_report.ipynb"
    assert "Traceback" not in text
    assert _shows_an_artist_repr(outputs) == []  # no <Axes: ...> under a figure
    missing = [line for line in FINDINGS[name] if line not in text]
    assert missing == [], f"{name} printed:\n{text}"
    assert took < LIMIT_S, f"{name} took {took:.0f} s"
    if name == "03_probe.ipynb":
        _check_the_walkthrough_verdict(text, outputs, tmp_path / "run")
    if name == "05_report.ipynb":
        figures = re.search(r"(\d+) figures inlined as PNG", text)
        assert figures and int(figures.group(1)) > 0
        report = (tmp_path / "reports" / "parity-report.html").resolve()
        assert f"{report}: " in text  # the path it was written to, said in full
        _check_the_report_is_shown_and_kept(outputs, report)


def _check_the_report_is_shown_and_kept(outputs: list[dict], report: Path) -> None:
    """Issue 32 item 10: 05_report wrote the report to a temporary folder, printed its section names and deleted it; it now
    shows the page in a frame and links it, and the file stays where the notebook's output parameter put it."""
    shown = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert report.is_file() and report.stat().st_size > 100_000
    assert re.search(rf'<iframe\b[^>]*src="{re.escape(str(report))}"', shown), "no frame shows the report"
    assert re.search(rf"<a href='{re.escape(str(report))}' target='_blank'>", shown), "no link opens the report"


def _check_the_walkthrough_verdict(text: str, outputs: list[dict], run_dir: Path) -> None:
    """The walkthrough's verdict says what its own run holds, and its band table shows the bit-identical share."""
    run = read_run(run_dir)
    assert run.manifest["complete"]
    slots = slot_table(run)
    per_c = slots.group_by("c").agg(requests=pl.len(), bits=(pl.col("bitwise_prefix") == pl.col("length")).sum(),
                                         tokens=(~pl.col("diverged")).sum()).sort("c")
    # its words are the judgement's (issue 41): all requests bit-identical once printed "batch invariant" where certify said AMBER
    judged = list(judge(run))
    assert judged
    for row in judged:
        cause = f" ({row['cause']})" if row["cause"] else ""
        assert f"Verdict for bia serve --mode default ({row['arm']}): {row['verdict']}{cause}: {row['reason']}\n  next: {row['next_step']}\n" in text, text
    assert "batch invariant: all" not in text
    for row in per_c.iter_rows(named=True):
        assert f"c={row['c']}: {row['bits']} of {row['requests']} bit-identical, {row['tokens']} token-identical" in text
    shown = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "bit_identical_share" in shown and "token_identical_share" in shown and 'class="bia-headline' in shown


def test_a_tutorial_runs_from_the_repository_root_too(tmp_path):
    """The tutorials find the embedded data wherever they run: papermill from the repository root, not notebooks/."""
    executed, _ = _execute("01_witnesses.ipynb", tmp_path, ROOT)
    text, outputs = _outputs(executed)
    assert [o for o in outputs if o.get("output_type") == "error"] == []
    assert FINDINGS["01_witnesses.ipynb"][0] in text


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_report_template_opens_with_prose_and_calls_only_public_names(name):
    """Issue 22 item 8: trend_report called the private analysis._show.cell and neither template said what it is. The
    templates' prose is one line (their output is the report itself; 04_trend and 05_report teach them)."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    first = notebook.cells[0]
    assert first.cell_type == "markdown" and "Run it with `bia " in first.source
    code = "".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert not re.search(r"analysis\.(\w+\.)*_\w", code) and "_show" not in code
