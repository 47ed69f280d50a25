"""``bia probe``: fire the same greedy request alone and in batches of c at a live server and write a run.

Per prompt: two m=1 references one after the other, then for each c of the ladder c requests
released together (``repeats`` times, interleaved across c): c copies of the prompt, or in the
``needle`` layout the prompt at a seeded position among c - 1 fillers. With ``observer`` each band
is fired a second time without logprobs, so :func:`analysis.run.observer_table` can compare texts.

Nothing is lost. The manifest is written first and rewritten (atomically) after every band. Each
request's raw bytes and the arrival time of every SSE event (a monotonic clock, seconds since the
request was sent) go to ``partial/`` as they arrive; when the request ends they move into
``captures/requests.jsonl`` in bia's capture envelope. A request that cannot count (an HTTP error,
a reset, a request past its whole-request deadline, a cut or malformed stream, an error event) is
listed under ``refused`` with its reason, its bytes kept in ``refused.jsonl`` (an HTTP error's first
64 KiB); its band is then unmeasurable and the run goes on. Settings no run can be made of, and a
server whose first answer is no chat stream with logprobs, stop the probe first (``_checks.py``).
A run stopped midway (Ctrl-C, a crash, a kill) is read by :func:`analysis.run.read_run`, whose
``missing()`` lists what it lacks, and :func:`probe` with ``resume=True`` finishes it: bands left
unfinished are fired again whole, and what they had written moves to ``superseded/``.

Which batch the server formed: the lines its log gained during the band (aprender's
``Batch m=N done`` by default), and the engine's running-requests gauge sampled on ``/metrics``
while the band is in flight. Every width seen is kept, not only the largest.

The engine (vLLM, SGLang, llama.cpp, apr serve, bia serve, or a plain OpenAI-compatible server) is
detected from read-only endpoints, or given; it decides the body's extras (``ignore_eos``, vLLM's
token ids as ``token_id:N``) and the gauge. What was chosen and why is in the manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import random
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..core._output import check_writable
from ..run import Unit, plan
from ..run._arms import ARM_REPEATS, PREFIX_SHARES
from ._arms import check_arms, cold_fields, completion_prefix, prefill_body, prefix_primer
from ._capture import EventClock, fetch_stream, open_partial, stream_problem
from ._checks import check_address, check_first_answer, check_open_files, check_settings, check_slots, check_timeout
from ._engines import PROFILES, Detection, EngineProfile, ServerUnreachable, detect_engine
from ._rundir import ProbeError, _drop_partial, _load_for_resume, _now, _RunWriter, _supersede
from ._widths import (BATCH_LINE, LogWatcher, MetricsPoller, co_resident, engine_growth, metrics_snapshot, running_requests, server_decode,
                      stream_evidence)

# Fillers for the needle layout when none are given and the prompt set holds a single prompt.
DEFAULT_FILLERS = (
    "Write one sentence about the sea.",
    "List three prime numbers.",
    "What does a compiler do?",
    "Describe a quiet morning.",
)


class ServerGone(ProbeError):
    """Every request of a unit found nothing listening: the probe stops, and ``resume`` goes on later."""


def request_body(prompt: str, *, max_tokens: int, top_logprobs: int, seed: int = 0, profile: EngineProfile | None = None,
                 model: str | None = None, logprobs: bool = True) -> dict[str, Any]:
    """The greedy request aprender's probe sends, with the engine's extras.

    Temperature 0, a seed, ``max_tokens``, streamed with usage, logprobs with ``top_logprobs``
    candidates (left out when ``logprobs`` is false: the observer-effect twin), plus what the
    engine profile adds (``ignore_eos``; vLLM's ``return_tokens_as_token_ids``).

    Examples
    --------
    >>> body = request_body("Hi", max_tokens=8, top_logprobs=5, profile=PROFILES["vllm"], model="m")
    >>> body["return_tokens_as_token_ids"], body["ignore_eos"], body["top_logprobs"], body["model"]
    (True, True, 5, 'm')
    >>> sorted(request_body("Hi", max_tokens=8, top_logprobs=5, logprobs=False))  # doctest: +NORMALIZE_WHITESPACE
    ['ignore_eos', 'max_tokens', 'messages', 'seed', 'stream', 'stream_options', 'temperature']
    """
    profile = profile or PROFILES["apr"]
    body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "seed": seed, "max_tokens": max_tokens,
                            "stream": True, "stream_options": {"include_usage": True}}
    if model is not None:
        body["model"] = model
    if logprobs:
        body.update({"logprobs": True, "top_logprobs": top_logprobs})
    body.update({k: v for k, v in profile.body.items() if logprobs or k != "return_tokens_as_token_ids"})
    return body


def _apply_detection(manifest: dict[str, Any], detection: Detection) -> None:
    """What the engine decides in a run's manifest: its name, the model, ignore_eos, what the server says of itself."""
    manifest["identity"] = {"host": platform.node(), "engine": detection.profile.label, "model": {"path": detection.model}}
    manifest["engine"] = {"profile": detection.profile.name, "evidence": list(detection.evidence), "said": detection.describe(),
                          "running_metric": detection.profile.running_metric if detection.metrics else None}
    manifest["sampler"]["ignore_eos"] = "ignore_eos" in detection.profile.body
    manifest["server"] = {"info_path": detection.info_path, "info": detection.info}
    manifest["effective"] = detection.profile.effective(detection.info)


def _new_manifest(endpoint: str, detection: Detection, prompts: Sequence[str | Mapping[str, Any]], **settings: Any) -> dict[str, Any]:
    manifest = {
        "run_version": 1, "producer": "bia probe", "url": endpoint, "started": _now(),
        "sampler": {"temperature": 0.0, "seed": settings["seed"], "max_tokens": settings["max_tokens"], "top_logprobs": settings["top_logprobs"]},
        "ladder": list(settings["ladder"]), "repeats": settings["repeats"], "observer": settings["observer"],
        "bands_anyway": settings["bands_anyway"],
        "declared_min": settings["declared_min"] if settings["declared_min"] is not None else min(64, settings["max_tokens"]),
        "max_constant_run": 16, "prompts": [_prompt_entry(i, p) for i, p in enumerate(prompts)],
        "fillers": list(settings["fillers"]),
        "requested": {"layout": settings["layout"], "stream": True, "engine": settings["engine"], "log_pattern": settings["log_pattern"],
                      "server_log": str(settings["server_log"]) if settings["server_log"] else None, **settings["expect"]},
        "expected": sorted(settings["expect"]),
        "environment": {"python": platform.python_version(), "httpx": httpx.__version__, "machine": platform.machine()},
        "done": [], "m_formed": [], "refused": [], "complete": False,
    }
    if settings.get("arms") is not None:  # a run with control arms (analysis.run._arms): its plan is the arms'
        manifest.update(arms=list(settings["arms"]), arm_repeats=ARM_REPEATS, prefix_shares=list(PREFIX_SHARES))
    _apply_detection(manifest, detection)
    return manifest


def _addresses(url: str) -> tuple[str, str, str | None]:
    """The server's base URL and its chat endpoint, from either of them, and a note when the URL named another endpoint
    (``/v1/completions``, ``/v1/models``): that path is taken off, and the server probed at its base.

    Examples
    --------
    >>> _addresses("http://h:8000/"), _addresses("http://h:8000/v1/chat/completions")
    (('http://h:8000', 'http://h:8000/v1/chat/completions', None), ('http://h:8000', 'http://h:8000/v1/chat/completions', None))
    >>> _addresses("http://h:8000/proxy/v1/completions")[:2]
    ('http://h:8000/proxy', 'http://h:8000/proxy/v1/chat/completions')
    """
    stripped = url.rstrip("/")
    parts = urlsplit(stripped)
    origin, path = f"{parts.scheme}://{parts.netloc}", parts.path
    for tail in ("/v1/chat/completions", "/chat/completions"):
        if path.endswith(tail):
            return origin + path[: -len(tail)], stripped, None
    cut = path.find("/v1")
    if cut >= 0 and path[cut + 3: cut + 4] in ("", "/"):  # the API root, or another endpoint under it
        base = origin + path[:cut]
        note = None if path[cut:] == "/v1" else (f"note: {url} names {path[cut:]}, not the chat endpoint; probing the server at {base} "
                                                 "(its /v1/chat/completions): give the base URL to say so")
        return base, base + "/v1/chat/completions", note
    return stripped, stripped + "/v1/chat/completions", None


# An idle kept-alive connection is dropped after this many seconds, well before servers close their end (uvicorn, which
# serves vLLM and SGLang, after 5 s; cpp-httplib in llama-server after 5 s; gunicorn after 2 s). httpx's default is
# also 5 s: a band sent on connections the server is closing at that moment gets resets ("ReadError: ").
KEEPALIVE_EXPIRY_S = 1.0


def _client(timeout: float, api_key: str | None) -> httpx.AsyncClient:
    """The probe's HTTP client: no cap on concurrent connections (a band of c is c at once), idle connections dropped
    after :data:`KEEPALIVE_EXPIRY_S`, the key as a bearer token."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # sent, never written into the run
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_EXPIRY_S)
    return httpx.AsyncClient(timeout=timeout, headers=headers, limits=limits)


async def probe(
    url: str,
    out: str | os.PathLike[str],
    *,
    prompts: Sequence[str | Mapping[str, Any]] = (),
    ladder: Sequence[int] = (1, 4, 8, 16),
    repeats: int = 1,
    max_tokens: int = 64,
    top_logprobs: int = 5,
    seed: int = 0,
    layout: str = "copies",
    fillers: Sequence[str] | None = None,
    arms: Sequence[str] | None = None,
    observer: bool = False,
    engine: str = "auto",
    model: str | None = None,
    server_log: str | os.PathLike[str] | None = None,
    log_pattern: str = BATCH_LINE,
    metrics: bool = True,
    metrics_interval: float = 0.01,
    timeout: float = 120.0,
    declared_min: int | None = None,
    expect: dict[str, Any] | None = None,
    bands_anyway: bool = False,
    api_key: str | None = None,
    resume: bool = False,
    retry_refused: bool = False,
    progress: bool | None = None,
    say=None,
) -> Path:
    """Probe the chat endpoint at ``url`` (``.../v1/chat/completions`` or the server's base URL) and write a run.

    With ``resume=True`` the run at ``out`` is finished instead: its manifest's settings are used
    (only the URL, the server log, ``metrics`` and ``timeout`` may change), the finished units kept, and the rest fired again (with
    ``retry_refused``, also the units that had a request refused, say while the server was down).
    When nothing answers any request of a unit the probe stops with :class:`ServerGone`, leaving
    that unit for a resume. ``timeout`` is the deadline of each whole request, its stream included.

    Before anything is sent, settings no run can be made of are refused with :class:`ProbeError`:
    an address that is not http(s), a time-out that is not a positive number, a band wider than
    the process may hold open or than the server says it runs at once. The session's first
    request is the server check: unless it comes back as a chat stream with logprobs (not an
    HTTP error, a web page, a stream without logprobs), the probe stops with a
    :class:`ProbeError` saying what came back. A run directory the probe created and finished
    no unit in is removed when it stops so.

    ``expect`` holds settings the server should have (``{"kernel_mode": "batch-invariant"}``): they are recorded as requested, checked against what the server reports
    about itself (its ``effective`` settings), and a mismatch is said and shown in the report.
    ``api_key`` is sent as a bearer token on every request and never written into the run.
    As aprender's probe, no band is run for a prompt whose two references part before
    ``declared_min`` (the manifest's ``skipped`` says why), unless ``bands_anyway``. ``say``
    receives one line naming the engine chosen and why (``print`` to stderr by default).

    ``prompts`` are texts, or ``{"text": ..., "answer": ...}`` mappings whose answers
    :func:`analysis.run.accuracy_table` scores (Yuan et al.'s Std@Acc).

    ``arms`` (any of ``repeat``, ``copies``, ``mixed``, ``prefix``, ``cache``, ``serial``,
    ``prefill``) fires those control arms for each prompt instead of the one ``layout``, in one run
    whose requests carry their arm (see ``analysis.run._arms``); the m=1 references are then
    fired cold where the engine can skip its prompt cache per request.
    :func:`analysis.attribution_table` puts each divergence on the first arm that reproduces it.
    An arm the engine cannot run (the cache arm without a per-request cold switch, the prefill arm
    without a way to put completion tokens into the prompt) is refused before anything is fired.

    Returns
    -------
    Path
        The run directory, which :func:`analysis.run.read_run` reads.

    Examples
    --------
    Against ``bia serve --port 8000 --log-file serve.log`` (``tests/test_probe.py`` runs this for real):

    >>> run_dir = asyncio.run(probe("http://127.0.0.1:8000", "runs/probe", prompts=["If the argument is"],
    ...                             server_log="serve.log", max_tokens=32))  # doctest: +SKIP
    engine: bia serve (GET /v1/models: owned_by 'bia'); model 'tiny_lm'; body adds ignore_eos; widths also from /metrics bia:num_requests_running
    """
    folder = Path(out)
    say = say or (lambda line: print(line, file=sys.stderr))
    check_address(url)
    check_timeout(timeout)
    check_writable(folder, "the run directory")  # before any request: a file in the way, or a folder that refuses writing
    if not resume:
        check_settings(prompts, ladder, repeats, max_tokens, top_logprobs, layout)
        check_arms(arms, layout=layout)
        if declared_min is not None and not 0 <= declared_min <= max_tokens:
            raise ProbeError(f"declared_min must be between 0 and max_tokens={max_tokens}, got {declared_min}: no reference could reach it")
    created = _first_missing(folder)  # what the probe may remove again when it stops having kept nothing
    base, endpoint, note = _addresses(url)
    if note:
        say(note)
    async with _client(timeout, api_key) as client:
        if resume:
            manifest = _load_for_resume(folder)
            check_open_files(manifest["ladder"])
            redetect = manifest["requested"].get("engine") == "auto" and not manifest["done"]  # nothing fired yet: the profile may still change
            if not redetect:  # the bands already fired keep their request body
                engine = (manifest.get("engine") or {}).get("profile", "auto")
                model = ((manifest.get("identity") or {}).get("model") or {}).get("path")
        elif (folder / "manifest.json").exists():
            raise ProbeError(f"{folder}: already holds a run; resume it (bia probe --resume) or choose another folder")
        detection = await detect_engine(client, base, engine, model)
        say(detection.describe())
        check_slots(manifest["ladder"] if resume else ladder, detection)
        check_arms(manifest.get("arms") if resume else arms, detection.profile)
        if resume:
            moved = _supersede(folder, manifest, retry_refused)
            if redetect:
                _apply_detection(manifest, detection)
            effective = detection.profile.effective(detection.info)
            if effective != manifest.get("effective", {}):
                say(f"warning: the server now reports {effective}, where the run began with {manifest.get('effective', {})}")
            if server_log is not None:  # a restarted server may log elsewhere
                manifest["requested"]["server_log"] = str(server_log)
            manifest.setdefault("resumed", []).append({"at": _now(), "url": endpoint, "moved_aside": moved, "said": detection.describe(),
                                                       "effective": effective})
        else:
            manifest = _new_manifest(endpoint, detection, prompts, ladder=ladder, repeats=repeats, max_tokens=max_tokens,
                                     top_logprobs=top_logprobs, seed=seed, layout=layout, fillers=list(fillers or []),
                                     observer=observer, engine=engine, log_pattern=log_pattern, server_log=server_log, declared_min=declared_min,
                                     expect=dict(expect or {}), bands_anyway=bands_anyway, arms=arms)
        for line in expectation_notes(manifest):
            say(line)
        writer = _RunWriter(folder, manifest)
        writer.cache_metrics = detection.profile.cache_metrics if metrics and detection.metrics else ()
        writer.engine_metrics = dict(detection.profile.engine_metrics) if metrics and detection.metrics else {}
        discard = False
        try:
            await _fire_plan(client, endpoint, base, writer, detection, metrics, metrics_interval, progress, say, timeout)
            manifest["complete"] = True
            manifest.pop("stopped", None)
        except ProbeError as exc:  # the server is gone, refuses the key, or is no chat server: say what becomes of the run
            manifest["stopped"] = {"at": _now(), "why": f"{type(exc).__name__}: {exc}"}
            discard = created is not None and not manifest["done"]
            raise type(exc)(f"{exc}; nothing was kept, so {created} was removed" if discard else
                            f"{exc}; the run stays readable, and bia probe --resume finishes it") from None
        except BaseException as exc:  # Ctrl-C, a cancelled task, a crash: say so in the manifest, then let it go on
            why = "cancelled (Ctrl-C, or the caller stopped it)" if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)) else f"{type(exc).__name__}: {exc}"
            manifest["stopped"] = {"at": _now(), "why": why}
            raise
        finally:
            writer.close()
            if discard:
                shutil.rmtree(created, ignore_errors=True)
            else:
                manifest["finished"] = _now()
                writer.save()
    return folder


def _first_missing(folder: Path) -> Path | None:
    """The outermost of ``folder`` and its parents that does not exist yet (None when ``folder`` exists): what a probe creates."""
    missing = None
    for path in (folder, *folder.parents):
        if path.exists():
            break
        missing = path
    return missing


async def dry_run(
    url: str,
    *,
    prompts: Sequence[str | Mapping[str, Any]],
    ladder: Sequence[int] = (1, 4, 8, 16),
    repeats: int = 1,
    max_tokens: int = 64,
    top_logprobs: int = 5,
    seed: int = 0,
    layout: str = "copies",
    arms: Sequence[str] | None = None,
    observer: bool = False,
    engine: str = "auto",
    model: str | None = None,
    api_key: str | None = None,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """What :func:`probe` would do, without firing a completion or writing anything.

    Detection runs (GET requests only); the answer holds the engine line, the first prompt's
    request body, the plan's units, and how many completions the run would request.

    Examples
    --------
    >>> import asyncio
    >>> from analysis.serve import BackgroundServer
    >>> with BackgroundServer() as server:  # doctest: +SKIP
    ...     asyncio.run(dry_run(server.url, prompts=["Hi"], ladder=(1, 4)))["requests"]
    7
    """
    check_address(url)
    check_timeout(timeout)
    check_settings(prompts, ladder, repeats, max_tokens, top_logprobs, layout)
    check_arms(arms, layout=layout)
    base, endpoint, note = _addresses(url)
    if note:
        print(note, file=sys.stderr)
    async with _client(timeout, api_key) as client:
        detection = await detect_engine(client, base, engine, model)
    check_slots(ladder, detection)
    check_arms(arms, detection.profile)
    manifest = _new_manifest(endpoint, detection, prompts, ladder=ladder, repeats=repeats, max_tokens=max_tokens,
                             top_logprobs=top_logprobs, seed=seed, layout=layout, fillers=[], observer=observer, engine=engine,
                             log_pattern=BATCH_LINE, server_log=None, declared_min=None, expect={}, bands_anyway=False, arms=arms)
    units = plan(manifest)
    first = manifest["prompts"][0]["text"]
    return {"said": detection.describe(), "effective": manifest["effective"],
            "body": request_body(first, max_tokens=max_tokens, top_logprobs=top_logprobs, seed=seed, profile=detection.profile, model=detection.model),
            "units": [u.key for u in units],
            "requests": sum(u.band_c or len(u.slots) for u in units) + sum(u.arm in ("cache", "prefix") for u in units)}  # with primers


def expectation_notes(manifest: dict[str, Any]) -> list[str]:
    """A line for each expected setting the server contradicts or does not report.

    Examples
    --------
    >>> expectation_notes({"expected": ["kernel_mode"], "requested": {"kernel_mode": "batch-invariant"}, "effective": {"kernel_mode": "default"}})
    ["warning: the server reports kernel_mode='default', not the expected 'batch-invariant'"]
    """
    effective, requested = manifest.get("effective") or {}, manifest.get("requested") or {}
    notes = []
    for key in manifest.get("expected", []):
        if key not in effective:
            notes.append(f"note: the server does not report {key}; the expected {requested.get(key)!r} cannot be checked")
        elif effective[key] != requested.get(key):
            notes.append(f"warning: the server reports {key}={effective[key]!r}, not the expected {requested.get(key)!r}")
    return notes


def _prompt_entry(index: int, prompt: str | Mapping[str, Any]) -> dict[str, Any]:
    """A prompt as the manifest keeps it: its id, its text, and its answer when one is given (for accuracy)."""
    if isinstance(prompt, str):
        return {"prompt_id": f"p{index}", "text": prompt}
    entry = {"prompt_id": f"p{index}", "text": prompt["text"]}
    if prompt.get("answer") is not None:
        entry["answer"] = str(prompt["answer"])
    return entry


async def _fire_plan(client, endpoint, base, writer: _RunWriter, detection: Detection, metrics: bool, interval: float, progress, say,
                     deadline: float) -> None:
    from tqdm import tqdm

    manifest = writer.manifest
    requested = manifest["requested"]
    sampler = manifest["sampler"]
    texts = {p["prompt_id"]: p["text"] for p in manifest["prompts"]}
    watcher = LogWatcher(requested.get("server_log"), requested.get("log_pattern") or BATCH_LINE)
    gauge = detection.profile.running_metric if metrics and detection.metrics else None
    units = [u for u in plan(manifest) if u.key not in set(manifest["done"])]
    checked = False  # the session's first unit fired is the server check
    show = sys.stderr.isatty() if progress is None else progress
    bands = tqdm(total=sum(u.role != "reference" for u in units), desc="bands", unit="band", disable=not show, file=sys.stderr, position=0)
    sent = tqdm(total=sum(u.band_c or len(u.slots) for u in units), desc="requests", unit="request", disable=not show, file=sys.stderr, position=1)
    try:
        for unit in units:
            bands.set_postfix_str(unit.key)
            if unit.role != "reference" and unit.prompt_id in {entry["prompt_id"] for entry in manifest.get("skipped", [])}:
                manifest["done"].append(unit.key)  # the references disagree: aprender's rule runs no band for this prompt
                bands.update(1)  # a skipped band is done too
                sent.update(unit.band_c or 1)
                continue
            body = request_body(texts[unit.prompt_id], max_tokens=sampler["max_tokens"], top_logprobs=sampler["top_logprobs"], seed=sampler["seed"],
                                profile=detection.profile, model=detection.model, logprobs=unit.role != "observer")
            tag = _arm_tag(unit, manifest)
            if unit.role == "reference":
                slot = unit.slots[0]
                if tag:  # a run with arms: m=1 is alone and cold, so the cache arm alone says what a warm cache does
                    body = {**body, **cold_fields(detection.profile)}
                partial = writer.partial(unit, slot, "reference")
                before = await _engine_snapshot(client, base, writer.engine_metrics)
                results = [await fetch_stream(client, endpoint, body, partial, writer.origin, deadline)]
                _stop_if_gone(endpoint, results, [partial])
                decode = server_decode(engine_growth(writer.engine_metrics, before, await _engine_snapshot(client, base, writer.engine_metrics)),
                                       "request")
                refusals = [writer.keep(results[0], partial, unit=unit.key, prompt_id=unit.prompt_id, role="reference", slot=slot, **tag,
                                        **({"server_decode": decode} if decode else {}))]
            elif unit.role == "prefill":
                results, refusals = await _fire_prefill(client, endpoint, writer, unit, body, detection.profile, texts[unit.prompt_id], deadline)
            else:
                if unit.arm == "repeat":  # alone and cold, as the references: only run-to-run noise can part them
                    body = {**body, **cold_fields(detection.profile)}
                if unit.arm in ("cache", "prefix"):  # what the cache holds when the request comes: the prompt itself, or a prefix of it
                    primer = body if unit.arm == "cache" else {**body, "messages": [{"role": "user", "content": prefix_primer(texts[unit.prompt_id],
                                                                                                                             unit.repeat)}]}
                    await _fire_primer(client, endpoint, writer, unit, primer, deadline)
                results, refusals = await _fire_band(client, endpoint, base, writer, unit, body, watcher, gauge, interval, deadline)
            if not checked:
                check_first_answer(endpoint, unit.role, results, refusals, writer.reference_tokens.get(unit.key), sampler["top_logprobs"])
                checked = True
            if unit.role == "reference" and unit.slots[0] == 1 and not manifest.get("bands_anyway"):
                _judge_references(writer, unit.prompt_id, say)
            manifest["done"].append(unit.key)
            writer.save()
            bands.update(unit.role != "reference")
            sent.update(unit.band_c or len(unit.slots))
    finally:
        sent.close()
        bands.close()


def _arm_tag(unit: Unit, manifest: dict[str, Any]) -> dict[str, str]:
    """The ``arm`` a request's capture envelope carries in a run with arms (references: ``reference``); nothing in a run without."""
    if manifest.get("arms") is None:
        return {}
    return {"arm": unit.arm or "reference"}


async def _fetch_sequential(client, endpoint, body: dict[str, Any], partial, writer: _RunWriter, deadline: float) -> dict[str, Any]:
    """One request of a run of requests sent one after another, sent once more when the server closed the reused connection
    before answering at all (llama-server ends a kept-alive connection after a number of requests; the request then never
    reached it): such a close is the connection's fate, not the request's. Each retry is listed in the manifest's ``resent``."""
    result = await fetch_stream(client, endpoint, body, partial, writer.origin, deadline)
    if "without sending a response" in result.get("error", "") and not result.get("sse") and result.get("status") is None:
        writer.manifest.setdefault("resent", []).append({"partial": partial.name, "reason": result["error"]})
        result = await fetch_stream(client, endpoint, body, partial, writer.origin, deadline)
    return result


async def _fire_primer(client, endpoint, writer: _RunWriter, unit: Unit, body: dict[str, Any], deadline: float) -> None:
    """The request that fills the prompt cache before a cache or prefix arm's request: kept as a filler of its unit."""
    partial = writer.partial(unit, 1, "filler")
    result = await _fetch_sequential(client, endpoint, body, partial, writer, deadline)
    _stop_if_gone(endpoint, [result], [partial])
    writer.keep(result, partial, unit=unit.key, prompt_id=unit.prompt_id, role="filler", slot=1, repeat=unit.repeat, **_arm_tag(unit, writer.manifest))


async def _fire_prefill(client, endpoint, writer: _RunWriter, unit: Unit, body: dict[str, Any], profile: EngineProfile, prompt: str,
                        deadline: float) -> tuple[list[dict], list[dict | None]]:
    """The prefill arm: for each position j, ref #1's first j tokens put into the prompt and the next token scored, one request
    at a time and cold. A position no message can hold (bytes that are not whole UTF-8) is listed in ``prefill_skipped``."""
    pieces = writer.pieces(unit.prompt_id) or []
    results, refusals = [], []
    for slot in unit.slots:
        completion, why = completion_prefix(pieces, slot)
        if completion is None:
            writer.manifest.setdefault("prefill_skipped", []).append({"prompt_id": unit.prompt_id, "slot": slot, "reason": why})
            continue
        partial = writer.partial(unit, slot, "prefill")
        result = await _fetch_sequential(client, endpoint, prefill_body(body, prompt, completion, profile), partial, writer, deadline)
        _stop_if_gone(endpoint, [result], [partial])
        results.append(result)
        refusals.append(writer.keep(result, partial, unit=unit.key, prompt_id=unit.prompt_id, role="prefill", slot=slot, repeat=unit.repeat,
                                    arm="prefill"))
    return results, refusals


def _judge_references(writer: _RunWriter, prompt_id: str, say) -> None:
    """aprender's rule: when a prompt's two m=1 references part before declared_min, no band is run for it."""
    agree = writer.reference_agreement(prompt_id)
    declared_min = writer.manifest["declared_min"]
    if agree is not None and agree < declared_min:
        reason = (f"the two m=1 references diverge at token {agree} < declared_min {declared_min}; no band is run for this prompt "
                  "(aprender's rule; --bands-anyway runs them)")
        writer.manifest.setdefault("skipped", []).append({"prompt_id": prompt_id, "reason": reason})
        say(f"{prompt_id}: {reason}")


def _stop_if_gone(endpoint: str, results: list[dict], partials: list[Path]) -> None:
    """Stop the probe when nothing answered any request of a unit, or every one was refused for its credentials:
    the unit stays unfinished for a resume, rather than every band after it being refused the same way."""
    for flag, why in (("unreachable", "the server stopped answering"), ("unauthorized", "the server refused the credentials (give --api-key)")):
        if results and all(r.get(flag) for r in results):
            for partial in partials:
                _drop_partial(partial)
            raise ServerGone(f"{endpoint}: {why}: {results[0]['error']}")


async def _fire_band(client, endpoint, base, writer: _RunWriter, unit: Unit, body, watcher: LogWatcher, gauge, interval,
                     deadline: float) -> tuple[list[dict], list[dict | None]]:
    """c requests released together; only the band's own slots are recorded as it, fillers as fillers.

    Returns each request's result and its refusal (None when kept)."""
    manifest = writer.manifest
    c = unit.band_c
    tag = _arm_tag(unit, manifest)
    if unit.arm == "mixed" or (unit.arm is None and manifest["requested"]["layout"] == "needle"):
        rng = random.Random(f"{manifest['sampler']['seed']}/{unit.key}")  # the same position when a resume fires the band again
        target = rng.randrange(c)
        others = [p["text"] for p in manifest["prompts"] if p["prompt_id"] != unit.prompt_id]
        fillers = manifest["fillers"] or others or list(DEFAULT_FILLERS)  # given, else the set's other prompts
        bodies = [body if row == target else {**body, "messages": [{"role": "user", "content": fillers[(row - (row > target)) % len(fillers)]}]}
                  for row in range(c)]
        roles = [(unit.role, 0) if row == target else ("filler", row) for row in range(c)]
    else:
        bodies, roles = [body] * c, [(unit.role, row) for row in range(c)]
    partials = [writer.partial(unit, slot, role) for role, slot in roles]
    watcher.mark()
    cache_names = writer.cache_metrics
    watched = (*cache_names, *writer.engine_metrics.values())  # one GET of /metrics reads both, before and after
    cache_before = await metrics_snapshot(client, f"{base}/metrics", watched) if watched else None
    poller = MetricsPoller(client, f"{base}/metrics", gauge, interval, writer.origin) if gauge else None
    async with poller or contextlib.nullcontext():
        if unit.arm == "serial":  # one after another: the same c requests as the copies band, never two in flight
            results = [await _fetch_sequential(client, endpoint, b, p, writer, deadline) for b, p in zip(bodies, partials)]
        else:
            opened = [open_partial(p) for p in partials]  # before the release: no file is opened between its first send and its last
            results = await asyncio.gather(*(fetch_stream(client, endpoint, b, p, writer.origin, deadline, f)
                                             for b, p, f in zip(bodies, partials, opened)))
    _stop_if_gone(endpoint, results, partials)
    await asyncio.sleep(0.05)  # let the server's last log line land
    cache_after = await metrics_snapshot(client, f"{base}/metrics", watched) if watched else None
    engine = engine_growth(writer.engine_metrics, cache_before, cache_after)
    decode = server_decode(engine, "band")
    refusals = [writer.keep(result, partial, unit=unit.key, prompt_id=unit.prompt_id, role=role, band_c=c, slot=slot, repeat=unit.repeat,
                            batch_row=row, **tag, **({"server_decode": decode} if decode else {}))
                for row, (result, (role, slot), partial) in enumerate(zip(results, roles, partials))]
    entry = {"unit": unit.key, "prompt_id": unit.prompt_id, "role": unit.role, "band_c": c, "repeat": unit.repeat, **tag, "widths": watcher.widths()}
    if engine:
        entry["engine"] = engine
    streams = stream_evidence([writer.live.pop(partial, None) for partial in partials], c)  # fillers too: they share the batch
    if streams is not None:
        entry["streams"] = streams
    if poller:
        entry.update({"running": poller.samples, "running_t_s": poller.times, "running_metric": gauge, "poll_interval_s": interval})
        if poller.errors:
            entry["poll_errors"] = poller.errors[:5] + ([f"... {len(poller.errors) - 5} more"] if len(poller.errors) > 5 else [])
    if cache_before is not None and cache_after is not None:
        entry["cache"] = {name: {"before": cache_before.get(name), "after": cache_after.get(name)}
                          for name in cache_names if name in cache_before or name in cache_after}
    manifest["m_formed"].append(entry)
    return results, refusals


async def _engine_snapshot(client, base: str, roles: dict[str, str]) -> dict[str, float] | None:
    """The engine's counters now (see ``EngineProfile.engine_metrics``); None when the profile has none or /metrics fails."""
    return await metrics_snapshot(client, f"{base}/metrics", tuple(roles.values())) if roles else None


__all__ = ["BATCH_LINE", "DEFAULT_FILLERS", "PROFILES", "Detection", "EngineProfile", "EventClock", "LogWatcher", "MetricsPoller", "ProbeError",
           "ServerGone", "ServerUnreachable", "co_resident", "detect_engine", "dry_run", "expectation_notes", "fetch_stream", "probe", "request_body",
           "running_requests", "stream_problem"]
