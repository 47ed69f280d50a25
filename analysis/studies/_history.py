"""A history of witnesses, runs and release markers over time, and the regressions in it.

:func:`read_history` turns sources (witness and marker files or URLs, run directories, folders of
either, and history folders) into one :class:`History` of three frames keyed by time, host,
engine, model, server commit and settings:

- ``entries``: one row per witness or run, with its verdict (:func:`analysis.judge`'s) and settings;
- ``bands``: one row per entry and batch size c: the earliest divergence from m=1, the share of
  requests bit-identical and token-identical to m=1, unique completions, the median decode rate and
  the c/c=1 decode ratio with its interval;
- ``markers``: aprender's release markers (server commit, when, status, widest batch formed).

A series is one host, engine and model run with one set of the settings that change results:
``series_settings`` (in ``entries`` and ``bands``, derived from ``settings`` when read) names them as
``key=value, ...``: a run's :data:`RESULT_SETTINGS` (kernel mode, dtype, device, layout, prompt cache
and the like), a witness's environment switches. A change of them starts another series, so it is
never taken for a regression.

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
import hashlib
import json
import os
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import polars as pl

from ..metrics import parity
from ..core import progress as show_progress
from ..core import OutputExists, write_atomic
from ..verdicts import REGRESSION_RULES, SERIES, Rule, regressions
from ..io import expand_sources, is_url, read_source_bytes

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

HISTORY_VERSION = 1

ENTRY_SCHEMA: dict[str, PolarsDataType] = {
    "entry": pl.String, "kind": pl.String, "source": pl.String, "time": pl.Datetime("us", "UTC"), "time_origin": pl.String,
    "host": pl.String, "engine": pl.String, "model": pl.String, "commit": pl.String, "settings": pl.String,
    "verdict": pl.String, "appended": pl.Datetime("us", "UTC")
}
BAND_SCHEMA: dict[str, PolarsDataType] = {
    "entry": pl.String, "time": pl.Datetime("us", "UTC"), "host": pl.String, "engine": pl.String, "model": pl.String,
    "commit": pl.String, "c": pl.Int64, "requests": pl.Int64, "earliest_divergence": pl.Int64, "bit_identical_share": pl.Float64,
    "token_identical_share": pl.Float64, "unique_completions": pl.Int64, "decode_tok_s": pl.Float64, "decode_ratio": pl.Float64,
    "decode_ratio_low": pl.Float64, "decode_ratio_high": pl.Float64, "result": pl.String
}
MARKER_SCHEMA: dict[str, PolarsDataType] = {
    "entry": pl.String, "source": pl.String, "time": pl.Datetime("us", "UTC"), "host": pl.String, "commit": pl.String,
    "status": pl.String, "max_m": pl.Int64, "cc": pl.String
}


# The settings of a run that change its results (from its manifest's requested and effective settings,
# the effective winning): a run with other values of them is in another series. Settings that do not
# change what is computed (the server log, the log pattern, streaming) or that name a version
# (llama.cpp's build_info, vLLM's version: what a regression is looked for across) are left out.
RESULT_SETTINGS = ("kernel_mode", "dtype", "device", "layout", "batch_invariant", "deterministic_inference", "prompt_cache",
                   "radix_cache_disabled", "attention_backend", "tp_size")


def series_settings(kind: str | None, settings: str | None) -> str | None:
    """The settings that put an entry in its series, as ``key=value, ...``; None when it has none.

    A run's are its :data:`RESULT_SETTINGS` in that order; a witness's are all its environment
    switches (aprender's ``env``: each changes what the server computes), by name.

    Parameters
    ----------
    kind : str or None
        The entry's kind: ``run`` keeps its result settings only; anything else keeps every setting.
    settings : str or None
        The entry's settings as a JSON object; None, empty or malformed text has none.

    Returns
    -------
    str or None

    Examples
    --------
    >>> series_settings("run", '{"server_log": "serve.log", "layout": "copies", "kernel_mode": "fixed-tiles", "dtype": "float32"}')
    'kernel_mode=fixed-tiles, dtype=float32, layout=copies'
    >>> series_settings("witness", '{"FP8_DECODE": "1", "CUDA_BATCH_WINDOW_MS": "200"}')
    'CUDA_BATCH_WINDOW_MS=200, FP8_DECODE=1'
    >>> series_settings("run", '{"stream": true}') is None
    True
    """
    try:
        values = json.loads(settings) if settings else {}
    except ValueError:
        values = {}
    if not isinstance(values, dict):
        values = {}
    names = RESULT_SETTINGS if kind == "run" else sorted(values)
    shown = [f"{name}={_setting(values[name])}" for name in names if values.get(name) is not None]
    return ", ".join(shown) or None


def _setting(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class HistoryError(ValueError):
    """A source or history folder that cannot join a history; the message names it."""


@dataclass(frozen=True)
class History:
    """Entries, bands and markers over time (see the module docstring)."""

    entries: pl.DataFrame
    bands: pl.DataFrame
    markers: pl.DataFrame

    def __repr__(self) -> str:
        series = self.entries.select(SERIES).unique().height
        return f"History({self.entries.height} entries in {series} series, {self.bands.height} bands, {self.markers.height} markers)"

    def _repr_html_(self) -> str:
        from ..core import cell, summary_html

        span = self.entries["time"].drop_nulls()
        facts = [("entries", self.entries.height), ("series (host, engine, model, settings)", self.entries.select(SERIES).unique().height),
                 ("from", span.min() if span.len() else None), ("to", span.max() if span.len() else None),  # as every time is shown
                 ("markers", self.markers.height)]
        lines = [(f"{r['rule']}: {r['host']} {r['engine']} c={r['c']}, first bad {cell(r['first_bad_time'])}", "fail")
                 for r in self.regressions().iter_rows(named=True)]
        # a commit's 40 hex digits are most of a row: 10 are enough to tell commits apart, the rest in each cell's tooltip
        return summary_html("bia history", None, facts, lines, self.entries.select("time", "kind", *SERIES, "commit", "verdict"),
                            shorten={"commit": 10})

    def regressions(self, rules: Iterable[Rule] = REGRESSION_RULES) -> pl.DataFrame:
        """Each place a rule finds a band that was good and is not: the last good and the first bad
        entry of its series (host, engine, model, series_settings) and c, and the server commits between them.

        Parameters
        ----------
        rules : iterable of Rule, default REGRESSION_RULES
            The rules to apply.

        Returns
        -------
        polars.DataFrame
            One row per regression: the rule, the series and c, the last good and first bad entries and the commits
            between them; empty, with its columns, when none.
        """
        return regressions(self.bands, self.markers, rules)


# --- reading sources into entries, bands and markers -----------------------------------------------


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
    verdict_of = dict(judge_witnesses(ws).frame.select("run", "verdict").iter_rows())  # the judgement every surface renders
    entry_of = {source: _digest(text.encode("utf-8")) for source, text in ws.texts.items()}
    markers = [{"entry": entry_of[m["source"]], "source": m["source"], "time": m["started_utc"], "host": m["host"], "commit": m["commit"],
                "status": m["status"], "max_m": m["max_m"], "cc": m["cc"]} for m in ws.markers.iter_rows(named=True)]
    released = {(m["host"], m["commit"]): m["time"] for m in sorted(markers, key=lambda m: m["time"] or appended, reverse=True)}
    entries, bands = [], []
    slots = ws.slots.with_columns(held=pl.col("agree_to") >= pl.col("completion_tokens"))
    for w in ws.witnesses.iter_rows(named=True):
        when = released.get((w["host"], w["commit"]))
        settings = {k[4:]: v for k, v in w.items() if k.startswith("env_") and v is not None}
        key = {"entry": entry_of[w["source"]], "time": when or appended, "host": w["host"], "engine": f"aprender {w['probe']}",
               "model": w["model_path"], "commit": w["commit"]}
        entries.append({**key, "kind": "witness", "source": w["source"], "time_origin": "release marker" if when else "appended",
                        "settings": json.dumps(settings, sort_keys=True), "verdict": verdict_of[w["source"]], "appended": appended})
        mine = ws.bands.filter(pl.col("source") == w["source"])
        rates = dict(zip(mine["c"].to_list(), mine["decode_tok_s"].to_list()))
        for b in mine.iter_rows(named=True):
            held = slots.filter((pl.col("source") == w["source"]) & (pl.col("c") == b["c"]))["held"].drop_nulls()
            ratio = rates[b["c"]] / rates[1] if rates.get(1) and rates.get(b["c"]) is not None else None
            bands.append({**key, "c": b["c"], "requests": b["n_slots"], "earliest_divergence": b["divergence_at"], "bit_identical_share": None,
                          "token_identical_share": float(held.mean()) if held.len() else None, "unique_completions": None,
                          "decode_tok_s": b["decode_tok_s"], "decode_ratio": ratio, "decode_ratio_low": None, "decode_ratio_high": None,
                          "result": b["derived_result"]})
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
    from ._judgement import judge_runs

    run = read_run(folder)
    manifest = run.manifest
    identity = manifest.get("identity") or {}
    when = _utc(manifest.get("started")) or _utc(manifest.get("finished"))
    settings = {**(manifest.get("requested") or {}), **(manifest.get("effective") or {})}
    key = {"entry": _run_digest(folder), "time": when or appended, "host": identity.get("host"), "engine": identity.get("engine"),
           "model": (identity.get("model") or {}).get("path"), "commit": identity.get("commit")}
    entry = {**key, "kind": "run", "source": str(folder), "time_origin": "manifest" if when else "appended",
             "settings": json.dumps(settings, sort_keys=True, default=str), "verdict": judge_runs(run).verdict, "appended": appended}
    slots = slot_table(run)
    unique = band_table(run).group_by("c").agg(pl.col("unique_completions").max())
    rates = {c: group["decode_tok_s"].drop_nulls().to_list() for (c,), group in slots.group_by(["c"])}
    per_c = slots.group_by("c").agg(
        pl.len().alias("requests"), pl.col("divergence_at").min().alias("earliest_divergence"),
        (pl.col("bitwise_prefix") == pl.col("length")).mean().alias("bit_identical_share"),
        (~pl.col("diverged")).mean().alias("token_identical_share"), pl.col("decode_tok_s").median().alias("decode_tok_s"),
    ).join(unique, on="c", how="left").sort("c")
    bands = []
    for b in per_c.iter_rows(named=True):
        base, batched = rates.get(1) or [], rates.get(b["c"]) or []
        ratio = _decode_ratio(base, batched)
        bands.append({**key, "c": b["c"], "requests": b["requests"], "earliest_divergence": b["earliest_divergence"],
                      "bit_identical_share": b["bit_identical_share"], "token_identical_share": b["token_identical_share"],
                      "unique_completions": b["unique_completions"], "decode_tok_s": b["decode_tok_s"], "decode_ratio": ratio[0],
                      "decode_ratio_low": ratio[1], "decode_ratio_high": ratio[2], "result": None})
    return entry, bands


MIN_RATE_SAMPLES = 3  # per-request decode rates a side needs before the ratio of their medians gets an interval


def _decode_ratio(base: list[float], batched: list[float]) -> tuple[float | None, float | None, float | None]:
    """The c/c=1 ratio of median decode rates, with its bootstrap interval when each side has ``MIN_RATE_SAMPLES`` rates.

    With fewer, the ratio is shown but has no interval: one request at c=1 is the machine's noise of that second, and
    the regression rules judge only ratios with an interval.

    Examples
    --------
    >>> _decode_ratio([100.0], [50.0])
    (0.5, None, None)
    >>> ratio, low, high = _decode_ratio([100.0, 110.0, 90.0], [50.0, 55.0, 45.0])
    >>> ratio, low <= ratio <= high
    (0.5, True)
    >>> _decode_ratio([], [50.0])
    (None, None, None)
    """
    if not base or not batched:
        return None, None, None
    if min(len(base), len(batched)) < MIN_RATE_SAMPLES:
        return statistics.median(batched) / statistics.median(base), None, None
    return parity.ratio_interval(base, batched)


def _is_run(path: Path) -> bool:
    return (path / "manifest.json").is_file() and (path / "captures").is_dir()


def _is_history(path: Path) -> bool:
    return (path / "history.json").is_file()


def _split(sources: Iterable[str | os.PathLike[str]]) -> tuple[list[Path], list[Path], list[str]]:
    """History folders, run directories and witness or marker sources, from what was given."""
    histories, runs, documents = [], [], []
    for source in sources:
        text = os.fspath(source)
        path = Path(text)
        if is_url(text) or path.is_file() or not path.exists():
            documents.append(text)  # a missing path is named by expand_sources
        elif _is_history(path):
            histories.append(path)
        elif _is_run(path):
            runs.append(path)
        else:
            found = sorted(m.parent for m in path.rglob("manifest.json") if _is_run(m.parent))
            runs += found
            inside = [p for p in path.rglob("*.json") if p.is_file() and not any(r in p.parents for r in found)]
            documents += sorted(str(p) for p in inside)
            if not found and not inside:  # as expand_sources says of a folder with nothing to read
                raise FileNotFoundError(f"{text}: holds no run, witness or marker")
    return histories, runs, documents


def _rows_of(sources: Iterable[str | os.PathLike[str]], appended: dt.datetime) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, list]:
    """The three frames of sources that are not history folders, and the history folders given."""
    histories, runs, documents = _split(sources)
    entries: list[dict[str, Any]] = []
    bands: list[dict[str, Any]] = []
    markers: list[dict[str, Any]] = []
    if documents:
        entries, bands, markers = _witness_rows(expand_sources(documents), appended)
    for folder in show_progress(list(runs), None, "reading runs", unit="run"):  # each run is parsed whole: a bar on a terminal when there are several
        entry, run_bands = _run_rows(folder, appended)
        entries.append(entry)
        bands += run_bands
    return _frame(entries, ENTRY_SCHEMA), _frame(bands, BAND_SCHEMA), _frame(markers, MARKER_SCHEMA), histories


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
        frames.append(pl.concat([pl.read_parquet(p) for p in parts], how="vertical") if parts else pl.DataFrame(schema=schema))
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


def _history_of(entries: pl.DataFrame, bands: pl.DataFrame, markers: pl.DataFrame) -> History:
    """A History of these rows, each entry (and each entry's band at c) once, in time order, each entry
    and band with its ``series_settings`` (derived here, so a history folder written before them has them too)."""
    entries = entries.unique("entry", keep="first", maintain_order=True)
    entries = entries.with_columns(pl.Series("series_settings", [series_settings(kind, settings) for kind, settings
                                                                  in entries.select("kind", "settings").iter_rows()], dtype=pl.String))
    bands = bands.unique(["entry", "c"], keep="first", maintain_order=True).join(entries.select("entry", "series_settings"), on="entry",
                                                                                 how="left", maintain_order="left")
    return History(entries.sort("time"), bands.sort("time", "c"), markers.unique("entry", keep="first", maintain_order=True).sort("time"))


def append_history(sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], folder: str | os.PathLike[str]) -> History:
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
    if folder.exists() and not _is_history(folder):  # an empty folder may become one; anything else is refused, never cleared
        if folder.is_file() or any(folder.iterdir()):
            raise OutputExists(f"{folder}: the history folder holds something that is not a bia history (no history.json); "
                               "give a new or empty folder")
    # the folder's version, then every source, are read before the folder is made or touched: a fault leaves it as it was
    known = _read_folder(folder) if _is_history(folder) else _empty_history()
    sources = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    appended = dt.datetime.now(dt.UTC)
    entries, bands, markers, histories = _rows_of(sources, appended)
    if histories:
        raise HistoryError(f"{histories[0]}: a history folder cannot be appended to another; read both with read_history")
    if not _is_history(folder):
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "history.json", json.dumps({"history_version": HISTORY_VERSION}))
    new_entries = entries.join(known[0].select("entry"), on="entry", how="anti").unique("entry", maintain_order=True)
    new_markers = markers.join(known[2].select("entry"), on="entry", how="anti").unique("entry", maintain_order=True)
    new_bands = bands.join(new_entries.select("entry"), on="entry", how="semi").unique(["entry", "c"], maintain_order=True)
    stamp = appended.strftime("%Y%m%dT%H%M%S%fZ")
    for name, frame in (("entries", new_entries), ("bands", new_bands), ("markers", new_markers)):
        if frame.height:
            (folder / name).mkdir(exist_ok=True)
            part = folder / name / f"part-{stamp}.parquet"
            frame.write_parquet(part.with_suffix(".part"))
            os.replace(part.with_suffix(".part"), part)  # a part appears whole or not at all
    _keep_originals(folder, pl.concat([new_entries.select("entry", "kind", "source"), new_markers.select("entry", "source")
                                       .with_columns(kind=pl.lit("marker")).select("entry", "kind", "source")]))
    return _history_of(*(pl.concat([old, new], how="vertical") for old, new in zip(known, (new_entries, new_bands, new_markers))))


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
