"""Server-sent events by the WHATWG rules (httpx-sse's decoders), with what a capture needs on top:
where each event started, whether the stream was cut mid-event, and whether [DONE] came."""

from __future__ import annotations

from dataclasses import dataclass, field

from httpx_sse._decoders import SSEDecoder, SSELineDecoder


@dataclass(frozen=True)
class Event:
    """One dispatched event: its data (lines joined by "\\n"), type, and the line it started on."""

    data: str
    event: str
    line: int
    index: int


@dataclass
class SseCapture:
    """A whole SSE capture, parsed."""

    events: list[Event] = field(default_factory=list)
    cut_mid_event: bool = False  # bytes after the last blank line: an event never finished
    trailing_line: int | None = None


def parse_sse(text: str) -> SseCapture:
    """Split an SSE capture into events.

    CR, LF and CRLF end lines; a blank line dispatches; ``:`` lines are comments; several
    ``data:`` lines join with a newline; a leading BOM is dropped. An event left open at the end
    is a cut one, except a final ``data: [DONE]``: captures saved with trailing whitespace
    stripped lose the blank line after it.

    Parameters
    ----------
    text : str
        The capture's text.

    Returns
    -------
    SseCapture
        Its events, and whether it was cut mid-event.

    Examples
    --------
    >>> s = parse_sse("data: a\\ndata: b\\n\\n: note\\r\\ndata: [DONE]\\r\\n\\r\\n")
    >>> [(e.data, e.line) for e in s.events], s.cut_mid_event
    ([('a\\nb', 1), ('[DONE]', 5)], False)
    >>> parse_sse("data: {\\"x\\": 1}\\n\\ndata: {\\"y\\"").cut_mid_event
    True
    >>> parse_sse("data: {}\\n\\ndata: [DONE]").cut_mid_event  # a final [DONE] whose blank line was stripped ends the stream
    False
    """
    text = text.removeprefix("\ufeff")
    decoder = SSELineDecoder()
    lines = decoder.decode(text) + decoder.flush() if text else []
    events = SSEDecoder()
    stream = SseCapture()
    start: int | None = None
    has_data = False  # WHATWG dispatches only an event that had a data line
    for number, line in enumerate(lines, start=1):
        if line and not line.startswith(":"):
            start = start or number
            has_data = has_data or line.partition(":")[0] == "data"
        dispatched = events.decode(line)
        if not line:
            if dispatched is not None and has_data:
                stream.events.append(Event(dispatched.data, dispatched.event, start or number, len(stream.events)))
            start, has_data = None, False
    if start is not None:
        last = events.decode("") if has_data else None
        if (
            last is not None and last.data == "[DONE]"
        ):  # saved with trailing whitespace stripped: a complete stream, not a cut one
            stream.events.append(Event(last.data, last.event, start, len(stream.events)))
        else:
            stream.cut_mid_event, stream.trailing_line = True, start
    return stream
