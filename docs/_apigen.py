"""Write the API reference's pages from the package itself (run by conf.py before every build).

The top-level page lists every name in ``analysis.__all__``, so a name added there appears in the
reference without editing the docs; each public module gets a page that documents the names it adds
and links the ones it shares with ``analysis``. Only public import paths are written: an object
is documented where users import it, never under the private module that defines it.
"""

from __future__ import annotations

import importlib
import inspect
import shutil
from pathlib import Path

# The public modules, in the order a reader meets them; each gets its own page.
PUBLIC_MODULES = ["run", "dumps", "parity", "plots", "report", "trend", "probe", "experiment", "serve", "testing"]

# The top-level page's sections: the first that matches a name takes it.
SECTIONS = [
    ("Read and write", lambda name, obj: callable(obj) and not inspect.isclass(obj) and name.startswith(
        ("read_", "scan_", "write_dataset", "study_tables", "append_history", "expand_sources", "fetch_url", "assemble_run"))),
    ("Errors", lambda name, obj: inspect.isclass(obj) and issubclass(obj, BaseException)),
    ("Objects", lambda name, obj: inspect.isclass(obj)),
    ("Plots", lambda name, obj: callable(obj) and name.startswith("plot_")),
    ("Reports and experiments", lambda name, obj: callable(obj) and name.startswith(("render_", "default_", "run_experiment"))),
    ("Tables and verdicts", lambda name, obj: callable(obj)),
    ("Data", lambda name, obj: True),
]


def _autosummary(names: list[str], toctree: str = "generated") -> list[str]:
    return [".. autosummary::", f"   :toctree: {toctree}", ""] + [f"   {name}" for name in names] + [""]


def top_level_names() -> list[str]:
    import analysis

    return list(analysis.__all__)


def module_names(module: str) -> list[str]:
    """A public module's own public names: its ``__all__``, else what it defines without a leading underscore."""
    mod = importlib.import_module(f"analysis.{module}")
    if hasattr(mod, "__all__"):
        return list(mod.__all__)
    return sorted(name for name, obj in vars(mod).items()
                  if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                  and getattr(obj, "__module__", None) == mod.__name__)


def top_level_page() -> str:
    import analysis

    lines = ["The ``analysis`` namespace", "==========================", "",
             ".. automodule:: analysis", "   :no-members:", "",
             ".. currentmodule:: analysis", "",
             "Every name in ``analysis.__all__``: the flow a notebook walks, read, tables, plots, report.", ""]
    taken: set[str] = set()
    for title, matches in SECTIONS:
        names = [n for n in analysis.__all__ if n not in taken and matches(n, getattr(analysis, n))]
        if not names:
            continue
        taken.update(names)
        lines += [title, "-" * len(title), ""] + _autosummary(names)
    assert taken == set(analysis.__all__)
    return "\n".join(lines) + "\n"


def module_page(module: str) -> str:
    import analysis

    mod = importlib.import_module(f"analysis.{module}")
    full = f"analysis.{module}"
    names = module_names(module)
    shared = [n for n in names if n in analysis.__all__ and getattr(analysis, n) is getattr(mod, n)]
    own = [n for n in names if n not in shared]
    lines = [f"``{full}``", "=" * (len(full) + 4), "", f".. automodule:: {full}", "   :no-members:", ""]
    if shared:
        refs = ", ".join(f":py:obj:`analysis.{n}`" for n in shared)
        lines += [f"Also importable from ``analysis``, and documented there: {refs}.", ""]
    if own:
        lines += [f".. currentmodule:: {full}", ""] + _autosummary(own)
    return "\n".join(lines) + "\n"


def documented_objects() -> dict[int, str]:
    """id(object) -> the public path its page documents it under (to point type hints at it)."""
    import analysis

    found = {id(getattr(analysis, n)): f"analysis.{n}" for n in analysis.__all__
             if inspect.isclass(getattr(analysis, n)) or inspect.isfunction(getattr(analysis, n))}
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(f"analysis.{module}")
        for n in module_names(module):
            obj = getattr(mod, n)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                found.setdefault(id(obj), f"analysis.{module}.{n}")
    return found


def write(api_dir: Path) -> list[Path]:
    """Write ``analysis.rst`` and one ``analysis.<module>.rst`` per public module into *api_dir* (only when changed).

    autosummary's pages from an earlier build (``generated/``) are removed first: a name that left the public
    surface must not leave its page behind, outside every toctree.
    """
    api_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(api_dir / "generated", ignore_errors=True)
    pages = {"analysis.rst": top_level_page()}
    pages.update({f"analysis.{m}.rst": module_page(m) for m in PUBLIC_MODULES})
    written = []
    for name, text in pages.items():
        path = api_dir / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written


def copy_notebook(source: Path, target: Path) -> None:
    """Copy a notebook for the build; one that starts without a heading gets its metadata title (else its file name) as one."""
    import nbformat

    notebook = nbformat.read(source, as_version=4)
    first = next((cell for cell in notebook.cells if cell.cell_type == "markdown"), None)
    if first is None or not first.source.lstrip().startswith("# "):
        title = notebook.metadata.get("title") or source.stem.replace("_", " ").capitalize()
        notebook.cells.insert(0, nbformat.v4.new_markdown_cell(f"# {title}"))
    nbformat.write(notebook, target)
