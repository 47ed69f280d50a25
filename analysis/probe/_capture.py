"""One streamed request: raw bytes to disk as they arrive, and the monotonic arrival time of every SSE event."""

from __future__ import annotations

import asyncio
import codecs
import re
import time
from pathlib import Path
from typing import Any

import httpx
from httpx_sse._decoders import SSELineDecoder

from ..core import duration


class EventClock:
    """Stamps SSE events as their bytes arrive, by the WHATWG rules, and judges the stream on the way.

    Only events that carry data count, as the dump reader counts them. Text is decoded
    incrementally, so a UTF-8 character split across two reads is still one character. One pass
    also notes what :func:`stream_problem` would find (a cut event, an error event, no [DONE]),
    so a finished stream is not parsed a second time.

    Examples
    --------
    >>> clock = EventClock()
    >>> clock.feed(b"data: {}\\n\\ndata: [DO", 0.5), clock.feed(b"NE]\\r\\n\\r\\n: ping\\n\\n", 0.75)
    (1, 1)
    >>> clock.arrivals, clock.problem()
    ([0.5, 0.75], None)
    >>> clock.feed(b"data: x\\r\\r", 1.0), clock.finish(1.5)  # a CR at the end may yet be a CRLF: the event ends with the stream
    (0, 1)
    """

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._lines = SSELineDecoder()
        self._begun = False
        self._cr = False  # a CR was seen: lines go through httpx-sse's line decoder
        self._tail = ""  # the fast path's text after the last blank line
        self._line_no = 0
        self._event_start: int | None = None  # line where the open event began
        self._event_type = ""
        self._data: list[str] = []  # the open event's data lines
        self._done = False
        self._error: str | None = None
        self.arrivals: list[float] = []

    def feed(self, data: bytes, now: float) -> int:
        """Take the next bytes read at ``now``; how many events they completed.

        Parameters
        ----------
        data : bytes
            The bytes just read from the stream (a UTF-8 character may be split across two reads).
        now : float
            When they arrived, in seconds on the caller's clock: the arrival time of each event they complete.

        Returns
        -------
        int
        """
        before = len(self.arrivals)
        self._route(self._text.decode(data), now)
        return len(self.arrivals) - before

    def finish(self, now: float) -> int:
        """The stream ended at ``now``: a last line held back (a CR that a LF might have followed) ends here.

        Parameters
        ----------
        now : float
            When the stream ended, on the caller's clock: the arrival time of any event that ends with it.

        Returns
        -------
        int
            How many events the stream's end completed.
        """
        before = len(self.arrivals)
        self._route(self._text.decode(b"", final=True), now)
        if self._cr:
            self._take(self._lines.flush(), now)
        else:
            lines = self._tail.split("\n")
            self._take(
                lines if lines[-1] else lines[:-1], now
            )  # an unterminated last line is still a line, as at flush
            self._tail = ""
        if self._event_start is not None and self._data == [
            "[DONE]"
        ]:  # a final [DONE] without its blank line ends the stream (parse_sse)
            self._take([""], now)
        return len(self.arrivals) - before

    def _route(self, text: str, now: float) -> None:
        if not self._begun and text:
            text, self._begun = text.removeprefix("\ufeff"), True  # a leading BOM is not part of the first field name
        if (
            not self._cr and "\r" in text
        ):  # CR line ends from here on: the line decoder takes over where the fast path stopped
            self._cr, text, self._tail = True, self._tail + text, ""
        if self._cr:
            self._take(self._lines.decode(text), now)
            return
        # LF-only fast path: an event is whatever precedes a blank line.
        text = self._tail + text
        end = text.rfind("\n\n") + 2  # 1 when no blank line yet
        if end < 2:
            self._tail = text
            return
        done, self._tail = text[:end], text[end:]
        n = done.count("\n\ndata:") + 1
        if done.startswith("data:") and done.count("\n") == 2 * n and "[DONE]" not in done and '{"error"' not in done:
            # No newline but the n separators, each block one data line, none [DONE] or an error: n events, counted in C.
            self._line_no += 2 * n
            self.arrivals.extend([now] * n)
            return
        blocks = done.split("\n\n")
        blocks.pop()  # the empty text after the last separator
        for block in blocks:
            if self._event_start is None and block.startswith("data:") and "\n" not in block:
                self._line_no += 2
                self.arrivals.append(now)
                value = block[6:] if block.startswith("data: ") else block[5:]
                if value[:1] in ("{", "["):
                    self._judge("", value, value)
            else:
                lines = block.split("\n")
                lines.append("")
                self._take(lines, now)

    def problem(self) -> str | None:
        """After :meth:`finish`: why the stream cannot count, worded as :func:`stream_problem` words it; None when whole."""
        if self._event_start is not None:
            return f"the stream was cut mid-event (line {self._event_start})"
        if self._error is not None:
            return f"the server sent an error event: {self._error[:200]}"
        return None if self._done else "the stream ended without [DONE]"

    def _take(self, lines: list[str], now: float) -> None:
        for line in lines:
            self._line_no += 1
            if not line:
                if self._data:
                    self.arrivals.append(now)
                    self._dispatch()
                self._event_start, self._event_type, self._data = None, "", []
                continue
            if line.startswith(":"):
                continue
            if self._event_start is None:
                self._event_start = self._line_no
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                self._data.append(value)
            elif field == "event":
                self._event_type = value

    def _dispatch(self) -> None:
        self._judge(self._event_type, self._data[0], "\n".join(self._data))

    def _judge(self, event_type: str, first: str, data: str) -> None:
        """Note an error event (the first one) or [DONE] among the dispatched events."""
        if self._error is None and (event_type == "error" or first.startswith('{"error"')):
            self._error = data
        elif data == "[DONE]":
            self._done = True


KEPT_BYTES = (
    64 * 1024
)  # an HTTP error's body kept with its refusal, and the most of an answer read before its first SSE event


def open_partial(partial: Path) -> tuple[Any, Any]:
    """A request's partial capture files, opened to append: its raw bytes (unbuffered) and its event times (line-buffered).

    A band opens every request's files before it releases them (``fetch_stream(..., opened=...)``), so no file is opened
    between the band's first send and its last: opening 2c files inside the release would spread it.

    Parameters
    ----------
    partial : Path
        The request's ``.sse`` file; the event times go to its ``.times`` sibling.

    Returns
    -------
    raw : file
        The ``.sse`` file, opened ``ab`` without buffering.
    times : file
        The ``.times`` file, opened ``a`` with line buffering.
    """
    return partial.open("ab", buffering=0), partial.with_suffix(".times").open("a", buffering=1)


async def fetch_stream(
    client: httpx.AsyncClient,
    url: str,
    body: dict,
    partial: Path | None = None,
    origin: float | None = None,
    deadline: float | None = None,
    opened: tuple[Any, Any] | None = None,
) -> dict[str, Any]:
    """POST ``body`` and read its SSE answer, all of it within ``deadline`` seconds.

    Returns ``{"sse", "arrival_times", "t_sent"}`` for a whole stream, or ``{"error", ...}`` with
    the reason it cannot count, the bytes that arrived (``sse``; an HTTP error's first 64 KiB as
    ``body``) and, when the server answered, its ``status`` and ``content_type``. Arrival times are
    seconds after the request was sent; with ``origin`` (a ``time.monotonic()`` reading),
    ``sent_at_s`` says when it was sent on that clock, so the release skew of a band's requests can
    be read. With ``partial``, the raw bytes go to ``partial`` (``.sse``) and the arrival times to
    its ``.times`` sibling as they arrive, so a probe killed mid-stream leaves them; ``opened`` gives those two files
    already open (``open_partial``), and they are closed here all the same.

    ``deadline`` covers the whole request, the stream included: httpx's time-out is per read, so a
    server that trickles bytes or keep-alive comments would never trip it. A request past its
    deadline is refused, keeping what had arrived.

    Parameters
    ----------
    client : httpx.AsyncClient
        The client the request is sent with.
    url : str
        The chat endpoint to POST to.
    body : dict
        The request's JSON body.
    partial : Path, optional
        The ``.sse`` file the raw bytes are appended to as they arrive (event times to its ``.times`` sibling); none
        are written without it (or ``opened``).
    origin : float, optional
        A ``time.monotonic()`` reading; with it the result says when the request was sent (``sent_at_s``) on that clock.
    deadline : float, optional
        Seconds the whole request may take, its stream included; no limit when None.
    opened : tuple of two files, optional
        ``partial``'s two files already open (from ``open_partial``), used instead of opening them here.

    Returns
    -------
    dict of str to object
        The whole stream, or the refusal with its reason and what arrived.
    """
    sent = time.monotonic()
    clock = EventClock()
    chunks: list[bytes] = []
    answer: dict[str, Any] = {}
    raw, times = opened if opened is not None else open_partial(partial) if partial is not None else (None, None)
    try:
        async with asyncio.timeout(deadline):
            refused = await _exchange(client, url, body, clock, chunks, answer, raw, times, sent)
        if refused is not None:
            return refused
    except TimeoutError:
        received = sum(map(len, chunks))
        arrived = (
            f"the {received} bytes that had arrived are kept with the refusal" if received else "nothing had arrived"
        )
        return {
            "error": f"the request ran past its {duration(deadline)} deadline (the time-out covers the whole request, the stream "
            f"included); {arrived}",
            "sse": _text(chunks),
            **answer,
        }
    except httpx.ConnectError as exc:  # nothing answers at the address: the server is down, not this request refused
        return {"error": f"ConnectError: {exc}", "unreachable": True}
    except httpx.TimeoutException:
        return {"error": "timed out", "sse": _text(chunks), **answer}
    except httpx.HTTPError as exc:
        return {"error": network_error(exc), "sse": _text(chunks), **answer}
    finally:
        if raw is not None:
            raw.close()
        if times is not None:  # the two are opened together: both or neither
            times.close()
    text = _text(chunks)
    problem = clock.problem() if clock.arrivals else _no_events(sum(map(len, chunks)), answer)
    if problem:
        return {"error": problem, "sse": text, **answer}
    result = {"sse": text, "arrival_times": clock.arrivals, "t_sent": 0.0}
    if origin is not None:
        result["sent_at_s"] = sent - origin
    return result


def network_error(exc: BaseException) -> str:
    """An HTTP client error in one line, with the operating system's reason where httpx's own message is empty.

    httpx words a connection reset as ``ReadError`` with no text; the reason lies at the end of the exception's causes.

    Parameters
    ----------
    exc : BaseException
        The error httpx raised; its causes (``__cause__``, then ``__context__``) are read for a reason when its own
        text is empty.

    Returns
    -------
    str

    Examples
    --------
    >>> try:
    ...     try:
    ...         raise ConnectionResetError(104, "Connection reset by peer")
    ...     except OSError as reset:
    ...         raise httpx.ReadError("") from reset
    ... except httpx.ReadError as exc:
    ...     network_error(exc)
    'ReadError: ConnectionResetError: [Errno 104] Connection reset by peer'
    >>> network_error(httpx.ReadTimeout("timed out"))
    'ReadTimeout: timed out'
    """
    text, cause, seen = str(exc), exc.__cause__ or exc.__context__, {id(exc)}
    while not text and cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        text = f"{type(cause).__name__}: {cause}" if str(cause) else ""
        cause = cause.__cause__ or cause.__context__
    return f"{type(exc).__name__}: {text or 'the connection broke, and no reason was given'}"


async def _exchange(
    client, url, body, clock: EventClock, chunks: list[bytes], answer: dict, raw, times, sent: float
) -> dict[str, Any] | None:
    """Send the request and read its answer into ``chunks`` and the clock; a refusal, or None when the stream was read to its end."""
    async with client.stream("POST", url, json=body) as response:
        answer.update(status=response.status_code, content_type=response.headers.get("content-type"))
        if response.status_code >= 400:
            return await _http_refusal(response, answer)
        received = 0
        async for data in response.aiter_bytes():
            now = time.monotonic() - sent
            chunks.append(data)
            completed = clock.feed(data, now)
            if raw is not None:
                raw.write(data)
                if completed:
                    times.write(f"{now!r}\n" * completed)
            received += len(data)
            if (
                received > KEPT_BYTES and not clock.arrivals
            ):  # an HTML page or a file, not an event stream: read no more of it
                return {"error": _no_events(received, answer), "sse": _text(chunks), **answer}
        clock.finish(time.monotonic() - sent)
    return None


def _no_events(received: int, answer: dict) -> str:
    return f"{received} bytes arrived without one SSE event (HTTP {answer['status']}, content-type {answer['content_type']!r}): not an event stream"


async def _http_refusal(response: httpx.Response, answer: dict) -> dict[str, Any]:
    """An HTTP error as the server worded it (status, reason, body), its first 64 KiB kept: what the status and body
    say, not a guess (a 501 is as often a file server that takes no POST as a server without logprobs)."""
    kept = bytearray()
    async for data in response.aiter_bytes():
        kept += data[: KEPT_BYTES - len(kept)]
        if len(kept) >= KEPT_BYTES:
            break
    text = kept.decode("utf-8", errors="replace")
    words = (
        re.sub(r"<[^>]*>", " ", text[:2000]) if "html" in (answer.get("content_type") or "") else text[:300]
    )  # an error page's words
    detail = " ".join(words.split())[:200]
    why = f"HTTP {response.status_code} {response.reason_phrase}".rstrip() + (f": {detail}" if detail else "")
    if response.status_code == 405:
        why += " (the server does not take a POST at this address)"
    refusal = {"error": why, "body": text, **answer}
    return {**refusal, "unauthorized": True} if response.status_code in (401, 403) else refusal


def _text(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", errors="replace")


def stream_problem(text: str) -> str | None:
    """Why a finished stream cannot count: cut mid-event, no [DONE], or an error event; None when whole.

    Parameters
    ----------
    text : str
        The stream's text, as captured.

    Returns
    -------
    str or None

    Examples
    --------
    >>> stream_problem('data: {"choices": []}\\n\\ndata: [DONE]\\n\\n') is None
    True
    >>> stream_problem('data: {"choices": []}\\n\\n')
    'the stream ended without [DONE]'
    """
    from ..dumps import parse_sse

    stream = parse_sse(text)
    if stream.cut_mid_event:
        return f"the stream was cut mid-event (line {stream.trailing_line})"
    for event in stream.events:
        if event.event == "error" or event.data.startswith('{"error"'):
            return f"the server sent an error event: {event.data[:200]}"
    if not any(event.data == "[DONE]" for event in stream.events):
        return "the stream ended without [DONE]"
    return None
