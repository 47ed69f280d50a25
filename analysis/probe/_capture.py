"""One streamed request: raw bytes to disk as they arrive, and the monotonic arrival time of every SSE event."""

from __future__ import annotations

import codecs
import time
from pathlib import Path
from typing import Any

import httpx
from httpx_sse._decoders import SSELineDecoder


class EventClock:
    """Stamps SSE events as their bytes arrive, by the WHATWG rules (a blank line ends an event).

    Only events that carry data count, as the dump reader counts them. Text is decoded
    incrementally, so a UTF-8 character split across two reads is still one character.

    Examples
    --------
    >>> clock = EventClock()
    >>> clock.feed(b"data: {}\\n\\ndata: [DO", 0.5), clock.feed(b"NE]\\r\\n\\r\\n: ping\\n\\n", 0.75)
    (1, 1)
    >>> clock.arrivals
    [0.5, 0.75]
    >>> clock.feed(b"data: x\\r\\r", 1.0), clock.finish(1.5)  # a CR at the end may yet be a CRLF: the event ends with the stream
    (0, 1)
    """

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._lines = SSELineDecoder()
        self._pending = False
        self._begun = False
        self.arrivals: list[float] = []

    def feed(self, data: bytes, now: float) -> int:
        """Take the next bytes read at ``now``; how many events they completed."""
        before = len(self.arrivals)
        text = self._text.decode(data)
        if not self._begun and text:
            text, self._begun = text.removeprefix("\ufeff"), True  # a leading BOM is not part of the first field name
        self._take(self._lines.decode(text), now)
        return len(self.arrivals) - before

    def finish(self, now: float) -> int:
        """The stream ended at ``now``: a last line held back (a CR that a LF might have followed) ends here."""
        before = len(self.arrivals)
        self._take(self._lines.decode(self._text.decode(b"", final=True)) + self._lines.flush(), now)
        return len(self.arrivals) - before

    def _take(self, lines: list[str], now: float) -> None:
        for line in lines:
            if line:
                self._pending = self._pending or line.partition(":")[0] == "data"  # the field name, as the reader counts
            elif self._pending:
                self.arrivals.append(now)
                self._pending = False


async def fetch_stream(client: httpx.AsyncClient, url: str, body: dict, partial: Path | None = None) -> dict[str, Any]:
    """POST ``body`` and read its SSE answer.

    Returns ``{"sse", "arrival_times", "t_sent"}`` for a whole stream, or ``{"error", "sse"}`` with
    the reason it cannot count. With ``partial``, the raw bytes go to ``partial`` (``.sse``) and the
    arrival times to its ``.times`` sibling as they arrive, so a probe killed mid-stream leaves them.
    """
    sent = time.monotonic()
    clock, chunks = EventClock(), []
    raw = partial.open("ab", buffering=0) if partial is not None else None
    times = partial.with_suffix(".times").open("a", buffering=1) if partial is not None else None
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code >= 400:
                detail = (await response.aread()).decode("utf-8", errors="replace")[:200]
                why = "the server cannot give logprobs (501)" if response.status_code == 501 else f"HTTP {response.status_code}: {detail}"
                return {"error": why}
            async for data in response.aiter_bytes():
                now = time.monotonic() - sent
                chunks.append(data)
                completed = clock.feed(data, now)
                if raw is not None:
                    raw.write(data)
                    if completed:
                        times.write(f"{now!r}\n" * completed)
            clock.finish(time.monotonic() - sent)
    except httpx.TimeoutException:
        return {"error": "timed out", "sse": _text(chunks)}
    except httpx.HTTPError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "sse": _text(chunks)}
    finally:
        if raw is not None:
            raw.close()
            times.close()
    text = _text(chunks)
    problem = stream_problem(text)
    if problem:
        return {"error": problem, "sse": text}
    return {"sse": text, "arrival_times": clock.arrivals, "t_sent": 0.0}


def _text(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", errors="replace")


def stream_problem(text: str) -> str | None:
    """Why a finished stream cannot count: cut mid-event, no [DONE], or an error event; None when whole.

    Examples
    --------
    >>> stream_problem('data: {"choices": []}\\n\\ndata: [DONE]\\n\\n') is None
    True
    >>> stream_problem('data: {"choices": []}\\n\\n')
    'the stream ended without [DONE]'
    """
    from ..dumps._sse import parse_sse

    stream = parse_sse(text)
    if stream.cut_mid_event:
        return f"the stream was cut mid-event (line {stream.trailing_line})"
    for event in stream.events:
        if event.event == "error" or event.data.startswith('{"error"'):
            return f"the server sent an error event: {event.data[:200]}"
    if not any(event.data == "[DONE]" for event in stream.events):
        return "the stream ended without [DONE]"
    return None
