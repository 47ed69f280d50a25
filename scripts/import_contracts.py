"""A contract import-linter has no built-in type for: a folder's private modules are its own.

``lint-imports`` (scripts/test.sh) loads this module through ``contract_types`` in pyproject.toml's
``[tool.importlinter]``; it runs with the repository root on ``sys.path``.

A module is private when a part of its name below the root package starts with ``_`` (``analysis.run._model``,
``analysis.dumps.formats._openai_fast``). Its folder is the first part below the root (``analysis.run``); a
top-level module (``analysis.testing``) is a folder of its own. An import of a private module from another folder
breaks the contract: that folder's face (its ``__init__`` and ``__all__``) is the way in.
"""

from __future__ import annotations

from importlinter import Contract, ContractCheck, fields, output


def folder(module: str, root: str) -> str:
    """The folder a module belongs to: the root and the first part below it (the root for the root)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == root and len(parts) > 1 else module


def is_private(module: str) -> bool:
    """Whether a part of the module's name below the root package starts with an underscore."""
    return any(part.startswith("_") and not part.startswith("__") for part in module.split(".")[1:])


class PrivateModulesContract(Contract):
    """No module imports a private module of another folder of ``root``.

    Configuration: ``root`` (the package), ``ignore_imports`` (``importer -> imported`` pairs allowed, each
    with its reason in a comment beside it).
    """

    type_name = "private_modules"

    root = fields.StringField()
    ignore_imports = fields.ListField(subfield=fields.StringField(), required=False)

    def check(self, graph, verbose: bool) -> ContractCheck:
        root = str(self.root)
        ignored = {tuple(part.strip() for part in pair.split("->")) for pair in (self.ignore_imports or [])}
        broken = []
        for imported in sorted(graph.modules):
            if not imported.startswith(root + ".") or not is_private(imported):
                continue
            for importer in sorted(graph.find_modules_that_directly_import(imported)):
                if folder(importer, root) == folder(imported, root) or (importer, imported) in ignored:
                    continue
                lines = tuple(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
                broken.append((importer, imported, lines))
        return ContractCheck(kept=not broken, warnings=[], metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, lines in check.metadata["broken"]:
            output.print_error(f"- {importer} -> {imported} (l.{', '.join(map(str, lines))})", bold=False)
            output.new_line()
        output.print_error("Import the name from its folder's face (the folder's __init__ and __all__).", bold=False)
        output.new_line()
