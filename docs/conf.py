"""Sphinx configuration for bia's documentation: built offline by ``bash scripts/docs.sh``, warnings as errors."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS)]

import _apigen  # noqa: E402  (docs/_apigen.py)

import analysis  # noqa: E402

project = "bia"
author = "the bia authors"
copyright = "the bia authors"
release = version = analysis.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_nb",
    "sphinx_copybutton",
]

# --- Build-time sources -------------------------------------------------------------------------
# The API reference's pages come from analysis.__all__ and the public modules (docs/_apigen.py), and the
# tutorials are the repository's notebooks/*.ipynb, copied here: Sphinx reads nothing outside docs/.
# Both folders are written on every build and kept out of git.
_apigen.write(DOCS / "api")
NOTEBOOKS = DOCS / "tutorials" / "notebooks"
shutil.rmtree(NOTEBOOKS, ignore_errors=True)
NOTEBOOKS.mkdir(parents=True)
for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
    _apigen.copy_notebook(notebook, NOTEBOOKS / notebook.name)

exclude_patterns = ["_build", "**/.ipynb_checkpoints", "**/runs"]
templates_path = ["_templates"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

# --- API reference --------------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autosummary_ignore_module_all = False
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks: set[str] = set()

# --- Notebooks: executed on every build; a failing cell fails the build ------------------------------
nb_execution_mode = "force"
nb_execution_timeout = 300
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_in_temp = False
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# --- Warnings: every reference must resolve (nitpicky). -----------------------------------------------
# Offline means no intersphinx, so names of the standard library and of third-party packages in type hints
# (polars.DataFrame, pathlib.Path, ...) cannot resolve; they, and only they, are ignored.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(polars|pl|pandas|pd|numpy|np|pyarrow|pa|matplotlib|plt|httpx|torch|ray|starlette|uvicorn|IPython|nbformat"
               r"|jinja2|rich|typer|click|safetensors|transformers)(\..*)?"),
    (r"py:.*", r"(pathlib|collections|collections\.abc|typing|datetime|decimal|os|io|re|json|asyncio|concurrent\.futures"
               r"|subprocess|threading|types|enum|dataclasses|contextlib|logging|tomllib|argparse|socket|hashlib|fractions"
               r"|random)\..*"),
    # a private type (its last name starts with an underscore) has no page of its own
    (r"py:class", r"(.*\.)?_[A-Za-z]\w*"),
    (r"py:.*", r"(Path|PathLike|Iterable|Iterator|Mapping|Sequence|Callable|Any|Literal|datetime|DataFrame|LazyFrame|Series"
               r"|Axes|Figure|Expr|Table|Schema|DataType|Fraction|Pattern|Generator|AsyncIterator|Awaitable)"),
]

# --- HTML ----------------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"bia {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_static_path: list[str] = []
html_show_sourcelink = False


# --- Type hints name the private modules that define objects; point them at the public path instead. ----
_PUBLIC = _apigen.documented_objects()


def _locate(target: str):
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


def _public_path(path: str) -> str | None:
    """The public path documenting what *path* names (a private module's object, or a method of one), else None."""
    obj = _locate(path)
    if obj is None:
        return None
    if id(obj) in _PUBLIC:
        return _PUBLIC[id(obj)]
    parent, _, attr = path.rpartition(".")
    owner = _locate(parent) if parent else None
    if owner is not None and id(owner) in _PUBLIC and isinstance(owner, type):
        return f"{_PUBLIC[id(owner)]}.{attr}"
    return None


def _public_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    module, cls = node.get("py:module") or "", node.get("py:class") or ""
    candidates = [target]
    if module:
        candidates += [f"{module}.{cls}.{target}" if cls else None, f"{module}.{target}"]
    candidates.append(f"analysis.{target}")
    for candidate in filter(None, candidates):
        if not candidate.startswith("analysis"):
            continue
        public = _public_path(candidate)
        if public is not None and public != target:
            found = env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, "obj", public, node, contnode)
            if found is not None:
                found["reftitle"] = public  # the tooltip too names the public path
                return found
    return None


def _dataclass_defaults(app, what, name, obj, options, signature, return_annotation):
    """A dataclass field's default_factory shows as ``<factory>``, which Sphinx cannot parse as a signature: name it."""
    if signature and "<factory>" in signature:
        signature = signature.replace("<factory>", "field(default_factory=...)")
    return signature, return_annotation


def _copy_tutorial_reports(app, exception):
    """05_report.ipynb shows the report it writes (reports/ beside it) in a frame: the built page's frame needs the file beside it."""
    written = NOTEBOOKS / "reports"
    if exception is None and app.builder.format == "html" and written.is_dir():
        shutil.copytree(written, Path(app.outdir) / "tutorials" / "notebooks" / "reports", dirs_exist_ok=True)


def setup(app):
    app.connect("build-finished", _copy_tutorial_reports)
    app.connect("missing-reference", _public_reference)
    app.connect("autodoc-process-signature", _dataclass_defaults)
