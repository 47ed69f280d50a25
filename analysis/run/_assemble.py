"""A run from loose dumps: each request placed (prompt, role, band, slot, repeat) by its capture envelope,
by a mapping file saying which file is which, or as one band per file; what cannot be placed is refused,
naming the file and the field it lacks."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from ..core import not_json
from ..dumps import DUMP_SUFFIXES, Dump, read_dumps
from ..io import expand_sources, is_url
from ._layout import _DEFAULTS, RunError, _checked_manifest
from ._model import Run

PLACEMENT = ("prompt_id", "role", "c", "slot", "repeat")
ROLES = ("reference", "band", "observer", "filler")
LONE_PROMPT = "p0"  # the prompt of requests whose envelope names none, when bia places them itself
_HOW = (
    "say which file is which with a mapping (bia assemble --mapping FILE, a JSON or CSV file of source, prompt_id, role, "
    "c, slot, repeat), or take each file as one band of the requests it holds (--band-per-file)"
)


def assemble_dumps(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
    *,
    mapping: str | os.PathLike[str] | Iterable[Mapping[str, Any]] | None = None,
    band_per_file: bool = False,
    manifest: Mapping[str, Any] | None = None,
    **options: Any,
) -> Run:
    """Build a run from loose dump files, folders and globs, each request placed in the run's plan.

    A request's place (``prompt_id``, ``role``, ``c``, ``slot``, ``repeat``) comes from, first to last:

    - ``mapping``: a JSON or CSV file (or a list of dicts) of ``source`` and those fields, each
      mapped source holding one request; a relative source is read from the mapping file's folder;
    - ``band_per_file``: each file is one band of the requests it holds (``c`` their count, slots
      in file order, repeats in the order the files come), of its envelope's prompt or else ``p0``;
      a file holding one request is an m=1 reference (the first ref #1, the next ref #2);
    - the capture envelope each request came in (``bia probe`` writes one);
    - a lone request whose envelope says nothing is ref #1 of prompt ``p0``: it reads, and allows
      no batch comparison.

    Parameters
    ----------
    sources : path, glob or folder, or an iterable of them
        The dumps (a folder contributes its dump files).
    mapping : path or iterable of dicts, optional
        Which file is which.
    band_per_file : bool
        Take each unmapped file as one band.
    manifest : mapping, optional
        Fields for the run's manifest (identity, sampler, ...); its ladder is the bands' c by default.
    **options
        For :func:`analysis.read_dumps` (``lenient``, ``format``, ...).

    Returns
    -------
    Run
        Not yet on disk: :func:`analysis.write_run` writes it.

    Raises
    ------
    RunError
        A request that cannot be placed (the file, its line, and the field it lacks), two requests
        in one place, or bands with no m=1 reference.

    Examples
    --------
    >>> run = assemble_dumps("tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json")
    >>> run.dump.requests.select("prompt_id", "role", "slot").row(0), run.ladder
    (('p0', 'reference', 0), [])
    """
    if options.get("backend", "polars") != "polars":
        raise RunError("a run is assembled from polars frames; read it with backend='polars'")
    entries = read_mapping(mapping) if isinstance(mapping, (str, os.PathLike)) else [dict(e) for e in mapping or []]
    files = expand_sources(sources, suffix=DUMP_SUFFIXES) if _given(sources) else []
    known = {_real(f) for f in files}
    files += [str(e["source"]) for e in entries if "source" in e and _real(str(e["source"])) not in known]
    if not files:
        raise RunError("no dump to assemble: give dump files, folders or globs, or a mapping")
    dump = read_dumps(files, **options)
    placed = _placements(dump.requests, entries, band_per_file)
    _check(placed)
    requests = (
        dump.requests.drop(PLACEMENT)
        .join(placed.select("source", "record", *PLACEMENT), on=["source", "record"], how="left", maintain_order="left")
        .select(dump.requests.columns)
    )
    ladder = sorted(set(placed.filter(pl.col("role") == "band")["c"].drop_nulls().to_list()))
    full = _checked_manifest(
        {**_DEFAULTS, "ladder": ladder, "assembled_by": "bia assemble", **(manifest or {})}, "manifest"
    )
    return Run(full, Dump(dump.tokens, dump.candidates, requests, dump.formats, dump.skipped), None)


def _given(sources: Any) -> bool:
    return isinstance(sources, (str, os.PathLike)) or bool(list(sources))


def _real(source: str) -> str:
    return source if is_url(source) else os.path.realpath(source)


def _placements(requests: pl.DataFrame, entries: list[dict[str, Any]], band_per_file: bool) -> pl.DataFrame:
    """One row per (source, record): its place in the run and where that came from (``placed_by``)."""
    records = requests.unique(["source", "record"], keep="first", maintain_order=True).select(
        "source", "record", *PLACEMENT
    )
    by_source = {_real(str(e["source"])): e for e in entries if "source" in e}
    counts = records.group_by("source", maintain_order=True).len()
    sizes = dict(counts.iter_rows())
    rows: list[dict[str, Any]] = []
    refs: dict[str, list[str]] = {}
    repeats: dict[tuple[str, int], list[str]] = {}
    slots: dict[str, int] = {}
    for row in records.iter_rows(named=True):
        entry = by_source.get(_real(row["source"]))
        if entry is not None:
            if sizes[row["source"]] != 1:
                raise RunError(
                    f"{row['source']}: a mapped file must hold exactly one request, it holds {sizes[row['source']]}"
                )
            rows.append({**row, **{k: entry.get(k) for k in PLACEMENT}, "placed_by": "mapping"})
        elif band_per_file:
            prompt = row["prompt_id"] if row["prompt_id"] is not None else LONE_PROMPT
            c = sizes[row["source"]]
            if c == 1:
                slot = refs.setdefault(prompt, [])
                if row["source"] not in slot:
                    slot.append(row["source"])
                if len(slot) > 2:
                    raise RunError(
                        f"{row['source']}: a third file of one request for prompt {prompt!r}: with one band per file, a file of "
                        f"one request is an m=1 reference, and a prompt has two ({slot[0]}, {slot[1]})"
                    )
                rows.append(
                    {
                        **row,
                        "prompt_id": prompt,
                        "role": "reference",
                        "c": None,
                        "slot": slot.index(row["source"]),
                        "repeat": None,
                        "placed_by": "band per file",
                    }
                )
            else:
                seen = repeats.setdefault((prompt, c), [])
                if row["source"] not in seen:
                    seen.append(row["source"])
                slots[row["source"]] = band_slot = slots.get(row["source"], -1) + 1
                rows.append(
                    {
                        **row,
                        "prompt_id": prompt,
                        "role": "band",
                        "c": c,
                        "slot": band_slot,
                        "repeat": seen.index(row["source"]),
                        "placed_by": "band per file",
                    }
                )
        else:
            rows.append({**row, "placed_by": "envelope"})
    if len(rows) == 1 and rows[0]["placed_by"] == "envelope" and all(rows[0][k] is None for k in ("role", "c", "slot")):
        rows[0].update(
            prompt_id=rows[0]["prompt_id"] or LONE_PROMPT, role="reference", slot=0, placed_by="lone request"
        )
    schema = {
        "source": pl.String,
        "record": pl.Int64,
        "prompt_id": pl.String,
        "role": pl.String,
        "c": pl.Int64,
        "slot": pl.Int64,
        "repeat": pl.Int64,
        "placed_by": pl.String,
    }
    for row in rows:
        row["prompt_id"] = None if row["prompt_id"] is None else str(row["prompt_id"])
    return pl.DataFrame(rows, schema=schema, orient="row")


def _where(row: Mapping[str, Any]) -> str:
    return row["source"] if not row["record"] else f"{row['source']}: line {row['record']}"


def _check(placed: pl.DataFrame) -> None:
    """Every request has a whole place, no two share one, and every prompt with bands has ref #1."""
    for row in placed.iter_rows(named=True):
        where, said = (
            _where(row),
            {"mapping": "its mapping entry", "envelope": "its capture envelope"}.get(row["placed_by"], "bia"),
        )
        role = row["role"]
        if role is None:
            raise RunError(
                f'{where}: field "role" missing: {said} does not say whether this request is an m=1 reference or part of a band '
                f"of c, so bia cannot place it in a run; {_HOW}"
            )
        if role not in ROLES:
            raise RunError(f'{where}: field "role": expected one of {", ".join(ROLES)}, got {role!r}')
        needed = ("prompt_id", "slot") if role == "reference" else ("prompt_id", "c", "slot")
        for name in needed:
            if row[name] is None:
                raise RunError(
                    f'{where}: field "{name}" missing: {said} names the role {role!r} but not the {name}, so bia cannot place '
                    f"this request in a run; {_HOW}"
                )
        for name, low in (("c", 1), ("slot", 0), ("repeat", 0)):
            if row[name] is not None and row[name] < low:
                raise RunError(f'{where}: field "{name}": expected an integer >= {low}, got {row[name]}')
        if role == "reference" and row["slot"] > 1:
            raise RunError(f'{where}: field "slot": a reference is slot 0 (ref #1) or 1 (ref #2), got {row["slot"]}')
        if role == "band" and row["slot"] >= row["c"]:
            raise RunError(
                f'{where}: field "slot": a band of c={row["c"]} has slots 0 to {row["c"] - 1}, got {row["slot"]}'
            )
    keyed = placed.with_columns(pl.col("repeat").fill_null(0))
    twice = keyed.filter(pl.len().over(PLACEMENT) > 1)
    if twice.height:
        first, second = twice.sort(PLACEMENT, maintain_order=True).head(2).iter_rows(named=True)
        band = f" of the band c={first['c']}, repeat {first['repeat']}" if first["c"] is not None else ""
        raise RunError(
            f"{_where(second)}: {first['role']} slot {first['slot']}{band} of prompt {first['prompt_id']!r} is already "
            f"taken by {_where(first)}; one place in a run holds one request"
        )
    referenced = set(placed.filter((pl.col("role") == "reference") & (pl.col("slot") == 0))["prompt_id"].to_list())
    for row in placed.filter(pl.col("role") != "reference").iter_rows(named=True):
        if row["prompt_id"] not in referenced:
            raise RunError(
                f'{_where(row)}: prompt {row["prompt_id"]!r} has bands but no m=1 reference (role "reference", slot 0) '
                "among the dumps, and a batched request is judged against it; add the request sent alone"
            )


def read_mapping(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of a mapping file: a JSON list of objects (or an object of source -> fields), or a CSV file
    with a header row; each entry has a ``source`` (relative to the mapping file's folder) and its place.

    Parameters
    ----------
    path : str or os.PathLike
        The mapping file; ``.csv`` is read as CSV, anything else as JSON.

    Returns
    -------
    list of dict
        One entry per file: ``source`` (made relative to the mapping's folder unless absolute or a URL),
        ``prompt_id`` as a string, and ``c``, ``slot`` and ``repeat`` as integers or None (a legacy ``band_c`` is read as
        ``c``).

    Raises
    ------
    FileNotFoundError
        No such file.
    RunError
        The file cannot be read, is neither form, names no file, or an entry lacks a ``source`` or has a
        non-integer ``c``, ``slot`` or ``repeat``.

    Examples
    --------
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "map.csv").write_text("source,prompt_id,role,c,slot\\nalone.json,p0,reference,,0\\nc4.jsonl,p0,band,4,0\\n")
    >>> [(Path(e["source"]).name, e["role"], e["c"]) for e in read_mapping(folder / "map.csv")]
    [('alone.json', 'reference', None), ('c4.jsonl', 'band', 4)]
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such mapping file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(f"{path}: cannot read the mapping ({exc})") from None
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        if not rows or "source" not in rows[0]:
            raise RunError(
                f"{path}: a mapping CSV has a header row naming source, prompt_id, role, c, slot, repeat, and a row per file"
            )
        entries = [
            (
                {k.strip(): (v.strip() or None if isinstance(v, str) else v) for k, v in row.items() if k is not None},
                f"row {n}",
            )
            for n, row in enumerate(rows, start=2)
        ]
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise RunError(f"{path}: {not_json(exc)}; a mapping is a JSON list of objects or a CSV file") from None
        if isinstance(data, dict):
            data = [
                {"source": source, **fields} if isinstance(fields, dict) else fields for source, fields in data.items()
            ]
        if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
            raise RunError(f"{path}: a mapping is a JSON list of objects, one per file, or an object of file -> fields")
        entries = [(dict(e), f"[{n}]") for n, e in enumerate(data)]
    out = []
    for entry, where in entries:
        if "band_c" in entry and "c" not in entry:  # legacy: mappings written for run_version 1 named c band_c
            entry["c"] = entry.pop("band_c")  # legacy key
        source = entry.get("source")
        if not source or not isinstance(source, str):
            raise RunError(f'{path}: {where}: field "source": expected the dump file\'s path')
        for name in ("c", "slot", "repeat"):
            value = entry.get(name)
            if isinstance(value, str):
                try:
                    value = int(value)
                except ValueError:
                    raise RunError(f'{path}: {where}: field "{name}": expected an integer, got {value!r}') from None
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise RunError(f'{path}: {where}: field "{name}": expected an integer, got {value!r}')
            entry[name] = value
        if entry.get("prompt_id") is not None:
            entry["prompt_id"] = str(entry["prompt_id"])
        if not is_url(source) and not Path(source).is_absolute():
            entry["source"] = str(path.parent / source)
        out.append(entry)
    if not out:
        raise RunError(f"{path}: the mapping names no file")
    return out
