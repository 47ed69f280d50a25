"""The next step of a judgement row: a concrete command or setting for the engine that served the run."""

from __future__ import annotations

import math
import re
import shlex
from typing import Any, Protocol

from ..run import remake_step


class _Subject(Protocol):
    label: str
    manifest: Any
    ladder: list[int]


def _family(engine: str) -> str:
    lowered = engine.lower()
    for family in ("llama.cpp", "vllm", "sglang", "bia torch", "bia serve", "transformers"):
        if family in lowered:
            return family
    return "server"


def _probe_command(subject: _Subject, extra: str, *, resume: bool = True) -> str:
    """The probe that finishes the run (``--resume``), or a new run beside it with its prompts (a resume keeps its repeats)."""
    url = subject.manifest.get("url")
    base = re.sub(r"/v1/.*$", "", str(url)) if url else "URL"
    if resume:
        return f"bia probe {base} -o {subject.label} --resume{extra}"
    return f"bia probe {base} -o {subject.label}-more --prompts FILE{extra} (its prompts, one per line)"


def _probed(subject: _Subject) -> bool:
    """Whether a probe wrote the run (or nothing says what did): then a resume finishes it."""
    producer = subject.manifest.get("producer")
    return producer in (None, "bia probe") and subject.manifest.get("assembled_from") is None


_CACHE_OFF = {
    "llama.cpp": "llama-server --no-cache-prompt",
    "vllm": "vLLM --no-enable-prefix-caching",
    "sglang": "SGLang --disable-radix-cache",
}
_ALONE = {
    "bia torch": "bia experiment --modes row-invariant",
    "vllm": "VLLM_BATCH_INVARIANT=1 and --no-enable-prefix-caching",
    "sglang": "SGLang --enable-deterministic-inference",
    "llama.cpp": "llama-server --no-cache-prompt",
}
_INVARIANT = {
    "llama.cpp": "llama-server --parallel 1 (it has no batch-invariant kernels)",
    "vllm": "VLLM_BATCH_INVARIANT=1",
    "sglang": "SGLang --enable-deterministic-inference",
    "bia torch": "bia experiment --modes row-invariant",
    "bia serve": "bia serve --mode row-invariant",
    "transformers": "one prompt per generate call, or batch_invariant_ops' kernels",
}
_BATCH_LIMIT = {
    "llama.cpp": "llama-server --parallel {c}",
    "vllm": "vLLM --max-num-seqs {c}",
    "sglang": "SGLang --max-running-requests {c}",
}


def next_step(subject: _Subject, row: dict[str, Any]) -> str:
    """The next step as a concrete command or setting, for the engine that served the run.

    Parameters
    ----------
    subject : Subject
        The run judged: its ``label``, ``manifest`` and ``ladder``.
    row : dict of str to Any
        Its judgement row: ``engine``, ``verdict``, ``cause`` and the counts the verdict rests on.

    Returns
    -------
    str
    """
    family = _family(row["engine"])
    verdict, cause = row["verdict"], row["cause"]
    if verdict == "RED" and cause in ("prompt cache", "cache state", "shared prefix"):
        return f"turn the cache off: {_CACHE_OFF.get(family, 'the server without its prompt or prefix cache')}, then probe again"
    if verdict == "RED" and cause == "run-to-run":
        return f"make it repeat itself alone: {_ALONE.get(family, 'no prompt cache, deterministic kernels')}, then probe again"
    if verdict == "RED":
        return (
            f"batch-invariant kernels: {_INVARIANT.get(family, 'the engine batch-invariant, or one request at a time')}"
        )
    if (
        verdict == "UNVERIFIED" and subject.manifest.get("mlperf") is not None
    ):  # analysis.read_mlperf_pair: no run to finish or widen
        return (
            "MLPerf's accuracy logs record neither logprobs nor batch widths: for both, serve the SUT's model and "
            f"bia probe URL --arms mixed --ladder 1,{max(subject.ladder)}"
        )
    if verdict == "UNVERIFIED":
        if row.get("refused"):
            return f"fire the refused requests again: {_probe_command(subject, ' --retry-refused')}"
        if row["missing"] or (row["cs_missing"] and row["requests"]) or row.get("unjudged") or row.get("alone_unknown"):
            # a probe is resumed; an experiment or an assembled run is written again by what wrote it
            return f"finish the run: {_probe_command(subject, '') if _probed(subject) else remake_step(subject.manifest, subject.label)}"
        if row["bands_unformed"]:
            widest = max(subject.ladder)
            if family == "bia serve":
                return _bia_serve_unformed(subject.manifest, widest)
            return f"raise the batch limit so each c forms: {_BATCH_LIMIT.get(family, 'a batch limit of {c}').format(c=widest)}"
        if row["bits_unknown"]:
            return "probe with logprobs (bia probe keeps them unless the server drops them)"
        if row.get("no_evidence"):
            return (
                "the server answered with empty completions: check its errors and that it honours max_tokens and "
                "ignore_eos, then probe again"
            )
        return "probe a ladder of batch sizes above 1: bia probe URL --ladder 1,4,8,16"
    if verdict == "AMBER":  # the bound counts distinct batch contexts: more of them come from more prompts
        contexts = row["contexts"]
        more = row["requests_needed"] - contexts
        per_prompt = max(1, contexts // max(1, row["prompts"]))
        prompts = math.ceil(row["requests_needed"] / per_prompt)
        unit = "batched requests" if contexts == row["requests"] else "distinct batch contexts"
        if subject.manifest.get("producer") == "bia experiment":
            return f"{more} more {unit}: bia experiment --prompts FILE of {prompts} prompts"
        if (
            subject.manifest.get("producer") == "bia probe_callable"
        ):  # an engine in process: called again, not probed over HTTP
            return f"{more} more {unit}: probe_callable(generate, {prompts} prompts, OUTPUT) into a new run"
        return (
            f"{more} more {unit}: a new run with {prompts} prompts, {_probe_command(subject, '', resume=False)}, "
            "or one in the rotating layout (--layout rotating), whose every repeat is a new context"
        )
    return "none: keep it in CI with bia certify"


def _bia_serve_unformed(manifest: Any, widest: int) -> str:
    """bia serve's own settings for a band never seen formed: a ``--max-batch`` below the widest c, else a wider batching
    window (four times the one the server reported, 50 ms when it reported none), so requests sent together start together.

    Examples
    --------
    >>> _bia_serve_unformed({"effective": {"batch_window_ms": 50.0}, "url": "http://h:1/v1/chat/completions"}, 16)
    'let the requests sent together decode in one batch: bia serve --batch-window-ms 200, then certify again'
    >>> _bia_serve_unformed({"effective": {"max_batch": 8}}, 16)
    'raise the batch limit so each c forms: bia serve --max-batch 16'
    """
    effective = (manifest or {}).get("effective") or {}
    limit = effective.get("max_batch")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit < widest:
        return f"raise the batch limit so each c forms: bia serve --max-batch {widest}"
    window = effective.get("batch_window_ms")
    window = window if isinstance(window, (int, float)) and not isinstance(window, bool) and window > 0 else 50
    return f"let the requests sent together decode in one batch: bia serve --batch-window-ms {4 * window:g}, then certify again"


def repro_folder(run: str) -> str:
    """Where ``bia repro`` writes a run's repro by default, and where the report looks for it: the folder beside the run,
    named after it, ``RUN-repro`` (a folder scan skips the runs inside it, ``analysis.studies.run_directories``).

    Parameters
    ----------
    run : str
        The run directory.

    Returns
    -------
    str

    Examples
    --------
    >>> repro_folder("runs/probe/")
    'runs/probe-repro'
    """
    return f"{run.rstrip('/')}-repro"


def repro_step(run: str, url: str | None = None, *, generate: str | None = None) -> str:
    """The command that turns a RED run into a bug report (``bia repro``): the smallest batch that still parts, shrunk
    against ``url`` when given, as a script and a REPORT.md beside the run (:func:`repro_folder`).

    Parameters
    ----------
    run : str
        The run directory.
    url : str, optional
        The server it was probed on, to shrink against.
    generate : str, optional
        A run made in process by a user's ``generate``: its ``--generate`` (``MODULE:FUNCTION``).

    Returns
    -------
    str

    Examples
    --------
    >>> repro_step("runs/certify-20261206-101500", "http://127.0.0.1:8000")
    'bia repro runs/certify-20261206-101500 --url http://127.0.0.1:8000 -o runs/certify-20261206-101500-repro'
    >>> repro_step("runs/my run")
    "bia repro 'runs/my run' -o 'runs/my run-repro'"
    """
    words = ["bia", "repro", run, *(["--url", url] if url else []), *(["--generate", generate] if generate else [])]
    return shlex.join([*words, "-o", repro_folder(run)])


def row_repro(subject: _Subject, row: dict[str, Any]) -> str | None:
    """A judgement row's ``repro``: for a RED row, the :func:`repro_step` of its run (``--url run``: against the URL the run
    recorded; a run of a user's ``generate`` in process names ``--generate MODULE:FUNCTION`` for the user to fill); else
    None.

    Parameters
    ----------
    subject : Subject
        The run judged.
    row : dict of str to Any
        Its judgement row.

    Returns
    -------
    str or None
    """
    if row["verdict"] != "RED":
        return None
    if subject.manifest.get("producer") == "bia probe_callable":  # in process: no server; transformers is called by bia
        in_process = None if _family(row["engine"]) == "transformers" else "MODULE:FUNCTION"
        return repro_step(subject.label, generate=in_process)
    # "run": the URL the run recorded (bia repro reads it), so no page that shows the command holds a link
    return repro_step(subject.label, "run" if subject.manifest.get("url") else None)
