"""What ``bia report`` and ``bia witness`` were given: run directories, witnesses and release markers, or logprob dumps."""

from __future__ import annotations

from pathlib import Path

from ..studies import dump_kind, run_directories
from ..studies import sort_sources as sort_all

REPORT_READS = frozenset({"run", "witness", "dump"})

ACCEPTS = (
    "bia report reads witness and release-marker files (JSON), run directories (with manifest.json) and logprob dumps "
    "(chat and completion responses or their SSE streams, with logprobs, from OpenAI-compatible servers, vLLM, SGLang, llama.cpp, "
    "TGI: docs/dumps.md#formats)"
)


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
    return run.request_columns("source", "record").unique().height == 1


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
    kind, why = dump_kind(file, runs)
    return why if kind == "other" else None


def sort_sources(given: list[str]) -> tuple[list[str], list[str], list[str], list[tuple[str, str]]]:
    """(run directories, witness and marker sources, dump files, and the files skipped with why) among what ``bia report``
    was given, sorted as every command sorts its sources (:func:`analysis.studies.sort_sources`).

    Parameters
    ----------
    given : list of str
        Paths, folders, globs and URLs, as given on the command line.

    Returns
    -------
    tuple of (list of str, list of str, list of str, list of tuple of (str, str))

    Raises
    ------
    FileNotFoundError
        A path that does not exist, a pattern that matches nothing, or a folder that holds nothing the report reads
        (:class:`analysis.studies.NothingToRead`).
    """
    sources = sort_all(given, reads=REPORT_READS, reader="bia report")
    return sources.runs, sources.witnesses, sources.dumps, sources.skipped


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
