"""The project's shape: public surface, environment.yml in step with pyproject.toml, entry points."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib

import pytest
import yaml
from conftest import MUTATION_RUN, ROOT

import analysis


def _name_and_spec(requirement: str) -> tuple[str, str]:
    match = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(.*)", requirement)
    return match.group(1).lower().replace("_", "-"), match.group(2).replace(" ", "")


def test_environment_yml_installs_what_pyproject_declares():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = dict(_name_and_spec(r) for r in project["dependencies"] + project["optional-dependencies"]["test"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    python = next(d for d in conda if d.startswith("python="))
    assert python == "python=3.11" and project["requires-python"] == ">=3.11"
    listed = dict(_name_and_spec(d) for d in conda if not d.startswith(("python=", "pip")) or d.startswith("pip "))
    assert listed == wanted
    assert pip == ["--no-deps --editable ."]


def test_public_surface_is_sorted_and_complete():
    assert analysis.__all__ == sorted(analysis.__all__)
    for name in analysis.__all__:
        assert hasattr(analysis, name), name
    public = {n for n in dir(analysis) if not n.startswith("_") and n not in {"cli", "dumps", "experiment", "parity", "plots", "probe", "report", "reproduce", "run", "serve", "testing", "trend", "annotations",
                                                                       # the pipeline's layers (subpackages), bound once imported
                                                                       "core", "io", "metrics", "verdicts", "witness", "studies", "views"}}
    assert public <= set(analysis.__all__), public - set(analysis.__all__)


@pytest.mark.slow
def test_torch_is_pinned_to_the_cpu_build_and_not_imported():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["torch"] == ["safetensors>=0.4", "torch==2.13.0"]
    run = subprocess.run([sys.executable, "-c", "import sys, analysis, analysis.cli, analysis.report, analysis.plots; print('torch' in sys.modules)"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.stdout.strip() == "False"


def test_python_m_analysis_and_console_script_agree():
    help_text = subprocess.run([sys.executable, "-m", "analysis", "--help"], capture_output=True, text=True).stdout
    for command in ("shape-check", "witness", "report"):
        assert command in help_text
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"bia": "analysis.cli:main"}


def test_readme_starts_with_the_two_commands():
    lines = [l for l in (ROOT / "README.md").read_text().splitlines() if l.strip()]
    head = "\n".join(lines[:12])
    assert "bash scripts/report.sh" in head and "bash scripts/test.sh" in head
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test.sh" in ci


def test_the_notebook_flow_is_one_namespace():
    """read -> tables -> plots -> report, each a name on ``analysis``, like polars or pingouin."""
    flow = ["read_witnesses", "read_dump", "read_dumps", "read_run", "assemble_run", "slot_table", "band_table", "prompt_table",
            "flip_table", "drift_table", "width_table", "to_witness", "shape_check", "plot_divergence", "plot_run_divergence",
            "plot_flip_curve", "render_report"]
    assert [name for name in flow if name not in analysis.__all__] == []
    from analysis.probe import probe

    assert callable(probe) and hasattr(analysis.probe, "PROFILES")  # the package stays reachable: no flat name hides it


def test_objects_show_one_line_and_html(tmp_path):
    run = analysis.read_run(ROOT / "data" / "llamacpp-cpu" / "no-cache-prompt")
    dump = analysis.read_dumps(ROOT / "data" / "experiment-cpu" / "default" / "captures")
    ws = analysis.read_witnesses(ROOT / "data" / "aprender-lambda")
    study = analysis.scan_study(analysis.write_dataset(ROOT / "data" / "experiment-cpu" / "default", tmp_path / "study"))
    for obj in (run, dump, ws, study):
        assert "\n" not in repr(obj) and len(repr(obj)) < 300
        page = obj._repr_html_()
        # a run's card opens with its verdict (its row of analysis.judge), then its summary
        opening = '<div class="bia-scroll" style="max-width:100%;overflow-x:auto"><table class="bia-table bia-answer">' if obj in (run, ws) else '<div class="bia-summary">'
        page = re.sub(r'^<div class="bia-jupyter"><style>.*?</style>', "", page, flags=re.S)  # the card's style for Jupyter (issue 44)
        assert page.startswith(opening) and '<div class="bia-summary">' in page and "None" not in page and "True" not in page
    assert repr(run).endswith("2 prompt(s), ladder [1, 4, 8, 16], 62 requests, complete)")
    assert repr(study) == f"Study(1 run(s) at {str(tmp_path / 'study')!r})" and ">default</td>" in study._repr_html_()
    assert 'data-verdict="RED"' in run._repr_html_() and "co-batching" in run._repr_html_()
    assert "c=1: 2 of 2 requests bit-identical to ref #1, 2 token-identical" in run._repr_html_()  # no prompt cache: alone is exact
    assert "c=4: 0 of 8 requests bit-identical to ref #1, 8 token-identical" in run._repr_html_()
    assert run.requests.height == 62 and run.tokens is run.dump.tokens


def test_a_run_card_names_its_kernel_mode():
    """As it was asked (batch-invariant), with the mode that ran beside it (issue 32 item 10)."""
    card = analysis.read_run(ROOT / "data" / "experiment-cpu" / "batch-invariant")._repr_html_()
    assert re.search(r"<th[^>]*>engine</th>.*?<th[^>]*>kernel mode</th><td[^>]*>batch-invariant \(runs as one-by-one\)</td>", card, flags=re.S)
    assert "kernel mode" not in analysis.read_run(ROOT / "data" / "llamacpp-cpu" / "no-cache-prompt")._repr_html_()  # none recorded, none said


@pytest.mark.slow
def test_objects_show_their_html_in_a_notebook_papermill_runs(tmp_path):
    """Each object, left as a cell's last expression, shows its HTML card among the executed outputs."""
    import nbformat
    import papermill
    from nbformat.v4 import new_code_cell, new_notebook

    cells = [f"import analysis\nanalysis.read_run({str(ROOT / 'data' / 'llamacpp-cpu' / 'cache-prompt')!r})",
             f"analysis.read_dumps({str(ROOT / 'data' / 'experiment-cpu' / 'default' / 'captures')!r})",
             f"analysis.read_witnesses({str(ROOT / 'data' / 'aprender-lambda')!r})",
             f"analysis.read_history({str(ROOT / 'data' / 'aprender-lambda')!r})"]
    notebook = new_notebook(cells=[new_code_cell(source) for source in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, tmp_path / "objects.ipynb")
    papermill.execute_notebook(str(tmp_path / "objects.ipynb"), str(tmp_path / "out.ipynb"), kernel_name="python3", progress_bar=False)
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    shown = [output.get("data", {}).get("text/html", "") for cell in executed.cells for output in cell.outputs]
    assert [html.split("</strong>")[0].rsplit(">", 1)[-1] for html in shown if 'class="bia-summary"' in html] == [
        "bia run", "bia dump", "bia witnesses", "bia history"]


@pytest.mark.skipif(MUTATION_RUN, reason="a mutation run's tree holds mutmut's copies of every function, not the source")
def test_no_module_is_longer_than_500_lines():
    """Each module holds one idea (issue 21): a module past 500 lines is split, not grown (issue 33)."""
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "analysis").rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def test_every_card_is_drawn_in_views_and_no_object_draws_its_own():
    """Views own every view (issue 33): no class outside analysis.views defines ``_repr_html_``; the face binds each public
    object's card, and each card comes from analysis.views."""
    import ast

    drawn_elsewhere = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in (ROOT / "analysis").rglob("*.py")
        if "views" not in path.relative_to(ROOT / "analysis").parts
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == "_repr_html_"
    ]
    assert drawn_elsewhere == []
    with_cards = {name for name in analysis.__all__ if hasattr(getattr(analysis, name), "_repr_html_")}
    assert with_cards == {"Run", "Judgement", "WitnessSet", "Dump", "History", "ShapeVerdict", "Study"}
    assert all(getattr(analysis, name)._repr_html_.__module__.startswith("analysis.views.html.") for name in with_cards)


def test_the_public_module_names_are_the_modules_where_the_code_lives():
    """analysis.parity, .plots and .trend keep their names; each exports exactly what its home module does."""
    from analysis.metrics import parity as parity_home
    from analysis.report import trend as trend_home
    from analysis.views import plots as plots_home

    for face, home in ((analysis.parity, parity_home), (analysis.plots, plots_home), (analysis.trend, trend_home)):
        assert face.__all__ == home.__all__
        assert all(getattr(face, name) is getattr(home, name) for name in home.__all__)


def _fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


def test_every_python_example_in_readme_runs_as_written():
    """README's Python blocks run from the repository root of a checkout, on the embedded data (issue 22, item 7)."""
    blocks = _fenced((ROOT / "README.md").read_text(), "python")
    assert blocks, "README shows no Python example"
    for block in blocks:
        done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert done.returncode == 0, f"README example failed:\n{block}\n{done.stderr[-2000:]}"
        assert done.stdout.strip(), f"README example printed nothing:\n{block}"


def test_readme_links_stay_inside_the_repository():
    """Every relative link in README names a file of this repository (none reaches ../shared or another checkout)."""
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local, "README links no page"
    assert [link for link in local if not (ROOT / link).resolve().is_relative_to(ROOT) or not (ROOT / link).exists()] == []


def test_the_html_the_documented_commands_write_is_ignored_by_git():
    """``-o experiment.html`` and the like, run from the repository root as README and docs/ show them, leave git status clean."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    written = sorted({m for doc in docs for m in re.findall(r"(?<!\S)-o ([\w./-]+\.html)\b", doc.read_text(encoding="utf-8"))})
    assert "experiment.html" in written
    shown = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert [name for name in written if name not in shown] == []


def test_readme_says_which_command_installs_which_extras():
    """README's Install names the bare install the report uses and every extra scripts/setup.sh adds by default (it once left out
    fast and offered '.[test]' as the pip command, issue 22 item 5)."""
    defaults = re.search(r'extras="\$\{BIA_EXTRAS-([\w,]+)\}"', (ROOT / "scripts" / "setup.sh").read_text()).group(1).split(",")
    install = (ROOT / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    bare, tests = (line for line in install.split("\n- ") if "setup.sh" in line)
    assert ".venv/bin/pip install -e .`" in bare and "BIA_EXTRAS= bash scripts/setup.sh" in bare and "scripts/report.sh" in bare
    assert 'BIA_EXTRAS="${BIA_EXTRAS-}" bash scripts/setup.sh' in (ROOT / "scripts" / "report.sh").read_text()  # none unless asked
    assert sorted(re.findall(r"`(\w+)`", tests.split("(about")[0].split("adds the", 1)[1])) == sorted(defaults)
