"""A run: the unit a probe or an experiment writes and the report reads.

Layout of a run directory (``run_version`` 1)::

    manifest.json        identity, sampler, ladder, declared_min, environment, requested and
                         effective settings, prompts, and m_formed per band
    captures/*.jsonl     raw captures as received, one request per line, in bia's capture
                         envelope: {"sse": "<raw SSE>" | "response": {...}, "arrival_times": [...],
                         "t_sent": ..., "prompt_id": ..., "role": "reference" | "band",
                         "band_c": c, "slot": i, "repeat": r}
                         (role "reference": slot 0 is ref #1, slot 1 ref #2; "observer": a band's
                         twin fired without logprobs; "filler": the needle layout's other requests)
    partial/             the probe's requests in flight (raw bytes and event times); a stopped run
                         keeps them, and ``Run.missing`` names them
    refused.jsonl        the bytes of streams the probe refused; superseded/: what a resume set aside
    derived/             Parquet tables, rebuildable from captures/ (``Run.write_derived``)
    witness.json         an aprender witness_version 3, rebuildable (``to_witness``)

:func:`read_run` reads it; :func:`assemble_run` builds the same object from loose dumps and a
mapping of which file is which prompt, band and slot.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from . import _columnar, parity
from ._manifest import manifest_problem
from ._output import claim_output
from ._strictjson import check_depth
from ._witness_rules import derive_run_verdict
from .dumps import Dump, DumpError, read_dumps
from .dumps._read import DUMP_SUFFIXES
from .dumps._schema import REQUEST_SCHEMA

RUN_VERSION = 1
_DEFAULTS = {"ladder": [1, 4, 8, 16], "declared_min": 64, "max_constant_run": 16}


@dataclass(frozen=True)
class Unit:
    """One step of a run's plan: a reference request, or one band (or its observer twin) of c requests released together.

    ``slots`` are the requests recorded as the unit's own: all c in the copies layout, the target
    (slot 0) alone in the needle layout, where the others are fillers.
    """

    prompt_id: str
    role: str  # "reference" | "band" | "observer"
    band_c: int | None
    repeat: int
    slots: tuple[int, ...]

    @property
    def key(self) -> str:
        """A stable name, as the manifest's ``done`` list and each capture's ``unit`` field hold it."""
        if self.role == "reference":
            return f"{self.prompt_id}/reference/s{self.slots[0]}"
        return f"{self.prompt_id}/{self.role}/c{self.band_c}/r{self.repeat}"

    def capture_name(self, slot: int) -> str:
        """The file name (without suffix) of one request's partial capture."""
        return f"{self.key.replace('/', '.')}.s{slot}"


def plan(manifest: Mapping[str, Any]) -> list[Unit]:
    """What a run's manifest calls for, in the order a probe sends it: per prompt the two m=1
    references, then each repeat of the ladder (each band followed by its observer twin, without
    logprobs, when ``observer`` is set).

    Examples
    --------
    >>> [u.key for u in plan({"ladder": [1, 4], "prompts": [{"prompt_id": "p0"}], "observer": True})]
    ['p0/reference/s0', 'p0/reference/s1', 'p0/band/c1/r0', 'p0/observer/c1/r0', 'p0/band/c4/r0', 'p0/observer/c4/r0']
    """
    ladder = list(manifest.get("ladder", _DEFAULTS["ladder"]))
    needle = (manifest.get("requested") or {}).get("layout") == "needle"
    roles = ("band", "observer") if manifest.get("observer") else ("band",)
    units = []
    for prompt in manifest.get("prompts", []):
        pid = str(prompt.get("prompt_id"))
        units += [Unit(pid, "reference", None, 0, (slot,)) for slot in (0, 1)]
        for repeat in range(int(manifest.get("repeats", 1))):
            units += [Unit(pid, role, c, repeat, (0,) if needle else tuple(range(c))) for c in ladder for role in roles]
    return units


class RunError(ValueError):
    """A run directory or mapping that cannot be read; the message names the file and field."""


@dataclass(frozen=True)
class Run:
    """A run's manifest and its captures in the dump schema (requests carry prompt, role, band, slot)."""

    manifest: dict[str, Any]
    dump: Dump
    path: Path | None = None
    # What the tables derive once per run (numbered steps, streams): a run's frames never change.
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def ladder(self) -> list[int]:
        return list(self.manifest.get("ladder", _DEFAULTS["ladder"]))

    @property
    def declared_min(self) -> int:
        return int(self.manifest.get("declared_min", _DEFAULTS["declared_min"]))

    def streams(self) -> dict[tuple, parity.Stream]:
        """Every request's completion stream, keyed by (source, record, choice_index) (built once per run)."""
        if "streams" not in self._cache:
            self._cache["streams"] = parity.streams(self.dump.tokens, self.dump.candidates)
        return self._cache["streams"]

    @property
    def requests(self) -> pl.DataFrame:
        """The requests with their decode rates (built once per run)."""
        if "requests" not in self._cache:
            self._cache["requests"] = parity.request_decode_rates(self.dump.requests)
        return self._cache["requests"]

    @property
    def tokens(self) -> Any:
        """Every scored position of every request (the dump's ``tokens`` frame)."""
        return self.dump.tokens

    @property
    def candidates(self) -> Any:
        """Every top-k candidate of every position (the dump's ``candidates`` frame)."""
        return self.dump.candidates

    @property
    def prompts(self) -> list[str]:
        """The prompt ids the captures hold, sorted."""
        return sorted({p for p in self.dump.requests["prompt_id"].to_list() if p is not None})

    def __repr__(self) -> str:
        engine = (self.manifest.get("identity") or {}).get("engine") or self.manifest.get("producer") or "unknown engine"
        state = "complete" if self.manifest.get("complete", True) else "incomplete"
        return (f"Run({str(self.path) if self.path else 'assembled'!r}: {engine}, {len(self.prompts)} prompt(s), ladder {self.ladder}, "
                f"{len(self.dump.requests)} requests, {state})")

    def _repr_html_(self) -> str:
        from ._show import run_summary

        return run_summary(self)

    def missing(self) -> list[dict[str, Any]]:
        """The requests the run's plan calls for that the captures lack and no refusal explains
        (what an interrupted probe did not finish). ``state`` says whether the request was in
        flight when the probe stopped (its partial bytes are under ``partial/``) or never sent.

        Examples
        --------
        >>> run = Run({"ladder": [1], "prompts": [{"prompt_id": "p"}]}, read_dumps([]))
        >>> [(m["role"], m["state"]) for m in run.missing()]
        [('reference', 'not sent'), ('reference', 'not sent'), ('band', 'not sent')]
        """
        have = {(r["prompt_id"], r["role"], r["band_c"], r["slot"], r["repeat"] or 0)
                for r in self.dump.requests.select("prompt_id", "role", "band_c", "slot", "repeat").iter_rows(named=True)}
        have |= {(r.get("prompt_id"), r.get("role"), r.get("band_c"), r.get("slot"), r.get("repeat") or 0) for r in self.manifest.get("refused", [])}
        out = []
        skipped = {entry.get("prompt_id") for entry in self.manifest.get("skipped", [])}  # references that disagree: no band by design
        for unit in plan(self.manifest):
            if unit.role != "reference" and unit.prompt_id in skipped:
                continue
            for slot in unit.slots:
                if (unit.prompt_id, unit.role, unit.band_c, slot, unit.repeat) in have:
                    continue
                partial = self.path is not None and (self.path / "partial" / f"{unit.capture_name(slot)}.sse").exists()
                out.append({"prompt_id": unit.prompt_id, "role": unit.role, "band_c": unit.band_c, "slot": slot, "repeat": unit.repeat,
                            "state": "in flight when the probe stopped" if partial else "not sent"})
        return out

    def write_derived(self) -> Path:
        """Write the Parquet tables under ``derived/`` with the size and sha256 of every capture file
        they were parsed from, so that :func:`read_run` opens them instead of parsing the captures
        again for as long as the captures are unchanged (needs a run directory)."""
        if self.path is None:
            raise RunError("an assembled run has no directory to write into")
        return _write_derived(self, _capture_stamps(self.path / "captures", _derived_record(self.path / "derived")))


def _parse_json(text: str) -> Any:
    """``json.loads`` behind the nesting guard, so a hostile manifest is a ValueError, not a RecursionError."""
    check_depth(text)
    return json.loads(text)


def _load_manifest(path: Path) -> dict[str, Any]:
    manifest_path = path / "manifest.json"
    if not manifest_path.exists():
        raise RunError(f"{path}: no manifest.json; a run directory starts with its manifest")
    try:
        manifest = _parse_json(manifest_path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise RunError(f"{manifest_path}: not UTF-8 text ({exc})") from None
    except ValueError as exc:
        raise RunError(f"{manifest_path}: not valid JSON ({exc})") from None
    return _checked_manifest(manifest, manifest_path)


def _checked_manifest(manifest: Any, where: Any) -> dict[str, Any]:
    """The manifest when it is an object of this run version whose fields have their types; else a RunError naming the field."""
    if not isinstance(manifest, dict):
        raise RunError(f"{where}: expected a JSON object")
    if manifest.get("run_version", RUN_VERSION) != RUN_VERSION:
        raise RunError(f"{where}: run_version {manifest.get('run_version')!r} is not {RUN_VERSION}")
    problem = manifest_problem(manifest)
    if problem:
        raise RunError(f"{where}: {problem}")
    return manifest


def read_run(path: str | os.PathLike[str], *, cache: bool = True, **options: Any) -> Run:
    """Read a run directory (see the module docstring for its layout).

    The captures are parsed once: the first read writes the tables to ``derived/`` (unless the
    directory is read-only), and later reads open them as long as every capture file has the size
    and sha256 recorded with them; a capture added, changed or removed makes them stale, and the
    captures are parsed again. ``cache=False`` always parses and writes nothing. ``options`` go to
    :func:`analysis.read_dumps` (for example ``lenient=True``); a read with options never uses the cache.

    Examples
    --------
    >>> run = read_run("data/experiment-cpu/default")
    >>> run.dump.requests.height, run.ladder
    (62, [1, 4, 8, 16])
    """
    path = Path(path)
    manifest = _load_manifest(path)
    captures = path / "captures"
    if not captures.is_dir():
        raise RunError(f"{path}: no captures/ folder")
    cached = cache and not options
    record = _derived_record(path / "derived") if cached else None
    stamps = _capture_stamps(captures, record) if cached else None  # taken before parsing: a capture appended meanwhile makes the cache stale
    if record is not None and (dump := _read_derived(path / "derived", captures, record, stamps)) is not None:
        return Run(manifest, dump, path)
    # A probe killed while appending a capture leaves its last line cut short: that request is left out
    # (Dump.skipped says so) and Run.missing lists it, so the run still opens.
    run = Run(manifest, _without_repeated_lines(read_dumps(captures, torn_tail=True, **options)), path)
    if cached and os.access(path, os.W_OK):
        try:
            _write_derived(run, stamps)
        except OSError:  # a full disk or a folder we may not write into: the run is read all the same
            pass
    return run


_UNIT = ("prompt_id", "role", "band_c", "repeat", "slot")  # what names one request of a run's plan


def _without_repeated_lines(dump: Dump) -> Dump:
    """The dump with each capture line that repeats an earlier one byte for byte (a copy appended twice) left
    out, and said in ``Dump.skipped``; two different lines for one request of the plan are a RunError naming both."""
    requests = dump.requests if isinstance(dump.requests, pl.DataFrame) else pl.from_pandas(dump.requests[["source", "record", "raw_sha256", *_UNIT]])
    keyed = requests.filter(pl.col("role").is_in(["reference", "band", "observer"])).with_columns(pl.col("repeat").fill_null(0))
    repeated = keyed.filter(pl.len().over(_UNIT) > 1).sort("source", "record")
    if repeated.is_empty():
        return dump
    dropped, notes = [], list(dump.skipped)
    for _, group in repeated.group_by(_UNIT, maintain_order=True):
        first, *others = group.select("source", "record", "raw_sha256", "role", "slot").rows()
        for source, record, digest, role, slot in others:
            if digest != first[2]:
                raise RunError(f"{source}: line {record}: {role} slot {slot} was already recorded at {first[0]} line {first[1]}, "
                               "with different content; one request of the plan has one capture line")
            dropped.append((source, record))
            notes.append(DumpError(source, f"line {record}", None, f"the same capture line as line {first[1]}: read once"))
    tokens, candidates, requests = (_drop_records(frame, dropped) for frame in (dump.tokens, dump.candidates, dump.requests))
    return Dump(tokens, candidates, requests, dump.formats, notes)


def _drop_records(frame, records: list[tuple[str, int]]):
    """A polars or pandas frame without the rows of these (source, record) pairs."""
    if isinstance(frame, pl.DataFrame):
        return frame.join(pl.DataFrame(records, schema={"source": pl.String, "record": pl.Int64}, orient="row"), on=["source", "record"], how="anti")
    gone = set(records)
    keep = [pair not in gone for pair in zip(frame["source"], frame["record"])]
    return frame[keep].reset_index(drop=True)


_DERIVED_VERSION = 4  # 1: no capture stamps; 2: stamps without modification times; 3: requests without liveness
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
        if (old and old["size"] == stat.st_size and known.get("mtime_ns", {}).get(file.name) == stat.st_mtime_ns
                and stat.st_mtime_ns < known.get("at_ns", 0) - _RACY_NS):
            files[file.name] = old
            continue
        with file.open("rb") as handle:
            files[file.name] = {"size": os.fstat(handle.fileno()).st_size, "sha256": hashlib.file_digest(handle, "sha256").hexdigest()}
    return {"files": files, "mtime_ns": mtimes, "at_ns": at_ns}


def _derived_record(folder: Path) -> dict[str, Any] | None:
    """What ``derived/manifest.json`` says, when it is of this version; None otherwise."""
    try:
        record = _parse_json((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("derived_version") == _DERIVED_VERSION else None


def _write_derived(run: Run, stamps: dict[str, dict[str, Any]]) -> Path:
    folder = run.path / "derived"
    (folder / "manifest.json").unlink(missing_ok=True)  # the tables below are not the recorded ones until the new manifest lands
    run.dump.write_parquet(folder)
    record = {"derived_version": _DERIVED_VERSION, "captures_dir": str(run.path / "captures"), "captures": stamps, "formats": run.dump.formats,
              "skipped": [{"source": e.source, "record": e.record, "field": e.field, "problem": e.problem} for e in run.dump.skipped]}
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
        return new + source[len(old):] if source.startswith(old) else source

    if old != new:  # the run was moved or copied: sources name the captures where they are now
        tables = [t.with_columns(pl.when(pl.col("source").str.starts_with(old)).then(pl.lit(new) + pl.col("source").str.slice(len(old)))
                                 .otherwise(pl.col("source")).alias("source")) for t in tables]
    skipped = [DumpError(moved(e["source"]), e["record"], e["field"], e["problem"]) for e in record.get("skipped", [])]
    return Dump(*tables, formats={moved(k): v for k, v in record.get("formats", {}).items()}, skipped=skipped)


def assemble_run(mapping: Iterable[Mapping[str, Any]], manifest: Mapping[str, Any] | None = None, **options: Any) -> Run:
    """Build a run from loose dump files and a mapping of which file is which.

    Each mapping entry: ``{"source": path, "prompt_id": ..., "role": "reference" | "band",
    "band_c": c, "slot": i, "repeat": r}``; each source must hold one request.

    Examples
    --------
    >>> run = assemble_run([{"source": "tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json",
    ...                      "prompt_id": "p", "role": "reference", "slot": 0}])
    >>> run.dump.requests.select("prompt_id", "role", "slot").row(0)
    ('p', 'reference', 0)
    """
    entries = [dict(e) for e in mapping]
    for k, entry in enumerate(entries):
        if "source" not in entry or entry.get("role") not in ("reference", "band"):
            raise RunError(f"mapping[{k}]: needs a source and a role of 'reference' or 'band', got {entry!r}")
    sources = [str(e["source"]) for e in entries]
    if len(set(sources)) != len(sources):
        twice = next(s for s in sources if sources.count(s) > 1)
        raise RunError(f"{twice}: mapped more than once; each request is one file")
    dump = read_dumps([e["source"] for e in entries], **options)
    columns = ("prompt_id", "role", "band_c", "slot", "repeat")
    by_source = {str(e["source"]): e for e in entries}
    requests = dump.requests
    counts = requests.group_by("source").len()
    many = counts.filter(pl.col("len") != 1)
    if many.height:
        raise RunError(f"{many['source'][0]}: a mapped source must hold exactly one request, it holds {many['len'][0]}")
    updates = {c: [by_source[s].get(c) for s in requests["source"]] for c in columns}
    requests = requests.with_columns(
        pl.Series("prompt_id", [None if v is None else str(v) for v in updates["prompt_id"]], dtype=pl.String),
        pl.Series("role", updates["role"], dtype=pl.String),
        *(pl.Series(c, updates[c], dtype=pl.Int64) for c in ("band_c", "slot", "repeat")),
    )
    full = _checked_manifest({**_DEFAULTS, **(manifest or {})}, "manifest")
    return Run(full, Dump(dump.tokens, dump.candidates, requests, dump.formats, dump.skipped), None)


# --- from a run to aprender's witness -------------------------------------------------------------


def _refusal(row: Mapping[str, Any], n_predict: int) -> str | None:
    """Why a request cannot stand in a witness (``row`` a numbered request, with its stream's ``length``), else None."""
    if row["completion_tokens"] != n_predict:
        got = "none" if row["completion_tokens"] is None else row["completion_tokens"]
        return f"completion_tokens={got} != n_predict={n_predict} (PP-28)"
    if row["length"] != n_predict:
        return f"{row['length']} logprob entries != n_predict={n_predict}; the request must ask for logprobs"
    return None


def to_witness(run: Run, prompt_id: str | None = None, *, repeat: int | None = None) -> dict[str, Any]:
    """An aprender ``witness_version`` 3 for one prompt of the run, by the probe's rules.

    ``bia shape-check`` reads it back, so a run bia collected is judged by aprender's V3.
    With repeated bands, ``repeat`` chooses which (the first by default).
    """
    manifest = run.manifest
    steps, requests, _ = _numbered(run)
    prompts = sorted({p for p in requests["prompt_id"].to_list() if p is not None})
    if prompt_id is None:
        if len(prompts) != 1:
            raise RunError(f"the run holds prompts {prompts}; choose one with prompt_id=")
        prompt_id = prompts[0]
    requests = requests.filter(pl.col("prompt_id") == prompt_id)
    sampler = dict(manifest.get("sampler", {}))
    n_predict = int(sampler.get("max_tokens", sampler.get("n_predict", 0)) or 0)
    declared_min, max_run = run.declared_min, int(manifest.get("max_constant_run", _DEFAULTS["max_constant_run"]))
    refs = requests.filter(pl.col("role") == "reference").sort("slot").to_dicts()
    band_rows = {}
    for c in run.ladder:
        rows = requests.filter((pl.col("role") == "band") & (pl.col("band_c") == c))
        chosen = repeat if repeat is not None else (rows["repeat"].drop_nulls().min() if rows["repeat"].drop_nulls().len() else None)
        if chosen is not None:
            rows = rows.filter(pl.col("repeat") == chosen)
        band_rows[c] = (chosen, rows.sort("slot").to_dicts())
    facts = _pair_facts(steps, _witness_pairs(refs, [rows for _, rows in band_rows.values()]))
    reference = _reference(refs, facts, n_predict, declared_min)
    bands = []
    if reference["stable"]:
        runs = _constant_runs(run)
        for c, (chosen, rows) in band_rows.items():
            m_formed = _m_formed(manifest, prompt_id, c, chosen)
            expected = 1 if (manifest.get("requested") or {}).get("layout") == "needle" else c  # needle: only the target is recorded
            bands.append(_band(c, m_formed, rows, facts, runs, refs[0], n_predict, declared_min, max_run, expected))
    result = derive_run_verdict(reference["stable"], [(b["c"], b["result"]) for b in bands])
    prompt_text = next((p.get("text") for p in manifest.get("prompts", []) if str(p.get("prompt_id")) == prompt_id), None)
    identity = manifest.get("identity", {})
    return {
        "witness_version": 3,
        "probe": "bia",
        "host": identity.get("host"),
        "commit": identity.get("commit"),
        "binary_sha256": identity.get("binary_sha256"),
        "prompt_sha256": hashlib.sha256(prompt_text.encode()).hexdigest() if isinstance(prompt_text, str) else identity.get("prompt_sha256"),
        "model": {"path": (identity.get("model") or {}).get("path"), "sha256": (identity.get("model") or {}).get("sha256")},
        "sampler": sampler,
        "declared_min": declared_min,
        "env": manifest.get("environment", {}),
        "reference": reference,
        "bands": bands,
        "result": result,
    }


def _witness_pairs(refs: list[dict], bands: list[list[dict]]) -> list[tuple[int, int]]:
    """The comparisons a witness needs: ref #1 against ref #2, and per band ref #1 against slot 0 and slot 0 against every slot."""
    if len(refs) < 2:
        return []
    pairs = [(refs[0]["req"], refs[1]["req"])]
    for rows in bands:
        if rows:
            pairs += [(refs[0]["req"], rows[0]["req"])] + [(rows[0]["req"], row["req"]) for row in rows]
    return pairs


def _pair_facts(steps: _columnar.Steps, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], dict[str, Any]]:
    """:func:`analysis.parity.compare` of each (reference, other) request pair, computed in one query."""
    frame = pl.DataFrame(pairs, schema={"ref": pl.Int64, "other": pl.Int64}, orient="row").unique(maintain_order=True)
    frame = frame.with_row_index("pair").with_columns(pl.col("pair").cast(pl.Int64))
    compared = frame.join(_columnar.compare_pairs(steps, frame, epsilon=parity.NEAR_TIE_EPSILON), on="pair")
    return {(row["ref"], row["other"]): row for row in compared.iter_rows(named=True)}


def _constant_runs(run: Run) -> dict[int, int]:
    """The longest run of one repeated token of every request, by request number (built once per run)."""
    if "constant_runs" not in run._cache:
        steps, _, _ = _numbered(run)
        runs = _columnar.constant_runs(steps)
        run._cache["constant_runs"] = dict(zip(runs["req"].to_list(), runs["max_constant_run"].to_list()))
    return run._cache["constant_runs"]


def _reference(refs: list[dict], facts: dict, n_predict: int, declared_min: int) -> dict[str, Any]:
    out: dict[str, Any] = {"stable": False, "tokens": refs[0]["completion_tokens"] if refs else None, "self_divergence_at": None}
    if len(refs) < 2:
        out["reason"] = f"the run holds {len(refs)} m=1 reference(s); two are needed"
        return out
    for label, row in (("ref#1", refs[0]), ("ref#2", refs[1])):
        why = _refusal(row, n_predict)
        if why:
            out["reason"] = f"{label}: {why}"
            return out
    agree = facts[(refs[0]["req"], refs[1]["req"])]["agree_to"]
    out["self_divergence_at"] = agree
    if agree < declared_min:
        out["reason"] = (f"the two m=1 references diverge at token {agree} < declared_min {declared_min}; "
                         "a batched difference could not be laid at batching's door")
    else:
        out["stable"] = True
    return out


def band_widths(manifest: Mapping[str, Any], prompt_id: str, c: int, repeat: int | None, role: str = "band") -> tuple[list[int], str | None]:
    """Every batch width a run recorded for one band, and where they came from.

    The server log's per-step widths when there are any (``"log"``), else the running-requests
    gauge sampled during the band (``"metrics"``), else ``([], None)``. A gauge sample of 0 caught
    the server idle (before the band's requests arrived, or after they finished): it is no batch
    width, so a band whose samples are all 0 has no width observed, which is unknown, not 0.

    Examples
    --------
    >>> manifest = {"m_formed": [{"prompt_id": "p0", "band_c": 4, "repeat": 0, "widths": [], "running": [0, 4, 4, 2, 0]}]}
    >>> band_widths(manifest, "p0", 4, 0)
    ([4, 4, 2], 'metrics')
    >>> band_widths({"m_formed": [{"prompt_id": "p0", "band_c": 1, "repeat": 0, "widths": [], "running": [0]}]}, "p0", 1, 0)
    ([], None)
    """
    entry = _band_entry(manifest, prompt_id, c, repeat, role) or {}
    if entry.get("widths"):
        return [int(w) for w in entry["widths"]], "log"
    busy = [int(w) for w in entry.get("running") or [] if w]
    if busy:
        return busy, "metrics"
    if entry.get("max"):
        return [int(entry["max"])], "log"
    return [], None


def _band_entry(manifest: Mapping[str, Any], prompt_id: str, c: int, repeat: int | None, role: str = "band") -> dict[str, Any] | None:
    """The manifest's record of one band (its ``m_formed`` entry: widths, gauge samples, cache metrics)."""
    for entry in manifest.get("m_formed", []):
        if (entry.get("band_c") == c and str(entry.get("prompt_id", prompt_id)) == prompt_id and entry.get("repeat") in (None, repeat)
                and entry.get("role", "band") == role):
            return entry
    return None


def _m_formed(manifest: Mapping[str, Any], prompt_id: str, c: int, repeat: int | None) -> int | None:
    """The largest batch width the server formed in a band, as the run recorded it; None when no width
    was observed (no log line, no gauge sample in its window): unknown, which is not 0.

    Examples
    --------
    >>> _m_formed({"m_formed": [{"prompt_id": "p0", "band_c": 1, "repeat": 0, "widths": [], "running": []}]}, "p0", 1, 0) is None
    True
    """
    widths, _ = band_widths(manifest, prompt_id, c, repeat)
    return max(widths, default=None)


def _band(c, m_formed, rows, facts, runs, ref_row, n_predict, declared_min, max_run, expected) -> dict[str, Any]:
    slots = []
    for i, row in enumerate(rows):
        slots.append({"i": i, "completion_tokens": row["completion_tokens"], "finish_reason": row["finish_reason"], "refused": _refusal(row, n_predict),
                      "decode_tok_s": row["decode_tok_s"]})
    band = {"c": c, "m_formed": m_formed, "result": "UNMEASURABLE", "divergence_at": None, "intra_agree_to": None, "max_constant_run": None,
            "declared_min": declared_min, "max_constant_run_declared": max_run, "reason": None,
            "decode_tok_s": parity.band_decode_rate([s["decode_tok_s"] for s in slots]), "slots": slots}
    refusals = [f"slot {s['i']}: {s['refused']}" for s in slots if s["refused"]]
    if len(slots) != expected:
        band["reason"] = f"fired c={c} requests, {len(slots)} of the {expected} recorded came back"
    elif refusals:
        band["reason"] = "; ".join(refusals)
    elif c > 1 and m_formed is None:
        band["reason"] = ("no batch width was observed in this band's window (no server log line, no running-requests gauge sample), "
                          "so whether the batched path ran is unknown")
    elif c > 1 and m_formed < 2:
        band["reason"] = (f"no batch with m>1 formed in this band's window (max m={m_formed}); the batched path was never exercised, "
                          "so nothing about it was witnessed")
    if band["reason"]:
        return band
    first = facts[(ref_row["req"], rows[0]["req"])]
    band["divergence_at"] = first["agree_to"]  # aprender: reference against slot 0; the shorter length when they never part
    if first["diverged"] and first["reference_margin"] is not None:
        band["top2_margin_at_divergence"] = first["reference_margin"]
    band["intra_agree_to"] = min(facts[(rows[0]["req"], row["req"])]["agree_to"] for row in rows)
    band["max_constant_run"] = max(runs[row["req"]] for row in rows)
    reasons = []
    if max_run > 0 and band["max_constant_run"] >= max_run:
        reasons.append(f"a slot repeated one token {band['max_constant_run']} times, at or above max_constant_run={max_run} (#2753 signature)")
    if band["intra_agree_to"] < declared_min:
        reasons.append(f"slots of one batch disagree at token {band['intra_agree_to']} < declared_min={declared_min}")
    band["result"] = "FAIL" if reasons else "PASS"
    band["reason"] = "; ".join(reasons) or None
    return band


def write_witness(run: Run, path: str | os.PathLike[str] | None = None, *, force: bool = False, **options: Any) -> Path:
    """Write :func:`to_witness` as JSON (``witness.json`` in the run directory by default); an existing
    file is refused unless ``force``."""
    if path is None:
        if run.path is None:
            raise RunError("an assembled run needs an explicit path for its witness")
        path = run.path / "witness.json"
    path = claim_output(path, force=force, what="the witness")
    path.write_text(json.dumps(to_witness(run, **options), indent=2, sort_keys=True), encoding="utf-8")
    return path


__all__ = ["Run", "RunError", "Unit", "accuracy_table", "assemble_run", "band_forks", "band_table", "band_widths", "drift_table", "flip_table",
           "observer_table", "plan", "prompt_table", "read_run", "reference_margins", "references", "slot_table", "to_witness", "width_table",
           "write_witness"]


# --- tables for the report ----------------------------------------------------------------------


def _stream_of(streams: dict, row: Mapping[str, Any]) -> parity.Stream:
    return streams.get((row["source"], row["record"], row["choice_index"]), parity.Stream((row["source"],), ()))


def references(run: Run, reference: str | Run = "ref1") -> dict[str, parity.Stream]:
    """The reference stream of every prompt: ref #1 ("ref1") or ref #2 ("ref2") of this run, or ref #1 of another run.

    Examples
    --------
    >>> references(assemble_run([{"source": "tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json",
    ...                           "prompt_id": "p", "role": "reference", "slot": 0}]))["p"].identities[:2]
    (9707, 0)
    """
    if isinstance(reference, Run):
        return references(reference, "ref1")
    if reference not in ("ref1", "ref2"):
        raise RunError(f"reference must be 'ref1', 'ref2' or another Run, got {reference!r}")
    slot = 0 if reference == "ref1" else 1
    streams = run.streams()
    refs = run.dump.requests.filter((pl.col("role") == "reference") & (pl.col("slot") == slot))
    return {row["prompt_id"]: _stream_of(streams, row) for row in refs.iter_rows(named=True)}


def _numbered(run: Run, reference: str | Run = "ref1") -> tuple[_columnar.Steps, pl.DataFrame, pl.DataFrame]:
    """The steps of the run's streams (and of a reference run's), its requests numbered (``req``, ``length``,
    ``decode_tok_s``), and each prompt's reference request (``prompt_id``, ``ref``)."""
    other = reference if isinstance(reference, Run) else None
    if other is None and reference not in ("ref1", "ref2"):
        raise RunError(f"reference must be 'ref1', 'ref2' or another Run, got {reference!r}")
    key = ("numbered", None if other is None else id(other))
    if key not in run._cache:
        dumps = [run.dump] if other is None else [run.dump, other.dump]
        steps = _columnar.build_steps([(d.tokens, d.candidates, d.requests) for d in dumps])
        numbered = [_numbered_requests(d.requests, steps, part) for part, d in enumerate(dumps)]
        run._cache[key] = (steps, numbered, other)  # holding ``other`` keeps its id from being reused
    steps, numbered, _ = run._cache[key]
    slot = 1 if reference == "ref2" else 0
    refs = (numbered[-1].filter((pl.col("role") == "reference") & (pl.col("slot") == slot))
            .unique("prompt_id", keep="last", maintain_order=True).select("prompt_id", ref="req"))
    return steps, numbered[0], refs


def _numbered_requests(requests: Any, steps: _columnar.Steps, part: int) -> pl.DataFrame:
    numbers = steps.requests.filter(pl.col("part") == part).drop("part")
    requests = parity.request_decode_rates(requests)
    # a pandas dump holds integer columns with gaps as floats: back to the schema's types
    requests = requests.with_columns(pl.col(name).cast(dtype) for name, dtype in REQUEST_SCHEMA.items() if name in requests.columns)
    return requests.join(numbers, on=["source", "record", "choice_index"], how="left", nulls_equal=True)


_BAND_ORDER = ["prompt_id", "band_c", "repeat", "slot"]


def _band_pairs(run: Run, reference: str | Run) -> tuple[_columnar.Steps, pl.DataFrame]:
    """Every batched request with its reference (``pair``, ``ref``, ``other``), in the tables' order."""
    steps, requests, refs = _numbered(run, reference)
    bands = requests.filter(pl.col("role") == "band").sort(_BAND_ORDER).join(refs, on="prompt_id", how="left", maintain_order="left")
    orphan = bands.filter(pl.col("ref").is_null())
    if orphan.height:
        row = orphan.row(0, named=True)
        raise RunError(f"{row['source']}: prompt {row['prompt_id']!r} has no {reference if isinstance(reference, str) else 'reference run'} reference")
    return steps, bands.with_row_index("pair").with_columns(pl.col("pair").cast(pl.Int64), other=pl.col("req"))


_SLOT_SCHEMA = {"prompt_id": pl.String, "band_c": pl.Int64, "repeat": pl.Int64, "slot": pl.Int64, "source": pl.String, "record": pl.Int64,
                "agree_to": pl.Int64, "diverged": pl.Boolean, "divergence_at": pl.Int64, "bitwise_prefix": pl.Int64, "max_abs_delta": pl.Float64,
                "max_ulp": pl.Int64, "topk_order_changes": pl.Int64, "reference_margin": pl.Float64, "own_margin": pl.Float64,
                "in_reference_topk": pl.Boolean, "near_tie": pl.Boolean, "k3_mean": pl.Float64, "k3_max": pl.Float64, "kl_topk_mean": pl.Float64,
                "kl_topk_max": pl.Float64, "length": pl.Int64, "ttft_s": pl.Float64, "decode_tok_s": pl.Float64}


def _slot_comparisons(run: Run, epsilon: float, reference: str | Run) -> pl.DataFrame:
    """Every batched request joined with its comparison against its reference (all of ``Comparison``'s columns)."""
    key = ("slots", epsilon, reference if isinstance(reference, str) else id(reference))
    if key not in run._cache:
        steps, pairs = _band_pairs(run, reference)
        compared = _columnar.compare_pairs(steps, pairs.select("pair", "ref", "other"), epsilon=epsilon)
        run._cache[key] = pairs.drop("length").join(compared, on="pair", how="left", maintain_order="left")
    return run._cache[key]


def slot_table(run: Run, *, epsilon: float = parity.NEAR_TIE_EPSILON, reference: str | Run = "ref1") -> pl.DataFrame:
    """One row per batched request: its comparison with ref #1 of its prompt, and its decode rate.

    Over the steps where the request agrees with the reference, ``k3_*`` is prime-rl's
    ``exp(d) - 1 - d`` of the sampled token's logprobs and ``kl_topk_*`` the KL of the reference's
    top-k (plus the rest) against the request's (see :func:`analysis.parity.topk_kl`). Every
    column is what :func:`analysis.parity.compare` gives, computed for all requests at once.

    Examples
    --------
    >>> run = assemble_run([
    ...     {"source": "tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json", "prompt_id": "p", "role": "reference", "slot": 0},
    ...     {"source": "tests/samples/renderers_generate_response_fixture__renderers-tests-test_client.json",
    ...      "prompt_id": "p", "role": "band", "band_c": 1, "slot": 0}])
    >>> slot_table(run).select("band_c", "agree_to", "diverged", "divergence_at").row(0)
    (1, 0, True, 0)
    """
    return _slot_comparisons(run, epsilon, reference).select([pl.col(n).cast(t) for n, t in _SLOT_SCHEMA.items()])


_BAND = ["prompt_id", "band_c", "repeat"]
_BAND_SCHEMA = {"prompt_id": pl.String, "band_c": pl.Int64, "repeat": pl.Int64, "m_formed": pl.Int64, "widths_seen": pl.String,
                "n_slots": pl.Int64, "divergence_min": pl.Int64, "divergence_median": pl.Float64, "divergence_max": pl.Int64,
                "diverged_slots": pl.Int64, "near_tie_slots": pl.Int64, "intra_agree_to": pl.Int64, "max_constant_run": pl.Int64,
                "unique_completions": pl.Int64, "modal_share": pl.Float64, "modal_share_low": pl.Float64, "modal_share_high": pl.Float64,
                "decode_tok_s": pl.Float64, "s_per_1000_seq": pl.Float64, "release_skew_s": pl.Float64, "prefix_cache": pl.String}


def band_table(run: Run, *, epsilon: float = parity.NEAR_TIE_EPSILON, reference: str | Run = "ref1") -> pl.DataFrame:
    """One row per (prompt, band, repeat): divergence over slots, agreement, completions, decode rate,
    seconds per 1000 sequences (the band's wall time from its first send to its last token, per
    request) and the release skew (first to last send); the last two for probe runs only, which
    record when each request was sent. Each column is :func:`analysis.parity.band_summary`'s, as group-bys."""
    slots = _slot_comparisons(run, epsilon, reference)
    if slots.height == 0:
        return pl.DataFrame(schema=_BAND_SCHEMA)
    steps = _numbered(run, reference)[0]
    slots = _with_agreement_to_slot_0(steps, slots, "intra")
    slots = (slots.join(_columnar.constant_runs(steps).rename({"req": "other"}), on="other", how="left")
             .join(_columnar.sequences(steps).rename({"req": "other"}), on="other", how="left"))
    sent = pl.col("extra").str.json_path_match("$.sent_at_s").cast(pl.Float64)
    slots = slots.with_columns(sent=sent, end=sent + pl.col("t_last_content"))
    timed = (pl.col("sent").null_count() == 0) & (pl.col("end").null_count() == 0)
    bands = slots.group_by(_BAND, maintain_order=True).agg(
        n_slots=pl.len().cast(pl.Int64),
        divergence_min=pl.col("agree_to").min(),
        divergence_median=pl.col("agree_to").median(),
        divergence_max=pl.col("agree_to").max(),
        diverged_slots=pl.col("diverged").sum().cast(pl.Int64),
        near_tie_slots=pl.col("near_tie").sum().cast(pl.Int64),
        intra_agree_to=pl.col("intra").min(),
        max_constant_run=pl.col("max_constant_run").max(),
        decode_tok_s=_columnar.band_rate(pl.col("decode_tok_s")),
        s_per_1000_seq=pl.when(timed).then((pl.col("end").max() - pl.col("sent").min()) / pl.len() * 1000),
        release_skew_s=pl.when(timed).then(pl.col("sent").max() - pl.col("sent").min()),
    )
    completions = (slots.group_by([*_BAND, "sequence"]).agg(count=pl.len())
                   .group_by(_BAND).agg(unique_completions=pl.len().cast(pl.Int64), modal_count=pl.col("count").max()))
    bands = bands.join(completions, on=_BAND, how="left", nulls_equal=True, maintain_order="left")
    low, high = _columnar.wilson(pl.col("modal_count"), pl.col("n_slots"))
    bands = bands.with_columns(modal_share=pl.col("modal_count") / pl.col("n_slots"), modal_share_low=low, modal_share_high=high)
    widths = _band_widths_text(run, bands)
    return bands.with_columns(pl.Series("m_formed", [w["m_formed"] for w in widths], dtype=pl.Int64),
                              pl.Series("widths_seen", [w["widths_seen"] for w in widths], dtype=pl.String),
                              pl.Series("prefix_cache", [_cache_summary(run.manifest, p, c, r) for p, c, r in bands.select(_BAND).rows()],
                                        dtype=pl.String)).select([pl.col(n).cast(t) for n, t in _BAND_SCHEMA.items()])


def _with_agreement_to_slot_0(steps: _columnar.Steps, bands: pl.DataFrame, name: str) -> pl.DataFrame:
    """Band requests (``pair``, ``req``, in slot order) with their band's first request (``first``) and how many
    leading tokens each shares with it (``name``)."""
    bands = bands.with_columns(first=pl.col("req").first().over(_BAND))
    agreed = _columnar.agreements(steps, bands.select("pair", ref="first", other="req")).rename({"agree_to": name})
    return bands.join(agreed, on="pair", how="left", maintain_order="left")


def _band_widths_text(run: Run, bands: pl.DataFrame) -> list[dict[str, Any]]:
    """Each band's largest width formed and its widths as text, from the manifest (one entry per band, not per request)."""
    out = []
    for prompt, c, repeat in bands.select(_BAND).rows():
        widths, origin = band_widths(run.manifest, prompt, c, repeat)
        seen = ", ".join(f"m={w} x{widths.count(w)}" for w in sorted(set(widths), reverse=True))
        out.append({"m_formed": max(widths) if widths else None,
                    "widths_seen": (seen + (" (running-requests gauge samples)" if origin == "metrics" else "")) or None})
    return out


_PROMPT_SCHEMA = {"prompt_id": pl.String, "tie_density_1e-3": pl.Float64, "tie_density_1e-2": pl.Float64, "tie_density_1e-1": pl.Float64,
                  "div_index": pl.Int64, "avg_std_top1_prob": pl.Float64, "std_output_length": pl.Float64,
                  "s7_ratio": pl.Float64, "s7_low": pl.Float64, "s7_high": pl.Float64}


def prompt_table(run: Run, *, reference: str | Run = "ref1") -> pl.DataFrame:
    """One row per prompt: the reference's tie density, Yuan et al.'s Div_Index, Avg_Std@top1_prob and
    the std of output lengths (averaged over prompts, their Avg_Std@Output_Length) across the
    reference and each band's slot 0 (the configurations), and S7's c=4/c=1 decode-rate
    ratio with a bootstrap interval over the bands' repeats (null where rates are missing)."""
    steps, requests, refs = _numbered(run, reference)
    bands = requests.filter(pl.col("role") == "band")
    firsts = (bands.filter(pl.col("slot") == 0).sort("band_c", "repeat").join(refs, on="prompt_id", maintain_order="left")
              .select("prompt_id", "ref", other="req").with_row_index("pair").with_columns(pl.col("pair").cast(pl.Int64)))
    lengths = steps.requests.select("req", "length")
    configurations = pl.concat([refs.select("prompt_id", req="ref"), firsts.select("prompt_id", req="other")]).join(lengths, on="req", how="left")
    thresholds = {"1e-3": 1e-3, "1e-2": 1e-2, "1e-1": 1e-1}
    margins = steps.steps.join(refs, left_on="req", right_on="ref").group_by("prompt_id").agg(
        (pl.col("margin") < t).sum().truediv(pl.col("margin").count()).alias(f"tie_density_{name}") for name, t in thresholds.items())
    parted = (_columnar.agreements(steps, firsts).join(firsts.select("pair", "prompt_id"), on="pair")
              .group_by("prompt_id").agg(first_part=pl.col("agree_to").min()))
    per_prompt = (configurations.group_by("prompt_id").agg(n=pl.len(), shortest=pl.col("length").min(),
                                                           std_output_length=pl.col("length").cast(pl.Float64).std(ddof=0))
                  .join(refs.join(lengths.rename({"req": "ref", "length": "ref_length"}), on="ref"), on="prompt_id")
                  .join(parted, on="prompt_id", how="left").with_columns(div_index=pl.coalesce("first_part", "ref_length")))
    top1 = (configurations.join(steps.steps.select("req", "idx", p=pl.coalesce("top1", "logprob").exp()), on="req")
            .join(per_prompt.select("prompt_id", "n", limit=pl.min_horizontal(pl.col("div_index") + 1, "shortest")), on="prompt_id")
            .filter(pl.col("idx") < pl.col("limit"))
            .group_by("prompt_id", "idx").agg(pl.col("n").first(), known=pl.col("p").count(), std=pl.col("p").std(ddof=0))
            .filter(pl.col("known") == pl.col("n")).group_by("prompt_id").agg(avg_std_top1_prob=pl.col("std").mean()))
    table = (refs.select("prompt_id").join(margins, on="prompt_id", how="left", maintain_order="left")
             .join(per_prompt, on="prompt_id", how="left", maintain_order="left").join(top1, on="prompt_id", how="left", maintain_order="left")
             .join(_s7(bands), on="prompt_id", how="left", maintain_order="left"))
    # a reference without margins has no tie density: NaN, as parity.tie_density gives
    table = table.with_columns(pl.col(f"tie_density_{name}").fill_null(float("nan")) for name in thresholds)
    return table.select([pl.col(n).cast(t) for n, t in _PROMPT_SCHEMA.items()])


def _s7(bands: pl.DataFrame) -> pl.DataFrame:
    """S7's c=4 / c=1 decode-rate ratio per prompt, with its bootstrap interval over each band's repeats."""
    rates = (bands.filter(pl.col("band_c").is_in([1, 4])).group_by("prompt_id", "band_c", "repeat")
             .agg(rate=_columnar.band_rate(pl.col("decode_tok_s"))).sort("prompt_id", "band_c", "repeat"))
    rows = []
    for (prompt,), group in rates.group_by(["prompt_id"], maintain_order=True):  # one bootstrap per prompt
        base, batched = (group.filter(pl.col("band_c") == c)["rate"] for c in (1, 4))
        if base.len() and batched.len() and base.null_count() == 0 and batched.null_count() == 0:
            ratio, low, high = parity.ratio_interval(base.to_list(), batched.to_list())
            rows.append({"prompt_id": prompt, "s7_ratio": ratio, "s7_low": low, "s7_high": high})
    return pl.DataFrame(rows, schema={"prompt_id": pl.String, "s7_ratio": pl.Float64, "s7_low": pl.Float64, "s7_high": pl.Float64}, orient="row")


def flip_table(run: Run, *, reference: str | Run = "ref1", edges: Sequence[float] = parity.FLIP_EDGES) -> pl.DataFrame:
    """:func:`analysis.parity.flip_curve` over every batched request of the run against its reference.

    Examples
    --------
    >>> flip_table(Run({"ladder": [1]}, read_dumps([]))).select("steps").to_series().sum()
    0
    """
    slots = _slot_comparisons(run, parity.NEAR_TIE_EPSILON, reference)
    steps = _numbered(run, reference)[0]
    at_risk = (slots.select("pair", "ref", "diverged", "divergence_at",
                            last=pl.when(pl.col("diverged")).then("divergence_at").otherwise(pl.min_horizontal("length", "reference_length") - 1))
               .join(steps.steps.select(ref="req", idx="idx", margin="margin"), on="ref")
               .filter((pl.col("idx") <= pl.col("last")) & pl.col("margin").is_not_null())
               .select("margin", flip=pl.col("diverged") & (pl.col("idx") == pl.col("divergence_at"))))
    return _columnar.flip_bins(at_risk, edges)


def drift_table(run: Run, *, reference: str | Run = "ref1") -> pl.DataFrame:
    """Per batched request and step before its fork, ``|delta logprob|`` against the reference (``label``, ``step``, ``abs_delta``).

    Examples
    --------
    >>> drift = drift_table(read_run("data/experiment-cpu/default"))
    >>> drift.row(0), drift["abs_delta"].max() > 0  # c=1 matches ref #1 bit for bit; some batched request drifts
    (('p0 c=1 slot 0', 0, 0.0), True)
    """
    slots = _slot_comparisons(run, parity.NEAR_TIE_EPSILON, reference)
    steps = _numbered(run, reference)[0]
    side = steps.steps.select("req", "idx", "logprob")
    joined = (slots.select("pair", "ref", "other", "agree_to", label=pl.format("{} c={} slot {}", "prompt_id", "band_c", "slot"))
              .join(side.rename({"req": "ref", "logprob": "lp_r"}), on="ref")
              .join(side.rename({"req": "other", "logprob": "lp_o"}), on=["other", "idx"])
              .filter((pl.col("idx") < pl.col("agree_to")) & pl.col("lp_r").is_not_null() & pl.col("lp_o").is_not_null()))
    return joined.sort("pair", "idx").select("label", step="idx", abs_delta=(pl.col("lp_r") - pl.col("lp_o")).abs())


def reference_margins(run: Run, *, reference: str | Run = "ref1") -> dict[str, list[float | None]]:
    """Each prompt's reference margin (top-1 minus top-2) at every step, for :func:`analysis.plots.plot_margin_trace`.

    Examples
    --------
    >>> margins = reference_margins(read_run("data/experiment-cpu/default"))
    >>> {prompt: [round(m, 4) for m in steps[:2]] for prompt, steps in margins.items()}
    {'p0': [2.5141, 0.3024], 'p1': [1.9879, 1.3107]}
    """
    steps, _, refs = _numbered(run, reference)
    lists = steps.steps.join(refs, left_on="req", right_on="ref").group_by("prompt_id", maintain_order=True).agg(pl.col("margin").sort_by("idx"))
    margins = dict(zip(lists["prompt_id"].to_list(), lists["margin"].to_list()))
    return {prompt: margins.get(prompt, []) for prompt in refs["prompt_id"].to_list()}


def band_forks(run: Run) -> pl.DataFrame:
    """Where the slots of each band first disagree among themselves (``at``) and which tokens they took there.

    One row per (band, token taken): ``token_id``, ``token_text``, ``token_bytes`` and how many slots
    took it (most first); a band whose slots never part has one row with ``at`` and null tokens.

    Examples
    --------
    >>> band_forks(read_run("data/experiment-cpu/default")).select("prompt_id", "band_c", "at", "slots").row(0)  # 64 tokens, no fork
    ('p0', 1, 64, None)
    """
    steps, requests, _ = _numbered(run)
    bands = requests.filter(pl.col("role") == "band").sort(_BAND_ORDER).with_row_index("pair").with_columns(pl.col("pair").cast(pl.Int64))
    bands = _with_agreement_to_slot_0(steps, bands, "agree_to").with_columns(
        at=pl.col("agree_to").filter(pl.col("req") != pl.col("first")).min().over(_BAND),
        shortest=pl.col("length").min().over(_BAND))
    bands = bands.with_columns(at=pl.coalesce("at", "shortest"))
    taken = (bands.filter(pl.col("at") < pl.col("shortest")).select(*_BAND, "pair", "at", "req")
             .join(steps.steps.select("req", "idx", "ident", "token_id", "token_text", "token_bytes"), left_on=["req", "at"], right_on=["req", "idx"])
             .group_by([*_BAND, "at", "ident"], maintain_order=True)
             .agg(pl.col("token_id", "token_text", "token_bytes").first(), slots=pl.len().cast(pl.Int64), first_slot=pl.col("pair").min())
             .sort([*_BAND, "slots", "first_slot"], descending=[False, False, False, True, False], nulls_last=False, maintain_order=True))
    keys = bands.group_by(_BAND, maintain_order=True).agg(pl.col("at").first())
    return keys.join(taken.drop("ident", "first_slot"), on=[*_BAND, "at"], how="left", nulls_equal=True, maintain_order="left")


def _cache_summary(manifest: Mapping[str, Any], prompt_id: str, c: int, repeat: int | None) -> str | None:
    """The prefix-cache metrics around a band, as text: a counter's growth during it, a gauge's value after it.

    Examples
    --------
    >>> entry = {"prompt_id": "p0", "band_c": 4, "repeat": 0, "cache": {"vllm:prefix_cache_hits_total": {"before": 6.0, "after": 18.0},
    ...                                                              "sglang:cache_hit_rate": {"before": 0.1, "after": 0.5}}}
    >>> _cache_summary({"m_formed": [entry]}, "p0", 4, 0)
    'vllm:prefix_cache_hits_total +12; sglang:cache_hit_rate 0.5'
    """
    parts = []
    for name, values in ((_band_entry(manifest, prompt_id, c, repeat) or {}).get("cache") or {}).items():
        before, after = values.get("before"), values.get("after")
        if name.endswith("_total") and before is not None and after is not None:
            parts.append(f"{name} +{after - before:g}")
        elif after is not None:
            parts.append(f"{name} {after:g}")
    return "; ".join(parts) or None


def _send_spans(group: pl.DataFrame) -> list[tuple[float, float]] | None:
    """Each request's (sent, last content chunk) on the run's clock; None without the probe's send times."""
    spans = []
    for extra, last in zip(group["extra"].to_list(), group["t_last_content"].to_list()):
        sent = json.loads(extra).get("sent_at_s") if extra else None
        if sent is None or last is None:
            return None
        spans.append((sent, sent + last))
    return spans or None


def _seconds_per_1000(spans: list[tuple[float, float]] | None) -> float | None:
    """Thinking Machines' seconds per 1000 sequences for one band (its ``_send_spans``): from the first request
    sent to the last content chunk received, per request, times 1000. None without the probe's send times."""
    if spans is None:
        return None
    return (max(end for _, end in spans) - min(start for start, _ in spans)) / len(spans) * 1000


def _release_skew(spans: list[tuple[float, float]] | None) -> float | None:
    """Seconds between the first and the last request of a band leaving the client: a batch can only form
    from requests that arrive together."""
    return None if spans is None else max(start for start, _ in spans) - min(start for start, _ in spans)


def observer_table(run: Run) -> pl.DataFrame:
    """The observer-effect check: each band's text with logprobs against its twin fired without them.

    One row per observer request: whether its completion text equals the same slot's text in the
    band that asked for logprobs, and the first character where they part (null when equal).
    Empty when the run was probed without ``observer``.

    Examples
    --------
    >>> observer_table(Run({"ladder": [1]}, read_dumps([]))).height
    0
    """
    requests = run.dump.requests
    key = ["prompt_id", "band_c", "repeat", "slot"]
    scored = requests.filter(pl.col("role") == "band").select(*key, pl.col("completion_text").alias("text_with_logprobs"))
    bare = requests.filter(pl.col("role") == "observer").select(*key, pl.col("completion_text").alias("text_without_logprobs"))
    joined = bare.join(scored, on=key, how="left", nulls_equal=True).sort(key)
    parts = [_first_difference(a, b) for a, b in zip(joined["text_with_logprobs"].to_list(), joined["text_without_logprobs"].to_list())]
    return joined.with_columns(
        pl.Series("texts_equal", [None if p == -2 else p == -1 for p in parts], dtype=pl.Boolean),
        pl.Series("first_difference", [None if p < 0 else p for p in parts], dtype=pl.Int64),
    )


def _first_difference(a: str | None, b: str | None) -> int:
    """-2 when a text is missing, -1 when equal, else the first index where they part."""
    if a is None or b is None:
        return -2
    if a == b:
        return -1
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def width_table(run: Run) -> pl.DataFrame:
    """The batch widths the server formed, per band: one row per (prompt, band, repeat, width) with how
    often it was seen and its share of the band, from the server log's per-step lines (``origin``
    "log") or, without them, the running-requests gauge's samples ("metrics").

    Examples
    --------
    >>> manifest = {"m_formed": [{"prompt_id": "p0", "band_c": 4, "repeat": 0, "widths": [4, 4, 4, 3]}]}
    >>> width_table(Run(manifest, read_dumps([]))).select("band_c", "width", "steps", "share").rows()
    [(4, 4, 3, 0.75), (4, 3, 1, 0.25)]
    """
    rows = []
    for entry in run.manifest.get("m_formed", []):
        if entry.get("role", "band") != "band":
            continue
        prompt, c, repeat = str(entry.get("prompt_id")), entry.get("band_c"), entry.get("repeat")
        widths, origin = band_widths(run.manifest, prompt, c, repeat)
        for width in sorted(set(widths), reverse=True):
            rows.append({"prompt_id": prompt, "band_c": c, "repeat": repeat, "width": width, "steps": widths.count(width),
                         "share": widths.count(width) / len(widths), "origin": origin})
    schema = {"prompt_id": pl.String, "band_c": pl.Int64, "repeat": pl.Int64, "width": pl.Int64, "steps": pl.Int64, "share": pl.Float64,
              "origin": pl.String}
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)


def accuracy_table(run: Run, *, match: str = "contains") -> tuple[pl.DataFrame, float | None]:
    """Accuracy per configuration against the prompts' answers, and Yuan et al.'s Std@Acc across them.

    A configuration is the m=1 reference (ref #1) or one band's slot 0 at each (c, repeat). A
    prompt counts when the manifest gives it an ``answer`` (``bia probe --prompts FILE.jsonl`` with
    ``{"text": ..., "answer": ...}`` lines); a completion is correct when it contains the answer
    (``match="contains"``) or equals it after trimming (``"exact"``).

    Examples
    --------
    >>> table, std = accuracy_table(Run({"prompts": [{"prompt_id": "p0", "text": "1+1="}]}, read_dumps([])))
    >>> table.height, std
    (0, None)
    """
    if match not in ("contains", "exact"):
        raise RunError(f"match must be 'contains' or 'exact', got {match!r}")
    answers = {str(p.get("prompt_id")): str(p["answer"]) for p in run.manifest.get("prompts", []) if p.get("answer") is not None}
    requests = run.dump.requests.filter(pl.col("prompt_id").is_in(list(answers)) & (pl.col("slot") == 0)
                                        & pl.col("role").is_in(["reference", "band"]))
    correct: dict[str, list[bool]] = {}
    for row in requests.sort("band_c", "repeat", "prompt_id", nulls_last=False).iter_rows(named=True):
        config = "m=1 reference" if row["role"] == "reference" else f"c={row['band_c']} repeat {row['repeat']}"
        text, answer = row["completion_text"] or "", answers[row["prompt_id"]]
        correct.setdefault(config, []).append(answer in text if match == "contains" else text.strip() == answer.strip())
    rows = [{"configuration": config, "prompts": len(hits), "correct": sum(hits), "accuracy": sum(hits) / len(hits)} for config, hits in correct.items()]
    schema = {"configuration": pl.String, "prompts": pl.Int64, "correct": pl.Int64, "accuracy": pl.Float64}
    table = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    return table, parity.std_at_acc(table["accuracy"].to_list())
