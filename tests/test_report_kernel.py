"""The environment a report's kernel runs in: polars' allocator gives freed pages back at once, unless the user says."""

import nbformat
import pytest

from analysis.report._notebook import execute_to_html


def _notebook_printing_the_allocator_setting(folder):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("import os\nprint('allocator:', os.environ.get('_RJEM_MALLOC_CONF', 'unset'))")
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / "env.ipynb"
    nbformat.write(notebook, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("set_by_user", "seen"),
    [(None, "allocator: dirty_decay_ms:0,muzzy_decay_ms:0"), ("narenas:2", "allocator: narenas:2")],
)
def test_the_kernel_gives_freed_pages_back_unless_the_user_configured_the_allocator(
    tmp_path, monkeypatch, set_by_user, seen
):
    if set_by_user is None:
        monkeypatch.delenv("_RJEM_MALLOC_CONF", raising=False)
    else:
        monkeypatch.setenv("_RJEM_MALLOC_CONF", set_by_user)
    page = execute_to_html(
        _notebook_printing_the_allocator_setting(tmp_path), {}, tmp_path / "env.html", what="test"
    ).read_text()
    assert seen in page
