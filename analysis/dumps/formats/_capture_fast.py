"""A columnar path for the big cases: JSON lines of OpenAI chat completions, bare or in capture envelopes.

Three kinds of line are read here, each giving exactly the frames the general (per-value Python)
path gives:

- a bare chat completion (``{"id", "object": "chat.completion", "choices": [...], ...}``);
- a capture envelope around one: ``{"response": {...}, "prompt_id", "role", "c", ...}``;
- a capture envelope around a streamed one: ``{"sse": "data: {...}\\n\\n...data: [DONE]\\n\\n", "arrival_times": [...], ...}``.

pyarrow's multithreaded JSON reader parses the payloads straight into Arrow with an explicit
schema (an envelope's response is cut out of its line first; a stream's events are split out of
its text and read as JSON lines of their own), and the tokens, candidates and requests are
derived with vectorized polars expressions; a thread reads, hashes and parses the next 32 MB while
the frames of the last are built. Whatever the file holds that this path does not cover
(another shape on some line, a null value, a value the checks refuse, a key whose
mere presence changes what the general path does, an SSE text that is not plain ``data:`` blocks,
blank lines) makes it return ``None``: the caller then takes the general path, which reads every
case and names every error. The general path is the authority; this one only ever agrees with it,
but for one thing: the JSON reader skips the values of keys that the schemas below do not name
without parsing them, so a key repeated in such a value, or nesting there deeper than
``_strictjson.MAX_DEPTH``, is not seen here (the general path refuses it). Keys it reads that are
repeated make the JSON reader fail, and capture envelopes are checked whole (``_check_strict``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
import pyarrow as pa

from .. import _json
from .._fastkit import (
    _RAW_SEPARATOR,
    _REFUSALS,
    _RESPONSE_GUARD,
    _SCHEMA,
    Frames,
    _ahead,
    _check_text,
    _chunks,
    _concat,
    _envelope_columns,
    _Line,
    _LineMeta,
    _Scratch,
    _table,
    _Unsupported,
)
from ._openai_fast import _check_shapes, _payload_frames, _read_bare
from ._registry import payload_formats
from ._streams_fast import _parsed_events, _sse_events, _sse_frames

# --- entry points -----------------------------------------------------------------------------


def read_jsonl(path: Path, source: str, fmt: str = "auto", limit: int | None = None) -> tuple[Frames, set[str]] | None:
    """The three frames of a JSON-lines file (its first ``limit`` bytes) and the formats found, or None when the
    general path is needed. The first line decides: a bare chat completion, or a capture envelope.

    Parameters
    ----------
    path : pathlib.Path
        The file.
    source : str
        Its name, for the ``source`` column and error messages.
    fmt : str, default "auto"
        The format asked for; anything but "auto" or "jsonl" takes the general path.
    limit : int, optional
        Read only the file's first ``limit`` bytes (None: all of it).

    Returns
    -------
    tuple of (Frames, set of str) or None
    """
    if fmt not in ("auto", "jsonl") or path.suffix in (
        ".pt",
        ".pth",
    ):  # a named payload format reads the file as one document
        return None
    with path.open("rb") as handle:
        first = handle.readline() if limit is None else handle.readline(limit)
        budget = 4096 if limit is None else min(4096, limit - len(first))
        more = handle.read(budget).strip() if budget > 0 else b""
    if not more:  # one document: the general path reads it as a single response
        return None

    envelope = _FIRST_KEY.match(first) is not None
    if not envelope:
        try:
            payload = _json.loads_payload(first)
        except ValueError:
            return None
        envelope = isinstance(payload, dict) and ("response" in payload or "sse" in payload)
        if not envelope and payload_formats(payload) != ["openai_chat"]:
            return None
    try:
        return _read_envelopes(path, source, limit) if envelope else (_read_bare(path, source, limit), {"openai_chat"})
    except _REFUSALS:
        return None


def read_capture_jsonl(path: Path, source: str, limit: int | None = None) -> tuple[Frames, set[str]] | None:
    """The three frames of a file of capture envelopes (``response`` or ``sse``) and the formats found, or None.

    Parameters
    ----------
    path : pathlib.Path
        The file.
    source : str
        Its name, for the ``source`` column and error messages.
    limit : int, optional
        Read only the file's first ``limit`` bytes (None: all of it).

    Returns
    -------
    tuple of (Frames, set of str) or None
    """
    try:
        return _read_envelopes(path, source, limit)
    except _REFUSALS:
        return None


# --- capture envelopes ------------------------------------------------------------------------


_FIRST_KEY = re.compile(rb'\{[ \t]*"(response|sse)"[ \t]*:[ \t]*')
_WS = b" \t"
_KEY_WINDOW = 1 << 16  # an envelope's keys before its response or sse: searched this far into the line


def _read_envelopes(path: Path, source: str, limit: int | None = None) -> tuple[Frames, set[str]]:
    parts: list[Frames] = []
    formats: set[str] = set()
    for frames, found in iter_capture_jsonl(path, source, limit):
        parts.append(frames)
        formats.add(found)
    return _concat(parts), formats


def is_capture_jsonl(path: Path) -> bool:
    """Whether the file's first line opens a capture envelope (``{"response": ...`` or ``{"sse": ...``), the files
    :func:`iter_capture_jsonl` reads piece by piece.

    Parameters
    ----------
    path : pathlib.Path
        The file.

    Returns
    -------
    bool
    """
    if path.suffix not in (".jsonl", ".ndjson"):
        return False
    with path.open("rb") as handle:
        return _FIRST_KEY.match(handle.readline(_KEY_WINDOW)) is not None


def iter_capture_jsonl(path: Path, source: str, limit: int | None = None) -> Iterator[tuple[Frames, str]]:
    """The frames of a file of capture envelopes, one run of consecutive envelopes of a kind at a time (at most a chunk
    of the file: memory holds one piece, not the file), each with its format.

    Parameters
    ----------
    path : pathlib.Path
        The file.
    source : str
        Its name, for the ``source`` column and error messages.
    limit : int, optional
        Read only the file's first ``limit`` bytes (None: all of it).

    Yields
    ------
    tuple of (Frames, str)
        The tokens, candidates and requests of the piece, and ``openai_chat`` or ``openai_chat_sse``.

    Raises
    ------
    DumpError
        A line no reader takes. What the columnar path leaves to the general one raises its own refusal, which
        ``read_dumps`` catches to read the whole file that way.
    """
    for kind, parsed in _ahead(_parsed_runs(path, limit)):
        if kind == "response":
            table, meta = parsed
            yield _payload_frames(table, meta, source), "openai_chat"
        else:
            table, run = parsed
            yield _sse_frames(table, run, source), "openai_chat_sse"


def _parsed_runs(path: Path, limit: int | None):
    """Each run of consecutive envelopes of one kind, checked and parsed: ("response", (table, meta)) or
    ("sse", (table, run))."""
    line = 0
    scratch = _Scratch()
    for data, size, spans in _chunks(path, limit):
        if line == 0 and data.find(b"Logprob(", 0, min(size, 262144)) != -1:
            raise _Unsupported("the general path would take this file for printed vLLM Logprob reprs")
        lines = [_envelope_line(data, a, b, line + i + 1) for i, (a, b) in enumerate(spans)]
        start = 0
        while start < len(lines):  # runs of one kind, each read in one go
            stop = start + 1
            while stop < len(lines) and lines[stop].kind == lines[start].kind:
                stop += 1
            run = lines[start:stop]
            if run[0].kind == "response":
                yield "response", _parsed_responses(data, run, scratch, spans[start:stop], line + start)
            else:
                yield "sse", (_parsed_events(run, scratch), run)
            start = stop
        line += len(spans)


def _envelope_line(data: bytes, a: int, b: int, record: int, careful: bool = False) -> _Line:
    view = memoryview(data)[a:b]
    sha = hashlib.sha256(view).hexdigest()
    first = _FIRST_KEY.match(data, a, b)
    kind, start = (first.group(1).decode(), first.end()) if first else _later_key(data, a, b)
    if kind == "response":
        return _response_line(data, a, b, start, record, sha, careful)
    return _sse_line(_sse_envelope(data, a, b, start), record, sha)


def _check_strict(raw: bytes, value: Any) -> None:
    """Leave to the general path what it refuses in parsed JSON: nesting past the limit, a repeated key."""
    try:
        _json.check_depth(raw, parsed=value)
        _json.check_unique_keys(raw, value)
    except _json.StrictJsonError:
        raise _Unsupported("nesting or a repeated key the general path refuses") from None


_DONE_END = b'[DONE]\\n\\n"'  # the end of a stream's text as JSON writers escape it


def _sse_envelope(data, a: int, b: int, start: int) -> Any:
    """An SSE envelope line (its ``sse`` value starting at ``start``) parsed, and left to the general path
    (``_check_strict``) when that refuses it.

    The stream's text, most of the line, is read as one string on its own when it ends at the line's
    last ``[DONE]\\n\\n"`` (the bytes up to there must read as one string): the repeated-key and
    nesting checks then look at the envelope's other keys only.
    """
    at = data.rfind(_DONE_END, start, b)
    if at != -1:
        end = at + len(_DONE_END)
        rest = bytes(data[a:start]) + b"null" + bytes(data[end:b])
        try:
            sse, env = orjson.loads(memoryview(data)[start:end]), orjson.loads(rest)
        except orjson.JSONDecodeError:  # the bytes up to that quote are more than one string
            env = None
        if isinstance(env, dict) and isinstance(sse, str) and "sse" in env and env["sse"] is None:
            _check_strict(rest, env)
            env["sse"] = sse
            return env
    line = bytes(data[a:b])
    try:
        env = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise _Unsupported("not JSON for orjson") from None
    _check_strict(line, env)
    return env


def _later_key(data: bytes, a: int, b: int) -> tuple[str, int]:
    """The first of "response" and "sse" that is a key of the line's object (not the first key), and where its value starts."""
    if data[a : a + 1] != b"{":
        raise _Unsupported("a line that is not a JSON object")
    found = None
    end = min(b, a + _KEY_WINDOW)
    for name in (b'"response"', b'"sse"'):
        at = data.find(name, a, end)
        while at != -1:
            start = _top_level_value(data, a, b, at, len(name))
            if start is not None:
                if found is None or at < found[0]:
                    found = (at, name[1:-1].decode(), start)
                break
            at = data.find(name, at + 1, end)
    if found is None:
        raise _Unsupported("a line that is not a capture envelope")
    return found[1], found[2]


def _top_level_value(data: bytes, a: int, b: int, at: int, length: int) -> int | None:
    """Where the value of the key at ``at`` starts, if that key follows whole pairs of the line's object; else None."""
    p = at - 1
    while p > a and data[p] in _WS:
        p -= 1
    if data[p] != ord(","):
        return None
    q = at + length
    while q < b and data[q] in _WS:
        q += 1
    if q >= b or data[q] != ord(":"):
        return None
    q += 1
    while q < b and data[q] in _WS:
        q += 1
    try:  # what precedes the key must be the line's opening brace and whole pairs
        head = orjson.loads(data[a:p] + b"}")
    except orjson.JSONDecodeError:
        return None
    return q if isinstance(head, dict) else None


def _response_line(data: bytes, a: int, b: int, start: int, record: int, sha: str, careful: bool) -> _Line:
    """Cut the response out of its envelope: the envelope's other keys parsed, the response's bytes located.

    The response ends at the closing brace after which the line holds only whole pairs and the envelope's
    brace; the candidate is trusted only because the JSON reader must then read the response's bytes as one
    object, and orjson the envelope with ``null`` in its place. Only a ``careful`` cut asks whether that brace
    closes the object of a later key instead (a search back through the response; ``_parsed_responses``).
    """
    if data[start : start + 1] != b"{":
        raise _Unsupported("a response that is not a JSON object")
    end = b
    while end > start and data[end - 1] in _WS:
        end -= 1
    if data[end - 1] != ord("}"):
        raise _Unsupported("a line that does not end its object")
    close = data.rfind(b"}", start, end - 1)
    for _ in range(64):
        if close <= start:
            break
        if _pairs_follow(data[close + 1 : end - 1]):
            pair = _object_pair_ending(data, start, close) if careful else None
            if pair is None:
                break
            close = data.rfind(
                b"}", start, pair
            )  # that brace closed a later key's object: the response ends before its pair
            continue
        close = data.rfind(b"}", start, close)
    else:
        close = -1
    if close <= start:
        raise _Unsupported("no end found for the response")
    rest = data[a:start] + b"null" + data[close + 1 : b]
    try:
        env = orjson.loads(rest)
    except orjson.JSONDecodeError:
        raise _Unsupported("the envelope is not JSON for orjson") from None
    _check_strict(rest, env)
    if env.get("response", 0) is not None or "sse" in env:
        raise _Unsupported("a second response, or an sse beside it")
    after = data[close + 1 : b]
    if b'"response"' in after or b"\\u" in after:  # a later "response" key would be the one the general path reads
        try:
            pairs = json.loads(rest, object_pairs_hook=lambda p: p)
        except ValueError:
            raise _Unsupported("the envelope is not JSON") from None
        if [key for key, _ in pairs].count("response") != 1:
            raise _Unsupported("a second response key")
    if _RAW_SEPARATOR.search(rest):
        raise _Unsupported("a line separator for str.splitlines")
    fmt = env.get("format")
    if fmt and fmt != "openai_chat":
        raise _Unsupported(f"format {fmt!r}")
    columns = _envelope_columns(env)
    return _Line(record, sha, env, "response", columns, span=(start, close + 1), explicit=bool(fmt))


def _pairs_follow(tail: bytes) -> bool:
    """Whether ``tail`` (what follows a candidate end of the response, up to the envelope's closing brace) is
    nothing, or a comma and whole pairs."""
    tail = tail.strip(_WS)
    if not tail:
        return True
    if tail[:1] != b",":
        return False
    try:
        return isinstance(orjson.loads(b"{" + tail[1:] + b"}"), dict)
    except orjson.JSONDecodeError:
        return False


_PAIR_WINDOW = 1 << 14  # an envelope key's object value after the response is looked for this far back


def _object_pair_ending(data: bytes, floor: int, close: int) -> int | None:
    """If the brace at ``close`` ends the object value of a pair ``, "key": {...}`` that starts after ``floor``,
    where that pair's comma is; else None (then ``close`` is taken to end the response, which the JSON reader
    confirms or refuses)."""
    low = max(floor + 1, close - _PAIR_WINDOW)
    tight, spaced = (
        data.rfind(b":{", low, close),
        data.rfind(b": {", low, close),
    )  # as json.dumps and orjson write a pair
    while True:
        colon = max(tight, spaced)
        if colon == -1:
            return None
        at = colon + 1 if colon == tight else colon + 2
        if colon == tight:
            tight = data.rfind(b":{", low, colon)
        else:
            spaced = data.rfind(b": {", low, colon)
        try:
            if not isinstance(orjson.loads(data[at : close + 1]), dict):
                continue
        except orjson.JSONDecodeError:
            continue
        key_end = colon - 1
        while key_end > floor and data[key_end] in _WS:
            key_end -= 1
        if data[key_end] != ord('"'):
            continue
        key_start = data.rfind(b'"', floor, key_end)
        while key_start > floor and _escaped(data, key_start):
            key_start = data.rfind(b'"', floor, key_start)
        comma = key_start - 1
        while comma > floor and data[comma] in _WS:
            comma -= 1
        if key_start > floor and data[comma] == ord(","):
            return comma


def _escaped(data: bytes, at: int) -> bool:
    """Whether the character at ``at`` follows an odd run of backslashes."""
    run = 0
    while data[at - 1 - run] == ord("\\"):
        run += 1
    return run % 2 == 1


_TIMES = {int, float, type(None)}  # an arrival time's types: a number, or null


def _sse_line(env: Any, record: int, sha: str) -> _Line:
    if not isinstance(env, dict) or not isinstance(env.get("sse"), str):
        raise _Unsupported("an sse that is not a string")
    fmt = env.get("format")
    if fmt and fmt != "openai_chat_sse":
        raise _Unsupported(f"format {fmt!r}")
    events, n = _sse_events(env["sse"])
    if _RAW_SEPARATOR.search(orjson.dumps({k: v for k, v in env.items() if k != "sse"})):
        raise _Unsupported("a line separator for str.splitlines")
    arrivals = env.get("arrival_times")
    if arrivals is not None:
        if not isinstance(arrivals, list) or len(arrivals) != n + 1:
            raise _Unsupported("arrival_times do not match the events")
        if not set(map(type, arrivals[:n])) <= _TIMES:  # orjson gives these exact types (a bool is not an int here)
            raise _Unsupported("an arrival time that is not a number")
    columns = _envelope_columns(env)
    return _Line(record, sha, env, "sse", columns, events=events, n_events=n, arrivals=arrivals, explicit=bool(fmt))


def _parsed_responses(
    data: bytes, run: list[_Line], scratch: _Scratch, spans: list[tuple[int, int]], line: int
) -> tuple[pa.Table, _LineMeta]:
    """A run of response envelopes read, their ``spans`` cut where each line's last object ends; if that is refused,
    cut again carefully (a key after the response may hold an object) and read again when that cut elsewhere.
    A cut the JSON reader reads is the one cut there is, so the careful search is paid only where it matters."""
    try:
        return _read_responses(data, run, scratch)
    except _Unsupported:
        careful = [_envelope_line(data, a, b, line + i + 1, careful=True) for i, (a, b) in enumerate(spans)]
        if [c.span for c in careful] == [r.span for r in run]:
            raise
        return _read_responses(data, careful, scratch)


def _read_responses(data: bytes, run: list[_Line], scratch: _Scratch) -> tuple[pa.Table, _LineMeta]:
    view = memoryview(data)
    spans = [cast(tuple[int, int], line.span) for line in run]  # a response line's span is always set
    buffer = scratch.lines([view[a:b] for a, b in spans])
    _check_text(buffer, np.cumsum([b - a + 1 for a, b in spans]), _RESPONSE_GUARD)
    table = _table(buffer, len(run), max(b - a for a, b in spans), _SCHEMA)
    _check_shapes(table)
    return table, _LineMeta.of(run)
