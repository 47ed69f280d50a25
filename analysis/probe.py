"""``bia probe``: fire the same greedy request alone and in batches of c at a live server and write a run.

Per prompt: two m=1 references one after the other, then for each c of the ladder c identical
requests released together (``repeats`` times, interleaved across c). Every response's raw bytes and
the arrival time of every SSE event (a monotonic clock, seconds since the request was sent) go to
``captures/requests.jsonl`` as the request finishes, in bia's capture envelope; the manifest is
written first and completed at the end. Which batch the server formed comes from its log, read
from the band's starting offset (aprender's ``Batch m=N done`` lines by default): every width seen
is kept, not only the largest. A request the server refuses (an HTTP error, a reset, a time-out)
is listed with its reason under ``refused`` in the manifest, and its band is then unmeasurable.
"""

from __future__ import annotations

import asyncio
import json
import platform
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from httpx_sse._decoders import SSELineDecoder

BATCH_LINE = r"Batch m=(\d+) done"


def request_body(prompt: str, *, max_tokens: int, top_logprobs: int, seed: int = 0) -> dict[str, Any]:
    """The greedy request aprender's probe sends (temperature 0, ignore_eos, streamed with usage and logprobs)."""
    return {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "seed": seed, "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": top_logprobs}


async def _one(client: httpx.AsyncClient, url: str, body: dict) -> dict[str, Any]:
    """Send one request; the raw SSE text and the arrival of each event, or why it failed."""
    sent = time.monotonic()
    decoder, chunks, arrivals, pending = SSELineDecoder(), [], [], False
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code >= 400:
                detail = (await response.aread()).decode("utf-8", errors="replace")[:200]
                why = "the server cannot give logprobs (501)" if response.status_code == 501 else f"HTTP {response.status_code}: {detail}"
                return {"error": why}
            async for text in response.aiter_text():
                now = time.monotonic() - sent
                chunks.append(text)
                for line in decoder.decode(text):
                    if line:
                        pending = pending or line.partition(":")[0] == "data"  # as the reader counts events: those with data
                    elif pending:  # a blank line ends an event: it arrived now
                        arrivals.append(now)
                        pending = False
    except httpx.TimeoutException:
        return {"error": "timed out", "sse": "".join(chunks)}
    except httpx.HTTPError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "sse": "".join(chunks)}
    text = "".join(chunks)
    problem = _stream_problem(text)
    if problem:
        return {"error": problem, "sse": text}
    return {"sse": text, "arrival_times": arrivals, "t_sent": 0.0}


def _stream_problem(text: str) -> str | None:
    """Why a finished stream cannot count: cut mid-event, no [DONE], or an error event; None when whole."""
    from .dumps._sse import parse_sse

    stream = parse_sse(text)
    if stream.cut_mid_event:
        return f"the stream was cut mid-event (line {stream.trailing_line})"
    for event in stream.events:
        if event.event == "error" or event.data.startswith('{"error"'):
            return f"the server sent an error event: {event.data[:200]}"
    if not any(event.data == "[DONE]" for event in stream.events):
        return "the stream ended without [DONE]"
    return None


def _widths(log: Path | None, offset: int, pattern: re.Pattern) -> list[int]:
    if log is None or not log.exists():
        return []
    with log.open("rb") as handle:
        handle.seek(offset)
        text = handle.read().decode("utf-8", errors="replace")
    return [int(m) for m in pattern.findall(text)]


def _size(log: Path | None) -> int:
    return log.stat().st_size if log is not None and log.exists() else 0


async def probe(
    url: str,
    out: str | Path,
    *,
    prompts: Sequence[str],
    ladder: Sequence[int] = (1, 4, 8, 16),
    repeats: int = 1,
    max_tokens: int = 64,
    top_logprobs: int = 5,
    server_log: str | Path | None = None,
    log_pattern: str = BATCH_LINE,
    timeout: float = 120.0,
    declared_min: int | None = None,
    progress: bool | None = None,
) -> Path:
    """Probe the chat endpoint at ``url`` (``.../v1/chat/completions`` or the server's base URL) and write a run."""
    endpoint = url if url.rstrip("/").endswith("/chat/completions") else url.rstrip("/") + "/v1/chat/completions"
    folder = Path(out)
    (folder / "captures").mkdir(parents=True, exist_ok=True)
    log = Path(server_log) if server_log else None
    pattern = re.compile(log_pattern)
    manifest: dict[str, Any] = {
        "run_version": 1, "producer": "bia probe", "url": endpoint,
        "identity": {"host": platform.node(), "engine": None, "model": {"path": None}},
        "sampler": {"temperature": 0.0, "seed": 0, "ignore_eos": True, "max_tokens": max_tokens, "top_logprobs": top_logprobs},
        "ladder": list(ladder), "repeats": repeats, "declared_min": declared_min if declared_min is not None else min(64, max_tokens),
        "max_constant_run": 16, "prompts": [{"prompt_id": f"p{i}", "text": p} for i, p in enumerate(prompts)],
        "requested": {"layout": "copies", "stream": True}, "m_formed": [], "refused": [], "complete": False,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")  # first, so an interrupted run stays readable
    captures = (folder / "captures" / "requests.jsonl").open("a", encoding="utf-8")

    refused_raw = folder / "refused.jsonl"  # outside captures/: partial bytes are kept, not read as responses

    def keep(result: dict, **where: Any) -> None:
        if "error" in result:
            manifest["refused"].append({**where, "reason": result["error"]})
            if result.get("sse"):
                with refused_raw.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps({**where, **result}, ensure_ascii=False) + "\n")
            return
        captures.write(json.dumps({**result, **where}, ensure_ascii=False) + "\n")
        captures.flush()

    import sys

    from tqdm import tqdm

    show = sys.stderr.isatty() if progress is None else progress
    total = len(prompts) * (2 + repeats * sum(ladder))
    bar = tqdm(total=total, desc="probe", unit="request", disable=not show, file=sys.stderr)
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            for index, prompt in enumerate(prompts):
                pid = f"p{index}"
                body = request_body(prompt, max_tokens=max_tokens, top_logprobs=top_logprobs)
                for slot in range(2):  # the two m=1 references, one after the other
                    keep(await _one(client, endpoint, body), prompt_id=pid, role="reference", slot=slot)
                    bar.update(1)
                for repeat in range(repeats):
                    for c in ladder:
                        offset = _size(log)
                        results = await asyncio.gather(*(_one(client, endpoint, body) for _ in range(c)))
                        await asyncio.sleep(0.05)  # let the server's last log line land
                        for slot, result in enumerate(results):
                            keep(result, prompt_id=pid, role="band", band_c=c, slot=slot, repeat=repeat)
                        bar.update(c)
                        bar.set_postfix_str(f"{pid} c={c}")
                        manifest["m_formed"].append({"prompt_id": pid, "band_c": c, "repeat": repeat, "widths": _widths(log, offset, pattern)})
        manifest["complete"] = True
    finally:
        bar.close()
        captures.close()
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return folder
