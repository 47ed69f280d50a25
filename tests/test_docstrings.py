"""Every public function documents its parameters the numpydoc way (issue 33).

The API pages are built by Sphinx with numpydoc (scripts/docs.sh); a function whose docstring has no
``Parameters`` section shows its signature and nothing about what each argument means, takes or defaults
to. This test walks every module of ``analysis`` and, for each public function or method on a module's
public face, checks that every parameter of its signature is named in a numpydoc ``Parameters`` (or
``Other Parameters``) section.

What counts as public: a name without a leading underscore, defined in the module being walked
(``obj.__module__ == module.__name__``, so a re-export is checked once, where it is defined), that is a
top-level function, or a method (plain, class or static) defined in the body of a public class. Private
modules (``_model.py``) are walked too: their public names are what the package re-exports. ``self`` and
``cls`` are not parameters to document; a function that takes nothing else is not checked. ``*args`` and
``**kwargs`` are documented as ``*args`` / ``**kwargs`` (with or without the stars), or, for ``**kwargs``,
by naming the keywords it takes (entries the named parameters do not account for).

One exception: a typer command callback in ``analysis/cli/`` is skipped when it has a docstring and its
command sets no ``help=``, since typer shows that docstring as the command's ``--help`` and each
option's help is written on the option itself; a numpydoc section there would be printed to the user.

The paths in ``CHECKED_FOLDERS`` cover every folder and module of the package; a new one is added there.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

from numpydoc.docscrape import NumpyDocString

import analysis

ROOT = Path(analysis.__file__).resolve().parent

# Paths under analysis/ (a folder, or a single module's file) whose public functions are checked: all of the package.
CHECKED_FOLDERS = ["core/", "io/", "verdicts/", "witness/", "run/", "studies/", "dumps/", "metrics/", "experiment/",
                   "views/", "report/", "probe/", "reproduce/", "cli/", "serve/", "testing.py", "__init__.py", "__main__.py",
                   "parity.py", "plots.py", "trend.py"]


def _modules():
    """Every module of the analysis package, imported, in walk order."""
    found = [analysis]
    for info in pkgutil.walk_packages(analysis.__path__, "analysis."):
        found.append(importlib.import_module(info.name))
    return found


def _relative(function) -> str:
    """The file that defines ``function``, relative to the package root, as ``run/_model.py``."""
    return Path(inspect.getsourcefile(inspect.unwrap(function))).resolve().relative_to(ROOT).as_posix()


def _checked(relative: str) -> bool:
    """Whether a file (relative to the package root) lies under one of ``CHECKED_FOLDERS``."""
    return any(relative == entry or (entry.endswith("/") and relative.startswith(entry)) for entry in CHECKED_FOLDERS)


def _typer_callbacks() -> set:
    """The callbacks of the ``bia`` commands whose docstring typer shows as their help (no ``help=`` given)."""
    import typer

    from analysis import cli

    skipped = set()
    apps = [value for module in _modules() if module.__name__.startswith("analysis.cli")
            for value in vars(module).values() if isinstance(value, typer.Typer)]
    while apps:
        app = apps.pop()
        for command in app.registered_commands:
            if command.callback is not None and command.help is None and inspect.getdoc(command.callback):
                skipped.add(command.callback)
        apps.extend(group.typer_instance for group in app.registered_groups)
    assert skipped or not hasattr(cli, "app"), "no typer command found in analysis.cli: the exception above names nothing"
    return skipped


def _public_routines(module):
    """``(qualified name, function, drops_first)`` for each public function and public method of a public class
    defined in ``module``; ``drops_first`` says the first parameter is ``self`` or ``cls``."""
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or "__mutmut_" in name or getattr(value, "__module__", None) != module.__name__:
            continue  # (mutmut's copies of a function, in a mutation run's tree, are not bia's API)
        if inspect.isfunction(value) or (callable(value) and hasattr(value, "__wrapped__") and not inspect.isclass(value)):
            yield f"{module.__name__}.{name}", value, False
        elif inspect.isclass(value):
            for attr, member in vars(value).items():
                if attr.startswith("_") or "__mutmut_" in attr:
                    continue
                if isinstance(member, staticmethod):
                    function, drops_first = member.__func__, False
                elif isinstance(member, classmethod):
                    function, drops_first = member.__func__, True
                elif inspect.isfunction(member):
                    function, drops_first = member, True
                else:
                    continue  # properties, constants, nested classes
                if function.__name__ != attr or not function.__qualname__.startswith(f"{value.__qualname__}."):
                    continue  # a lambda (a dataclass field's default) or a function bound under another name: no method
                yield f"{module.__name__}.{name}.{attr}", function, drops_first


def _documented_names(doc: str) -> set[str]:
    """The names a numpydoc docstring documents under ``Parameters`` and ``Other Parameters``."""
    parsed = NumpyDocString(doc)
    names = set()
    for section in ("Parameters", "Other Parameters"):
        for entry in parsed[section]:
            for name in entry.name.split(","):
                names.add(name.strip().replace("\\", ""))
    return names


def _missing(function, drops_first: bool) -> list[str] | None:
    """The parameters ``function``'s docstring leaves undocumented: None when it takes none to document; with
    ``(no docstring)`` or ``(no Parameters section)`` first, then every parameter, when there is nothing to read."""
    parameters = list(inspect.signature(inspect.unwrap(function)).parameters.values())
    if drops_first and parameters:
        parameters = parameters[1:]
    if not parameters:
        return None
    shown = [f"*{p.name}" if p.kind is p.VAR_POSITIONAL else f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name for p in parameters]
    doc = inspect.getdoc(function)
    if not doc:
        return ["(no docstring)", *shown]
    try:
        documented = _documented_names(doc)
    except ValueError as exc:  # numpydoc refuses a malformed section (a duplicated heading, say)
        return [f"(numpydoc cannot parse it: {exc})", *shown]
    if not documented:
        return ["(no Parameters section)", *shown]
    named = {p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    missing = []
    for p in parameters:
        if p.kind is p.VAR_POSITIONAL:
            if not documented & {f"*{p.name}", p.name}:
                missing.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            keywords = {name.lstrip("*") for name in documented} - named - {p.name}
            if not documented & {f"**{p.name}", p.name} and not keywords:
                missing.append(f"**{p.name}")
        elif p.name not in documented:
            missing.append(p.name)
    return missing


def offenders(checked=_checked) -> list[str]:
    """One line per public function whose Parameters section misses a parameter, among those whose defining file
    (relative to the package root) ``checked`` accepts. The file decides, not the module walked: the package
    re-homes its public classes (``analysis.Run.__module__`` is ``analysis``), whose methods live in the folders."""
    skipped = _typer_callbacks()
    lines = []
    for module in _modules():
        for _, function, drops_first in _public_routines(module):
            if function in skipped or not checked(_relative(function)):
                continue
            missing = _missing(function, drops_first)
            if missing:
                note = f"{missing.pop(0)} " if missing[0].startswith("(") else ""
                lines.append(f"{function.__module__}.{function.__qualname__}: {note}missing {', '.join(missing)}")
    return lines


def test_public_functions_document_their_parameters():
    found = offenders()
    assert not found, f"{len(found)} public function(s) without a numpydoc Parameters entry for each parameter:\n  " + "\n  ".join(found)


def test_the_check_reads_numpydoc_sections():
    # the check itself: a documented function passes, and each kind of gap is named
    def whole(a, b, *rest, **options):
        """Do it.

        Parameters
        ----------
        a, b : int
            Two numbers.
        *rest : int
            More.
        **options
            Passed on.
        """

    def half(a, b, **options):
        """Do it.

        Parameters
        ----------
        a : int
            A number.
        """

    def keywords(a, **options):
        """Do it.

        Parameters
        ----------
        a : int
            A number.
        width : int
            A keyword ``options`` takes.
        """

    def bare(a):
        """Do it."""

    def undocumented(a, *rest, **options):
        pass

    def nothing():
        pass

    assert _missing(whole, False) == []
    assert _missing(half, False) == ["b", "**options"]
    assert _missing(keywords, False) == []
    assert _missing(bare, False) == ["(no Parameters section)", "a"]
    assert _missing(lambda self: None, True) is None
    assert _missing(undocumented, False) == ["(no docstring)", "a", "*rest", "**options"]
    assert _missing(nothing, False) is None


def test_checked_folders_exist():
    for entry in CHECKED_FOLDERS:
        assert (ROOT / entry).exists(), f"CHECKED_FOLDERS names analysis/{entry}, which is not there"


def test_checked_folders_cover_the_package():
    relative = [path.relative_to(ROOT).as_posix() for path in ROOT.rglob("*.py")]
    unchecked = sorted(name for name in relative if not _checked(name))
    assert not unchecked, f"CHECKED_FOLDERS leaves out analysis/{unchecked[0]} ({len(unchecked)} in all): add it"


if __name__ == "__main__":  # the offenders in all of analysis/, checked or not: python tests/test_docstrings.py
    inside, outside = offenders(), offenders(lambda relative: not _checked(relative))
    print("\n".join(inside + outside))
    print(f"{len(inside)} offender(s) in CHECKED_FOLDERS, {len(outside)} elsewhere")
