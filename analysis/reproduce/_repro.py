"""``analysis.repro``: from a run's first parting request to a minimal case, a script and a report."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import check_writable, duration
from ..run import Run, read_run
from ..studies import judge, repro_folder
from ._case import Case, ReproError, case_bodies, first_part, start_case
from ._inprocess import batch_prompts, engine_source, in_process, inprocess_script_text
from ._report import parting_token, report_text
from ._script import script_text
from ._shrink import Outcome, Shrinker, shrink


@dataclass
class Repro:
    """What :func:`repro` wrote and found: whether a case parted in every try (``reproduced``), the case, the folder's files,
    the shrink's steps and what it spent."""

    folder: Path
    reproduced: bool
    outcome: str
    case: dict[str, Any] | None = None
    steps: list[str] = field(default_factory=list)
    requests: int = 0
    seconds: float = 0.0

    @property
    def script(self) -> Path:
        return self.folder / "repro.py"

    @property
    def report(self) -> Path:
        return self.folder / "REPORT.md"

    @property
    def run(self) -> Path:
        return self.folder / "run"

    def __str__(self) -> str:
        return f"{self.folder}: {self.outcome}"


def repro(
    run: Run | str | os.PathLike[str],
    url: str | None = None,
    out: str | os.PathLike[str] | None = None,
    *,
    request: str | None = None,
    tries: int = 3,
    max_requests: int = 400,
    max_time: float = 600.0,
    timeout: float = 120.0,
    api_key: str | None = None,
    resume: bool = False,
    say: Callable[[str], Any] | None = None,
    command: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    generate: str | None = None,
) -> Repro:
    """From a RED run's first request that parts, the smallest case that still parts, as a script and a bug report.

    The request is the judgement's ``first_request`` (:func:`analysis.judge`), or ``request`` (``PROMPT_ID/C/REPEAT/SLOT``).
    With ``url`` (a live server: ``"run"`` takes the URL the run recorded) it is shrunk while it still parts in every one of
    ``tries`` tries, each try a small probe run (two references and one band) judged as any run is: the smallest c (down to
    2), copies of the prompt for companions, the fewest ``max_tokens`` reaching the parting token, the shortest prompt
    prefix (ddmin-style), then ``max_tokens`` again. A part seen alone (run-to-run, prompt cache) is shrunk alone: the same
    request twice. A candidate that parts in only some tries is no repro; when none parts in every try the outcome is "not
    reproducible at N tries" and no script is written. ``max_requests`` and ``max_time`` bound the shrink (the smallest
    case found by then is kept); each step is said on stderr; ``resume`` goes on from ``out``'s ``shrink.json``.
    Without ``url`` nothing is fired: the run's own request is the repro. A run made in process
    (:func:`analysis.probe_callable`, ``bia experiment --hf``) has no server: its ``repro.py`` calls the engine itself, alone
    and in the run's batch (transformers on the checkpoint, or the user's ``generate`` by its import path).

    ``out`` gets ``repro.py`` (standalone, the standard library only: exit 1 while it parts, 0 when not), ``REPORT.md``
    and ``run/`` (the minimal case's run, which :func:`analysis.read_run` reads); ``tries/`` holds every try's run.

    Parameters
    ----------
    run : Run or path
        A run whose judgement is RED.
    url : str, optional
        The server to shrink against (its base URL or chat endpoint); ``"run"`` for the URL the run recorded.
    out : path, optional
        The folder to write; it must be new or empty unless ``resume``. By default the folder beside the run,
        ``RUN-repro`` (``analysis.studies.repro_folder``), where the report finds it.
    request : str, optional
        The batched request to reproduce, ``PROMPT_ID/C/REPEAT/SLOT``, instead of the judgement's first.
    tries : int
        Tries per candidate; a case is kept only when it parts in all of them.
    max_requests, max_time : int, float
        The shrink's budget in completions requested and in seconds.
    timeout : float
        Seconds each request may take.
    api_key : str, optional
        Sent as a bearer token; never written.
    resume : bool
        Go on with the shrink in ``out``.
    say : callable, optional
        Takes each progress line (stderr by default).
    command : str, optional
        The command line to name in the report (the Python call by default).
    checkpoint : path, optional
        A run made in process by transformers: its checkpoint folder (or bia's ``.safetensors`` model), when the run does
        not name one that is here.
    generate : str, optional
        A run made in process: ``module:function``, the ``generate`` it was probed with, which ``repro.py`` imports.

    Returns
    -------
    Repro

    Raises
    ------
    ReproError
        A run with nothing that parts, a ``request`` it does not hold, a bad budget, an ``out`` that holds something.
    analysis.probe.ServerUnreachable, analysis.probe.ServerGone
        Nothing answers at ``url``.

    Examples
    --------
    Without a server the run's own first part is written as it was (``tests/test_repro.py`` shrinks against bia serve):

    >>> import tempfile
    >>> found = repro("data/experiment-cpu/default", out=tempfile.mkdtemp() + "/repro", say=lambda line: None)
    >>> found.reproduced, found.case["c"], found.script.is_file()
    (True, 4, True)
    """
    say = say or (lambda line: print(line, file=sys.stderr))
    for name, value in (("tries", tries), ("max_requests", max_requests)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ReproError(f"{name} must be a whole number >= 1, got {value!r}")
    if isinstance(max_time, bool) or not isinstance(max_time, (int, float)) or not max_time > 0:
        raise ReproError(f"max_time must be a number of seconds > 0, got {max_time!r}")
    if out is None:
        if not isinstance(run, (str, os.PathLike)) and run.path is None:
            raise ReproError("an assembled run has no folder to write beside: give out")
        out = repro_folder(os.fspath(run if isinstance(run, (str, os.PathLike)) else run.path))  # type: ignore[arg-type]
    folder = Path(out)
    check_writable(folder, "the repro")
    if folder.is_file() or (folder.is_dir() and any(folder.iterdir()) and not resume):
        raise ReproError(f"{folder}: already holds something; choose another folder (or resume the shrink there)")
    loaded = run if isinstance(run, Run) else read_run(os.fspath(run))
    row = first_part(loaded, request)
    start = start_case(loaded, row)
    manifest = loaded.manifest
    url = manifest.get("url") if url == "run" else url
    command = command or f"analysis.repro({loaded.label!r}, url={url!r}, out={str(folder)!r})"
    folder.mkdir(parents=True, exist_ok=True)
    for stale in ("repro.py", "REPORT.md", "run"):  # a resumed shrink writes its result again
        path = folder / stale
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    if in_process(manifest):
        if url is not None:
            raise ReproError(
                f"{loaded.label}: made in process, by no server: leave the URL out (its repro.py calls the engine)"
            )
        return _write_in_process(
            folder, loaded, row, command, engine_source(loaded, folder, checkpoint=checkpoint, generate=generate)
        )
    if url is None:  # nothing to fire at: the run's own request, unshrunk, is the repro
        return _write(
            folder,
            loaded,
            row,
            start,
            row["first_request"],
            manifest,
            None,
            [],
            "0 requests",
            command,
            tries,
            0,
            0.0,
            url=manifest.get("url", ""),
        )
    shrinker = Shrinker(
        url,
        manifest,
        folder,
        tries=tries,
        max_requests=max_requests,
        max_time=max_time,
        timeout=timeout,
        api_key=api_key,
        say=say,
    )
    say(f"repro: {row['run']} {row['arm']}: {row['first']}; shrinking {start.words} against {url}, {tries} tries each")
    best, steps, stopped = shrink(start, shrinker, [int(c) for c in loaded.ladder])
    spent = f"{shrinker.requests} requests in {duration(shrinker.seconds)} ({len(shrinker.tried)} candidates, {tries} tries each)"
    if stopped:
        spent += f"; stopped by the budget: {stopped}"
    if best is None:
        return _write(
            folder,
            loaded,
            row,
            None,
            None,
            manifest,
            None,
            steps,
            spent,
            command,
            tries,
            shrinker.requests,
            shrinker.seconds,
            url=url,
        )
    minimal = read_run(folder / best.runs[0])
    shutil.copytree(folder / best.runs[0], folder / "run")
    return _write(
        folder,
        minimal,
        row,
        best.case,
        best.firsts[0],
        minimal.manifest,
        best,
        steps,
        spent,
        command,
        tries,
        shrinker.requests,
        shrinker.seconds,
        url=minimal.manifest.get("url", url),
    )


def _write(
    folder: Path,
    run: Run,
    row: dict[str, Any],
    case: Case | None,
    first: dict[str, Any] | None,
    manifest,
    best: Outcome | None,
    steps: list[str],
    spent: str,
    command: str,
    tries: int,
    requests: int,
    seconds: float,
    *,
    url: str,
) -> Repro:
    """Write repro.py (when a case parted in every try), REPORT.md, and say what was found."""
    precision = (judge(run).to_dicts()[0].get("domain") or {}).get("precision") or "float32"
    if case is None or first is None:
        outcome = f"not reproducible at {tries} tries"
        _report(folder, manifest, row, command, None, None, None, None, precision, steps, spent, outcome)
        return Repro(folder, False, outcome, None, steps, requests, seconds)
    sent = case_bodies(case, manifest, first)
    script_case = {"url": url, **sent, "tries": tries, "precision": precision}
    title = f"{(manifest.get('identity') or {}).get('engine', 'the engine')}: {case.words}".replace("\\", "/").replace(
        '"', "'"
    )
    (folder / "repro.py").write_text(script_text(script_case, title=title), encoding="utf-8")
    (folder / "repro.py").chmod(0o755)
    if case.alone_only and sent["cold"]:
        batch_words = (
            f"sent alone with `{json.dumps(sent['cold'])}` (the whole prompt evaluated), then twice as the server takes it "
            "by default: the first warms its prompt cache with it, the second (compared) is served from that cache"
        )
    elif case.alone_only:
        batch_words = "sent alone, then the same request alone again"
    else:
        companions = (
            "copies of the same request" if case.layout == "copies" else f"other prompts ({case.layout} layout)"
        )
        batch_words = (
            f"sent in a batch of {case.c} requests at once (the request at row {sent['row']}, the others "
            f"{companions}), against the same request sent alone"
        )
    part = parting_token(run, first)
    if part is not None:
        part["label"] = ("cached" if sent.get("cold") else "again") if case.alone_only else "batched"
    held = (
        f"parted in {best.parted} of {best.tried} tries"
        if best is not None
        else "the run's own request, not fired again"
    )
    outcome = f"{case.words}: {held}"
    _report(
        folder,
        manifest,
        row,
        command,
        case.words,
        sent["alone"],
        batch_words,
        part,
        precision,
        steps,
        spent,
        f"parts {'alone, run to run' if case.alone_only else f'in a batch of {case.c}'} ({held})",
    )
    found = {
        "prompt": case.prompt,
        "c": case.c,
        "layout": case.layout,
        "max_tokens": case.max_tokens,
        "row": sent["row"],
        "position": first.get("position"),
    }
    return Repro(folder, True, outcome, found, steps, requests, seconds)


def _write_in_process(folder: Path, run: Run, row: dict[str, Any], command: str, engine: dict[str, Any]) -> Repro:
    """repro.py calling the engine in process on the run's own parting request, and REPORT.md; nothing is called now."""
    first = row["first_request"]
    prompt, batch, own = batch_prompts(run, first)
    max_tokens = int((run.manifest.get("sampler") or {}).get("max_tokens") or 64)
    precision = (judge(run).to_dicts()[0].get("domain") or {}).get("precision") or "float32"
    case = {
        **engine,
        "prompt": prompt,
        "batch": batch,
        "row": own,
        "max_tokens": max_tokens,
        "tries": 1,
        "precision": precision,
    }
    name = (run.manifest.get("identity") or {}).get("engine") or "the engine"
    words = f"c={len(batch)}, row {own}, max_tokens={max_tokens}"
    (folder / "repro.py").write_text(inprocess_script_text(case, title=f"{name}: {words}".replace('"', "'")), "utf-8")
    (folder / "repro.py").chmod(0o755)
    call = f"`generate` ({engine['generate']})" if "generate" in engine else f"transformers ({engine['way']} batching)"
    part = parting_token(run, first)
    if part is not None:
        part["label"] = "batched"
    sent = {"prompt": prompt, "batch": batch, "row": own, "max_new_tokens": max_tokens, "greedy": True}
    _report(
        folder,
        run.manifest,
        row,
        command,
        words,
        sent,
        f"{call} called in process on the prompt alone, then on its batch of {len(batch)} (row {own} compared)",
        part,
        precision,
        [],
        "0 calls (in process: the run's own request, not shrunk)",
        f"parts in a batch of {len(batch)} (the run's own request)",
        "`python3 repro.py` calls the engine again in process"
        + (" (it needs torch and transformers; `--checkpoint DIR` another checkpoint)" if "way" in engine else "")
        + ": exit 1 while the batched row parts, 0 once it does not, 2 when the engine cannot be called.",
    )
    found = {
        "prompt": prompt,
        "c": len(batch),
        "layout": "in process",
        "max_tokens": max_tokens,
        "row": own,
        "position": first.get("position"),
    }
    return Repro(folder, True, f"{words}: the run's own request, called in process by repro.py", found)


def _report(
    folder: Path,
    manifest,
    row,
    command,
    case_words,
    body,
    batch_words,
    part,
    precision,
    steps,
    spent,
    outcome,
    note=None,
) -> None:
    text = report_text(
        manifest=manifest,
        row=row,
        command=command,
        case_words=case_words,
        body=body,
        batch_words=batch_words,
        part=part,
        precision=precision,
        steps=steps,
        spent=spent,
        outcome=outcome,
        script_note=note,
    )
    (folder / "REPORT.md").write_text(text, encoding="utf-8")


def command_line(argv: list[str]) -> str:
    """The command as a user would type it again, quoted for a shell.

    Parameters
    ----------
    argv : list of str
        The command's words.

    Returns
    -------
    str

    Examples
    --------
    >>> command_line(["bia", "repro", "runs/my run", "-o", "out"])
    "bia repro 'runs/my run' -o out"
    """
    return shlex.join(argv)
