"""The probe itself: :func:`probe` writes a run (or finishes one), :func:`dry_run` says what it would do."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ..core import check_writable
from ..run import plan
from ._arms import check_arms
from ._checks import check_address, check_open_files, check_slots
from ._engines import detect_engine
from ._fire import _fire_plan
from ._manifest import _apply_detection, _new_manifest, expectation_notes
from ._requests import _addresses, _client, request_body
from ._rundir import ProbeError, _load_for_resume, _now, _RunWriter, _supersede
from ._settings import ProbeSettings


async def probe(
    url: str,
    out: str | os.PathLike[str],
    settings: ProbeSettings | None = None,
    *,
    say: Callable[[str], Any] | None = None,
    **options: Any,
) -> Path:
    """Probe the chat endpoint at ``url`` (``.../v1/chat/completions`` or the server's base URL) and write a run.

    How is ``settings``, a :class:`ProbeSettings`; or its fields given as keywords (``prompts=[...], ladder=(1, 4)``), which are
    folded into one (over ``settings`` when both are given): every option below is a field of it, with the same default.

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

    Parameters
    ----------
    url : str
        The server's chat endpoint (``.../v1/chat/completions``) or its base URL; http(s) only.
    out : path
        The run directory to write, or with ``resume`` the run to finish.
    settings : ProbeSettings, optional
        How the server is probed; without it the settings are made of ``options``.
    say : callable, optional
        Takes each line to tell the user (the engine chosen and why, warnings); ``print`` to stderr by default.
    **options
        Fields of :class:`ProbeSettings` as keywords (``prompts``, ``ladder``, ``max_tokens``, ``resume``, ...), over
        ``settings`` when it is given.

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
    >>> settings = ProbeSettings(prompts=["If the argument is"], server_log="serve.log", max_tokens=32)
    >>> run_dir = asyncio.run(probe("http://127.0.0.1:8000", "runs/probe", settings))  # the same probe  # doctest: +SKIP
    """
    folder = Path(out)
    say = say or (lambda line: print(line, file=sys.stderr))
    check_address(url)
    settings = ProbeSettings.of(settings, **options)  # checked as it is made (with resume, only its time-out)
    check_writable(
        folder, "the run directory"
    )  # before any request: a file in the way, or a folder that refuses writing
    resume, engine, model = settings.resume, settings.engine, settings.model
    created = _first_missing(folder)  # what the probe may remove again when it stops having kept nothing
    base, endpoint, note = _addresses(url)
    if note:
        say(note)
    async with _client(settings.timeout, settings.api_key) as client:
        if resume:
            manifest = _load_for_resume(folder)
            check_open_files(manifest["ladder"])
            redetect = (
                manifest["requested"].get("engine") == "auto" and not manifest["done"]
            )  # nothing fired yet: the profile may still change
            if not redetect:  # the bands already fired keep their request body
                engine = (manifest.get("engine") or {}).get("profile", "auto")
                model = ((manifest.get("identity") or {}).get("model") or {}).get("path")
        elif (folder / "manifest.json").exists():
            raise ProbeError(f"{folder}: already holds a run; resume it (bia probe --resume) or choose another folder")
        detection = await detect_engine(client, base, engine, model)
        say(detection.describe())
        check_slots(manifest["ladder"] if resume else settings.ladder, detection)
        check_arms(manifest.get("arms") if resume else settings.arms, detection.profile)
        if resume:
            moved = _supersede(folder, manifest, settings.retry_refused)
            if redetect:
                _apply_detection(manifest, detection)
            effective = detection.profile.effective(detection.info)
            if effective != manifest.get("effective", {}):
                say(
                    f"warning: the server now reports {effective}, where the run began with {manifest.get('effective', {})}"
                )
            if settings.server_log is not None:  # a restarted server may log elsewhere
                manifest["requested"]["server_log"] = str(settings.server_log)
            manifest["requested"].update(refire=settings.refire, refire_s=settings.refire_s)  # how, not what, is fired
            manifest.setdefault("resumed", []).append(
                {
                    "at": _now(),
                    "url": endpoint,
                    "moved_aside": moved,
                    "said": detection.describe(),
                    "effective": effective,
                }
            )
        else:
            manifest = _new_manifest(endpoint, detection, settings)
        for line in expectation_notes(manifest):
            say(line)
        writer = _RunWriter(folder, manifest)
        watch = settings.metrics and detection.metrics
        writer.cache_metrics = detection.profile.cache_metrics if watch else ()
        writer.engine_metrics = dict(detection.profile.engine_metrics) if watch else {}
        discard = False
        try:
            await _fire_plan(
                client,
                endpoint,
                base,
                writer,
                detection,
                settings.metrics,
                settings.metrics_interval,
                settings.progress,
                say,
                settings.timeout,
            )
            manifest["complete"] = True
            manifest.pop("stopped", None)
        except (
            ProbeError
        ) as exc:  # the server is gone, refuses the key, or is no chat server: say what becomes of the run
            manifest["stopped"] = {"at": _now(), "why": f"{type(exc).__name__}: {exc}"}
            discard = created is not None and not manifest["done"]
            raise type(exc)(
                f"{exc}; nothing was kept, so {created} was removed"
                if discard
                else f"{exc}; the run stays readable, and bia probe --resume finishes it"
            ) from None
        except BaseException as exc:  # Ctrl-C, a cancelled task, a crash: say so in the manifest, then let it go on
            why = (
                "cancelled (Ctrl-C, or the caller stopped it)"
                if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt))
                else f"{type(exc).__name__}: {exc}"
            )
            manifest["stopped"] = {"at": _now(), "why": why}
            raise
        finally:
            writer.close()
            if discard:
                shutil.rmtree(cast(Path, created), ignore_errors=True)  # discard: only when the probe created a folder
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


# A dry run sends GET requests only: its time-out, unless the settings give one.
DRY_RUN_TIMEOUT_S = 30.0


async def dry_run(url: str, settings: ProbeSettings | None = None, **options: Any) -> dict[str, Any]:
    """What :func:`probe` would do with the same settings, without firing a completion or writing anything.

    ``settings`` and ``options`` are :func:`probe`'s (a :class:`ProbeSettings`, or its fields as keywords); made of keywords
    alone, the time-out is :data:`DRY_RUN_TIMEOUT_S` unless given. A dry run describes a new run: ``resume`` is left aside, so
    the plan's settings are checked as a new run's are. Detection runs (GET requests only); the answer holds the engine line,
    the first prompt's request body, the plan's units, and how many completions the run would request.

    Parameters
    ----------
    url : str
        The server's chat endpoint or its base URL, as :func:`probe` takes it.
    settings : ProbeSettings, optional
        The settings of the probe to describe; without it they are made of ``options``.
    **options
        Fields of :class:`ProbeSettings` as keywords, over ``settings`` when it is given.

    Returns
    -------
    dict of str to object
        ``said`` (the engine line), ``effective`` (what the server reports of itself), ``body`` (the first prompt's
        request), ``units`` (the plan's unit keys) and ``requests`` (the completions the run would request, primers
        included).

    Examples
    --------
    >>> import asyncio
    >>> from analysis.serve import BackgroundServer
    >>> with BackgroundServer() as server:  # doctest: +SKIP
    ...     asyncio.run(dry_run(server.url, prompts=["Hi"], ladder=(1, 4)))["requests"]
    7
    """
    check_address(url)
    if settings is None:
        options.setdefault("timeout", DRY_RUN_TIMEOUT_S)
    settings = ProbeSettings.of(settings, **options)
    if settings.resume:
        settings = settings.replace(resume=False, retry_refused=False)  # checked again, as a new run's settings
    base, endpoint, note = _addresses(url)
    if note:
        print(note, file=sys.stderr)
    async with _client(settings.timeout, settings.api_key) as client:
        detection = await detect_engine(client, base, settings.engine, settings.model)
    check_slots(settings.ladder, detection)
    check_arms(settings.arms, detection.profile)
    manifest = _new_manifest(endpoint, detection, settings)
    units = plan(manifest)
    first = manifest["prompts"][0]["text"]
    body = request_body(
        first,
        max_tokens=settings.max_tokens,
        top_logprobs=settings.top_logprobs,
        seed=settings.seed,
        profile=detection.profile,
        model=detection.model,
    )
    return {
        "said": detection.describe(),
        "effective": manifest["effective"],
        "body": body,
        "units": [u.key for u in units],
        "requests": sum(u.c or len(u.slots) for u in units) + sum(u.arm in ("cache", "prefix") for u in units),
    }  # with primers
