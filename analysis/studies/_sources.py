"""Which of the sources given a command reads: run directories, history folders, witness and marker files, logprob dumps;
and the files found in a folder that it does not read, each with why.

Every command that takes folders (``bia report``, ``witness``, ``certify``, ``history``, ``trend``) and
:func:`analysis.read_history` sort what they were given here, so that a stray file in a folder is skipped with the same
note by all of them, and a folder that holds nothing a command reads is the same error (:class:`NothingToRead`) in all,
never the embedded default read in its place. A file named on its own, or matched by a pattern, is read as what it looks
like, and its reader names what is wrong with it: only files found inside a folder are ever skipped.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

KINDS = {
    "history": "history folders",
    "run": "run directories",
    "witness": "witnesses and release markers",
    "dump": "logprob dumps",
}
_ONE = {
    "history": "a history folder",
    "run": "a run directory",
    "witness": "a witness or release marker",
    "dump": "a logprob dump",
    "broken": "not JSON bia parses",
}

# What each reader reads: a history (bia history, bia trend, read_history) its folders, runs, witnesses and markers
HISTORY_READS = frozenset({"history", "run", "witness"})


class SourceSkipped(UserWarning):
    """A file found in a folder that the reader does not read (a stray config, a dump where witnesses are read): skipped."""


class NothingToRead(FileNotFoundError):
    """A folder that holds nothing the command reads: the message names the folder, and what was found in it and skipped
    (the command's exit 3, as for a path that does not exist)."""


@dataclass
class Sources:
    """What a command was given, sorted by kind (each list in the order given, a folder's entries sorted), and the files
    found in its folders that it does not read, each as (file, why)."""

    histories: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    witnesses: list[str] = field(default_factory=list)
    dumps: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def is_run_dir(path: Path, *, strict: bool = False) -> bool:
    """A run directory: its manifest.json (and, ``strict``, for one found inside a folder, its captures/ too).

    Parameters
    ----------
    path : pathlib.Path
        A folder.
    strict : bool, default False
        Also require ``captures/``.

    Returns
    -------
    bool
    """
    return (path / "manifest.json").is_file() and (not strict or (path / "captures").is_dir())


def is_history(path: Path) -> bool:
    """A history folder (:func:`analysis.append_history`): its history.json.

    Parameters
    ----------
    path : pathlib.Path
        A folder.

    Returns
    -------
    bool
    """
    return (path / "history.json").is_file()


def run_directories(path: Path) -> list[Path]:
    """The run directory ``path`` is, or those inside the folder ``path`` (each with manifest.json and captures/), sorted.

    Parameters
    ----------
    path : pathlib.Path
        A run directory, or a folder.

    Returns
    -------
    list of pathlib.Path
    """
    if is_run_dir(path):
        return [path]
    found = {p.parent for p in path.rglob("manifest.json") if is_run_dir(p.parent, strict=True)}
    return sorted(run for run in found if not in_repro(run, path))


def in_repro(run: Path, root: Path) -> bool:
    """Whether ``run`` lies in a ``bia repro`` folder (a ``REPORT.md`` beside ``repro.py`` or ``shrink.json``) below
    ``root``: its minimal run and tries are the repro's, not runs of the study, so a scan of ``root`` leaves them out (a
    scan of the repro folder itself, or the run given by its path, reads them).

    Parameters
    ----------
    run : pathlib.Path
        A run directory found under ``root``.
    root : pathlib.Path
        The folder scanned.

    Returns
    -------
    bool

    Examples
    --------
    >>> in_repro(Path("runs/probe"), Path("runs"))
    False
    """
    for folder in run.parents:
        if folder == root or root not in folder.parents:
            return False
        if (folder / "REPORT.md").is_file() and ((folder / "repro.py").is_file() or (folder / "shrink.json").is_file()):
            return True
    return False


def looks_like_witness(file: str) -> bool:
    """Whether a file is a witness or a release marker (then read as one, its faults named as a witness's), not a dump.

    Parameters
    ----------
    file : str
        The file's path.

    Returns
    -------
    bool
        True as well for a file that cannot be read, so that the witness reader says why.
    """
    from ..core import loads_strict
    from ..dumps import DUMP_SUFFIXES
    from ..witness import MARKER_KEYS

    if file.endswith(tuple(s for s in DUMP_SUFFIXES if s != ".json")):
        return False
    try:
        raw = Path(file).read_bytes()
    except OSError:
        return True  # the witness reader says what is wrong with it
    try:
        data = loads_strict(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return b'"witness_version"' in raw or all(f'"{key}"'.encode() in raw for key in MARKER_KEYS)
    return isinstance(data, dict) and ("witness_version" in data or data.keys() >= MARKER_KEYS)


def dump_kind(file: Path, runs: list[Path]) -> tuple[str, str | None]:
    """What a file that is no witness is: ("dump", None) a dump; ("broken", None) one no reader can parse (not JSON, cut
    short, not UTF-8: the reader names where); ("other", why) sampler-trainer pairs, or JSON that matches no dump format.

    Parameters
    ----------
    file : pathlib.Path
        The file.
    runs : list of pathlib.Path
        The run directories found with it (pairs in ``RUN/../trainer/RUN.jsonl`` are theirs).

    Returns
    -------
    tuple of (str, str or None)
    """
    from ..core import loads_strict
    from ..dumps import DumpError, detect_format

    try:
        raw = file.read_bytes()
        first = next((line for line in raw.decode("utf-8").splitlines() if line.strip()), "")
    except (OSError, UnicodeDecodeError):
        return "broken", None
    try:
        head = loads_strict(first)
    except (ValueError, RecursionError):
        head = None  # not JSON lines: a document, or no JSON at all
    if isinstance(head, dict) and {"inference_logprobs", "trainer_logprobs"} <= head.keys():
        beside = [run for run in runs if file == run.parent / "trainer" / f"{run.name}.jsonl"]
        return "other", (
            ("sampler-trainer pairs of " + str(beside[0]) + ": the report's RL section reads them")
            if beside
            else ("sampler-trainer pairs, not a dump of a run: analysis.mismatch_summary reads them")
        )
    try:
        detect_format(raw, str(file))
    except DumpError as exc:
        if "matches no known dump format" in str(exc):
            if file.name == "manifest.json" and not (file.parent / "captures").is_dir():
                return "other", "a run's manifest.json without its captures/ folder: no run"
            return "other", "JSON that matches no dump format"
        return "broken", None
    return "dump", None


def sort_sources(
    given: Iterable[str | os.PathLike[str]], *, reads: Collection[str], reader: str = "bia report"
) -> Sources:
    """Sort the sources given a reader by kind: history folders, run directories, witness and marker sources, dumps.

    A folder contributes the run directories in it (manifest.json and captures/) and its files of a dump's suffix
    (``.json``, ``.jsonl``...) outside them, each as what it is; a file of a kind the reader does not read (or of none)
    is skipped, with why. A file no reader can parse goes to the reader's own reader, which names where it breaks: a
    damaged file is never skipped. A URL is a witness source (a dump for a reader of dumps alone); a file given by
    name, or matched by a pattern, is read as what it looks like.

    Parameters
    ----------
    given : iterable of str or os.PathLike
        Paths, folders, glob patterns and URLs, as given.
    reads : collection of str
        The kinds the reader reads, of ``KINDS``: "history", "run", "witness", "dump".
    reader : str, default "bia report"
        Its name, for the messages.

    Returns
    -------
    Sources

    Raises
    ------
    FileNotFoundError
        A path that does not exist, or a pattern that matches nothing.
    NothingToRead
        A folder that holds nothing the reader reads: the message names what it holds and why each was skipped.

    Examples
    --------
    >>> s = sort_sources(["data/aprender-lambda"], reads={"witness"}, reader="bia witness")
    >>> len(s.witnesses), s.skipped
    (5, [])
    """
    unknown = set(reads) - KINDS.keys()
    if unknown:
        raise ValueError(f"reads takes kinds of {sorted(KINDS)}, got {sorted(unknown)}")
    out = Sources()
    for source in given:
        _sort_one(os.fspath(source), set(reads), reader, out)
    return out


def _sort_one(source: str, reads: set[str], reader: str, out: Sources) -> None:
    from ..io import is_url

    path = Path(source)
    if is_url(source):  # fetched by the witness reader, or the dump reader where only dumps are read
        kind = next((k for k in ("witness", "dump") if k in reads), "run")
        {"run": out.runs, "witness": out.witnesses, "dump": out.dumps}[kind].append(source)
    elif glob.has_magic(source) and not path.exists():
        matches = sorted(glob.glob(source, recursive=True))
        if not matches:
            raise FileNotFoundError(f"{source}: pattern matches no file")
        for match in matches:
            _sort_one(match, reads, reader, out)
    elif not path.exists():
        raise FileNotFoundError(f"{source}: no such file or directory")
    elif path.is_dir() and "history" in reads and is_history(path):
        out.histories.append(source)
    elif path.is_dir() and "run" in reads and is_study(path):  # a dataset write_dataset wrote: its runs, streamed
        out.runs.append(source)
    elif path.is_dir() and is_run_dir(path):
        out.runs.append(source)  # read as a run, whose reader names what it lacks (captures/)
    elif path.is_dir():
        _sort_folder(path, source, reads, reader, out)
    else:  # a file asked for by name is read: as what it looks like, else by the reader's own reader, which says why not
        kind = "witness" if looks_like_witness(source) else "dump"
        kind = kind if kind in reads else next(k for k in ("dump", "witness", "run") if k in reads)
        {"run": out.runs, "witness": out.witnesses, "dump": out.dumps}[kind].append(source)


def _sort_folder(folder: Path, source: str, reads: set[str], reader: str, out: Sources) -> None:
    """A folder's runs and files, as the reader reads or skips them; NothingToRead when it reads none."""
    from ..dumps import DUMP_SUFFIXES

    inner = run_directories(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not any(p.is_relative_to(r) for r in inner))
    candidates = [p for p in files if p.name.endswith(DUMP_SUFFIXES)]
    found: list[tuple[str, str]] = []  # (kind, path) of what the reader reads
    skipped: list[tuple[str, str]] = []
    for run in inner:
        if "run" in reads:
            found.append(("run", str(run)))
        else:
            skipped.append((str(run), _not_read("run", reads, reader)))
    for file in candidates:
        if looks_like_witness(str(file)):
            kind, why = "witness", None
        else:
            kind, why = dump_kind(file, inner)
        if kind == "broken":  # damaged: the reader's own reader says where, rather than a skip that hides it
            kind = next((k for k in ("dump", "witness") if k in reads), kind)
        if kind in reads:
            found.append((kind, str(file)))
        elif kind == "other":
            skipped.append((str(file), f"not a witness, marker, dump or run: {why}"))
        else:
            skipped.append((str(file), _not_read(kind, reads, reader)))
    if not found:
        raise NothingToRead(_nothing(source, reads, reader, skipped, [p for p in files if p not in candidates]))
    for kind, where in found:
        {"run": out.runs, "witness": out.witnesses, "dump": out.dumps, "history": out.histories}[kind].append(where)
    out.skipped += skipped


def _not_read(kind: str, reads: set[str], reader: str) -> str:
    return f"{_ONE[kind]}; {reader} reads {_words(reads)}"


def _words(reads: set[str]) -> str:
    return ", ".join(KINDS[k] for k in KINDS if k in reads)


def _nothing(source: str, reads: set[str], reader: str, skipped: list[tuple[str, str]], others: list[Path]) -> str:
    """The message of a folder that holds nothing the reader reads: what it reads, and what the folder holds instead.

    Examples
    --------
    >>> _nothing("one", {"run"}, "bia certify", [("one/x.json", "why")], [Path("one/a.txt")])
    'one: nothing bia certify reads (run directories): skipped one/x.json (why); and 1 file of another suffix: one/a.txt'
    >>> _nothing("empty", {"witness"}, "bia witness", [], [])
    'empty: nothing bia witness reads (witnesses and release markers): the folder holds no file'
    """
    from ..dumps import DUMP_SUFFIXES

    what = _words(reads)
    parts = []
    if skipped:
        shown = "; ".join(f"{file} ({why})" for file, why in skipped[:3])
        parts.append(f"skipped {shown}" + (f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""))
    if others:
        names = ", ".join(str(p) for p in others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        parts.append(f"{len(others)} file{'s' if len(others) > 1 else ''} of another suffix: {names}")
    if not parts:
        return f"{source}: nothing {reader} reads ({what}): the folder holds no file"
    if not skipped:
        parts[0] = f"no run directory and no {', '.join('*' + s for s in DUMP_SUFFIXES)} file; {parts[0]}"
    return f"{source}: nothing {reader} reads ({what}): " + "; and ".join(parts)


def is_study(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder :func:`write_dataset` wrote (it holds ``runs.parquet``).

    Parameters
    ----------
    path : str or os.PathLike
        A path.

    Returns
    -------
    bool

    Examples
    --------
    >>> is_study("data/experiment-cpu/default")
    False
    """
    return Path(path).is_dir() and (Path(path) / "runs.parquet").is_file()
