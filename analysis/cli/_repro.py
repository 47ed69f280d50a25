"""``bia repro``: a RED run's first parting request, shrunk against the live server, as repro.py, REPORT.md and a minimal run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..verdicts import EXIT_MISSING
from ._args import EXIT_UNREACHABLE, _fail, _read_runs

#: ``bia repro``'s exit when no case parted in every try: nothing minimal was written (docs/cli.md).
EXIT_NOT_REPRODUCIBLE = 7


def repro_command(
    run: Annotated[Path, typer.Argument(metavar="RUN", help="A run directory whose verdict is RED.")],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="The folder to write repro.py, REPORT.md and run/ in (default: RUN-repro, beside the run, where the "
            "report finds it).",
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="The server to shrink against ('run': the URL the run recorded); without it nothing "
            "is fired and the run's own request is the repro.",
        ),
    ] = None,
    request: Annotated[
        str | None,
        typer.Option(
            metavar="PROMPT_ID/C/REPEAT/SLOT", help="The batched request to reproduce instead of the judgement's first."
        ),
    ] = None,
    tries: Annotated[
        int, typer.Option(min=1, help="Tries per candidate; a case is kept only when it parts in all of them.")
    ] = 3,
    max_requests: Annotated[int, typer.Option(min=1, help="The most completions the shrink may request.")] = 400,
    max_time: Annotated[float, typer.Option(help="The most seconds the shrink may take.")] = 600.0,
    timeout: Annotated[float, typer.Option(help="Seconds each request may take.")] = 120.0,
    api_key: Annotated[
        str | None,
        typer.Option(metavar="KEY", envvar="BIA_API_KEY", show_envvar=True, help="Bearer token; never written."),
    ] = None,
    resume: Annotated[bool, typer.Option(help="Go on with the shrink in --output (its shrink.json).")] = False,
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="A run made in process by transformers: its checkpoint folder (or bia's .safetensors model), when the "
            "run does not name one that is here.",
        ),
    ] = None,
    generate: Annotated[
        str | None,
        typer.Option(
            metavar="MODULE:FUNCTION",
            help="A run made in process by analysis.probe_callable: the generate it was probed with, which repro.py imports.",
        ),
    ] = None,
) -> None:
    """Shrink a RED run's first parting request against the live server, and write repro.py, REPORT.md and the minimal run."""
    from ..core import OutputExists
    from ..probe import ProbeError, ServerGone, ServerUnreachable
    from ..reproduce import ReproError, command_line, repro
    from ..studies import repro_folder

    output = output or Path(repro_folder(str(run)))
    if not (run / "manifest.json").is_file():
        raise _fail(f"{run}: no run there (no manifest.json)", EXIT_MISSING)
    _read_runs([run], "RUN")
    try:
        found = repro(
            run,
            url,
            output,
            request=request,
            tries=tries,
            max_requests=max_requests,
            max_time=max_time,
            timeout=timeout,
            api_key=api_key,
            resume=resume,
            command=command_line(["bia", "repro", *sys.argv[2:]]),
            checkpoint=checkpoint,
            generate=generate,
        )
    except (ServerUnreachable, ServerGone) as exc:
        raise _fail(exc, EXIT_UNREACHABLE) from None
    except OutputExists as exc:
        raise _fail(exc) from None
    except (ReproError, ProbeError) as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted: bia repro {run} -o {output} --resume goes on from {output / 'shrink.json'}", err=True)
        raise typer.Exit(130) from None
    written = [path for path in (found.report, found.script, found.run) if path.exists()]
    typer.echo(f"wrote {', '.join(map(str, written))}")
    typer.echo(found.outcome)
    if not found.reproduced:
        raise typer.Exit(EXIT_NOT_REPRODUCIBLE)
