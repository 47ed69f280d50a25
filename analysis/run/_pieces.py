"""A run directory's captures in pieces: parsed once, a chunk of the capture file at a time, into ``derived/pieces/``,
and read back one piece (a group of the plan's prompts) at a time, so that what is computed per prompt (the slot,
reference and band tables, and so the verdict) needs the memory of a piece and not of the run.

``derived/pieces/`` holds::

    manifest.json                   pieces_version, the captures' stamps, formats, what was left out, the piece count
    requests.parquet                every request, with its ``piece`` (small: one row a request), in the captures' order
    requests/piece=K.parquet        piece K's requests, every column
    dropped.parquet                 the (source, record) of lines read once already (Run's repeated lines), left out
    tokens/piece=K/*.parquet        the tokens of piece K's requests, one file per chunk of the captures, in file order
    candidates/piece=K/*.parquet
    plans/DIGEST.parquet            the plan's requests (``plan_run``) for one manifest and bia's code, kept when first read
    plans/DIGEST.where.parquet      which pieces hold each prompt, beside it

A piece is a run of consecutive prompts of the manifest's plan, as many as about ``PIECE_BYTES`` of captures hold;
requests of no planned prompt form the last piece. :func:`read_run` keeps the whole run in memory for notebooks; this
is the same parse and the same tables, a piece at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from ..dumps import (
    CANDIDATE_SCHEMA,
    DUMP_SUFFIXES,
    REQUEST_SCHEMA,
    TOKEN_SCHEMA,
    Dump,
    DumpError,
    StreamRefused,
    iter_dump_parts,
)
from ._derived import _capture_stamps
from ._formed import compact_formed
from ._kept_dump import KeptDump
from ._layout import RunError, load_manifest
from ._model import Run
from ._piecewise import KEPT_ROW_GROUP, _code_digest, _moved
from ._read import _said_cut, _without_repeated_lines
from ._read import read_whole_run as read_run

PIECE_BYTES = 64 << 20  # the captures a piece holds, about: a piece's tables stay well under a gigabyte
_PIECES_VERSION = 2
_KEYS = ["source", "record", "choice_index"]
# What each request has that is large and read only with its piece (at 516,000 requests, 140 MB of the plan's 330 MB):
# the plan leaves them out, so that reading one of them from the plan fails loudly instead of reading a null.
PIECE_COLUMNS = ("completion_text", "raw_sha256", "extra")


def run_pieces(path: str | os.PathLike[str]) -> tuple[Run, Iterator[Run]]:
    """A run directory's plan (every request, no token) and its pieces, each a :class:`Run` of a group of prompts.

    The first call parses the captures into ``derived/pieces/`` a chunk at a time (a read-only run, or one whose capture
    the columnar reader cannot take, is read whole and split); later calls read the pieces while every capture file has
    the size and sha256 recorded with them.

    Parameters
    ----------
    path : str or os.PathLike
        The run directory.

    Returns
    -------
    plan : Run
        The run with every request and no token: what ``Run.missing`` and the manifest's words need.
    pieces : iterator of Run
        One run per piece, with every request of its prompts and their tokens and candidates.

    Raises
    ------
    RunError
        Not a run directory, or a capture no reader takes.

    Examples
    --------
    >>> plan, pieces = run_pieces("data/experiment-cpu/default")
    >>> plan.requests.height, sum(piece.requests.height for piece in pieces)
    (62, 62)
    """
    plan, pieces = _open(Path(path))
    return plan, iter(pieces)


def _open(path: Path) -> tuple[Run, _Pieces | _Whole]:
    manifest, record = _current(path)
    if record is None:  # a run we may not write into: read whole, split in memory
        return _split(read_run(path, cache=False))
    return _read_pieces(path, manifest, path / "derived" / "pieces", record)


def prepare_pieces(path: str | os.PathLike[str]) -> None:
    """Check a run directory and parse its captures into ``derived/pieces/`` unless they are there for these captures,
    without reading its requests: what a process that hands the run to another (``bia report``'s kernel) does first, so
    that a bad capture is named at once and the other process reads the pieces. A read-only run is read whole to check it.

    Parameters
    ----------
    path : str or os.PathLike
        The run directory.

    Raises
    ------
    RunError
        As :func:`run_pieces` does.

    Examples
    --------
    >>> prepare_pieces("data/experiment-cpu/default")
    """
    manifest, record = _current(Path(path))
    if record is None:
        _split(read_run(path, cache=False))
        return
    skipped = _recorded_skips(record, _renamed(record["captures_dir"], os.fspath(Path(path) / "captures")))
    _said_cut(Run(manifest, _no_tokens(pl.DataFrame(schema=REQUEST_SCHEMA), {}, skipped), Path(path)))


def _current(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The run's manifest and the record of its pieces, written first unless current; no record for a run we may not
    write into. Its ``m_formed`` entries are held compactly (a row per band: they grow with the run)."""
    manifest = compact_formed(load_manifest(path))
    captures = path / "captures"
    if not captures.is_dir():
        raise RunError(f"{path}: no captures/ folder")
    record = _record(path / "derived" / "pieces")
    stamps = _capture_stamps(captures, record)
    if record is None or record["captures"]["files"] != stamps["files"]:
        if not os.access(path, os.W_OK):
            return manifest, None
        record = _write_pieces(path, manifest, stamps)
    return manifest, record


def _record(folder: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    whole = isinstance(record, dict) and {"captures_dir", "captures", "pieces"} <= set(record)  # else written in part
    return record if whole and record.get("pieces_version") == _PIECES_VERSION else None


def _piece_of(manifest: dict[str, Any], size: int) -> tuple[pl.DataFrame, int]:
    """Each planned prompt's piece, and the piece of requests of no planned prompt (the last)."""
    prompts = [str(p["prompt_id"]) for p in manifest.get("prompts") or [] if isinstance(p, dict) and "prompt_id" in p]
    per_piece = max(1, math.floor(len(prompts) * PIECE_BYTES / size)) if size and prompts else max(1, len(prompts))
    pieces = pl.DataFrame(
        {"prompt_id": prompts, "piece": [k // per_piece for k in range(len(prompts))]},
        schema={"prompt_id": pl.String, "piece": pl.Int64},
    ).unique("prompt_id", keep="first", maintain_order=True)
    return pieces, (len(prompts) - 1) // per_piece + 1 if prompts else 0


def _write_pieces(path: Path, manifest: dict[str, Any], stamps: dict[str, Any]) -> dict[str, Any]:
    folder = path / "derived" / "pieces"
    partial = folder.with_name("pieces.part")
    shutil.rmtree(partial, ignore_errors=True)
    files = [f for f in sorted((path / "captures").iterdir()) if f.is_file() and f.suffix in DUMP_SUFFIXES]
    pieces, other = _piece_of(manifest, sum(f.stat().st_size for f in files))
    requests: list[pl.DataFrame] = []
    formats: dict[str, list[str]] = {}
    skipped: list[DumpError] = []
    try:
        for number, file in enumerate(files):
            source = os.fspath(file)
            for chunk, ((tokens, candidates, chunk_requests), found, left) in enumerate(iter_dump_parts(file, source)):
                formats[source] = sorted({*formats.get(source, []), *found})
                skipped += left
                keyed = chunk_requests.join(pieces, on="prompt_id", how="left").with_columns(
                    pl.col("piece").fill_null(other)
                )
                requests.append(keyed)
                for name, frame in (("tokens", tokens), ("candidates", candidates)):
                    _write_chunk(
                        partial / name, frame, keyed.select(*_KEYS, "piece"), other, f"{number:04d}-{chunk:06d}"
                    )
    except StreamRefused:  # a line only the general path reads: the run read whole, then split
        shutil.rmtree(partial, ignore_errors=True)
        return _write_whole(path, stamps, pieces, other)
    except DumpError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise RunError(str(exc)) from None
    every = pl.concat(requests, how="vertical") if requests else None
    return _finish(path, partial, every, formats, skipped, stamps, other)


def _write_chunk(folder: Path, frame: pl.DataFrame, keys: pl.DataFrame, other: int, name: str) -> None:
    if not frame.height:
        return
    sources = keys["source"].unique()
    if sources.len() == 1 and frame["source"].unique().equals(sources):  # a chunk of one file: its lines by number
        by_line = keys.select("record", "piece").unique("record", keep="first", maintain_order=True)
        keyed = frame.join(by_line, on="record", how="left", maintain_order="left")  # a line's choices share its prompt
    else:
        keyed = frame.join(keys, on=_KEYS, how="left", nulls_equal=True, maintain_order="left")
    keyed = keyed.with_columns(pl.col("piece").fill_null(other))
    for (piece,), part in keyed.partition_by("piece", as_dict=True, include_key=False, maintain_order=True).items():
        out = folder / f"piece={piece}"
        out.mkdir(parents=True, exist_ok=True)
        part.write_parquet(out / f"{name}.parquet", compression="lz4")  # written once, read on every cold table pass


def _write_whole(path: Path, stamps: dict[str, Any], pieces: pl.DataFrame, other: int) -> dict[str, Any]:
    run = read_run(path, cache=False)
    partial = path / "derived" / "pieces.part"
    keyed = run.dump.requests.join(pieces, on="prompt_id", how="left").with_columns(pl.col("piece").fill_null(other))
    for name in ("tokens", "candidates"):
        _write_chunk(partial / name, getattr(run.dump, name), keyed.select(*_KEYS, "piece"), other, "0000-000000")
    return _finish(path, partial, keyed, run.dump.formats, list(run.dump.skipped), stamps, other)


def _finish(
    path: Path,
    partial: Path,
    requests: pl.DataFrame | None,
    formats: dict[str, list[str]],
    skipped: list[DumpError],
    stamps: dict[str, Any],
    other: int,
) -> dict[str, Any]:
    """Requests read once (Run's rule for repeated lines, over the whole run), the record, and the folder in place."""
    if requests is None:
        requests = pl.DataFrame(schema={**REQUEST_SCHEMA, "piece": pl.Int64})
    kept = _without_repeated_lines(_no_tokens(requests.drop("piece"), formats, skipped))
    once = requests.join(kept.requests.select("source", "record"), on=["source", "record"], how="semi")
    dropped = requests.join(once.select("source", "record"), on=["source", "record"], how="anti")
    partial.mkdir(parents=True, exist_ok=True)
    once.write_parquet(partial / "requests.parquet")
    (partial / "requests").mkdir()
    for (piece,), part in once.partition_by("piece", as_dict=True, include_key=False, maintain_order=True).items():
        part.write_parquet(partial / "requests" / f"piece={piece}.parquet")
    dropped.select("source", "record").write_parquet(partial / "dropped.parquet")
    record = {
        "pieces_version": _PIECES_VERSION,
        "captures_dir": os.fspath(path / "captures"),
        "captures": stamps,
        "pieces": other + 1,
        "formats": formats,
        "skipped": [
            {"source": e.source, "record": e.record, "field": e.field, "problem": e.problem} for e in kept.skipped
        ],
    }
    (partial / "manifest.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    folder = path / "derived" / "pieces"
    shutil.rmtree(folder, ignore_errors=True)
    partial.replace(folder)
    return record


def _read_pieces(path: Path, manifest: dict[str, Any], folder: Path, record: dict[str, Any]) -> tuple[Run, _Pieces]:
    moved = _moved(record["captures_dir"], os.fspath(path / "captures"))
    dropped = moved(pl.read_parquet(folder / "dropped.parquet"))
    renamed = _renamed(record["captures_dir"], os.fspath(path / "captures"))
    formats = {renamed(k): v for k, v in record.get("formats", {}).items()}
    skipped = _recorded_skips(record, renamed)
    planned, where = _planned_requests(path, manifest, folder, formats, skipped)
    if isinstance(planned, Path):  # kept: read from there by each reader, not held with the run
        dump: Dump = KeptDump(
            formats=formats,
            skipped=skipped,
            file=planned,
            old=record["captures_dir"],
            captures=os.fspath(path / "captures"),
        )
    else:
        dump = _no_tokens(moved(planned), formats, skipped)
    plan = _said_cut(Run(manifest, dump, path))  # as read_run says it
    pieces = _Pieces(path, manifest, folder, where, dropped, moved, formats, skipped, record["pieces"])
    return plan, pieces


def _planned_requests(
    path: Path, manifest: dict[str, Any], folder: Path, formats: dict[str, list[str]], skipped: list[DumpError]
) -> tuple[pl.DataFrame | Path, pl.DataFrame]:
    """The plan's requests (:func:`plan_run`), its sources as the pieces' record names them, and which pieces hold each
    prompt: kept under ``derived/pieces/plans/`` for this manifest and this code, so that opening a run reads neither
    every request's envelope and text nor the arms worked out again; where kept, the plan's file and not its rows (a
    reader reads the columns it needs from there: at 516,000 requests the plan is 129 MB held)."""
    # the plan's arms and rates are bia's: another version works them out again
    digest = hashlib.sha256((path / "manifest.json").read_bytes() + _code_digest().encode()).hexdigest()[:16]
    plans = folder / "plans"
    with contextlib.suppress(OSError, pl.exceptions.PolarsError):
        pl.read_parquet_schema(plans / f"{digest}.parquet")  # a plan spoiled is worked out again
        return plans / f"{digest}.parquet", pl.read_parquet(plans / f"{digest}.where.parquet")
    requests = pl.read_parquet(folder / "requests.parquet")
    where = requests.select("prompt_id", "piece").unique(maintain_order=True)
    planned = plan_run(manifest, requests.drop("piece"), formats, skipped, path).requests
    if os.access(folder, os.W_OK):
        with contextlib.suppress(OSError):  # a plan we cannot keep is only worked out again next time
            shutil.rmtree(plans, ignore_errors=True)  # one plan kept: the last manifest's, the last code's
            plans.mkdir()
            for frame, name in ((where, f"{digest}.where.parquet"), (planned, f"{digest}.parquet")):  # the plan last
                frame.write_parquet(plans / f"{name}.part", row_group_size=KEPT_ROW_GROUP)
                os.replace(plans / f"{name}.part", plans / name)
            return plans / f"{digest}.parquet", where
    return planned, where


def plan_run(
    manifest: dict[str, Any],
    requests: pl.DataFrame,
    formats: dict[str, list[str]],
    skipped: list[DumpError],
    path: Path | None,
) -> Run:
    """A streamed run's plan: every request and no token, each with its control arm and decode rate worked out from its
    capture envelope, without what only its piece's requests carry (:data:`PIECE_COLUMNS`): a reader of a request's
    text or envelope reads it a piece at a time.

    Parameters
    ----------
    manifest : dict
        The run's manifest.
    requests : polars.DataFrame
        Every request, every column.
    formats : dict of str to list of str
        The format of each capture.
    skipped : list of DumpError
        What reading the captures left out.
    path : pathlib.Path or None
        The run directory.

    Returns
    -------
    Run
        Its requests carry ``arm``, ``decode_tok_s`` and ``decode_rate_origin``, and ``Run.requests`` gives them as
        they are.

    Examples
    --------
    >>> from analysis import read_run
    >>> whole = read_run("data/experiment-cpu/default")
    >>> plan = plan_run(whole.manifest, whole.dump.requests, {}, [], None)
    >>> plan.requests.equals(whole.requests.drop(PIECE_COLUMNS)), "extra" in plan.requests.columns
    (True, False)
    """
    envelopes = Run(manifest, _no_tokens(requests, formats, skipped), path).requests  # arm, then decode rates
    return Run(manifest, _no_tokens(envelopes.drop(PIECE_COLUMNS), formats, skipped), path)


class _Pieces:
    """A run directory's pieces under ``derived/pieces/``: each read when asked for, in order, or by prompt."""

    def __init__(
        self,
        path: Path,
        manifest: dict[str, Any],
        folder: Path | None,
        where: pl.DataFrame,
        dropped: pl.DataFrame,
        moved: Any,
        formats: dict[str, list[str]],
        skipped: list[DumpError],
        count: int,
    ) -> None:
        self.path, self.manifest, self.folder = path, manifest, folder
        self.where, self.dropped, self.moved = where, dropped, moved
        self.formats, self.skipped, self.count = formats, skipped, count

    def __iter__(self) -> Iterator[Run]:
        for piece in range(self.count):
            one = self.piece(piece)
            if one is not None:
                yield one

    def piece(self, piece: int, prompts: list[str] | None = None) -> Run | None:
        """Piece ``piece``'s run (of only ``prompts``' requests and their tokens, when given), None when it holds no
        request."""
        if self.folder is None or piece not in self.where["piece"]:
            return None
        file = self.folder / "requests" / f"piece={piece}.parquet"
        try:
            mine = self.moved(pl.read_parquet(file))
        except (OSError, pl.exceptions.PolarsError) as exc:  # its requests are in the plan: none may go unsaid
            raise RunError(
                f"{file}: piece {piece}'s requests cannot be read ({exc}); delete {self.folder} to read the captures again"
            ) from None
        if prompts is not None:
            mine = mine.filter(pl.col("prompt_id").is_in(prompts))
        tokens, candidates = (
            self._rows(self.folder / name / f"piece={piece}", schema, None if prompts is None else mine)
            for name, schema in (("tokens", TOKEN_SCHEMA), ("candidates", CANDIDATE_SCHEMA))
        )
        return Run(self.manifest, Dump(tokens, candidates, mine, self.formats, self.skipped), self.path)

    def _rows(self, folder: Path, schema: dict[str, Any], requests: pl.DataFrame | None) -> pl.DataFrame:
        """A piece's token or candidate rows in the captures' order (file, then chunk), named where the run is now, less
        the dropped lines'; of ``requests`` only when given, streamed so that the rest of the piece is never held."""
        files = sorted(folder.glob("*.parquet"))
        if not files:
            return pl.DataFrame(schema=schema)
        if requests is None:  # the whole piece: read eagerly, twice as fast as a scan
            rows = self.moved(pl.concat([pl.read_parquet(f) for f in files], how="vertical"))
            return rows.join(self.dropped, on=["source", "record"], how="anti") if self.dropped.height else rows
        keys = requests.lazy().select(_KEYS)  # a piece's requests are read once: no dropped line is among them
        chosen = self.moved(pl.scan_parquet(files)).join(
            keys, on=_KEYS, how="semi", nulls_equal=True, maintain_order="left"
        )
        return chosen.collect(engine="streaming")

    def restricted(self, prompts: set[str]) -> Run:
        """The run of these prompts' requests with their tokens (read from their pieces, and of them only these prompts'
        rows), held whole."""
        wanted = sorted(prompts)
        numbers = sorted(self.where.filter(pl.col("prompt_id").is_in(wanted))["piece"].unique().to_list())
        runs = [run for run in (self.piece(n, wanted) for n in numbers) if run is not None]
        if not runs:
            return Run(
                self.manifest, _no_tokens(pl.DataFrame(schema=REQUEST_SCHEMA), self.formats, self.skipped), self.path
            )
        tokens, candidates, requests = (
            pl.concat([getattr(r.dump, name) for r in runs], how="vertical")
            for name in ("tokens", "candidates", "requests")
        )
        return Run(self.manifest, Dump(tokens, candidates, requests, self.formats, self.skipped), self.path)

    def collected(self, run: Run) -> Run:
        """The run held whole, as :func:`read_run` reads it."""
        return read_run(self.path)

    def captures_dir(self) -> str:
        """The run's captures folder as named now (the ``source`` of its rows begins with it)."""
        return os.fspath(self.path / "captures")

    def tables_folder(self, key: str) -> Path | None:
        """Where the merged tables of one context are kept beside the pieces (None: nowhere)."""
        return None if self.folder is None or not os.access(self.folder, os.W_OK) else self.folder / "tables" / key


class _Whole:
    """The pieces of a run held whole (a read-only run directory): one piece, the run itself."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def __iter__(self) -> Iterator[Run]:
        return iter([self.run])

    def restricted(self, prompts: set[str]) -> Run:
        return self.run.restricted(prompts)

    def collected(self, run: Run) -> Run:
        return self.run

    def captures_dir(self) -> str:
        return os.fspath(self.run.path / "captures") if self.run.path is not None else ""

    def tables_folder(self, key: str) -> Path | None:
        return None


def streamed_run(path: str | os.PathLike[str]) -> Run:
    """A run directory as a streamed run: every request, no token, its tables computed a piece at a time.

    Parameters
    ----------
    path : str or os.PathLike
        The run directory.

    Returns
    -------
    Run
        With ``pieces`` set (see :func:`analysis.read_run`'s ``stream``).
    """
    plan, pieces = _open(Path(path))
    return dataclasses.replace(plan, pieces=pieces)


def _recorded_skips(record: dict[str, Any], renamed: Any) -> list[DumpError]:
    """What reading the captures left out, as the pieces' record keeps it, each source named where the run is now."""
    return [DumpError(renamed(e["source"]), e["record"], e["field"], e["problem"]) for e in record.get("skipped", [])]


def _renamed(old: str, new: str):
    """A source as named where the run is now (it was moved or copied since its pieces were written)."""
    return lambda source: new + source[len(old) :] if old != new and source.startswith(old) else source


def _split(run: Run) -> tuple[Run, _Whole]:
    """A run already in memory as its plan and one piece (a read-only run directory)."""
    return plan_run(run.manifest, run.dump.requests, run.dump.formats, run.dump.skipped, run.path), _Whole(run)


def _no_tokens(requests: pl.DataFrame, formats: dict[str, list[str]], skipped: list[DumpError]) -> Dump:
    """A dump of these requests without a token or candidate: what the plan's checks read."""
    return Dump(pl.DataFrame(schema=TOKEN_SCHEMA), pl.DataFrame(schema=CANDIDATE_SCHEMA), requests, formats, skipped)
