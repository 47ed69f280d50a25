"""Reading sources into a history's rows: each witness and marker file (or URL) and each run directory into its entry,
its bands (one per batch size c) and its markers, keyed by the sha256 of its bytes; and telling history folders, run
directories and witness or marker documents apart among the sources given."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl

from ..core import progress as show_progress
from ..io import expand_sources
from ..metrics import decode_cost
from ._history_frames import BAND_SCHEMA, ENTRY_SCHEMA, MARKER_SCHEMA
from ._sources import HISTORY_READS, SourceSkipped, sort_sources


def _utc(text: Any) -> dt.datetime | None:
    """An ISO-8601 time as UTC (a time without zone is taken as UTC); None when absent or unreadable."""
    if not isinstance(text, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _frame(rows: list[dict[str, Any]], schema: dict[str, Any]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)


def _witness_rows(sources: list[str], appended: dt.datetime) -> tuple[list[dict], list[dict], list[dict]]:
    """Entries, bands and markers of witness and marker files (or URLs)."""
    from ..witness import read_witnesses
    from ._witness_judgement import judge_witnesses

    ws = read_witnesses(sources, progress=False)
    verdict_of = dict(
        judge_witnesses(ws).frame.select("run", "verdict").iter_rows()
    )  # the judgement every surface renders
    entry_of = {source: _digest(text.encode("utf-8")) for source, text in ws.texts.items()}
    markers = [
        {
            "entry": entry_of[m["source"]],
            "source": m["source"],
            "time": m["started_utc"],
            "host": m["host"],
            "commit": m["commit"],
            "status": m["status"],
            "max_m": m["max_m"],
            "cc": m["cc"],
        }
        for m in ws.markers.iter_rows(named=True)
    ]
    released = {
        (m["host"], m["commit"]): m["time"] for m in sorted(markers, key=lambda m: m["time"] or appended, reverse=True)
    }
    entries, bands = [], []
    slots = ws.slots.with_columns(held=pl.col("agree_to") >= pl.col("completion_tokens"))
    for w in ws.witnesses.iter_rows(named=True):
        when = released.get((w["host"], w["commit"]))
        settings = {k[4:]: v for k, v in w.items() if k.startswith("env_") and v is not None}
        key = {
            "entry": entry_of[w["source"]],
            "time": when or appended,
            "host": w["host"],
            "engine": f"aprender {w['probe']}",
            "model": w["model_path"],
            "commit": w["commit"],
        }
        entries.append(
            {
                **key,
                "kind": "witness",
                "source": w["source"],
                "time_origin": "release marker" if when else "appended",
                "settings": json.dumps(settings, sort_keys=True),
                "verdict": verdict_of[w["source"]],
                "appended": appended,
            }
        )
        mine = ws.bands.filter(pl.col("source") == w["source"])
        ratios = dict(
            decode_cost(mine.select("c", "decode_tok_s", decode_rate_origin=pl.lit("witness")))
            .select("c", "ratio")
            .rows()
        )
        for b in mine.iter_rows(named=True):
            held = slots.filter((pl.col("source") == w["source"]) & (pl.col("c") == b["c"]))["held"].drop_nulls()
            ratio = ratios.get(b["c"])
            bands.append(
                {
                    **key,
                    "c": b["c"],
                    "requests": b["n_slots"],
                    "earliest_divergence": b["divergence_at"],
                    "bit_identical_share": None,
                    "token_identical_share": float(held.mean()) if held.len() else None,
                    "unique_completions": None,
                    "decode_tok_s": b["decode_tok_s"],
                    "decode_ratio": ratio,
                    "decode_ratio_low": None,
                    "decode_ratio_high": None,
                    "result": b["derived_result"],
                }
            )
    return entries, bands, markers


def _run_digest(folder: Path) -> str:
    """A run's identity: its manifest and every capture file's bytes."""
    digest = hashlib.sha256((folder / "manifest.json").read_bytes())
    for capture in sorted((folder / "captures").iterdir()):
        if capture.is_file():
            with capture.open("rb") as handle:
                digest.update(capture.name.encode() + hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


def _run_rows(folder: Path, appended: dt.datetime) -> tuple[dict, list[dict]]:
    """The entry and bands of one run directory."""
    from ..run import band_table, read_run, slot_table
    from ._judge_study import judge_runs
    from ._judgement_cost import run_decode_cost

    run = read_run(folder)
    manifest = run.manifest
    identity = manifest.get("identity") or {}
    when = _utc(manifest.get("started")) or _utc(manifest.get("finished"))
    settings = {**(manifest.get("requested") or {}), **(manifest.get("effective") or {})}
    key = {
        "entry": _run_digest(folder),
        "time": when or appended,
        "host": identity.get("host"),
        "engine": identity.get("engine"),
        "model": (identity.get("model") or {}).get("path"),
        "commit": identity.get("commit"),
    }
    entry = {
        **key,
        "kind": "run",
        "source": str(folder),
        "time_origin": "manifest" if when else "appended",
        "settings": json.dumps(settings, sort_keys=True, default=str),
        "verdict": judge_runs(run).verdict,
        "appended": appended,
    }
    slots = slot_table(run)
    unique = band_table(run).group_by("c").agg(pl.col("unique_completions").max())
    cost = {r["c"]: r for r in run_decode_cost(run).iter_rows(named=True)}  # the answer's figures, one c=1 baseline
    per_c = (
        slots.group_by("c")
        .agg(
            pl.len().alias("requests"),
            pl.col("divergence_at").min().alias("earliest_divergence"),
            (pl.col("bitwise_prefix") == pl.col("length")).mean().alias("bit_identical_share"),
            (~pl.col("diverged")).mean().alias("token_identical_share"),
        )
        .join(unique, on="c", how="left")
        .sort("c")
    )
    bands = []
    for b in per_c.iter_rows(named=True):
        rate = cost.get(b["c"]) or {}
        bands.append(
            {
                **key,
                "c": b["c"],
                "requests": b["requests"],
                "earliest_divergence": b["earliest_divergence"],
                "bit_identical_share": b["bit_identical_share"],
                "token_identical_share": b["token_identical_share"],
                "unique_completions": b["unique_completions"],
                "decode_tok_s": rate.get("median"),
                "decode_ratio": rate.get("ratio"),
                "decode_ratio_low": rate.get("low"),
                "decode_ratio_high": rate.get("high"),
                "result": None,
            }
        )
    return entry, bands


def _split(sources: Iterable[str | os.PathLike[str]]) -> tuple[list[Path], list[Path], list[str]]:
    """History folders, run directories and witness or marker sources, from what was given, sorted as every command sorts
    its sources (:func:`sort_sources`); a file in a folder that is none of them is skipped with a ``SourceSkipped`` warning."""
    sorted_ = sort_sources(sources, reads=HISTORY_READS, reader="read_history")
    for file, why in sorted_.skipped:
        warnings.warn(f"skipped {file} ({why})", SourceSkipped, stacklevel=3)
    return [Path(h) for h in sorted_.histories], [Path(r) for r in sorted_.runs], sorted_.witnesses


def _rows_of(
    sources: Iterable[str | os.PathLike[str]], appended: dt.datetime
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, list]:
    """The three frames of sources that are not history folders, and the history folders given."""
    histories, runs, documents = _split(sources)
    entries: list[dict[str, Any]] = []
    bands: list[dict[str, Any]] = []
    markers: list[dict[str, Any]] = []
    if documents:
        entries, bands, markers = _witness_rows(expand_sources(documents), appended)
    for folder in show_progress(
        list(runs), None, "reading runs", unit="run"
    ):  # each run is parsed whole: a bar on a terminal when there are several
        entry, run_bands = _run_rows(folder, appended)
        entries.append(entry)
        bands += run_bands
    return _frame(entries, ENTRY_SCHEMA), _frame(bands, BAND_SCHEMA), _frame(markers, MARKER_SCHEMA), histories
