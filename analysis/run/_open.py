"""Opening a run directory: held whole (:func:`analysis.run._read.read_whole_run`) or a piece at a time
(:func:`analysis.run._pieces.streamed_run`)."""

from __future__ import annotations

import os
from typing import Any

from ._model import Run
from ._pieces import streamed_run
from ._read import read_whole_run
from ._slot_tables import slot_table  # noqa: F401  (the docstring's example)


def read_run(path: str | os.PathLike[str], *, cache: bool = True, stream: bool = False, **options: Any) -> Run:
    """Read a run directory (see the module docstring for its layout).

    The captures are parsed once: the first read writes the tables to ``derived/`` (unless the
    directory is read-only), and later reads open them as long as every capture file has the size
    and sha256 recorded with them; a capture added, changed or removed makes them stale, and the
    captures are parsed again. ``cache=False`` always parses and writes nothing. ``options`` go to
    :func:`analysis.read_dumps` (for example ``lenient=True``); a read with options never uses the cache.

    Parameters
    ----------
    path : str or os.PathLike
        The run directory: ``manifest.json`` and ``captures/``.
    cache : bool, default True
        Read and write the parsed tables in ``derived/``.
    stream : bool, default False
        Read the captures a piece at a time (a group of prompts, :func:`analysis.run.run_pieces`): the run holds its requests and no
        token, and each table (:func:`slot_table`, :func:`band_table`, ...) is computed one piece at a time and merged,
        so memory is a piece's and not the run's; the tables are kept under ``derived/pieces/tables/`` for the next
        read. What ``bia report``, ``bia certify`` and :func:`analysis.judge` read a run directory with. Without it the
        run is held whole, the same computation collected (``run.tokens``, the tables as frames).
    **options : Any
        Passed to ``read_dumps``; any option turns the cache off for this read.

    Returns
    -------
    Run

    Raises
    ------
    RunError
        No such folder, no manifest or no ``captures/``, or a manifest that cannot be read.

    Examples
    --------
    >>> run = read_run("data/experiment-cpu/default")
    >>> run.dump.requests.height, run.ladder
    (62, [1, 4, 8, 16])
    >>> streamed = read_run("data/experiment-cpu/default", stream=True)
    >>> streamed.dump.tokens.height, slot_table(streamed).equals(slot_table(run))
    (0, True)
    """
    if stream:
        if options or not cache:
            raise TypeError("read_run: stream=True reads through the pieces' cache, with no read_dumps option")
        return streamed_run(path)
    return read_whole_run(path, cache=cache, **options)
