"""The ``bia`` command line: the typer app, one command per module (``_probe``, ``_report``, ``_certify``...), assembled here in the
order ``bia --help`` lists them; what the commands share (errors, exit codes, parsing) is in ``_args``, their common options in
``_options``."""

from __future__ import annotations

import typer

from ._assemble import assemble_command
from ._certify import certify_command
from ._experiment import experiment_command
from ._help import Command, Group
from ._history import history_command
from ._probe import probe_command
from ._report import report_command
from ._repro import repro_command
from ._serve import serve_command
from ._shape_check import shape_check_command
from ._trend import trend_command
from ._witness import witness_command

app = typer.Typer(
    cls=Group,
    help="bia: batch-invariance studies of LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain "Error: ..." line for a mistyped option, not a box that wraps in logs
)

# The commands, in the order bia --help lists them.
for _name, _command in (
    ("shape-check", shape_check_command),
    ("witness", witness_command),
    ("assemble", assemble_command),
    ("report", report_command),
    ("experiment", experiment_command),
    ("probe", probe_command),
    ("serve", serve_command),
    ("certify", certify_command),
    ("repro", repro_command),
    ("history", history_command),
    ("trend", trend_command),
):
    app.command(_name, cls=Command)(_command)
del _name, _command


def main() -> None:
    """Entry point of the ``bia`` console script and ``python -m analysis``."""
    import warnings

    shown = warnings.showwarning

    def note(message, category, filename, lineno, file=None, line=None) -> None:
        # bia's own warnings (a capture cut short, a file skipped, a source given twice) are a note's one line, as the
        # commands' own notes are; anything else keeps Python's form
        if category.__module__.startswith("analysis."):
            typer.echo(f"note: {message}", err=True)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = note
    app(prog_name="bia")


__all__ = ["app", "main"]
