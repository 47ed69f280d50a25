"""How fast the probe's mixed arm records a band of 128 requests, against a bare httpx client firing the same 128.

A loopback server (a separate process, plain asyncio) answers every POST with a chat-completion
stream of ``--events`` chunks with logprobs, as fast as it can. In alternating rounds of the same run:

- bare: 128 concurrent POSTs on one ``httpx.AsyncClient``, each stream read with ``aiter_bytes`` and nothing else;
- probe: ``bia probe --arms mixed --ladder 128`` as a user runs it (``analysis.probe.probe``): the needle at
  a seeded position among 127 other prompts, every request's bytes and event times written to ``partial/``
  as they arrive, kept in ``captures/requests.jsonl`` after the band.

The probe's rate is its band's recorded events over the band's recording window, read back from the
run itself: from the first request sent to the last event's arrival (each capture's ``sent_at_s`` plus
its arrival times). The references it fires first, and the dump reader's parse of each whole stream
after the band (which cannot delay an arrival), fall outside that window; the whole probe call's wall
time is printed apart.

Target (issue 24): the mixed arm records at least 80% of the bare client's events per second.

    .venv/bin/python benchmarks/bench_probe_arms.py [--band 128] [--events 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_probe_events import _serve, served  # noqa: E402  (the same server of chat chunks with logprobs)


async def _bare(url: str, band: int) -> float:
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True}

    async def one(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", url, json=body) as response:
            async for _ in response.aiter_bytes():
                pass

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=None)) as client:
        started = time.perf_counter()
        await asyncio.gather(*(one(client) for _ in range(band)))
        return time.perf_counter() - started


def _probe(url: str, band: int, folder: Path) -> tuple[float, float, int]:
    """The probe's mixed arm at c = band: (its recording window, the whole call's wall time, events recorded in the band)."""
    from analysis.probe import probe

    started = time.perf_counter()
    asyncio.run(probe(url, folder, prompts=["needle"], ladder=(band,), max_tokens=64, arms=["mixed"], engine="openai", metrics=False,
                      fillers=[f"filler {k}" for k in range(band - 1)], progress=False, say=lambda line: None))
    wall = time.perf_counter() - started
    starts, ends, events = [], [], 0
    for line in (folder / "captures" / "requests.jsonl").read_text().splitlines():
        capture = json.loads(line)
        if capture.get("role") in ("band", "filler"):
            starts.append(capture["sent_at_s"])
            ends.append(capture["sent_at_s"] + capture["arrival_times"][-1])
            events += len(capture["arrival_times"])
    assert len(starts) == band, f"the band recorded {len(starts)} of {band} requests"
    return max(ends) - min(starts), wall, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--band", type=int, default=128)
    parser.add_argument("--events", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.events, args.serve))
        return
    with tempfile.TemporaryDirectory() as tmp, served(__file__, args.events, Path(tmp)) as url:
        asyncio.run(_bare(url + "/v1/chat/completions", args.band))  # warm both paths once
        _probe(url, args.band, Path(tmp) / "warm")
        bare, window, wall, counted = [], [], [], set()
        for k in range(args.rounds):
            for kind in ("bare", "probe") if k % 2 == 0 else ("probe", "bare"):
                if kind == "bare":
                    bare.append(asyncio.run(_bare(url + "/v1/chat/completions", args.band)))
                else:
                    seconds, whole, events = _probe(url, args.band, Path(tmp) / f"r{k}")
                    window.append(seconds)
                    wall.append(whole)
                    counted.add(events)
    events = args.band * (args.events + 2)  # content chunks, usage, [DONE]
    assert counted == {events}, counted
    rates = {"bare": events / statistics.median(bare), "probe": events / statistics.median(window)}
    print(f"a band of {args.band} streams x {args.events} events, {args.rounds} alternating rounds, medians:")
    print(f"  bare  {rates['bare']:10,.0f} events/s  ({statistics.median(bare):.3f} s per band; all {', '.join(f'{t:.3f}' for t in bare)})")
    print(f"  probe {rates['probe']:10,.0f} events/s  ({statistics.median(window):.3f} s from first send to last arrival; "
          f"all {', '.join(f'{t:.3f}' for t in window)})")
    ratio = rates["probe"] / rates["bare"]
    print(f"  probe / bare = {ratio:.2f}  (target >= 0.80: {'met' if ratio >= 0.8 else 'NOT met'})")
    print(f"  the whole probe call (detection, two references, the band, the parse of every stream, the manifest): "
          f"{statistics.median(wall):.3f} s")


if __name__ == "__main__":
    main()
