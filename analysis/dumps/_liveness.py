"""The liveness rule: whether a stream's tokens arrived as they were produced, from what the server
declared or from the arrival times of its content chunks. ``formats/_streams_fast._liveness`` is the same rule as
a polars expression."""

from __future__ import annotations

from typing import Any

LIVE_SHARE = (
    0.5  # observed live: more than half the content chunks arrived at a time of their own (read as produced) ...
)
LIVE_SPAN = 0.2  # ... or the content chunks spread over at least a fifth of the time from the send to the last of them
# A rush: tokens read microseconds apart, late in the request's life (a front end that lags its engine, as vLLM's does on a
# busy CPU, sends a finished request's tokens at once). 0.1 ms a token is 10,000 tokens/s for one sequence, faster than
# engines decode one, llama.cpp running bia's tiny model included (a bar of 1 ms called such live streams rushes once a
# loaded machine delayed their first token); the span short against the time to the last chunk
# rules out a fast engine that streamed from the start. A stream slower than that yet faster than its engine decoded it
# is caught where the engine's rate is known (analysis.metrics.parity._rates.request_decode_rates).
RUSH_GAP_S = 0.0001


def liveness(declared: Any, times: list[float | None], tokens: int | None = None) -> tuple[str, bool | None]:
    """How a stream's liveness is known, and whether it is live (``stream_live``).

    A ``stream_mode`` the server sent decides: "live" is ``declared live``, unless the chunks came in a rush
    (below: a server can stream live and its tokens still reach the client in one read, when they pass a buffer
    on the way), any other value ``declared replay`` (never live). Otherwise the content chunks' arrival times (seconds since
    the request was sent) decide: with fewer than two, ``untimed`` (unknown); ``observed live`` when
    they spread over time (some span, and more than ``LIVE_SHARE`` of them at times of their own or a
    span of at least ``LIVE_SPAN`` of the time to the last one), unless they came less than
    ``RUSH_GAP_S`` a token apart on average (over ``tokens``, the completion's tokens the chunks
    carried, when more than the chunks: a lagging front end packs several in one chunk) and spread
    over less than ``LIVE_SPAN`` of the time to the last one: then ``observed rush`` (never live), read from one buffer, so their times show when they
    were sent, not when they were decoded; else ``observed burst``, the whole answer released at
    once after the last token (never live).

    Parameters
    ----------
    declared : object
        The ``stream_mode`` the server sent, or None.
    times : list of float or None
        The content chunks' arrival times, in seconds since the request was sent (None: not recorded).
    tokens : int, optional
        How many completion tokens the chunks carried, when known.

    Returns
    -------
    tuple of (str, bool or None)
        How it is known, and whether the stream is live (None: unknown).

    Examples
    --------
    >>> liveness(None, [0.1, 0.2, 0.3, 0.4])  # a token every 0.1 s
    ('observed live', True)
    >>> liveness(None, [2.0, 2.0, 2.0, 2.0001])  # buffered, then sent in one write
    ('observed burst', False)
    >>> liveness(None, [1.0, 1.00002, 1.00004, 1.00006])  # 20 us apart after a second of silence: a rush
    ('observed rush', False)
    >>> liveness(None, [1.0, 1.002]), liveness(None, [1.0, 1.002], tokens=64)  # 2 ms for 1 token is live; for 63, a rush
    (('observed live', True), ('observed rush', False))
    >>> liveness("live", [0.1, 0.2]), liveness("live", [0.05, 0.05002, 0.05004])  # said live; read 20 us a token apart: not decoding
    (('declared live', True), ('observed rush', False))
    >>> liveness("replay", [0.1, 0.2]), liveness(None, [None, None])
    (('declared replay', False), ('untimed', None))
    """
    if declared is not None and declared != "live":
        return "declared replay", False
    known = [t for t in times if t is not None]
    rush = len(known) >= 2 and _rushed(known, tokens)
    if (
        declared is not None
    ):  # a server's "live" holds unless the client read the tokens faster than any engine makes them
        return ("observed rush", False) if rush else ("declared live", True)
    if len(known) < 2:
        return "untimed", None
    span = known[-1] - known[0]
    if span > 0 and (len(set(known)) > LIVE_SHARE * len(known) or span >= LIVE_SPAN * known[-1]):
        return ("observed rush", False) if rush else ("observed live", True)
    return "observed burst", False


def _rushed(known: list[float], tokens: int | None) -> bool:
    """Chunks less than ``RUSH_GAP_S`` a token apart, over less than ``LIVE_SPAN`` of the time to the last of them."""
    span = known[-1] - known[0]
    return span < LIVE_SPAN * known[-1] and span < RUSH_GAP_S * (max(len(known), tokens or 0) - 1)


def timing_columns(declared: Any, times: list[float | None], tokens: int | None = None) -> dict[str, Any]:
    """A stream's timing columns from the arrival times of its content chunks (which carried ``tokens`` tokens,
    when known): the first known one, the last one, how many there were, and its liveness.

    Parameters
    ----------
    declared : object
        The ``stream_mode`` the server sent, or None.
    times : list of float or None
        The content chunks' arrival times, in seconds since the request was sent.
    tokens : int, optional
        How many completion tokens the chunks carried, when known.

    Returns
    -------
    dict
        ``ttft_s``, ``t_last_content``, ``n_content_chunks``, ``liveness`` and ``stream_live``.
    """
    how, live = liveness(declared, times, tokens)
    return {
        "ttft_s": next((t for t in times if t is not None), None),
        "t_last_content": times[-1] if times else None,
        "n_content_chunks": len(times),
        "liveness": how,
        "stream_live": live,
    }
