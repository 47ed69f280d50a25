"""``bia trend``: the trend report, bands over time per host, engine and model, regressions flagged."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..core import OutputExists
from ._args import _fail, _go_offline, _quiet_after_interrupt, _sources, _unread
from ._options import Offline


def trend_command(
    sources: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="SOURCE...", help="History folders, runs, witnesses, markers; the embedded history if none."
        ),
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")] = Path("trend.html"),
    title: Annotated[str, typer.Option(help="The report's title.")] = "Batch-invariance trend",
    force: Annotated[bool, typer.Option("--force", help="Overwrite the output when it exists.")] = False,
    offline: Offline = False,
) -> None:
    """The trend report: bands over time per host, engine and model, regressions flagged with the commits around them."""
    from ..core import WitnessError, claim_output
    from ..io import SourceError
    from ..report import ReportError
    from ..report.trend import render_trend
    from ..run import RunError
    from ..studies import HISTORY_READS, HistoryError

    _go_offline(offline)
    try:  # the output first, before any source is read (render_trend claims it again, as its Python callers need)
        claim_output(output, force=force, what="the trend report")
    except OutputExists as exc:
        raise _fail(exc) from None
    given = []
    if sources:  # the embedded history only when nothing at all is given: a folder with nothing to read is exit 3
        found = _sources(sources, HISTORY_READS, "trend")
        given = [*found.histories, *found.runs, *found.witnesses]
    try:
        with _quiet_after_interrupt():
            written = render_trend(given, output, title=title, force=force)
    except OutputExists as exc:
        raise _fail(exc) from None
    except (FileNotFoundError, SourceError) as exc:
        raise _unread(exc) from None
    except (WitnessError, RunError, HistoryError) as exc:
        raise _fail(str(exc), 4) from None
    except ReportError as exc:
        raise _fail(str(exc), 1) from None
    typer.echo(f"wrote {written}")
