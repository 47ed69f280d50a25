"""Reading runs: a run directory (:func:`read_run`), or loose dumps and a mapping (:func:`assemble_run`)."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from ..dumps import Dump, DumpError, read_dumps
from ._derived import _capture_stamps, _derived_record, _read_derived, _write_derived
from ._layout import _DEFAULTS, CapturesCutShort, RunError, _checked_manifest, load_manifest, remake_step
from ._model import Run


def read_whole_run(path: str | os.PathLike[str], *, cache: bool = True, **options: Any) -> Run:
    """:func:`analysis.run.read_run` without ``stream``: the run held whole, from ``derived/`` while it is current.

    Parameters
    ----------
    path : str or os.PathLike
        The run directory.
    cache : bool, default True
        Read and write the parsed tables in ``derived/``.
    **options : Any
        Passed to ``read_dumps``; any option turns the cache off for this read.

    Returns
    -------
    Run
    """
    path = Path(path)
    manifest = load_manifest(path)
    captures = path / "captures"
    if not captures.is_dir():
        raise RunError(f"{path}: no captures/ folder")
    cached = cache and not options
    record = _derived_record(path / "derived") if cached else None
    stamps = (
        _capture_stamps(captures, record) if cached else None
    )  # taken before parsing: a capture appended meanwhile makes the cache stale
    if (
        record is not None
        and stamps is not None
        and (dump := _read_derived(path / "derived", captures, record, stamps)) is not None
    ):
        return _said_cut(Run(manifest, dump, path))
    # A probe killed while appending a capture leaves its last line cut short: that request is left out
    # (Dump.skipped says so) and Run.missing lists it, so the run still opens, and a warning says so.
    run = _said_cut(Run(manifest, _without_repeated_lines(read_dumps(captures, torn_tail=True, **options)), path))
    if stamps is not None and os.access(path, os.W_OK):  # stamps are taken exactly when the cache is used
        with contextlib.suppress(
            OSError
        ):  # a full disk or a folder we may not write into: the run is read all the same
            _write_derived(run, stamps)
    return run


def _said_cut(run: Run) -> Run:
    """The run, once a CapturesCutShort warning has named each capture file of it that ends cut short (from the cache too:
    every read says it), with what writes that request again for the run's kind."""
    for note in run.dump.skipped:
        if note.problem.startswith("cut short"):
            warnings.warn(
                f"{note.source}: {note.record} is {note.problem.split('):')[0]}): its request is left out "
                f"and the run lacks it; to write it again: {remake_step(run.manifest, run.path)}",
                CapturesCutShort,
                stacklevel=3,
            )
    return run


_UNIT = (
    "prompt_id",
    "role",
    "c",
    "repeat",
    "slot",
    "envelope_arm",
)  # what names one request of a run's plan (with its control arm)


def _without_repeated_lines(dump: Dump) -> Dump:
    """The dump with each request counted once: a capture line that repeats an earlier one byte for byte (a copy appended
    twice), a line whose response id the same request of the plan already had (its response written again in another
    envelope), and a band's slot beyond its c are left out, each said in ``Dump.skipped``; two different responses for one
    request of the plan are a RunError naming both. (Two slots of a band with one response id are both kept: some servers
    give every response the same id, so an id shared across slots is no proof of a copy.)"""
    requests = (
        dump.requests
        if isinstance(dump.requests, pl.DataFrame)
        else pl.from_pandas(dump.requests[["source", "record", "raw_sha256", "extra", "request_id", *_UNIT[:-1]]])
    )
    keyed = requests.filter(pl.col("role").is_in(["reference", "band", "observer", "prefill"])).with_columns(
        pl.col("repeat").fill_null(0), envelope_arm=pl.col("extra").str.json_path_match("$.arm").fill_null("")
    )
    dropped, notes = [], list(dump.skipped)
    beyond = keyed.filter((pl.col("role") == "band") & (pl.col("slot") >= pl.col("c"))).sort("source", "record")
    for source, record, prompt, c, repeat, slot in beyond.select(
        "source", "record", "prompt_id", "c", "repeat", "slot"
    ).rows():
        dropped.append((source, record))
        notes.append(
            DumpError(
                source,
                f"line {record}",
                "slot",
                f"{prompt} c={c} repeat {repeat}: slot {slot} is beyond its band's c: refused",
            )
        )
    keyed = keyed.join(beyond.select("source", "record"), on=["source", "record"], how="anti")
    repeated = keyed.filter(pl.len().over(_UNIT) > 1).sort("source", "record")
    for _, group in repeated.group_by(_UNIT, maintain_order=True):
        first, *others = group.select("source", "record", "raw_sha256", "role", "slot", "request_id").rows()
        for source, record, digest, role, slot, response in others:
            if digest != first[2] and response is not None and response == first[5]:  # one response, written twice
                dropped.append((source, record))
                notes.append(
                    DumpError(
                        source,
                        f"line {record}",
                        "id",
                        f"response {response!r} was already read at line {first[1]}: read once",
                    )
                )
                continue
            if digest != first[2]:
                raise RunError(
                    f"{source}: line {record}: {role} slot {slot} was already recorded at {first[0]} line {first[1]}, "
                    "with different content; one request of the plan has one capture line"
                )
            dropped.append((source, record))
            notes.append(
                DumpError(source, f"line {record}", None, f"the same capture line as line {first[1]}: read once")
            )
    keyed = keyed.join(
        pl.DataFrame(dropped, schema={"source": pl.String, "record": pl.Int64}, orient="row"),
        on=["source", "record"],
        how="anti",
    )
    if not dropped:
        return dump
    tokens, candidates, requests = (
        _drop_records(frame, dropped) for frame in (dump.tokens, dump.candidates, dump.requests)
    )
    return Dump(tokens, candidates, requests, dump.formats, notes)


def _drop_records(frame, records: list[tuple[str, int]]):
    """A polars or pandas frame without the rows of these (source, record) pairs."""
    if isinstance(frame, pl.DataFrame):
        return frame.join(
            pl.DataFrame(records, schema={"source": pl.String, "record": pl.Int64}, orient="row"),
            on=["source", "record"],
            how="anti",
        )
    gone = set(records)
    keep = [pair not in gone for pair in zip(frame["source"], frame["record"])]
    return frame[keep].reset_index(drop=True)


def assemble_run(
    mapping: Iterable[Mapping[str, Any]], manifest: Mapping[str, Any] | None = None, **options: Any
) -> Run:
    """Build a run from loose dump files and a mapping of which file is which.

    Each mapping entry: ``{"source": path, "prompt_id": ..., "role": "reference" | "band",
    "c": c, "slot": i, "repeat": r}``; each source must hold one request.

    Parameters
    ----------
    mapping : iterable of Mapping of str to Any
        One entry per dump file, as above (``read_mapping`` reads them from a file).
    manifest : Mapping of str to Any, optional
        Manifest fields over the defaults and the plan the mapping implies (its prompts, ladder and
        repeats), e.g. ``{"sampler": {"max_tokens": N}}``; ``complete`` is worked out when not given.
    **options : Any
        Passed to ``read_dumps``.

    Returns
    -------
    Run
        A run without a directory (``path`` None).

    Raises
    ------
    RunError
        An entry without a source or with another role, a file mapped twice, or a file that does not hold
        exactly one request.

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
    columns = ("prompt_id", "role", "c", "slot", "repeat")
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
        *(pl.Series(c, updates[c], dtype=pl.Int64) for c in ("c", "slot", "repeat")),
    )
    full = _checked_manifest({**_DEFAULTS, **_mapped_plan(entries), **(manifest or {})}, "manifest")
    run = Run(full, Dump(dump.tokens, dump.candidates, requests, dump.formats, dump.skipped), None)
    if "complete" not in (manifest or {}):  # complete when the plan the mapping implies has nothing missing
        full["complete"] = not run.missing()
    return run


def _mapped_plan(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The plan a mapping implies, for a manifest that gives none: its prompts, and a ladder of the c its bands name.

    Examples
    --------
    >>> _mapped_plan([{"prompt_id": "p", "role": "band", "c": 4}, {"prompt_id": "p", "role": "reference"}])
    {'ladder': [4], 'prompts': [{'prompt_id': 'p'}]}
    """
    prompts = sorted({str(e["prompt_id"]) for e in entries if e.get("prompt_id") is not None})
    ladder = sorted({int(e["c"]) for e in entries if e.get("role") == "band" and e.get("c") is not None})
    return {"ladder": ladder, "prompts": [{"prompt_id": p} for p in prompts]}
