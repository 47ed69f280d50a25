"""Every notebook under notebooks/ is a jupytext pair: the percent-format .py is the source contributors edit, lint and
diff; the .ipynb beside it (committed, without outputs) is what papermill, bia report, bia trend, the docs and the wheel
read. The pair must say the same: a .py edited without ``jupytext --sync notebooks/*.py`` fails here."""

from __future__ import annotations

import shutil
from pathlib import Path

import jupytext
import jupytext.cli
import nbformat
import pytest
from conftest import ROOT

NOTEBOOKS = ROOT / "notebooks"
PAIRS = sorted(path.stem for path in NOTEBOOKS.glob("*.py"))


def _cells(notebook: nbformat.NotebookNode) -> list[tuple[str, str, dict]]:
    """What a cell is, as both files hold it: its kind, its source and its metadata (the papermill tag), not its id."""
    return [(cell.cell_type, cell.source, dict(cell.metadata)) for cell in notebook.cells]


def pair_differences(py: Path) -> list[str]:
    """Where ``py`` and the .ipynb beside it differ: one line per cell (or notebook field) that differs, empty when in sync."""
    ipynb = py.with_suffix(".ipynb")
    if not ipynb.exists():
        return [f"{ipynb.name} is missing"]
    text, stored = jupytext.read(py), nbformat.read(ipynb, as_version=4)
    found = [f"{py.name} has {len(text.cells)} cells, {ipynb.name} {len(stored.cells)}"] if len(text.cells) != len(stored.cells) else []
    for index, (ours, theirs) in enumerate(zip(_cells(text), _cells(stored))):
        if ours != theirs:
            found.append(f"cell {index} ({ours[0]}, {ours[1][:40]!r}...) differs: {py.name} {ours} vs {ipynb.name} {theirs}")
    for field in ("title", "kernelspec"):
        if text.metadata.get(field) != stored.metadata.get(field):
            found.append(f"metadata {field}: {py.name} {text.metadata.get(field)!r} vs {ipynb.name} {stored.metadata.get(field)!r}")
    return found


def test_every_notebook_is_a_pair():
    assert PAIRS == sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb"))
    assert {"parity_report", "trend_report", "01_witnesses", "05_report"} <= set(PAIRS)
    assert not (ROOT / "scripts" / "make_notebook.py").exists()  # the .py files are the source now


@pytest.mark.parametrize("name", PAIRS)
def test_a_pair_is_in_sync(name):
    """After editing notebooks/NAME.py, ``jupytext --sync notebooks/*.py`` writes the .ipynb; this fails until then."""
    assert pair_differences(NOTEBOOKS / f"{name}.py") == []
    stored = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    code = [cell for cell in stored.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)  # committed without outputs


def _copy(tmp_path: Path, name: str) -> Path:
    for suffix in (".py", ".ipynb"):
        shutil.copy(NOTEBOOKS / f"{name}{suffix}", tmp_path / f"{name}{suffix}")
    shutil.copy(NOTEBOOKS / "jupytext.toml", tmp_path / "jupytext.toml")
    return tmp_path / f"{name}.py"


def test_an_edited_py_is_out_of_sync_until_synced(tmp_path):
    py = _copy(tmp_path, "parity_report")
    assert pair_differences(py) == []
    text = py.read_text(encoding="utf-8")
    assert 'epsilon: float = 0.05\n' in text
    py.write_text(text.replace("epsilon: float = 0.05\n", "epsilon: float = 0.5\n"), encoding="utf-8")
    found = pair_differences(py)
    assert len(found) == 1 and found[0].startswith("cell 1 (code, '# bia parity report")  # the parameters cell, named
    # a cell added to the .py alone
    py.write_text(py.read_text(encoding="utf-8") + '\n# %%\nprint("one more")\n', encoding="utf-8")
    assert any("cells" in line for line in pair_differences(py))
    # the command docs/development.md gives brings the .ipynb in step, keeping the papermill tag and the cell ids
    jupytext.cli.jupytext(["--sync", str(py)])
    assert pair_differences(py) == []
    synced = nbformat.read(py.with_suffix(".ipynb"), as_version=4)
    assert synced.cells[1].metadata["tags"] == ["parameters"] and "epsilon: float = 0.5" in synced.cells[1].source
    assert [cell.id for cell in synced.cells[:-1]] == [cell.id for cell in nbformat.read(NOTEBOOKS / "parity_report.ipynb", as_version=4).cells]


def test_a_hand_edited_ipynb_is_out_of_sync(tmp_path):
    py = _copy(tmp_path, "01_witnesses")
    ipynb = py.with_suffix(".ipynb")
    notebook = nbformat.read(ipynb, as_version=4)
    notebook.cells[0].cell_type = "code"  # the opening prose turned into code
    notebook.cells[0].pop("attachments", None)
    notebook.cells[0].update(outputs=[], execution_count=None)
    nbformat.write(notebook, ipynb)
    assert [line[:18] for line in pair_differences(py)] == ["cell 0 (markdown, "]
    notebook.metadata["title"] = "Another title"
    notebook.cells[0] = nbformat.read(NOTEBOOKS / "01_witnesses.ipynb", as_version=4).cells[0]
    nbformat.write(notebook, ipynb)
    assert pair_differences(py) == ["metadata title: 01_witnesses.py '1. Parity witnesses' vs 01_witnesses.ipynb 'Another title'"]
