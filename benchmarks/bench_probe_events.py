"""How many SSE events per second the probe records, against a bare httpx read of the same streams.

A loopback server (a separate process, plain asyncio) replays 16 concurrent streams of 2,000
chat-completion chunks with logprobs as fast as it can. Two clients read them in the same run,
alternating rounds:

- bare: httpx ``aiter_bytes`` and nothing else;
- probe: ``analysis.probe.fetch_stream`` as the probe runs it, stamping every event's arrival on
  a monotonic clock, writing the raw bytes and times to ``partial/`` as they arrive, then the
  capture envelope to ``captures/requests.jsonl``.

Three more rounds add the dump reader's parse of each whole stream, which the probe runs after a
band so that a malformed event refuses the request; it is reported apart, since it comes after
the last arrival and cannot delay a timestamp.

Target (issue 6): the probe records at least 80% of the bare read's events per second.

    .venv/bin/python benchmarks/bench_probe_events.py [--streams 16] [--events 2000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson


def _payload(events: int) -> bytes:
    chunks = []
    for step in range(events):
        token = f" tok{step % 97}"
        entry = {"token": token, "logprob": -0.25 - step % 7 / 10, "bytes": list(token.encode()),
                 "top_logprobs": [{"token": f" alt{k}", "logprob": -1.0 - k, "bytes": list(f" alt{k}".encode())} for k in range(5)]}
        chunk = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": "bench", "stream_mode": "live",
                 "choices": [{"index": 0, "delta": {"content": token}, "logprobs": {"content": [entry]}, "finish_reason": None}]}
        chunks.append(f"data: {json.dumps(chunk)}\n\n")
    usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": events, "total_tokens": events + 4}}
    chunks.append(f"data: {json.dumps(usage)}\n\n")
    chunks.append("data: [DONE]\n\n")
    return "".join(chunks).encode()


async def _serve(events: int, port_file: Path) -> None:
    """Answer every POST with the same stream, written event by event (a drain every 64 events), and every GET with a
    404 (no engine to detect: a plain OpenAI server, for bench_probe_arms' detection)."""
    frames = [part + b"\n\n" for part in _payload(events).split(b"\n\n")[:-1]]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
        await reader.readexactly(length)
        if head.startswith(b"GET"):
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
            for k, frame in enumerate(frames):
                writer.write(frame)
                if k % 64 == 63:
                    await writer.drain()
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=512)
    port_file.write_text(str(server.sockets[0].getsockname()[1]))
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def served(script: str, events: int, folder: Path):
    """Run ``script --serve`` (which calls :func:`_serve`) in a child process; yields its base URL, stops it after."""
    port_file = folder / "port"
    server = subprocess.Popen([sys.executable, script, "--serve", str(port_file), "--events", str(events)])
    try:
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        server.terminate()
        server.wait()


async def _bare(client: httpx.AsyncClient, url: str, body: dict) -> int:
    async with client.stream("POST", url, json=body) as response:
        size = 0
        async for data in response.aiter_bytes():
            size += len(data)
    return size


async def _probed(client: httpx.AsyncClient, url: str, body: dict, folder: Path, slot: int, captures, check: bool) -> int:
    from analysis.probe import fetch_stream
    from analysis.probe._rundir import _parse_capture

    partial = folder / "partial" / f"s{slot}.sse"
    result = await fetch_stream(client, url, body, partial)
    if "error" in result:
        raise RuntimeError(result["error"])
    line = orjson.dumps({**result, "slot": slot})  # as the probe writes its envelope
    if check:  # the probe's parse of the whole stream, which it runs after the band
        assert _parse_capture(line, folder / "requests.jsonl")[1] is None
    captures.write(line + b"\n")
    partial.unlink()
    partial.with_suffix(".times").unlink()
    return len(result["arrival_times"])


async def _round(kind: str, url: str, streams: int, folder: Path) -> float:
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=None)) as client:
        started = time.perf_counter()
        if kind == "bare":
            await asyncio.gather(*(_bare(client, url, body) for _ in range(streams)))
        else:
            (folder / "partial").mkdir(parents=True, exist_ok=True)
            with (folder / "requests.jsonl").open("ab") as captures:
                counts = await asyncio.gather(*(_probed(client, url, body, folder, s, captures, kind == "probe+parse") for s in range(streams)))
            assert len(set(counts)) == 1, counts
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.events, args.serve))
        return
    with tempfile.TemporaryDirectory() as tmp, served(__file__, args.events, Path(tmp)) as base:
        url = base + "/v1/chat/completions"
        total = args.streams * (args.events + 2)  # content chunks, usage, [DONE]
        asyncio.run(_round("bare", url, args.streams, Path(tmp) / "warm"))  # warm up both paths once
        asyncio.run(_round("probe", url, args.streams, Path(tmp) / "warm"))
        times: dict[str, list[float]] = {"bare": [], "probe": []}
        for k in range(args.rounds):
            for kind in ("bare", "probe") if k % 2 == 0 else ("probe", "bare"):
                times[kind].append(asyncio.run(_round(kind, url, args.streams, Path(tmp) / f"r{k}")))
        checked = [asyncio.run(_round("probe+parse", url, args.streams, Path(tmp) / f"c{k}")) for k in range(3)]
    rates = {kind: total / statistics.median(seconds) for kind, seconds in times.items()}
    print(f"{args.streams} streams x {args.events} events, {args.rounds} alternating rounds, medians:")
    for kind in ("bare", "probe"):
        print(f"  {kind:5s} {rates[kind]:10,.0f} events/s  ({statistics.median(times[kind]):.3f} s per round; "
              f"all rounds {', '.join(f'{t:.3f}' for t in times[kind])})")
    ratio = rates["probe"] / rates["bare"]
    print(f"  probe / bare = {ratio:.2f}  (target >= 0.80: {'met' if ratio >= 0.8 else 'NOT met'})")
    print(f"  with the dump reader's parse of every whole stream that the probe runs after each band (it does not touch the arrival "
          f"times): {statistics.median(checked):.3f} s per round, {total / statistics.median(checked) / rates['bare']:.2f}x the bare read")


if __name__ == "__main__":
    main()
