"""The API reference lists every public name: docs/_apigen.py writes it from analysis.__all__ on every build."""

from __future__ import annotations

import importlib.util
import re

import pytest
from conftest import ROOT

import analysis

pytestmark = pytest.mark.slow

DOCS = ROOT / "docs"


def _apigen():
    spec = importlib.util.spec_from_file_location("_apigen", DOCS / "_apigen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _autosummary_entries(rst: str) -> list[str]:
    """The names listed under every ``.. autosummary::`` directive of a page."""
    names, inside = [], False
    for line in rst.splitlines():
        if line.startswith(".. autosummary::"):
            inside = True
        elif inside and re.match(r"^   [A-Za-z_][\w.]*$", line):
            names.append(line.strip())
        elif inside and line and not line.startswith("   "):
            inside = False
    return names


def test_every_public_name_is_in_the_api_reference():
    listed = _autosummary_entries(_apigen().top_level_page())
    assert sorted(listed) == sorted(analysis.__all__), set(analysis.__all__) ^ set(listed)


def test_every_public_module_has_a_page_in_the_reference():
    apigen = _apigen()
    assert set(apigen.PUBLIC_MODULES) == {"run", "dumps", "report", "parity", "plots", "trend", "probe", "experiment", "serve", "testing"}
    toctree = (DOCS / "api" / "index.md").read_text()
    for module in apigen.PUBLIC_MODULES:
        assert f"\nanalysis.{module}\n" in toctree, module
        page = apigen.module_page(module)
        assert f".. automodule:: analysis.{module}" in page
        for name in apigen.module_names(module):  # each own name listed, each shared one linked to analysis.<name>
            assert f"   {name}\n" in page or f":py:obj:`analysis.{name}`" in page, (module, name)


def test_the_docs_name_no_private_module():
    for page in DOCS.glob("*.md"):
        assert not re.search(r"analysis\._(?!_)\w", page.read_text()), page.name


def test_the_built_reference_has_a_page_per_public_name():
    """Checked when a build is there (scripts/test.sh builds the docs before pytest)."""
    generated = DOCS / "_build" / "html" / "api" / "generated"
    if not generated.is_dir():
        pytest.skip("docs not built: bash scripts/docs.sh")
    missing = [name for name in analysis.__all__ if not (generated / f"analysis.{name}.html").is_file()]
    assert missing == []
