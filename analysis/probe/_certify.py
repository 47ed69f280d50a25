"""Certify a live server in one call: probe it with as many batched requests as the bound needs, and stop as soon as the
verdict is known (``bia certify URL``).

The plan: bia's prompts at every c of the ladder in the ``rotating`` layout (c - 1 copies of the prompt and a companion
whose row and text change with every repeat), repeated until the batched requests (c > 1) sit in as many distinct batch
contexts as :func:`analysis.requests_needed` asks for the target rate at the confidence (the fewest repeats that do), or
what ``max_requests`` allows. A band seen formed narrower than its c is fired again (``refire``). While the probe runs, the run written so far is judged every ``poll_s`` seconds; the first
request that parts from m=1 (or a server that differs from itself alone) makes the verdict RED, and the probe is
stopped there. ``max_time`` stops it too; the verdict is then the judgement of what came back.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from ..metrics import requests_needed
from ..run import ROTATING, CapturesCutShort, RunError, read_run
from ..studies import Judgement, judge
from ._engines import wait_for_server
from ._probe import probe
from ._rundir import ProbeError
from ._settings import ProbeSettings


def planned_repeats(
    *, target_rate: float, confidence: float, ladder: Sequence[int], prompts: int, max_requests: int | None = None
) -> int:
    """The fewest repeats of the certificate's plan whose batched requests sit in as many distinct batch contexts as the bound
    needs, or the most that ``max_requests`` allows.

    The plan fires the ``rotating`` layout (``analysis.run.rotating_batch``): a band of c > 1 sends c - 1 copies of its
    prompt and one companion whose row and text change with every repeat, so each repeat puts each copy in a new context
    (prompt, c, row, the batch it sat in): a repeat adds ``prompts`` x the sum of c - 1 over the ladder's c > 1 contexts, and
    sends ``prompts`` x the sum of c batched requests (the companions included).

    Parameters
    ----------
    target_rate : float
        The rate of batched requests that part from m=1 the certificate is to bound.
    confidence : float
        The bound's confidence.
    ladder : sequence of int
        The batch sizes c; those above 1 count.
    prompts : int
        How many prompts the plan fires.
    max_requests : int, optional
        The most batched requests to send, companions included; at least one round of the ladder.

    Returns
    -------
    int

    Raises
    ------
    ProbeError
        A ladder with no c above 1, or a ``max_requests`` below one round of it.

    Examples
    --------
    >>> planned_repeats(target_rate=0.01, confidence=0.95, ladder=[1, 4, 8, 16], prompts=2)  # 50 contexts a repeat; 299 needed
    6
    >>> planned_repeats(target_rate=0.01, confidence=0.95, ladder=[1, 4, 8, 16], prompts=2, max_requests=200)  # 56 sent a repeat
    3
    >>> planned_repeats(target_rate=0.01, confidence=0.95, ladder=[1, 2, 4], prompts=1)  # 1 + 3 contexts a repeat
    75
    """
    per_repeat = prompts * sum(c for c in ladder if c > 1)
    if per_repeat == 0:
        raise ProbeError(f"--ladder {','.join(map(str, ladder))}: a certificate needs a batch size above 1")
    contexts = prompts * sum(c - 1 for c in ladder if c > 1)
    repeats = math.ceil(requests_needed(target_rate, confidence) / contexts)
    if max_requests is not None:
        if max_requests < per_repeat:
            raise ProbeError(
                f"--max-requests {max_requests}: one round of the ladder sends {per_repeat} batched requests; give at least that"
            )
        repeats = min(repeats, max_requests // per_repeat)
    return repeats


async def certify_server(
    url: str,
    out: str | os.PathLike[str],
    settings: ProbeSettings | None = None,
    *,
    target_rate: float = 0.01,
    confidence: float = 0.95,
    max_requests: int | None = None,
    max_time: float | None = None,
    poll_s: float = 2.0,
    say: Callable[[str], Any] | None = None,
    wait: float = 0.0,
    on_wait: Callable[[], Any] | None = None,
    **options: Any,
) -> tuple[Path, Judgement, str | None]:
    """Probe ``url`` for a certificate and judge it; returns the run directory, the judgement, and why the probe was stopped
    early (``"RED"``, ``"max-time"``) or None when it finished its plan.

    ``settings`` and ``options`` are :func:`analysis.probe.probe`'s (a :class:`ProbeSettings`, or its fields as keywords:
    ``prompts``, which must be given, ``ladder``, ``max_tokens``, ``engine``, ``server_log``, ``refire``, ``progress``...);
    their ``repeats`` is replaced by the plan's (:func:`planned_repeats`), and, unless they name arms, their layout by the
    ``rotating`` one, so that every repeat is a new batch context. ``say`` goes to the probe.

    Parameters
    ----------
    url : str
        The server's chat endpoint or its base URL.
    out : path
        The run directory to write.
    settings : ProbeSettings, optional
        The probe's settings; without it they are made of ``options``.
    target_rate : float, default 0.01
        The rate of batched requests that part from m=1 to bound.
    confidence : float, default 0.95
        The bound's confidence.
    max_requests : int, optional
        The most batched requests to plan (see :func:`planned_repeats`).
    max_time : float, optional
        Seconds after which the probe is stopped and what came back is judged; a positive number.
    poll_s : float, default 2.0
        How often, in seconds, the run written so far is judged.
    say : callable, optional
        Takes each line the probe tells (see :func:`analysis.probe.probe`).
    wait : float, default 0
        Seconds to wait for a server that is starting (:func:`wait_for_server`), after the plan is checked.
    on_wait : callable, optional
        Called once when the server is not up yet (to say that it waits).
    **options
        Fields of :class:`ProbeSettings` as keywords, over ``settings`` when it is given.

    Returns
    -------
    run_dir : Path
        The run directory.
    judgement : Judgement
        :func:`analysis.judge`'s judgement of the run at the target rate and confidence.
    stopped : str or None
        ``"RED"`` or ``"max-time"`` when the probe was stopped early, None when it finished its plan.

    Examples
    --------
    >>> import asyncio
    >>> settings = ProbeSettings(prompts=["If the argument is"], ladder=(1, 4), max_tokens=16)
    >>> run_dir, judgement, stopped = asyncio.run(certify_server("http://127.0.0.1:8000", "runs/certify", settings,
    ...                                                          max_requests=200))  # doctest: +SKIP
    """
    if max_time is not None and not (math.isfinite(max_time) and max_time > 0):
        raise ProbeError(f"--max-time takes a positive number of seconds, got {max_time!r}")
    settings = ProbeSettings.of(settings, **options)
    repeats = planned_repeats(
        target_rate=target_rate,
        confidence=confidence,
        ladder=settings.ladder,
        prompts=len(settings.prompts),
        max_requests=max_requests,
    )
    if wait > 0:  # a server that is starting (README's paste starts it and certifies it at once)
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
            await wait_for_server(client, url, wait, on_wait=on_wait)
    out = Path(out)
    planned = settings.replace(repeats=repeats, **({} if settings.arms is not None else {"layout": ROTATING}))
    task = asyncio.ensure_future(probe(url, out, planned, say=say))
    started, stopped = time.monotonic(), None
    while not task.done():
        await asyncio.wait({task}, timeout=poll_s)
        if task.done():
            break
        if max_time is not None and time.monotonic() - started > max_time:
            stopped = "max-time"
        elif await asyncio.to_thread(_red_so_far, out, target_rate, confidence):
            stopped = "RED"
        if stopped:
            task.cancel()
            break
    try:
        await task
    except asyncio.CancelledError:
        if stopped is None:  # cancelled from outside (Ctrl-C): not ours to swallow
            raise
    return out, judge(read_run(out), target_rate=target_rate, confidence=confidence), stopped


def _red_so_far(out: Path, target_rate: float, confidence: float) -> bool:
    """Whether the run written so far is already RED: a batched request parted, or the server differs from itself alone."""
    if not (out / "manifest.json").is_file():
        return False
    try:
        with warnings.catch_warnings():  # a line being appended as we read is no cut capture: said by no note
            warnings.simplefilter("ignore", CapturesCutShort)
            run = read_run(out, cache=False)  # the captures grow while we read: never cache a snapshot of them
        return judge(run, target_rate=target_rate, confidence=confidence).verdict == "RED"
    except (RunError, OSError, ValueError):  # a manifest being replaced, a line being written: judged at the next poll
        return False
