"""``bia witness``: a terminal table of witnesses and their bands, with each witness's V3 verdict."""

from __future__ import annotations

from typing import Annotated

import typer

from ..verdicts import EXIT_RED
from ._args import _fail, _go_offline, _policy, _sources, _unread
from ._options import Bands, ModelPrefix, Offline, PolicyFile


def witness_command(
    paths: Annotated[
        list[str], typer.Argument(metavar="SOURCE...", help="Witness or marker files, folders, globs or URLs.")
    ],
    reasons: Annotated[bool, typer.Option("--reasons", help="List every V3 reason and discrepancy.")] = False,
    policy_file: PolicyFile = None,
    model_prefix: ModelPrefix = None,
    bands: Bands = None,
    offline: Offline = False,
) -> None:
    """A terminal table of witnesses and their bands, with the V3 verdict of each witness."""
    _go_offline(offline)
    from ..core import WitnessError
    from ..io import SourceError
    from ..views import print_witness_tables
    from ..witness import read_witnesses

    policy = _policy(policy_file, model_prefix, None, bands, None, None, None, None)
    from ..report import run_directory_problem

    for path in paths:  # a run directory, not read file by file as witnesses (its cache files are none)
        if (problem := run_directory_problem(path)) is not None:
            raise _fail(problem, EXIT_RED)
    sources = _sources(paths, frozenset({"witness"}), "witness")  # a stray file in a folder: a note, not a failure
    try:
        ws = read_witnesses(sources.witnesses)
    except (FileNotFoundError, IsADirectoryError, SourceError) as exc:
        raise _unread(exc) from None
    except WitnessError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_RED) from None
    print_witness_tables(ws, ws.shape_checks(policy), show_reasons=reasons)
