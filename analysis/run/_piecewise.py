"""The tables of a run read a piece at a time (``read_run(path, stream=True)``): each table is a function of one
prompt's requests, so a run's table is the table of each piece, merged in a fixed order.

A table function decorated with :func:`piecewise` computes as before on a run held whole. On a streamed run (one whose
``pieces`` is set), the first table asked for computes every registered table in one pass over the pieces (each piece's
tokens read once, whichever tables the caller needs next), merges them, and keeps them under ``derived/pieces/tables/``
where the run directory takes it: each reader reads the columns it asks for from there, and the run holds none of them
(a warm report reads those files, not the tokens). Where nothing can be kept (a study, a read-only run), the run holds
them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import polars as pl

from ..metrics import parity

# Rows a row group of a kept table or plan holds: a scan decodes a row group (and reads ahead a few) at a time, so
# what a scan holds is set by this and not by the run (polars' default, 512**2, was a sixth of a 516,000-request table).
KEPT_ROW_GROUP = 16_384
_CONTEXT_KEYS = ("epsilon", "reference")  # what a pass is computed for: every table of it takes these or fewer


@dataclass(frozen=True)
class _Table:
    name: str
    compute: Callable[..., pl.DataFrame]
    takes: tuple[str, ...]  # which of _CONTEXT_KEYS it takes
    merge: Callable[[pl.DataFrame], pl.DataFrame] | None  # what makes the pieces' rows, concatenated, the run's
    eager: bool  # computed in the one pass and kept; else in a pass of its own when asked for, held with the run only


_REGISTRY: dict[str, _Table] = {}


def piecewise(
    name: str,
    *,
    merge: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
    eager: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a per-prompt table: on a streamed run it is computed a piece at a time and merged.

    The function takes the run and, as keywords, any of ``epsilon`` and ``reference``; it must give, for a run that
    holds some of the prompts, exactly the rows the whole run gives for those prompts, or rows that ``merge`` makes the
    whole run's once concatenated. A call with another option (a run as the reference) computes on the run collected.
    Every registered table also takes ``columns``: only those columns, in that order; on a streamed run, a table kept
    on disk reads no other column from its file, so that a reader holds what it reads and not the whole table. And
    ``lazy``: the table as a ``polars.LazyFrame``, a scan of its file where it is kept, so that a reader that reduces it
    (counts, a first row) holds what the streaming engine reads at a time and not the column.

    Parameters
    ----------
    name : str
        The table's name among the merged tables.
    merge : callable, optional
        What makes the pieces' rows, concatenated, the whole run's (a reduction, a first row per key).
    eager : bool, default True
        Computed with every other eager table in the one pass and kept under ``derived/pieces/tables/``. A table that
        grows with the run (a row per step of every request) is not eager: a pass of its own computes it when asked for,
        so that a report, which reads only what its figures draw, never holds it.

    Returns
    -------
    callable
        The decorator.
    """

    def wrap(function: Callable[..., pl.DataFrame]) -> Callable[..., Any]:
        signature = inspect.signature(function)
        takes = tuple(key for key in _CONTEXT_KEYS if key in signature.parameters)
        defaults = {key: signature.parameters[key].default for key in takes}
        _REGISTRY[name] = _Table(name, function, takes, merge, eager)

        @functools.wraps(function)
        def table(
            run: Any, *, columns: Sequence[str] | None = None, lazy: bool = False, **options: Any
        ) -> pl.DataFrame | pl.LazyFrame:
            given = {**defaults, **options}
            if getattr(run, "pieces", None) is None:
                frame = function(run, **options)
            elif set(options) - set(takes):
                frame = function(run.collected(), **options)
            elif not isinstance(given.get("reference", "ref1"), str):  # another run's ref #1 of each prompt
                frame = _against_run(run, name, options)
            else:
                epsilon = float(given.get("epsilon", parity.NEAR_TIE_EPSILON))
                reference = given.get("reference", "ref1")
                return table_of(run, name, epsilon=epsilon, reference=reference, columns=columns, lazy=lazy)
            frame = frame if columns is None else frame.select(columns)
            return frame.lazy() if lazy else frame

        # help() and the API pages say what every registered table takes: columns= beside the function's own (its
        # signature stays the function's, which the API pages read back from its source)
        table.__doc__ = _with_columns(function.__doc__)
        return table

    return wrap


_COLUMNS_DOC = (
    "{indent}columns : sequence of str, optional\n"
    "{indent}    Only these columns, in this order: on a streamed run, a table kept on disk reads no other column.\n"
    "{indent}lazy : bool, default False\n"
    "{indent}    A ``polars.LazyFrame`` instead: on a streamed run, a scan of the table's file where it is kept.\n\n"
)


def _with_columns(doc: str | None) -> str | None:
    """A registered table's docstring with ``columns`` last among its parameters (before its Returns section)."""
    match = re.search(r"\n([ \t]*)Returns\n\1-------\n", doc or "")
    if doc is None or match is None or f"\n{match.group(1)}Parameters\n" not in doc:
        return doc
    at = match.start() + 1
    return doc[:at] + _COLUMNS_DOC.format(indent=match.group(1)) + doc[at:]


def merged_tables(
    run: Any, *, epsilon: float = parity.NEAR_TIE_EPSILON, reference: str = "ref1"
) -> dict[str, pl.DataFrame]:
    """Every registered eager table of a streamed run for this epsilon and reference, each read whole (see
    :func:`table_of`).

    Parameters
    ----------
    run : Run
        A streamed run (``read_run(path, stream=True)``).
    epsilon : float
        The near-tie epsilon.
    reference : {"ref1", "ref2"}
        Which reference each request is compared with.

    Returns
    -------
    dict of str to polars.DataFrame
    """
    return {
        name: cast(pl.DataFrame, table_of(run, name, epsilon=epsilon, reference=reference))
        for name in _eager_tables(run, epsilon, reference)
    }


def _eager_tables(run: Any, epsilon: float, reference: str) -> dict[str, pl.DataFrame | _Kept]:
    """The eager tables of a streamed run for this context: each kept on disk (read back from ``derived/pieces/tables/``
    when written there for the same captures and version, else computed in one pass and written there), or held with the
    run where nothing can be kept (a study, a read-only run)."""
    key = ("piecewise", float(epsilon), reference)
    tables = run._cache.setdefault(key, {})
    missing = [name for name, table in _REGISTRY.items() if table.eager and name not in tables]
    if not missing:
        return tables
    folder = run.pieces.tables_folder(f"{_code_digest()}-{float(epsilon)!r}-{reference}")
    captures = run.pieces.captures_dir()
    tables.update(_read_back(folder, missing, captures))
    missing = [name for name in missing if name not in tables]
    if missing:
        computed = _one_pass(run, missing, {"epsilon": float(epsilon), "reference": reference})
        written = _write_back(folder, computed, captures)
        tables.update({name: written.get(name, frame) for name, frame in computed.items()})
    return tables


@dataclass(frozen=True)
class _Kept:
    """A merged table kept on disk, read each time it is asked for: a report holds it only while a reader reads it, and
    only the columns that reader asks for (at 516,000 requests the slot table alone is 144 MB)."""

    file: Path
    old: str  # the captures folder its sources named when it was written
    captures: str  # where they are now

    def read(self, columns: Sequence[str] | None) -> pl.DataFrame:
        frame = pl.read_parquet(self.file, columns=None if columns is None else list(dict.fromkeys(columns)))
        if "source" in frame.columns:
            frame = _moved(self.old, self.captures)(frame)
        return frame if columns is None else frame.select(columns)

    def scan(self, columns: Sequence[str] | None) -> pl.LazyFrame:
        """The file scanned: checked to be the table's now (a file spoiled after it was written raises here, not in
        the middle of a reader's query), read when the scan is collected."""
        names = pl.read_parquet_schema(self.file)
        missing = [name for name in columns or () if name not in names]
        if missing:
            raise pl.exceptions.ColumnNotFoundError(f"{self.file.stem} has no column {missing[0]!r}")
        frame = pl.scan_parquet(self.file)
        if "source" in names:
            frame = _moved(self.old, self.captures)(frame)
        return frame if columns is None else frame.select(columns)


def _moved(old: str, new: str):
    """A frame whose ``source`` column names the captures where the run is now (``new``), not where they were read
    (``old``): a run directory moved or copied since its pieces or tables were written."""
    if old == new:
        return lambda frame: frame
    return lambda frame: frame.with_columns(
        pl.when(pl.col("source").str.starts_with(old))
        .then(pl.lit(new) + pl.col("source").str.slice(len(old)))
        .otherwise(pl.col("source"))
        .alias("source")
    )


def table_of(
    run: Any,
    name: str,
    *,
    epsilon: float = parity.NEAR_TIE_EPSILON,
    reference: str = "ref1",
    columns: Sequence[str] | None = None,
    lazy: bool = False,
) -> pl.DataFrame | pl.LazyFrame:
    """One registered table of a streamed run: from the eager tables' one pass (read from where it is kept, each time),
    or a table that is not eager in a pass of its own, held with the run.

    Parameters
    ----------
    run : Run
        A streamed run.
    name : str
        The table's registered name.
    epsilon : float
        The near-tie epsilon.
    reference : {"ref1", "ref2"}
        Which reference each request is compared with.
    columns : sequence of str, optional
        Only these columns, in this order (a kept table reads no other column from its file).
    lazy : bool, default False
        A ``polars.LazyFrame``: a kept table's file scanned, read when collected.

    Returns
    -------
    polars.DataFrame or polars.LazyFrame
    """
    if _REGISTRY[name].eager:
        return _eager_table(run, name, float(epsilon), reference, columns, lazy)
    context = {"epsilon": float(epsilon), "reference": reference}
    key = ("piecewise-alone", name, context["epsilon"], reference)
    if key not in run._cache:
        run._cache[key] = _one_pass(run, [name], context)[name]
    return _read(run._cache[key], columns, lazy)


def _eager_table(
    run: Any, name: str, epsilon: float, reference: str, columns: Sequence[str] | None, lazy: bool
) -> pl.DataFrame | pl.LazyFrame:
    """An eager table, read (or scanned) from where it is kept; a kept file gone or spoiled since the run read it back is
    computed and kept again, once (a second failure is raised, not computed again without end)."""
    table = _eager_tables(run, epsilon, reference)[name]
    if not isinstance(table, _Kept):
        return _read(table, columns, lazy)
    try:
        return _read(table, columns, lazy)
    except pl.exceptions.ColumnNotFoundError:
        raise
    except (OSError, pl.exceptions.PolarsError):
        run._cache.pop(("piecewise", epsilon, reference), None)
        with contextlib.suppress(OSError):  # not read back again
            (table.file.parent / "done.json").unlink()
        return _read(_eager_tables(run, epsilon, reference)[name], columns, lazy)


def _read(
    table: pl.DataFrame | _Kept, columns: Sequence[str] | None, lazy: bool = False
) -> pl.DataFrame | pl.LazyFrame:
    """A table held or kept, of only ``columns`` when given; scanned (kept) or held (``.lazy()``) when ``lazy``."""
    if isinstance(table, _Kept):
        return table.scan(columns) if lazy else table.read(columns)
    frame = table if columns is None else table.select(columns)
    return frame.lazy() if lazy else frame


@functools.cache
def _code_digest() -> str:
    """A digest of bia's own source: merged tables kept by other code (another version, a change being made) are not
    read back."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for file in sorted(package.rglob("*.py")):
        digest.update(file.relative_to(package).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def _against_run(run: Any, name: str, options: dict[str, Any]) -> pl.DataFrame:
    """A table against another run (its ref #1 of each prompt): a piece at a time, each against the other run's
    requests of the piece's prompts."""
    reference = options["reference"]
    key = ("piecewise-against", name, id(reference), options.get("epsilon"))
    if key not in run._cache:
        table = _REGISTRY[name]
        frames = [
            table.compute(piece, **{**options, "reference": reference.restricted(set(piece.prompts))})
            for piece in run.pieces
        ]
        run._cache[key] = (_merged(run, table, frames, options), reference)
    return run._cache[key][0]  # held with the reference, so that its id is not reused


def _one_pass(run: Any, names: list[str], context: dict[str, Any]) -> dict[str, pl.DataFrame]:
    """Each table of ``names`` computed a piece at a time and merged. Every piece's rows after the first wait on disk
    (a scratch folder, removed after), so that the pass holds one piece's working set and not, beside it, the rows of
    every piece before (at 516,000 requests, 250 MB)."""
    parts: dict[str, list[pl.DataFrame | Path]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="bia-tables-") as scratch:
        for number, piece in enumerate(run.pieces):
            for name in names:
                table = _REGISTRY[name]
                frame = table.compute(piece, **{key: context[key] for key in table.takes})
                parts[name].append(frame if not number else _spilled(frame, Path(scratch) / f"{name}-{number}.parquet"))
        return {
            name: _merged(run, _REGISTRY[name], [_unspilled(part) for part in frames], context)
            for name, frames in parts.items()
        }


def _spilled(frame: pl.DataFrame, file: Path) -> Path:
    frame.write_parquet(file, compression="lz4")  # written once, read once: the cheapest codec
    return file


def _unspilled(part: pl.DataFrame | Path) -> pl.DataFrame:
    return part if isinstance(part, pl.DataFrame) else pl.read_parquet(part)


def _merged(run: Any, table: _Table, frames: list[pl.DataFrame], options: dict[str, Any]) -> pl.DataFrame:
    """The pieces' rows as the run's: concatenated in the pieces' order and merged; with no piece (no request at all),
    the table's columns computed on the run's requests alone."""
    if not frames:
        return table.compute(run.without_pieces(), **{key: options[key] for key in table.takes if key in options})
    frame = pl.concat(frames, how="vertical_relaxed")
    return table.merge(frame) if table.merge is not None else frame


def _read_back(folder: Path | None, names: list[str], captures: str) -> dict[str, _Kept]:
    """The merged tables kept in ``folder`` (their ``source`` naming the captures where they are now, ``captures``, when
    read), each checked to be a Parquet file of the table."""
    if folder is None or not (folder / "done.json").exists():
        return {}
    try:
        record = json.loads((folder / "done.json").read_text(encoding="utf-8"))
        done, old = set(record["tables"]), str(record["captures"])
        kept = {name: _Kept(folder / f"{name}.parquet", old, captures) for name in names if name in done}
        for table in kept.values():
            pl.read_parquet_schema(table.file)
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError):
        return {}  # unreadable: computed again
    return kept


def _write_back(folder: Path | None, tables: dict[str, pl.DataFrame], captures: str) -> dict[str, _Kept]:
    """The tables written into ``folder``, as kept there; none where they cannot be written (only slower next time)."""
    if folder is None:
        return {}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        done_file = folder / "done.json"
        done = set(json.loads(done_file.read_text(encoding="utf-8"))["tables"]) if done_file.exists() else set()
        for name, frame in tables.items():
            partial = folder / f"{name}.parquet.part"
            frame.write_parquet(partial, row_group_size=KEPT_ROW_GROUP)
            os.replace(partial, folder / f"{name}.parquet")
        partial = folder / "done.json.part"
        record = {"tables": sorted(done | set(tables)), "captures": captures}  # where the sources were when written
        partial.write_text(json.dumps(record), encoding="utf-8")
        os.replace(partial, done_file)
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {name: _Kept(folder / f"{name}.parquet", captures, captures) for name in tables}
