"""Firing a probe's plan: each unit's references, bands, primers and prefill requests sent and kept, with what the server's
log, /metrics and streams say of the batch each band formed."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any, cast

from ..run import Unit, plan
from ._arms import cold_fields, completion_prefix, prefill_body, prefix_primer
from ._bands import REFIRE, REFIRE_S, attempt_record, band_rows, fire_again, widest_seen
from ._capture import fetch_stream, open_partial
from ._checks import check_first_answer
from ._engines import Detection, EngineProfile
from ._requests import request_body
from ._rundir import ProbeError, _drop_partial, _RunWriter
from ._widths import (
    BATCH_LINE,
    LogWatcher,
    MetricsPoller,
    engine_growth,
    metrics_snapshot,
    server_decode,
    stream_evidence,
)


class ServerGone(ProbeError):
    """Every request of a unit found nothing listening: the probe stops, and ``resume`` goes on later."""


async def _fire_plan(
    client,
    endpoint,
    base,
    writer: _RunWriter,
    detection: Detection,
    metrics: bool,
    interval: float,
    progress,
    say,
    deadline: float,
) -> None:
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
    bands = tqdm(
        total=sum(u.role != "reference" for u in units),
        desc="bands",
        unit="band",
        disable=not show,
        file=sys.stderr,
        position=0,
    )
    sent = tqdm(
        total=sum(u.c or len(u.slots) for u in units),
        desc="requests",
        unit="request",
        disable=not show,
        file=sys.stderr,
        position=1,
    )
    try:
        for unit in units:
            bands.set_postfix_str(unit.key)
            if unit.role != "reference" and unit.prompt_id in {
                entry["prompt_id"] for entry in manifest.get("skipped", [])
            }:
                manifest["done"].append(
                    unit.key
                )  # the references disagree: aprender's rule runs no band for this prompt
                bands.update(1)  # a skipped band is done too
                sent.update(unit.c or 1)
                continue
            body = request_body(
                texts[unit.prompt_id],
                max_tokens=sampler["max_tokens"],
                top_logprobs=sampler["top_logprobs"],
                seed=sampler["seed"],
                profile=detection.profile,
                model=detection.model,
                logprobs=unit.role != "observer",
            )
            tag = _arm_tag(unit, manifest)
            if unit.role == "reference":
                slot = unit.slots[0]
                if tag:  # a run with arms: m=1 is alone and cold, so the cache arm alone says what a warm cache does
                    body = {**body, **cold_fields(detection.profile)}
                partial = writer.partial(unit, slot, "reference")
                before = await _engine_snapshot(client, base, writer.engine_metrics)
                results = [await fetch_stream(client, endpoint, body, partial, writer.origin, deadline)]
                _stop_if_gone(endpoint, results, [partial])
                decode = server_decode(
                    engine_growth(
                        writer.engine_metrics, before, await _engine_snapshot(client, base, writer.engine_metrics)
                    ),
                    "request",
                )
                refusals = [
                    writer.keep(
                        results[0],
                        partial,
                        unit=unit.key,
                        prompt_id=unit.prompt_id,
                        role="reference",
                        slot=slot,
                        **tag,
                        **({"server_decode": decode} if decode else {}),
                    )
                ]
            elif unit.role == "prefill":
                results, refusals = await _fire_prefill(
                    client, endpoint, writer, unit, body, detection.profile, texts[unit.prompt_id], deadline
                )
            else:
                if unit.arm == "repeat":  # alone and cold, as the references: only run-to-run noise can part them
                    body = {**body, **cold_fields(detection.profile)}
                if unit.arm in (
                    "cache",
                    "prefix",
                ):  # what the cache holds when the request comes: the prompt itself, or a prefix of it
                    primer = (
                        body
                        if unit.arm == "cache"
                        else {
                            **body,
                            "messages": [
                                {"role": "user", "content": prefix_primer(texts[unit.prompt_id], unit.repeat)}
                            ],
                        }
                    )
                    await _fire_primer(client, endpoint, writer, unit, primer, deadline)
                results, refusals = await _fire_band(
                    client, endpoint, base, writer, unit, body, watcher, gauge, interval, deadline, say
                )
            if not checked:
                check_first_answer(
                    endpoint,
                    unit.role,
                    results,
                    refusals,
                    writer.reference_tokens.get(unit.key),
                    sampler["top_logprobs"],
                )
                checked = True
            if unit.role == "reference" and unit.slots[0] == 1 and not manifest.get("bands_anyway"):
                _judge_references(writer, unit.prompt_id, say)
            manifest["done"].append(unit.key)
            writer.save()
            bands.update(unit.role != "reference")
            sent.update(unit.c or len(unit.slots))
    finally:
        sent.close()
        bands.close()


def _arm_tag(unit: Unit, manifest: dict[str, Any]) -> dict[str, str]:
    """The ``arm`` a request's capture envelope carries in a run with arms (references: ``reference``); nothing in a run without."""
    if manifest.get("arms") is None:
        return {}
    return {"arm": unit.arm or "reference"}


async def _fetch_sequential(
    client, endpoint, body: dict[str, Any], partial, writer: _RunWriter, deadline: float
) -> dict[str, Any]:
    """One request of a run of requests sent one after another, sent once more when the server closed the reused connection
    before answering at all (llama-server ends a kept-alive connection after a number of requests; the request then never
    reached it): such a close is the connection's fate, not the request's. Each retry is listed in the manifest's ``resent``."""
    result = await fetch_stream(client, endpoint, body, partial, writer.origin, deadline)
    if (
        "without sending a response" in result.get("error", "")
        and not result.get("sse")
        and result.get("status") is None
    ):
        writer.manifest.setdefault("resent", []).append({"partial": partial.name, "reason": result["error"]})
        result = await fetch_stream(client, endpoint, body, partial, writer.origin, deadline)
    return result


async def _fire_primer(client, endpoint, writer: _RunWriter, unit: Unit, body: dict[str, Any], deadline: float) -> None:
    """The request that fills the prompt cache before a cache or prefix arm's request: kept as a filler of its unit."""
    partial = writer.partial(unit, 1, "filler")
    result = await _fetch_sequential(client, endpoint, body, partial, writer, deadline)
    _stop_if_gone(endpoint, [result], [partial])
    writer.keep(
        result,
        partial,
        unit=unit.key,
        prompt_id=unit.prompt_id,
        role="filler",
        slot=1,
        repeat=unit.repeat,
        **_arm_tag(unit, writer.manifest),
    )


async def _fire_prefill(
    client,
    endpoint,
    writer: _RunWriter,
    unit: Unit,
    body: dict[str, Any],
    profile: EngineProfile,
    prompt: str,
    deadline: float,
) -> tuple[list[dict], list[dict | None]]:
    """The prefill arm: for each position j, ref #1's first j tokens put into the prompt and the next token scored, one request
    at a time and cold. A position no message can hold (bytes that are not whole UTF-8) is listed in ``prefill_skipped``."""
    pieces = writer.pieces(unit.prompt_id) or []
    results, refusals = [], []
    for slot in unit.slots:
        completion, why = completion_prefix(pieces, slot)
        if completion is None:
            writer.manifest.setdefault("prefill_skipped", []).append(
                {"prompt_id": unit.prompt_id, "slot": slot, "reason": why}
            )
            continue
        partial = writer.partial(unit, slot, "prefill")
        result = await _fetch_sequential(
            client, endpoint, prefill_body(body, prompt, completion, profile), partial, writer, deadline
        )
        _stop_if_gone(endpoint, [result], [partial])
        results.append(result)
        refusals.append(
            writer.keep(
                result,
                partial,
                unit=unit.key,
                prompt_id=unit.prompt_id,
                role="prefill",
                slot=slot,
                repeat=unit.repeat,
                arm="prefill",
            )
        )
    return results, refusals


def _judge_references(writer: _RunWriter, prompt_id: str, say) -> None:
    """aprender's rule: when a prompt's two m=1 references part before declared_min, no band is run for it."""
    agree = writer.reference_agreement(prompt_id)
    declared_min = writer.manifest["declared_min"]
    if agree is not None and agree < declared_min:
        reason = (
            f"the two m=1 references diverge at token {agree} < declared_min {declared_min}; no band is run for this prompt "
            "(aprender's rule; --bands-anyway runs them)"
        )
        writer.manifest.setdefault("skipped", []).append({"prompt_id": prompt_id, "reason": reason})
        say(f"{prompt_id}: {reason}")


def _stop_if_gone(endpoint: str, results: list[dict], partials: list[Path]) -> None:
    """Stop the probe when nothing answered any request of a unit, or every one was refused for its credentials:
    the unit stays unfinished for a resume, rather than every band after it being refused the same way."""
    for flag, why in (
        ("unreachable", "the server stopped answering"),
        ("unauthorized", "the server refused the credentials (give --api-key)"),
    ):
        if results and all(r.get(flag) for r in results):
            for partial in partials:
                _drop_partial(partial)
            raise ServerGone(f"{endpoint}: {why}: {results[0]['error']}")


async def _fire_band(
    client,
    endpoint,
    base,
    writer: _RunWriter,
    unit: Unit,
    body,
    watcher: LogWatcher,
    gauge,
    interval,
    deadline: float,
    say=None,
) -> tuple[list[dict], list[dict | None]]:
    """c requests released together; only the band's own slots are recorded as it, fillers as fillers.

    A band whose width evidence shows a batch narrower than its c is fired again (:func:`fire_again`: up to the run's
    ``refire`` times, within ``refire_s`` seconds); only its last attempt is kept, and its ``m_formed`` entry lists every
    attempt (``attempts``). Returns each request's result and its refusal (None when kept)."""
    manifest = writer.manifest
    c = cast(int, unit.c)  # a band or its observer twin: only references and prefill units have no c
    tag = _arm_tag(unit, manifest)
    bodies, roles, _, batch = band_rows(unit, manifest, body)
    partials = [writer.partial(unit, slot, role) for role, slot in roles]
    wheres = [
        {
            "unit": unit.key,
            "prompt_id": unit.prompt_id,
            "role": role,
            "c": c,
            "slot": slot,
            "repeat": unit.repeat,
            "batch_row": row,
            "row": row,
            "batch": batch,
            **tag,
        }
        for row, (role, slot) in enumerate(roles)
    ]
    requested = manifest["requested"]
    refire = 0 if unit.arm == "serial" else int(requested.get("refire", REFIRE))  # serial: one at a time on purpose
    started, attempts, records = time.monotonic(), [], []
    while True:
        began = time.monotonic()
        attempt = await _fire_attempt(
            client, endpoint, base, writer, unit, bodies, wheres, partials, watcher, gauge, interval, deadline
        )
        entry = {"unit": unit.key, "prompt_id": unit.prompt_id, "role": unit.role, "c": c, "repeat": unit.repeat, **tag}
        entry.update(attempt["entry"])
        widest = widest_seen(entry)
        attempts.append((attempt, entry))
        records.append(attempt_record(entry, widest, time.monotonic() - began))
        refused = any("error" in p["result"] for p in attempt["prepared"])
        spent = time.monotonic() - started
        if refused or not fire_again(c, widest, len(attempts), refire, spent, requested.get("refire_s", REFIRE_S)):
            break
        (say or (lambda line: None))(
            f"{unit.key}: the widest batch seen was m={widest}, narrower than c={c}; fired again ({len(attempts)} of {refire})"
        )
        for partial in partials:  # the attempt set aside is in memory until the last: its partial bytes go
            _drop_partial(partial)
    attempt, entry = attempts[-1]
    if len(records) > 1 or (c > 1 and refire):
        entry["attempts"] = records
    refusals = [writer.commit(prepared, partial) for prepared, partial in zip(attempt["prepared"], partials)]
    manifest["m_formed"].append(entry)
    return attempt["results"], refusals


async def _fire_attempt(
    client, endpoint, base, writer: _RunWriter, unit: Unit, bodies, wheres, partials, watcher, gauge, interval, deadline
) -> dict[str, Any]:
    """One fire of a band: its results, each stream's live window (parsed now, kept or not later), and what the log, the
    gauge, the engine's counters, the streams and the cache metrics say of the batch it formed."""
    c = cast(int, unit.c)
    watcher.mark()
    cache_names = writer.cache_metrics
    watched = (*cache_names, *writer.engine_metrics.values())  # one GET of /metrics reads both, before and after
    cache_before = await metrics_snapshot(client, f"{base}/metrics", watched) if watched else None
    poller = MetricsPoller(client, f"{base}/metrics", gauge, interval, writer.origin) if gauge else None
    async with poller or contextlib.nullcontext():
        if unit.arm == "serial":  # one after another: the same c requests as the copies band, never two in flight
            results = [
                await _fetch_sequential(client, endpoint, b, p, writer, deadline) for b, p in zip(bodies, partials)
            ]
        else:
            opened = [
                open_partial(p) for p in partials
            ]  # before the release: no file is opened between its first send and its last
            results = await asyncio.gather(
                *(
                    fetch_stream(client, endpoint, b, p, writer.origin, deadline, f)
                    for b, p, f in zip(bodies, partials, opened)
                )
            )
    _stop_if_gone(endpoint, results, partials)
    await asyncio.sleep(0.05)  # let the server's last log line land
    cache_after = await metrics_snapshot(client, f"{base}/metrics", watched) if watched else None
    engine = engine_growth(writer.engine_metrics, cache_before, cache_after)
    decode = server_decode(engine, "band")
    prepared = [
        writer.prepare(result, **where, **({"server_decode": decode} if decode else {}))
        for result, where in zip(results, wheres)
    ]  # parsed once, after the band: its window now, its line when this attempt is the one kept
    entry: dict[str, Any] = {"widths": watcher.widths()}
    if engine:
        entry["engine"] = engine
    streams = stream_evidence([p["window"] for p in prepared], c)  # fillers too: they share the batch
    if streams is not None:
        entry["streams"] = streams
    if poller:
        entry.update(
            {
                "running": poller.samples,
                "running_t_s": poller.times,
                "running_metric": gauge,
                "poll_interval_s": interval,
            }
        )
        if poller.errors:
            entry["poll_errors"] = poller.errors[:5] + (
                [f"... {len(poller.errors) - 5} more"] if len(poller.errors) > 5 else []
            )
    if cache_before is not None and cache_after is not None:
        entry["cache"] = {
            name: {"before": cache_before.get(name), "after": cache_after.get(name)}
            for name in cache_names
            if name in cache_before or name in cache_after
        }
    return {"results": results, "prepared": prepared, "entry": entry}


async def _engine_snapshot(client, base: str, roles: dict[str, str]) -> dict[str, float] | None:
    """The engine's counters now (see ``EngineProfile.engine_metrics``); None when the profile has none or /metrics fails."""
    return await metrics_snapshot(client, f"{base}/metrics", tuple(roles.values())) if roles else None
