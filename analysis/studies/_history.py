"""A history of witnesses, runs and release markers over time: reading sources into one, and keeping a history folder.

:func:`read_history` turns sources (witness and marker files or URLs, run directories, folders of
either, and history folders) into one :class:`History` of three frames, ``entries``, ``bands`` and
``markers``, keyed by time, host, engine, model, server commit and settings (``_history_frames`` says what
each holds and what a series is; ``_history_rows`` reads each source into their rows).

:func:`append_history` adds sources to a history folder, which a scheduled job grows night after
night. Its layout (``history_version`` 1)::

    HISTORY/
      history.json                      {"history_version": 1}
      originals/<sha256[:16]>-<name>    every witness and marker file as it was read (never rewritten)
      runs/<sha256[:16]>-<name>/        each run's manifest.json (its captures stay where they are)
      entries/part-<UTC stamp>.parquet  one part per append: rows are only ever added
      bands/part-<UTC stamp>.parquet
      markers/part-<UTC stamp>.parquet

A source already in the history (the same bytes: a witness's sha256, a run's manifest and captures)
is not added twice. :meth:`History.regressions` applies :data:`REGRESSION_RULES`, rules kept as data.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import polars as pl

from ..core import OutputExists, write_atomic
from ..io import read_source_bytes
from ._history_frames import BAND_SCHEMA, ENTRY_SCHEMA, MARKER_SCHEMA, History, _history_of
from ._history_rows import _rows_of
from ._sources import is_history as _is_history

HISTORY_VERSION = 1


class HistoryError(ValueError):
    """A source or history folder that cannot join a history; the message names it."""


def _empty_history() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """A new history folder's three datasets."""
    return pl.DataFrame(schema=ENTRY_SCHEMA), pl.DataFrame(schema=BAND_SCHEMA), pl.DataFrame(schema=MARKER_SCHEMA)


def _read_folder(folder: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """A history folder's three datasets."""
    try:
        version = json.loads((folder / "history.json").read_text(encoding="utf-8")).get("history_version")
    except (OSError, ValueError, AttributeError):
        version = None
    if version != HISTORY_VERSION:
        raise HistoryError(f"{folder / 'history.json'}: history_version {version!r} is not {HISTORY_VERSION}")
    frames = []
    for name, schema in (("entries", ENTRY_SCHEMA), ("bands", BAND_SCHEMA), ("markers", MARKER_SCHEMA)):
        parts = sorted((folder / name).glob("part-*.parquet"))
        frames.append(
            pl.concat([pl.read_parquet(p) for p in parts], how="vertical") if parts else pl.DataFrame(schema=schema)
        )
    entries, bands, markers = frames
    return entries, bands, markers


def read_history(sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> History:
    """One history over witnesses, markers and runs (see the module docstring).

    Parameters
    ----------
    sources : path, URL, or an iterable of them
        History folders (:func:`append_history`), run directories, witness and marker files or
        URLs, and folders holding any of them. The same entry reached twice is kept once.

    Examples
    --------
    >>> history = read_history("data/aprender-lambda")
    >>> history.entries.height, history.markers["commit"].str.slice(0, 7).to_list()
    (3, ['a765c86', 'c554a77'])
    >>> history.bands.filter(c=4)["earliest_divergence"].to_list()
    [3, 3, 3]
    """
    sources = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    appended = dt.datetime.now(dt.UTC)
    entries, bands, markers, histories = _rows_of(sources, appended)
    for folder in histories:
        more = _read_folder(folder)
        entries, bands, markers = (pl.concat([a, b], how="vertical") for a, b in zip((entries, bands, markers), more))
    return _history_of(entries, bands, markers)


def append_history(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], folder: str | os.PathLike[str]
) -> History:
    """Add sources to the history folder ``folder`` (made when missing) and return the whole history.

    Entries the folder already holds are not added again, so a job may append the same sources
    every night. The originals are copied in beside the tables; nothing there is ever rewritten.

    Parameters
    ----------
    sources : str, os.PathLike or iterable of them
        Witnesses, markers and run directories, as ``read_history`` takes them (not another history folder).
    folder : str or os.PathLike
        The history folder: missing, empty, or one bia made.

    Returns
    -------
    History
        Everything the folder holds after the append.

    Raises
    ------
    OutputExists
        ``folder`` is a file or holds something other than a history.
    HistoryError
        A source is itself a history folder.

    Examples
    --------
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp()) / "history"
    >>> append_history("data/aprender-lambda", folder).entries.height
    3
    >>> append_history("data/aprender-lambda", folder).entries.height  # the same files again: nothing new
    3
    """
    folder = Path(folder)
    # an empty folder may become one; anything else is refused, never cleared
    if folder.exists() and not _is_history(folder) and (folder.is_file() or any(folder.iterdir())):
        raise OutputExists(
            f"{folder}: the history folder holds something that is not a bia history (no history.json); "
            "give a new or empty folder"
        )
    # the folder's version, then every source, are read before the folder is made or touched: a fault leaves it as it was
    known = _read_folder(folder) if _is_history(folder) else _empty_history()
    sources = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    appended = dt.datetime.now(dt.UTC)
    entries, bands, markers, histories = _rows_of(sources, appended)
    if histories:
        raise HistoryError(
            f"{histories[0]}: a history folder cannot be appended to another; read both with read_history"
        )
    if not _is_history(folder):
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "history.json", json.dumps({"history_version": HISTORY_VERSION}))
    new_entries = entries.join(known[0].select("entry"), on="entry", how="anti").unique("entry", maintain_order=True)
    new_markers = markers.join(known[2].select("entry"), on="entry", how="anti").unique("entry", maintain_order=True)
    new_bands = bands.join(new_entries.select("entry"), on="entry", how="semi").unique(
        ["entry", "c"], maintain_order=True
    )
    stamp = appended.strftime("%Y%m%dT%H%M%S%fZ")
    for name, frame in (("entries", new_entries), ("bands", new_bands), ("markers", new_markers)):
        if frame.height:
            (folder / name).mkdir(exist_ok=True)
            part = folder / name / f"part-{stamp}.parquet"
            frame.write_parquet(part.with_suffix(".part"))
            os.replace(part.with_suffix(".part"), part)  # a part appears whole or not at all
    _keep_originals(
        folder,
        pl.concat(
            [
                new_entries.select("entry", "kind", "source"),
                new_markers.select("entry", "source")
                .with_columns(kind=pl.lit("marker"))
                .select("entry", "kind", "source"),
            ]
        ),
    )
    return _history_of(
        *(pl.concat([old, new], how="vertical") for old, new in zip(known, (new_entries, new_bands, new_markers)))
    )


def _keep_originals(folder: Path, added: pl.DataFrame) -> None:
    """Copy each new witness and marker file into ``originals/``, and each new run's manifest into ``runs/``."""
    for entry, kind, source in added.iter_rows():
        name = Path(source.rstrip("/")).name or "source"
        if kind == "run":
            target = folder / "runs" / f"{entry[:16]}-{name}"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(source) / "manifest.json", target / "manifest.json")
        else:
            target = folder / "originals" / f"{entry[:16]}-{name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.write_bytes(read_source_bytes(source))
