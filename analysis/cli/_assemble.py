"""``bia assemble``: a run directory written from loose dumps; and the assembly ``bia report`` does for the dumps it is given."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..core import OutputExists
from ._args import _fail, _sources, _unread
from ._options import BandPerFile, MappingFile


def _assemble(dumps: list[str], mapping: Path | None, band_per_file: bool, *, command: str = "report"):
    """The run the dumps make, or a one-line error and bia's exit code: 3 a path that does not exist (6 a URL not fetched), 4 a dump
    bia cannot read, 2 a request it cannot place."""
    from ..core import NOT_JSON
    from ..dumps import DumpError
    from ..io import SourceError
    from ..report import ACCEPTS
    from ..run import RunError, assemble_dumps

    try:
        return assemble_dumps(dumps, mapping=mapping, band_per_file=band_per_file)
    except (FileNotFoundError, SourceError) as exc:
        raise _unread(exc) from None
    except DumpError as exc:
        if exc.problem.startswith(
            NOT_JSON
        ):  # a file broken off, not one of an unknown kind: said as bia witness says it
            raise _fail(exc, 4) from None
        where = f"{exc.record}.{exc.field}" if exc.field else exc.record
        if command == "assemble":
            raise _fail(f"{exc.source}: not a logprob dump bia reads ({where}: {exc.problem})", 4) from None
        raise _fail(
            f"{exc.source}: neither a witness (no witness_version), a release marker, a run directory nor a logprob dump bia reads "
            f"({where}: {exc.problem}); {ACCEPTS}",
            4,
        ) from None
    except RunError as exc:
        raise _fail(str(exc), 2) from None


def assemble_command(
    dumps: Annotated[
        list[str] | None,
        typer.Argument(metavar="DUMP...", help="Dump files, folders or globs (envelopes: prompt_id, role, c, slot)."),
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="The run directory to write.")] = Path(
        "runs/assembled"
    ),
    mapping: MappingFile = None,
    band_per_file: BandPerFile = False,
    force: Annotated[bool, typer.Option("--force", help="Replace what the output folder holds.")] = False,
) -> None:
    """Write a run directory from loose dumps, each request placed by its capture envelope, --mapping or --band-per-file.

    Exit 0 written, 2 a request it cannot place (file and field named) or an occupied output, 3 no such path, 4 not a dump, 6 a URL not fetched.
    """
    from ..report import is_lone
    from ..run import RunError, write_run

    if not dumps and mapping is None:
        raise _fail("give the dumps (files, folders or globs), or --mapping FILE")
    found = _sources(dumps, frozenset({"dump"}), "assemble").dumps if dumps else []  # a stray file in a folder: a note
    run = _assemble(found, mapping, band_per_file, command="assemble")
    try:
        folder = write_run(run, output, force=force)
    except OutputExists as exc:
        raise _fail(exc) from None
    except RunError as exc:
        raise _fail(str(exc), 4) from None
    requests = run.dump.requests.unique(["source", "record"]).height
    typer.echo(
        f"wrote {folder}: {requests} request{'s' if requests != 1 else ''}, {len(run.prompts)} prompt(s), ladder {run.ladder}"
    )
    if is_lone(run):
        typer.echo(
            "note: one request allows no batch comparison (it is ref #1 of its prompt); add the prompt sent in batches of c",
            err=True,
        )
