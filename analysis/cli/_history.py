"""``bia history``: runs, witnesses and markers added to a history folder, each once, for ``bia trend``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..core import OutputExists
from ._args import _fail, _go_offline, _sources, _unread
from ._options import Offline


def history_command(
    sources: Annotated[
        list[str],
        typer.Argument(metavar="SOURCE...", help="Run directories, witness and marker files or URLs, folders of them."),
    ],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="The history folder to add them to (made when missing).")
    ],
    offline: Offline = False,
) -> None:
    """Add runs, witnesses and markers to a history folder (each once), for bia trend."""
    from ..core import OutputUnwritable, WitnessError, check_writable
    from ..io import SourceError
    from ..run import RunError
    from ..studies import HISTORY_READS, HistoryError, append_history

    _go_offline(offline)
    try:
        check_writable(output / "history.json", "the history folder")  # before any source is read
        before = _history_size(output)
        given = _sources(sources, HISTORY_READS, "history")
        history = append_history([*given.histories, *given.runs, *given.witnesses], output)
    except (FileNotFoundError, SourceError) as exc:
        raise _unread(exc) from None
    except (WitnessError, RunError, HistoryError) as exc:
        raise _fail(str(exc), 4) from None
    except OutputExists as exc:
        raise _fail(
            exc.problem if isinstance(exc, OutputUnwritable) else f"{exc.problem}; a history folder holds history.json"
        ) from None
    typer.echo(
        f"{output}: {history.entries.height - before} new entr{'y' if history.entries.height - before == 1 else 'ies'}, "
        f"{history.entries.height} in all"
    )


def _history_size(folder: Path) -> int:
    from ..studies import read_history

    return read_history([folder]).entries.height if (folder / "history.json").is_file() else 0
