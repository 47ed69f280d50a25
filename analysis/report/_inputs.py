"""What ``bia report`` and ``bia witness`` were given: run directories, witnesses and release markers, or logprob dumps."""

from __future__ import annotations

import glob
from pathlib import Path

ACCEPTS = (
    "bia report reads witness and release-marker files (JSON), run directories (with manifest.json) and logprob dumps "
    "(chat and completion responses or their SSE streams, with logprobs, from OpenAI-compatible servers, vLLM, SGLang, llama.cpp, "
    'TGI: README, "Per-token logprob dumps")'
)


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


def is_lone(run) -> bool:
    """Whether a run holds a single request: it reads, and allows no batch comparison.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    bool
    """
    return run.dump.requests.unique(["source", "record"]).height == 1


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
    return sorted({p.parent for p in path.rglob("manifest.json") if is_run_dir(p.parent, strict=True)})


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


def not_a_dump(file: Path, runs: list[Path]) -> str | None:
    """Why a file found in a folder is no dump for a run (None when it may be one): sampler-trainer pairs (beside their runs,
    the report's RL section reads them), or JSON that matches no dump format (a model's config, say).

    Parameters
    ----------
    file : pathlib.Path
        The file.
    runs : list of pathlib.Path
        The run directories found with it (pairs in ``RUN/../trainer/RUN.jsonl`` are theirs).

    Returns
    -------
    str or None
    """
    from ..core import loads_strict
    from ..dumps import DumpError, detect_format

    try:
        raw = file.read_bytes()
        first = next((line for line in raw.decode("utf-8").splitlines() if line.strip()), "")
    except (OSError, UnicodeDecodeError):
        return None  # the dump reader names what is wrong with it
    try:
        head = loads_strict(first)
    except (ValueError, RecursionError):
        head = None  # not JSON lines: a document, or no JSON at all
    if isinstance(head, dict) and {"inference_logprobs", "trainer_logprobs"} <= head.keys():
        beside = [run for run in runs if file == run.parent / "trainer" / f"{run.name}.jsonl"]
        return (
            ("sampler-trainer pairs of " + str(beside[0]) + ": the report's RL section reads them")
            if beside
            else ("sampler-trainer pairs, not a dump of a run: analysis.mismatch_summary reads them")
        )
    try:
        detect_format(raw, str(file))
    except DumpError as exc:
        if "matches no known dump format" in str(exc):
            return "JSON that matches no dump format"
    return None


def sort_sources(given: list[str]) -> tuple[list[str], list[str], list[str], list[tuple[str, str]]]:
    """(run directories, witness and marker sources, dump files, and the files skipped with why) among what ``bia report``
    was given; a folder contributes the run directories in it as runs, and its other files as witnesses or dumps, but
    not the files in it that are no dump (:func:`not_a_dump`), which are skipped and said.

    Parameters
    ----------
    given : list of str
        Paths, folders, globs and URLs, as given on the command line.

    Returns
    -------
    tuple of (list of str, list of str, list of str, list of tuple of (str, str))
    """
    from ..dumps import DUMP_SUFFIXES
    from ..io import expand_sources, is_url

    runs: list[str] = []
    witnesses: list[str] = []
    dumps: list[str] = []
    skipped: list[tuple[str, str]] = []
    for source in given:
        path = Path(source)
        if is_url(source) or (not path.exists() and not glob.has_magic(source)):
            witnesses.append(source)  # the witness reader fetches a URL, and names a path that does not exist
        elif path.is_dir() and is_run_dir(path):
            runs.append(source)
        elif glob.has_magic(source) and not path.exists():
            matches = sorted(glob.glob(source, recursive=True))
            if not matches:
                raise FileNotFoundError(f"{source}: pattern matches no file")
            more = sort_sources(matches)
            runs, witnesses, dumps, skipped = runs + more[0], witnesses + more[1], dumps + more[2], skipped + more[3]
        elif path.is_dir():
            inner = run_directories(path)
            runs += [str(p) for p in inner]
            loose = sorted(
                str(p)
                for p in path.rglob("*")
                if p.is_file() and p.name.endswith(DUMP_SUFFIXES) and not any(p.is_relative_to(r) for r in inner)
            )
            if not loose and not inner:
                expand_sources(source, suffix=DUMP_SUFFIXES)  # says that the folder holds nothing to read
            for file in loose:
                if looks_like_witness(file):
                    witnesses.append(file)
                elif (why := not_a_dump(Path(file), inner)) is not None:
                    skipped.append((file, why))
                else:
                    dumps.append(file)
        else:
            (witnesses if looks_like_witness(source) else dumps).append(source)
    return runs, witnesses, dumps, skipped


def first_prompt(run: Path) -> str | None:
    """The first prompt id a run's manifest lists, if it can be read.

    Parameters
    ----------
    run : pathlib.Path
        A run directory.

    Returns
    -------
    str or None
    """
    import json

    try:
        prompts = json.loads((run / "manifest.json").read_text(encoding="utf-8")).get("prompts") or []
        return str(prompts[0]["prompt_id"]) if prompts else None
    except (OSError, ValueError, RecursionError, AttributeError, KeyError, TypeError, IndexError):
        return None


def run_directory_problem(source: str) -> str | None:
    """What to say when ``bia witness`` is given a run directory (or a folder of them): what it is, and what to run on it.

    Parameters
    ----------
    source : str
        What ``bia witness`` was given.

    Returns
    -------
    str or None
        None when it is no run directory and holds none.
    """
    path = Path(source)
    runs = run_directories(path) if path.is_dir() else []
    if not runs:
        return None
    run, one = runs[0], runs[0] == path
    what = (
        f"{source} is a run directory"
        if one
        else f"{source} holds run directories ({', '.join(str(r) for r in runs[:3])}{f' and {len(runs) - 3} more' if len(runs) > 3 else ''})"
    )
    witness = run / "witness.json"
    if witness.is_file():
        check = f"its witness is {witness}: bia witness {witness}, or bia shape-check {witness}"
    else:
        prompt = first_prompt(run)
        check = (
            f"for aprender's V3 check, write a prompt's witness first (python -c \"import analysis; "
            f"analysis.write_witness(analysis.read_run('{run}'){'' if prompt is None else f', prompt_id={prompt!r}'})\") "
            f"and run bia shape-check {witness}"
        )
    return (
        f"{what}, not {'a witness' if one else 'witnesses'}: bia report {source} -o report.html reports {'it' if one else 'them'} "
        f"(the runs' verdicts, figures and detail); {check}"
    )
