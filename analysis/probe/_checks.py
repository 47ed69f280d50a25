"""What the probe refuses before it fires, and the check that the server answers as a chat server at all.

Settings no run can be made of (an address that is not http(s), a time-out that is not a positive
number, a band wider than the process may hold open or than the server runs at once) are refused
before anything is sent or written; the session's first request must come back as a chat stream
with logprobs, or the probe stops rather than refuse every request after it the same way.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard, cast
from urllib.parse import urlsplit

from ._engines import Detection
from ._rundir import ProbeError

MAX_TOP_LOGPROBS = 20  # OpenAI's limit, which vLLM's default max_logprobs and bia serve keep too
FILES_PER_REQUEST = 3  # a request in flight holds its socket and its partial .sse and .times files open
FILE_HEADROOM = 64  # the manifest, the captures, the server log, /metrics polls and kept-alive connections
# What a server says of the requests it runs at once (the engine profile's effective settings) and where it says it.
SLOT_SETTINGS = {
    "total_slots": "llama.cpp's total_slots (llama-server -np)",
    "max_running_requests": "SGLang's max_running_requests (--max-running-requests)",
    "max_batch": "bia serve's max_batch (bia serve --max-batch)",
}


def check_address(url: str) -> None:
    """Refuse a URL the probe cannot send to: it must be ``http://`` or ``https://`` with a host.

    Parameters
    ----------
    url : str
        The address the probe is to send to.

    Raises
    ------
    ProbeError
        A URL with no http(s) scheme or no host, or one that does not parse (a port that is not a number, say).

    Examples
    --------
    >>> check_address("localhost:8000")
    Traceback (most recent call last):
    ...
    analysis.ProbeError: url must be an http:// or https:// address with a host, got 'localhost:8000' (no scheme: did you mean http://localhost:8000?)
    """
    hint = f" (no scheme: did you mean http://{url}?)" if isinstance(url, str) and "://" not in url else ""
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port that is not a number, or out of range, raises here
    except (TypeError, ValueError) as exc:
        raise ProbeError(f"url must be an http:// or https:// address with a host, got {url!r}: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ProbeError(f"url must be an http:// or https:// address with a host, got {url!r}{hint}")


def check_timeout(timeout: float) -> None:
    """Refuse a time-out that bounds nothing: it must be a positive, finite number of seconds.

    Parameters
    ----------
    timeout : float
        Seconds each whole request may take.

    Raises
    ------
    ProbeError
        A time-out that is not a number (a bool included), not finite, or not above 0.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ProbeError(
            f"timeout must be a positive, finite number of seconds (the deadline of each whole request), got {timeout!r}"
        )


def check_settings(
    prompts: Sequence[str | Mapping[str, Any]],
    ladder: Sequence[int],
    repeats: int,
    max_tokens: int,
    top_logprobs: int,
    layout: str,
) -> None:
    """Refuse settings no run can be made of, before anything is sent or written.

    Parameters
    ----------
    prompts : sequence of str or mapping
        The prompts: non-empty texts, or mappings whose ``text`` is one.
    ladder : sequence of int
        The batch sizes c, each a whole number of at least 1 and no wider than the process may hold open
        (:func:`check_open_files`).
    repeats, max_tokens : int
        How many times each band is fired, and each request's length; at least 1 each.
    top_logprobs : int
        Candidates per step, from 0 to ``MAX_TOP_LOGPROBS``.
    layout : {"copies", "needle", "rotating"}
        How a band is laid out.

    Raises
    ------
    ProbeError
        The first setting no run can be made of.
    """
    if layout not in ("copies", "needle", "rotating"):
        raise ProbeError(f"layout must be 'copies', 'needle' or 'rotating', got {layout!r}")
    texts = [p if isinstance(p, str) else p.get("text") if isinstance(p, Mapping) else None for p in prompts]
    if not prompts or not all(isinstance(t, str) and t for t in texts):
        raise ProbeError("prompts must be one or more non-empty texts (or {'text': ..., 'answer': ...} mappings)")
    if not ladder or not all(_whole(c) and c >= 1 for c in ladder):
        raise ProbeError(f"the ladder needs one or more whole numbers c of at least 1, got {list(ladder)}")
    for name, value in (("repeats", repeats), ("max_tokens", max_tokens)):
        if not _whole(value) or value < 1:
            raise ProbeError(f"{name} must be at least 1, got {value!r}")
    if not _whole(top_logprobs) or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise ProbeError(
            f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS} (OpenAI's limit, which servers enforce), got {top_logprobs!r}"
        )
    check_open_files(ladder)


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_open_files(ladder: Sequence[int]) -> None:
    """Refuse a band wider than this process may hold open: each request in flight holds a socket and two files.

    A ladder past the limit would otherwise fail mid-band with "Too many open files", its partial
    files left behind.

    Parameters
    ----------
    ladder : sequence of int
        The batch sizes c; the widest is checked against the process's open-file limit (``ulimit -n``), less what it
        holds and some headroom.

    Raises
    ------
    ProbeError
        The widest band needs more open files than the process may open.
    """
    try:
        import resource
    except ImportError:  # not POSIX: no limit to read
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return
    held, widest = _open_files(), max(ladder)
    room = max(0, (soft - held - FILE_HEADROOM) // FILES_PER_REQUEST)
    if widest > room:
        raise ProbeError(
            f"the ladder's c={widest} needs about {widest * FILES_PER_REQUEST} open files at once (a socket and two capture "
            f"files per request), but this process may open {soft} (ulimit -n) and holds {held}: the widest band that fits is "
            f"c={room}; raise ulimit -n or lower the ladder"
        )


def _open_files() -> int:
    """How many file descriptors this process holds now (0 where the system does not list them)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 0


def check_slots(ladder: Sequence[int], detection: Detection) -> None:
    """Refuse a band wider than the requests the server says it runs at once: no batch of that width can form.

    Only servers that say so are checked (llama.cpp's ``/props``, SGLang's server info when
    ``max_running_requests`` is set); the rest of such a band would wait in the server's queue and
    be measured as a narrower batch than its c.

    Parameters
    ----------
    ladder : sequence of int
        The batch sizes c; the widest is checked.
    detection : Detection
        What was detected of the server: its profile and the server info whose effective settings give its slots.

    Raises
    ------
    ProbeError
        The widest band is wider than the slots the server reports.
    """
    effective = detection.profile.effective(detection.info)
    widest = max(ladder)
    for name, what in SLOT_SETTINGS.items():
        slots = effective.get(name)
        if _whole(slots) and slots >= 1 and widest > slots:
            raise ProbeError(
                f"the ladder's c={widest} is wider than the {slots} requests the server runs at once (GET {detection.info_path}: "
                f"{what} = {slots}): no batch of {widest} can form; lower the ladder to at most {slots} or start the server "
                "with more"
            )


def check_first_answer(
    endpoint: str,
    role: str,
    results: list[dict[str, Any]],
    refusals: list[dict[str, Any] | None],
    tokens: tuple | None,
    top_logprobs: int,
) -> None:
    """The session's first unit is the server check: unless one of its requests came back as a chat stream (with
    logprobs, for a reference), nothing after it could count, so the probe stops and says what came back.

    Parameters
    ----------
    endpoint : str
        The chat endpoint the requests went to, named in the error.
    role : str
        The unit's role: for ``reference`` the stream must also carry logprobs.
    results : list of dict
        The unit's requests as captured.
    refusals : list of dict or None
        For each request, why it was refused (a dict with its ``error``), or None where it was kept.
    tokens : tuple, optional
        The token identities of the unit's reference as kept (None where none was); an empty tuple means its stream
        carried no logprobs.
    top_logprobs : int
        The candidates per step that were asked for, named in the error.

    Raises
    ------
    ProbeError
        Every request was refused, or a reference came back without logprobs.
    """
    kept = [result for result, refusal in zip(results, refusals) if refusal is None]
    if not kept:
        first = cast("dict[str, Any]", refusals[0])  # none kept: every request was refused, so each has its refusal
        raise ProbeError(
            f"{endpoint}: the server did not answer as an OpenAI-compatible chat stream: {first['error']}; "
            f"what came back: {came_back(first)}"
        )
    if role == "reference" and tokens == ():
        raise ProbeError(
            f"{endpoint}: the server streamed a chat completion without logprobs (asked for logprobs with top_logprobs="
            f"{top_logprobs}); bia compares tokens by their logprobs, so no request could count; the stream began "
            f"{kept[0].get('sse', '')[:120]!r}"
        )


def came_back(result: dict[str, Any]) -> str:
    """A refused or kept request's answer in a line: status, content type and first bytes.

    Parameters
    ----------
    result : dict of str to object
        The request as captured: its ``status``, ``content_type``, and ``body`` or ``sse``.

    Returns
    -------
    str

    Examples
    --------
    >>> came_back({"status": 404, "content_type": "text/html", "body": "<h1>Not Found</h1>"})
    "HTTP 404, content-type 'text/html', first bytes '<h1>Not Found</h1>'"
    """
    data = result.get("body") or result.get("sse") or ""
    parts = (
        [f"HTTP {result['status']}, content-type {result.get('content_type')!r}"]
        if result.get("status") is not None
        else []
    )
    parts.append(f"first bytes {data[:80]!r}" if data else "no body" if parts else "no HTTP answer")
    return ", ".join(parts)
