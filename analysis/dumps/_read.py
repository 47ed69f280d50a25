"""``read_dump`` and ``read_dumps``: detect a dump's format, parse it into the one schema."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..core import check_backend, to_backend
from ..core import progress as show_progress
from ..io import expand_sources, local_path
from . import _json
from ._fastkit import _REFUSALS
from ._kit import Meta
from ._schema import SCHEMAS, Rows
from ._values import DumpError
from .formats import (
    DUMP_SUFFIXES,
    FORMATS,
    detect_format,
    is_capture_jsonl,
    iter_capture_jsonl,
    parse_jsonl,
    parse_payload_text,
    parse_torch,
    read_jsonl,
    utf8_text,
)

# --- parsing a source -------------------------------------------------------------------------


def parse_source(
    raw: bytes, source: str, fmt: str = "auto", *, lenient: bool = False, torch_options: dict | None = None
) -> tuple[Rows, set[str]]:
    """Parse one source's bytes; returns its rows and the formats found in it.

    Parameters
    ----------
    raw : bytes
        The source's whole content.
    source : str
        Its name (path or URL), for error messages and the ``source`` column.
    fmt : str, default "auto"
        "auto" (detect it) or one of ``FORMATS``.
    lenient : bool, default False
        Skip bad records (listed in the rows' ``skipped``) instead of failing.
    torch_options : dict, optional
        For a torch dump: ``top_k``, ``prompt_length``, ``eos_token_id``.

    Returns
    -------
    tuple of (Rows, set of str)
    """
    if fmt not in ("auto", *FORMATS):
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {fmt!r}")
    detected = detect_format(raw, source) if fmt == "auto" else fmt
    rows = Rows(source, detected)
    formats = {detected}
    if detected == "torch":
        parse_torch(raw, rows, **(torch_options or {}))
        return rows, formats
    text = utf8_text(raw, source)
    if detected == "jsonl":
        formats.clear()
        parse_jsonl(text, rows, fmt, lenient, formats)
        return rows, formats or {"jsonl"}
    meta = Meta(raw_sha256=hashlib.sha256(raw).hexdigest())
    parse_payload_text(text, detected, rows, meta, lenient)
    return rows, formats


# --- the public object --------------------------------------------------------------------------


@dataclass(frozen=True)
class Dump:
    """Per-token logprob dumps in one schema.

    Attributes
    ----------
    tokens : frame
        One row per scored position (key: source, record, choice_index, segment, position).
    candidates : frame
        One row per delivered candidate (the token key plus list_kind, list_index).
    requests : frame
        One row per request and choice.
    formats : dict
        The format detected (or given) for each source.
    skipped : list of DumpError
        What lenient mode skipped, each with its source, record and reason; empty otherwise.
    """

    tokens: Any
    candidates: Any
    requests: Any
    formats: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[DumpError] = field(default_factory=list)
    backend: str = "polars"

    def __repr__(self) -> str:
        return (
            f"Dump({len(self.tokens)} tokens, {len(self.candidates)} candidates, {len(self.requests)} requests "
            f"from {len(self.formats)} source(s); skipped {len(self.skipped)}; backend={self.backend!r})"
        )

    def write_parquet(self, folder: str | os.PathLike[str]) -> Path:
        """Write the three tables as Parquet (plus a manifest), so the dump is parsed only once.

        Parameters
        ----------
        folder : str or path
            The folder to write ``tokens.parquet``, ``candidates.parquet``, ``requests.parquet`` and
            ``manifest.json`` in; created when missing, files already there overwritten.

        Returns
        -------
        pathlib.Path
            ``folder``.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("tokens", "candidates", "requests"):
            frame = getattr(self, name)
            frame = frame if isinstance(frame, pl.DataFrame) else pl.from_pandas(frame, schema_overrides=SCHEMAS[name])
            frame.write_parquet(folder / f"{name}.parquet")
        manifest = {"formats": self.formats, "skipped": [str(e) for e in self.skipped], "schema_version": 1}
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        return folder


@dataclass(frozen=True)
class ScannedDump:
    """A dump written by :meth:`Dump.write_parquet`, as lazy frames (nothing read until collected)."""

    tokens: pl.LazyFrame
    candidates: pl.LazyFrame
    requests: pl.LazyFrame
    formats: dict[str, list[str]]


def scan_dump(folder: str | os.PathLike[str]) -> ScannedDump:
    """Lazily open a dump folder written by :meth:`Dump.write_parquet`.

    Parameters
    ----------
    folder : str or path
        A folder holding the three Parquet tables and ``manifest.json``.

    Returns
    -------
    ScannedDump
    """
    folder = Path(folder)
    manifest = folder / "manifest.json"
    if not manifest.exists():
        raise FileNotFoundError(f"{folder}: no manifest.json; write one with Dump.write_parquet")
    formats = json.loads(manifest.read_text(encoding="utf-8"))["formats"]
    tokens, candidates, requests = (
        pl.scan_parquet(folder / f"{name}.parquet") for name in ("tokens", "candidates", "requests")
    )
    return ScannedDump(tokens, candidates, requests, formats=formats)


def _fast_jsonl(
    path: Path, source: str, fmt: str, limit: int | None = None
) -> tuple[tuple[pl.DataFrame, ...], set[str]] | None:
    """The columnar path (frames and formats found), when the file is JSON lines of chat completions, bare or in
    capture envelopes; ``limit`` reads only the file's first bytes (a torn tail left out). None: take the general path."""
    return read_jsonl(path, source, fmt, limit)


def read_dumps(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    format: str = "auto",
    backend: str = "polars",
    lenient: bool = False,
    progress: bool | None = None,
    timeout: float | None = None,
    max_bytes: int | None = None,
    torch_options: dict | None = None,
    torn_tail: bool = False,
) -> Dump:
    """Read logprob dumps from files, folders, glob patterns or http(s) URLs into one schema.

    Parameters
    ----------
    sources : path, URL, or an iterable of them
        A folder contributes its ``.json``, ``.jsonl``, ``.ndjson``, ``.sse``, ``.pt`` files.
    format : str
        "auto" (detect, and say what was detected in ``Dump.formats``) or one of ``FORMATS``.
    backend : {"polars", "pandas"}
    lenient : bool
        Skip bad records (JSONL lines, broken stream events) instead of failing; every skip is
        reported in ``Dump.skipped``.
    progress : bool, optional
        A progress bar over sources; by default only in a terminal.
    timeout, max_bytes : optional
        Limits for URL downloads.
    torch_options : dict, optional
        For ``.pt`` files: ``top_k``, ``prompt_length``, ``eos_token_id``.
    torn_tail : bool
        A JSON-lines file being appended to when its writer was killed can end in a cut line: no
        newline, not JSON. With ``torn_tail`` that line is left out and listed in ``Dump.skipped``
        (``read_run`` uses it); otherwise it is an error like any other.

    Returns
    -------
    Dump

    Examples
    --------
    >>> d = read_dumps("tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json")
    >>> d.tokens.select("position", "token_id", "value_status").head(2).rows()
    [(0, 9707, 'ok'), (1, 0, 'ok')]
    >>> d.formats
    {'tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json': ['openai_chat']}
    """
    check_backend(backend)
    fetch = {k: v for k, v in {"timeout": timeout, "max_bytes": max_bytes}.items() if v is not None}
    tables: dict[str, list[pl.DataFrame]] = {"tokens": [], "candidates": [], "requests": []}
    formats, skipped = {}, []
    if format not in ("auto", *FORMATS):
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    failed: list[DumpError] = []
    for source in show_progress(expand_sources(sources, suffix=DUMP_SUFFIXES), progress, "reading dumps"):
        path = local_path(source, **fetch)
        try:
            if not torn_tail and path.suffix in (".jsonl", ".ndjson") and _blank(path):
                raise DumpError(
                    source,
                    "$",
                    None,
                    "an empty file: no JSON line (a run's capture file may be empty before its first "
                    "response: read_run reads those)",
                )
            keep, torn = _torn_tail(path, source) if torn_tail else (None, None)
            fast = _fast_jsonl(path, source, format, keep)
            if fast is not None:
                parts, found = fast
                if torn is not None:
                    skipped.append(torn)
            else:
                raw = path.read_bytes()
                rows, found = parse_source(
                    raw if keep is None else raw[:keep], source, format, lenient=lenient, torch_options=torch_options
                )
                if torn is not None:
                    rows.skipped.append(torn)
                skipped.extend(rows.skipped)
                parts = rows.frames()
        except (
            DumpError
        ) as exc:  # every source is tried, so one error names all that cannot be read, not only the first
            failed.append(exc)
            continue
        formats[source] = sorted(found)
        for name, frame in zip(tables, parts):
            tables[name].append(frame)
    if failed:
        raise _all_failures(failed)
    frames = {
        name: pl.concat(parts, how="vertical") if parts else pl.DataFrame(schema=SCHEMAS[name])
        for name, parts in tables.items()
    }
    return Dump(
        **{n: to_backend(f, backend) for n, f in frames.items()}, formats=formats, skipped=skipped, backend=backend
    )


class StreamRefused(Exception):
    """A file :func:`iter_dump_parts` began in pieces turned out to need the general path, which reads it whole."""


def iter_dump_parts(
    path: str | os.PathLike[str], source: str | None = None
) -> Iterator[tuple[tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame], list[str], list[DumpError]]]:
    """One dump file's tokens, candidates and requests a piece at a time, as :func:`read_dumps` reads them with
    ``torn_tail``: a file of capture envelopes a chunk at a time, so that memory holds a piece and not the file; any
    other file in one piece. Each piece comes with the formats found in it and what was left out.

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    source : str, optional
        Its name in the ``source`` column (the path as given by default).

    Yields
    ------
    tuple
        ``(tokens, candidates, requests)``, the formats, and the lines left out (a cut last line).

    Raises
    ------
    DumpError
        A file or line no reader takes.
    StreamRefused
        After some pieces, a line only the general path reads: read the file whole (:func:`read_dumps`).

    Examples
    --------
    >>> parts = list(iter_dump_parts("data/experiment-cpu/default/captures/requests.jsonl"))
    >>> sum(frames[2].height for frames, _, _ in parts), parts[0][1]
    (62, ['openai_chat_sse'])
    """
    path = Path(path)
    source = os.fspath(path) if source is None else source
    keep, torn = _torn_tail(path, source)
    if is_capture_jsonl(path):
        try:
            pieces = iter_capture_jsonl(path, source, keep)
            first = next(pieces, None)  # a refusal (the general path's file) shows on the first piece, or not at all
        except _REFUSALS:
            first, pieces = None, None
        if pieces is not None:
            for frames, found in [first] if first is not None else []:
                yield frames, [found], []
            try:
                for frames, found in pieces:
                    yield frames, [found], []
            except _REFUSALS as exc:  # read_dumps would read the whole file by the general path: the caller does
                raise StreamRefused(f"{source}: the columnar reader left it to the general path ({exc})") from exc
            if torn is not None:
                empty = [pl.DataFrame(schema=SCHEMAS[n]) for n in ("tokens", "candidates", "requests")]
                yield (empty[0], empty[1], empty[2]), [], [torn]
            return
    dump = read_dumps(path, torn_tail=True)
    yield (
        (dump.tokens, dump.candidates, dump.requests),
        sorted({f for fs in dump.formats.values() for f in fs}),
        list(dump.skipped),
    )


def _blank(path: Path) -> bool:
    """Whether a file holds nothing but whitespace (read a block at a time: a real dump's first block has content)."""
    with path.open("rb") as handle:
        while block := handle.read(1 << 16):
            if block.strip():
                return False
    return True


def _all_failures(failed: list[DumpError]) -> DumpError:
    """The first source's error, naming every other source that could not be read either (each with its own reason).

    Examples
    --------
    >>> str(_all_failures([DumpError("a.json", "$", None, "an empty file"), DumpError("b.json", "line 2", "x", "bad")]))
    'a.json: $: an empty file; 1 more source could not be read: b.json: line 2.x: bad'
    """
    first, *others = failed
    if not others:
        return first
    shown = "; ".join(str(e) for e in others[:10]) + (f"; and {len(others) - 10} more" if len(others) > 10 else "")
    more = f"{len(others)} more source{'s' if len(others) > 1 else ''} could not be read"
    error = DumpError(first.source, first.record, first.field, f"{first.problem}; {more}: {shown}")
    error.others = others
    return error


def _torn_tail(path: Path, source: str) -> tuple[int | None, DumpError | None]:
    """How many leading bytes of a JSON-lines file to keep when its last line was cut, and the error that lists
    the cut; (None, None) when whole. Only the file's tail is read (and, for a cut, its newlines counted)."""
    if path.suffix not in (".jsonl", ".ndjson"):
        return None, None
    size = path.stat().st_size
    if not size:
        return None, None
    with path.open("rb") as handle:
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return None, None
        pieces, at, cut = [], size, 0
        while at > 0:
            step = min(1 << 20, at)
            at -= step
            handle.seek(at)
            piece = handle.read(step)
            newline = piece.rfind(b"\n")
            if newline != -1:
                pieces.append(piece[newline + 1 :])
                cut = at + newline + 1
                break
            pieces.append(piece)
        tail = b"".join(reversed(pieces))
        try:
            _json.loads_payload(tail)
            return None, None  # a whole last line that merely lacks its newline
        except (_json.NestingError, _json.DuplicateKeyError):
            return None, None  # whole too: reading it names what is wrong with it
        except ValueError:
            pass
        handle.seek(0)
        lines, left = 1, cut
        while left > 0:
            block = handle.read(min(1 << 24, left))
            lines += block.count(b"\n")
            left -= len(block)
    return cut, DumpError(
        source,
        f"line {lines}",
        None,
        f"cut short ({size - cut} bytes, no newline, not JSON): an append the writer did not finish; left out",
    )


def read_dump(source: str | os.PathLike[str], **options: Any) -> Dump:
    """Read one dump source (file, folder or URL); see :func:`read_dumps` for the options.

    Parameters
    ----------
    source : str or path
        A file, a folder or an http(s) URL.
    **options
        The keywords of :func:`read_dumps` (``format``, ``backend``, ``lenient``, ...).

    Returns
    -------
    Dump

    Examples
    --------
    >>> d = read_dump("tests/samples/sglang_generate_meta_info_logprobs__sglang-jax-pr13.partial.json")
    >>> d.tokens.group_by("segment").len().sort("segment").rows()
    [('completion', 6), ('prompt', 4)]
    """
    return read_dumps([source], **options)
