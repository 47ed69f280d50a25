"""The derived Parquet cache of a run directory: written from the captures, reopened while they are unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from ..dumps import DUMP_SUFFIXES, Dump, DumpError
from ._layout import _parse_json

if TYPE_CHECKING:  # the tables take any object shaped like a Run (RunLike); only type hints name the class
    from ._model import Run

_DERIVED_VERSION = 6  # 1: no capture stamps; 2: stamps without modification times; 3: requests without liveness; 4: no server timings; 5: the legacy band_c


_RACY_NS = 2_000_000_000  # a file modified this close to its stamping may change again within the clock's granularity


def _capture_stamps(captures: Path, record: dict[str, Any] | None = None) -> dict[str, Any]:
    """The size and sha256 of every capture file by name (``files``), with each file's modification time
    (``mtime_ns``) and when they were taken (``at_ns``).

    As git's index does, a file whose size and modification time are those ``record`` holds, and
    were already old when it was written, keeps its recorded hash without being read again; any other
    file is hashed.
    """
    at_ns = time.time_ns()
    known = (record or {}).get("captures") or {}
    files, mtimes = {}, {}
    for file in sorted(captures.iterdir()):
        if not (file.is_file() and file.suffix in DUMP_SUFFIXES):
            continue
        stat = file.stat()
        mtimes[file.name] = stat.st_mtime_ns
        old = known.get("files", {}).get(file.name)
        if (
            old
            and old["size"] == stat.st_size
            and known.get("mtime_ns", {}).get(file.name) == stat.st_mtime_ns
            and stat.st_mtime_ns < known.get("at_ns", 0) - _RACY_NS
        ):
            files[file.name] = old
            continue
        with file.open("rb") as handle:
            files[file.name] = {
                "size": os.fstat(handle.fileno()).st_size,
                "sha256": hashlib.file_digest(handle, "sha256").hexdigest(),
            }
    return {"files": files, "mtime_ns": mtimes, "at_ns": at_ns}


def _derived_record(folder: Path) -> dict[str, Any] | None:
    """What ``derived/manifest.json`` says, when it is of this version; None otherwise."""
    try:
        record = _parse_json((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("derived_version") == _DERIVED_VERSION else None


def _write_derived(run: Run, stamps: dict[str, dict[str, Any]]) -> Path:
    path = cast(Path, run.path)  # both callers write only a run read from its folder
    folder = path / "derived"
    (folder / "manifest.json").unlink(
        missing_ok=True
    )  # the tables below are not the recorded ones until the new manifest lands
    run.dump.write_parquet(folder)
    record = {
        "derived_version": _DERIVED_VERSION,
        "captures_dir": str(path / "captures"),
        "captures": stamps,
        "formats": run.dump.formats,
        "skipped": [
            {"source": e.source, "record": e.record, "field": e.field, "problem": e.problem} for e in run.dump.skipped
        ],
    }
    partial = folder / "manifest.json.part"
    partial.write_text(json.dumps(record, indent=1), encoding="utf-8")
    partial.replace(folder / "manifest.json")
    return folder


def _read_derived(folder: Path, captures: Path, record: dict[str, Any], stamps: dict[str, Any]) -> Dump | None:
    """The tables under ``derived/`` when they were written from exactly the captures there now, else None."""
    if record["captures"]["files"] != stamps["files"]:
        return None
    try:
        tables = [pl.read_parquet(folder / f"{name}.parquet") for name in ("tokens", "candidates", "requests")]
    except (OSError, pl.exceptions.PolarsError):
        return None  # missing, unreadable or half-written: parse the captures instead
    old, new = record["captures_dir"], str(captures)

    def moved(source: str) -> str:
        return new + source[len(old) :] if source.startswith(old) else source

    if old != new:  # the run was moved or copied: sources name the captures where they are now
        tables = [
            t.with_columns(
                pl.when(pl.col("source").str.starts_with(old))
                .then(pl.lit(new) + pl.col("source").str.slice(len(old)))
                .otherwise(pl.col("source"))
                .alias("source")
            )
            for t in tables
        ]
    skipped = [DumpError(moved(e["source"]), e["record"], e["field"], e["problem"]) for e in record.get("skipped", [])]
    tokens, candidates, requests = tables
    return Dump(
        tokens,
        candidates,
        requests,
        formats={moved(k): v for k, v in record.get("formats", {}).items()},
        skipped=skipped,
    )
