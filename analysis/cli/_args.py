"""What the ``bia`` commands share: the one-line error and its exit code, and the parsing of options and text files."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import typer

from ..core import OutputExists, not_json
from ..verdicts import EXIT_MISSING, PolicyError, V3Policy

EXIT_UNREACHABLE = (
    6  # a URL that could not be fetched, a server nothing answers at (docs/cli.md); 3 is a path that does not exist
)


def _go_offline(offline: bool) -> None:
    """--offline: every URL read in this process, and in the report's kernel, comes from the cache."""
    if offline:
        os.environ["BIA_OFFLINE"] = "1"


@contextlib.contextmanager
def _quiet_after_interrupt() -> Iterator[None]:
    """While a report notebook runs: a Ctrl-C ends the command with its one line and nothing more. Stopping the kernel
    mid-cell makes nbclient log that the kernel died and asyncio log a traceback of a task whose exception was never
    retrieved, so logging is turned off from the Ctrl-C on; the command is ending."""
    if threading.current_thread() is not threading.main_thread():  # a signal handler is the main thread's alone
        yield
        return

    def interrupted(signum: int, frame: object) -> None:
        logging.disable(logging.CRITICAL)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _policy(policy_file, model_prefix, model_label, bands, epsilon, cap, floor, s7_ratio) -> V3Policy:
    overrides = {
        "model_prefix": model_prefix,
        "model_label": model_label,
        "bands": _parse_bands(bands) if bands is not None else None,
        "near_tie_epsilon": epsilon,
        "near_tie_cap": cap,
        "declared_min_floor": floor,
        "s7_ratio": s7_ratio,
    }
    try:
        if policy_file is not None:
            return V3Policy.from_file(policy_file, **overrides)
        return V3Policy.from_mapping({k: v for k, v in overrides.items() if v is not None}, source="options")
    except (PolicyError, OSError) as exc:
        raise _fail(str(exc)) from None


def _parse_bands(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        typer.echo(f"error: --bands takes comma-separated integers, got {text!r}", err=True)
        raise typer.Exit(2) from None


def _fail(message: str | Exception, code: int = 2) -> typer.Exit:
    """Say ``error: message`` on stderr (an OutputExists in the command line's words); the caller raises what this returns (exit 2:
    a bad option or input)."""
    typer.echo(f"error: {message.command_line() if isinstance(message, OutputExists) else message}", err=True)
    return typer.Exit(code)


def _need_extra(module: str, extra: str, command: str) -> None:
    """Refuse, before any work, a command whose optional extra is not installed: which extra, and the line that installs it
    (exit 2), rather than a ModuleNotFoundError traceback mid-way."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None, or one whose spec cannot be read
        found = False
    if not found:
        gpu = " (README says how a GPU user gets a CUDA build of torch instead)" if module == "torch" else ""
        raise _fail(
            f"bia {command} needs the {extra} extra ({module} is not installed): pip install -e '.[{extra}]' in a checkout of bia{gpu}"
        )


def _row_invariant_blas(modes: list[str]) -> None:
    """For the row-invariant mode, MKL's AVX2 branch unless one is chosen: set before torch loads (MKL reads it once),
    it makes runs repeat bit for bit and keeps the row-count-independent GEMM the mode rests on (rowwise.check_blas)."""
    if "row-invariant" in modes:
        os.environ.setdefault("MKL_CBWR", "AVX2")


def _check_log_file(path: Path) -> None:
    """Refuse, before the model loads, a --log-file that cannot be appended to: a file or a folder that refuses writing in
    the way, a folder that does not exist, or a folder where the file should be."""
    from ..core import OutputUnwritable, check_writable

    try:
        check_writable(path, "--log-file")
    except OutputUnwritable as exc:
        raise _fail(exc) from None
    if not path.parent.is_dir():
        raise _fail(f"--log-file {path}: its folder {path.parent} does not exist")
    if path.is_dir():
        raise _fail(f"--log-file {path}: is a folder, not a file")


def _read_runs(paths: list[Path], option: str) -> None:
    """Read the runs an option names before any work: exit 3 where no run is (no manifest.json), 4 for one bia cannot read."""
    from ..run import RunError, read_run

    for path in paths:
        try:
            read_run(path)
        except RunError as exc:
            raise _fail(f"{option} {exc}", EXIT_MISSING if not (path / "manifest.json").is_file() else 4) from None


def _sources(given: list[str], reads: frozenset[str], command: str):
    """What a command was given, sorted as every command sorts it (:func:`analysis.studies.sort_sources`): a source given
    twice read once, and a file in a folder that the command does not read skipped, each with a note on stderr naming it
    and why; exit 3 for a path that does not exist or a folder that holds nothing the command reads."""
    from ..io import same_sources
    from ..studies import sort_sources

    kept, repeated = same_sources(given)
    for first, again in repeated:
        typer.echo(f"note: {again} is {first} given again; it is read once", err=True)
    try:
        sources = sort_sources(kept, reads=reads, reader=f"bia {command}")
    except FileNotFoundError as exc:
        raise _fail(exc, EXIT_MISSING) from None
    for file, why in sources.skipped:
        typer.echo(f"note: skipped {file} ({why})", err=True)
    return sources


def _unread(exc: OSError) -> typer.Exit:
    """A source not read: exit 6 for a URL that could not be fetched (SourceError), 3 for a path that does not exist."""
    from ..io import SourceError

    return _fail(exc, EXIT_UNREACHABLE if isinstance(exc, SourceError) else EXIT_MISSING)


def _parse_ladder(text: str, option: str = "--ladder") -> list[int]:
    """Distinct batch sizes >= 1, comma separated."""
    try:
        ladder = [int(part) for part in text.split(",")]
    except ValueError:
        raise _fail(f"{option} takes comma-separated integers, got {text!r}") from None
    if not ladder or min(ladder) < 1 or len(set(ladder)) != len(ladder):
        raise _fail(f"{option} takes distinct batch sizes >= 1, got {text!r}")
    return ladder


def _read_lines(path: Path, option: str) -> list[str]:
    """The non-blank lines of a UTF-8 text file given as ``option``; at least one."""
    lines = [line for line in _read_text(path, option).splitlines() if line.strip()]
    if not lines:
        raise _fail(f"{option} {path}: holds no line that is not blank")
    return lines


def _read_text(path: Path, option: str) -> str:
    """A UTF-8 text file given as ``option``, or a one-line error naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _fail(f"{option} {path}: no such file") from None
    except IsADirectoryError:
        raise _fail(f"{option} {path}: is a folder, not a text file") from None
    except UnicodeDecodeError as exc:
        raise _fail(f"{option} {path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise _fail(f"{option} {path}: cannot read it: {exc.strerror or exc}") from None


def _check_epsilon(value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise _fail(f"--epsilon takes a finite number >= 0, got {value!r}")


def _prompt_records(path: Path) -> list[dict]:
    """A JSON-lines prompt set: each line an object with a non-empty "text" and an optional "answer"."""
    import json

    records = []
    for number, line in enumerate(_read_text(path, "--prompts").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise _fail(f"{path}: line {number}: {not_json(exc, number)}") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str) or not record["text"]:
            typer.echo(
                f'error: {path}: line {number}: field "text": expected a non-empty string in an object', err=True
            )
            raise typer.Exit(2)
        records.append(record)
    if not records:
        raise _fail(f"--prompts {path}: holds no prompt")
    return records


# What a run's manifest records of each probe option that a resume keeps (the run's own settings)
_RECORDED = {
    "ladder": lambda m: m.get("ladder"),
    "repeats": lambda m: m.get("repeats"),
    "observer": lambda m: m.get("observer"),
    "bands_anyway": lambda m: m.get("bands_anyway"),
    "declared_min": lambda m: m.get("declared_min"),
    "arms": lambda m: m.get("arms"),
    "max_tokens": lambda m: (m.get("sampler") or {}).get("max_tokens"),
    "top_logprobs": lambda m: (m.get("sampler") or {}).get("top_logprobs"),
    "seed": lambda m: (m.get("sampler") or {}).get("seed"),
    "layout": lambda m: (m.get("requested") or {}).get("layout"),
    "engine": lambda m: (m.get("requested") or {}).get("engine"),
    "log_pattern": lambda m: (m.get("requested") or {}).get("log_pattern"),
    "prompts": lambda m: [p.get("text") for p in m.get("prompts") or []],
    "fillers": lambda m: m.get("fillers") or [],
    "model": lambda m: ((m.get("identity") or {}).get("model") or {}).get("path"),
}


def _resume_conflicts(output: Path, given: list[str], values: dict) -> list[str]:
    """The options given with --resume whose values differ from what the run's manifest records, each named with both values
    (an option the manifest does not record cannot be checked, and is named as such). None when the run is not there yet:
    the probe says so itself."""
    import json

    try:
        manifest = json.loads((output / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    differ = []
    for name in given:
        option = "--" + name.replace("_", "-")
        if name not in _RECORDED:
            differ.append(f"{option} cannot be given with --resume")
            continue
        value = values[name]
        if name == "prompts":
            value = [p.get("text") if isinstance(p, dict) else p for p in value]
        recorded = _RECORDED[name](manifest)
        if value != recorded:
            shown = (
                (f"{len(value)} prompt(s)", f"{len(recorded or [])}")
                if name in ("prompts", "fillers")
                else tuple(",".join(map(str, v)) if isinstance(v, list) else v for v in (value, recorded))
            )
            differ.append(f"{option} {shown[0]} differs from the run's {shown[1]}")
    return differ
