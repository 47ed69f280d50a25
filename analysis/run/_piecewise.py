"""The tables of a run read a piece at a time (``read_run(path, stream=True)``): each table is a function of one
prompt's requests, so a run's table is the table of each piece, merged in a fixed order.

A table function decorated with :func:`piecewise` computes as before on a run held whole. On a streamed run (one whose
``pieces`` is set), the first table asked for computes every registered table in one pass over the pieces (each piece's
tokens read once, whichever tables the caller needs next), merges them, and keeps them with the run and, where the run
directory takes it, under ``derived/pieces/tables/`` for the next reader: a warm report reads those, not the tokens.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ..metrics import parity

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

    def wrap(function: Callable[..., pl.DataFrame]) -> Callable[..., pl.DataFrame]:
        signature = inspect.signature(function)
        takes = tuple(key for key in _CONTEXT_KEYS if key in signature.parameters)
        defaults = {key: signature.parameters[key].default for key in takes}
        _REGISTRY[name] = _Table(name, function, takes, merge, eager)

        @functools.wraps(function)
        def table(run: Any, **options: Any) -> pl.DataFrame:
            if getattr(run, "pieces", None) is None:
                return function(run, **options)
            given = {**defaults, **options}
            if set(options) - set(takes):
                return function(run.collected(), **options)
            if not isinstance(given.get("reference", "ref1"), str):  # another run's ref #1 of each prompt
                return _against_run(run, name, options)
            context = {
                "epsilon": float(given.get("epsilon", parity.NEAR_TIE_EPSILON)),
                "reference": given.get("reference", "ref1"),
            }
            return table_of(run, name, **context)

        return table

    return wrap


def merged_tables(
    run: Any, *, epsilon: float = parity.NEAR_TIE_EPSILON, reference: str = "ref1"
) -> dict[str, pl.DataFrame]:
    """Every registered table of a streamed run for this epsilon and reference: kept with the run, read back from
    ``derived/pieces/tables/`` when written there for the same captures and version, else computed in one pass.

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
        _write_back(folder, computed, captures)
        tables.update(computed)
    return tables


def table_of(run: Any, name: str, *, epsilon: float = parity.NEAR_TIE_EPSILON, reference: str = "ref1") -> pl.DataFrame:
    """One registered table of a streamed run: from the eager tables' one pass, or a table that is not eager in a pass
    of its own, held with the run.

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

    Returns
    -------
    polars.DataFrame
    """
    if _REGISTRY[name].eager:
        return merged_tables(run, epsilon=epsilon, reference=reference)[name]
    context = {"epsilon": float(epsilon), "reference": reference}
    key = ("piecewise-alone", name, context["epsilon"], reference)
    if key not in run._cache:
        run._cache[key] = _one_pass(run, [name], context)[name]
    return run._cache[key]


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


def _read_back(folder: Path | None, names: list[str], captures: str) -> dict[str, pl.DataFrame]:
    """The merged tables kept in ``folder``, their ``source`` naming the captures where they are now (``captures``)."""
    if folder is None or not (folder / "done.json").exists():
        return {}
    try:
        record = json.loads((folder / "done.json").read_text(encoding="utf-8"))
        done, old = set(record["tables"]), str(record["captures"])
        tables = {name: pl.read_parquet(folder / f"{name}.parquet") for name in names if name in done}
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError):
        return {}  # unreadable: computed again
    if old == captures:
        return tables
    moved = pl.when(pl.col("source").str.starts_with(old)).then(pl.lit(captures) + pl.col("source").str.slice(len(old)))
    return {
        name: frame.with_columns(moved.otherwise(pl.col("source")).alias("source"))
        if "source" in frame.columns
        else frame
        for name, frame in tables.items()
    }


def _write_back(folder: Path | None, tables: dict[str, pl.DataFrame], captures: str) -> None:
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        done_file = folder / "done.json"
        done = set(json.loads(done_file.read_text(encoding="utf-8"))["tables"]) if done_file.exists() else set()
        for name, frame in tables.items():
            partial = folder / f"{name}.parquet.part"
            frame.write_parquet(partial)
            os.replace(partial, folder / f"{name}.parquet")
        partial = folder / "done.json.part"
        record = {"tables": sorted(done | set(tables)), "captures": captures}  # where the sources were when written
        partial.write_text(json.dumps(record), encoding="utf-8")
        os.replace(partial, done_file)
    except (OSError, ValueError, KeyError, TypeError):
        return  # a cache we cannot write is only slower next time
