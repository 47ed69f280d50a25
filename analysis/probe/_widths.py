"""Which batch the server formed during a band: its log from the band's offset, and its running-requests gauge."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path
from typing import Self

import httpx

BATCH_LINE = r"Batch m=(\d+) done"


class LogWatcher:
    """Reads what a server log gained since :meth:`~LogWatcher.mark`, and every batch width in it.

    Examples
    --------
    >>> import tempfile
    >>> log = Path(tempfile.mkdtemp()) / "serve.log"
    >>> _ = log.write_text("[PMAT-044] Batch m=1 done in 3 ms\\n")
    >>> watcher = LogWatcher(log)
    >>> watcher.mark()
    >>> with log.open("a") as handle:
    ...     _ = handle.write("[PMAT-044] Batch m=4 done in 5 ms\\n[PMAT-044] Batch m=3 done in 4 ms\\n")
    >>> watcher.widths()
    [4, 3]
    """

    def __init__(self, path: str | Path | None, pattern: str = BATCH_LINE) -> None:
        self.path = Path(path) if path else None
        self.pattern = re.compile(pattern)
        if self.pattern.groups < 1:
            raise ValueError(f"log pattern {pattern!r} needs a group that captures the batch width")
        self.offset = 0

    def mark(self) -> None:
        """Remember the log's size: the next :meth:`widths` reads only what comes after."""
        self.offset = self.path.stat().st_size if self.path is not None and self.path.exists() else 0

    def widths(self) -> list[int]:
        """The width of every matching line appended since :meth:`mark`, in order."""
        if self.path is None or not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            text = handle.read().decode("utf-8", errors="replace")
        return [int(match) for match in self.pattern.findall(text)]


def metric_values(text: str, names: tuple[str, ...] | list[str]) -> dict[str, float]:
    """Each named Prometheus sample summed over its label sets; names absent from the text are left out.

    Parameters
    ----------
    text : str
        A ``/metrics`` page in the Prometheus text format.
    names : tuple or list of str
        The sample names to read.

    Returns
    -------
    dict of str to float

    Examples
    --------
    >>> text = 'vllm:prefix_cache_hits_total{model_name="a"} 12.0\\nvllm:x 1\\n'
    >>> metric_values(text, ["vllm:prefix_cache_hits_total", "vllm:y"])
    {'vllm:prefix_cache_hits_total': 12.0}
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(names)
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def metrics_snapshot(client: httpx.AsyncClient, url: str, names: tuple[str, ...]) -> dict[str, float] | None:
    """The named metrics now, or None when /metrics does not answer.

    Parameters
    ----------
    client : httpx.AsyncClient
        The client to GET with; its read time-out bounds the whole GET.
    url : str
        The server's ``/metrics`` address.
    names : tuple of str
        The sample names to read (see :func:`metric_values`).

    Returns
    -------
    dict of str to float or None
    """
    try:
        async with asyncio.timeout(
            client.timeout.read
        ):  # the whole GET, not each read: a trickling /metrics must not hold the band
            response = await client.get(url)
        return metric_values(response.text, names) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, TimeoutError):
        return None


def running_requests(text: str, metric: str) -> int | None:
    """The sum of a Prometheus gauge over its label sets (one per model served), None when absent.

    Parameters
    ----------
    text : str
        A ``/metrics`` page in the Prometheus text format.
    metric : str
        The gauge's name (the engine profile's ``running_metric``).

    Returns
    -------
    int or None
        The sum, rounded to a whole number of requests.

    Examples
    --------
    >>> running_requests('vllm:num_requests_running{model_name="a"} 3.0\\n', "vllm:num_requests_running")
    3
    """
    value = metric_values(text, [metric]).get(metric)
    return None if value is None else round(value)


def co_resident(windows: list[tuple[float, float]]) -> int:
    """The most live windows open at one instant: how many of a band's requests were decoding at the same time,
    seen from their streams (each window from its first to its last content chunk; windows that touch overlap).

    Parameters
    ----------
    windows : list of (float, float)
        Each request's live window, as (first, last) content chunk times on one clock.

    Returns
    -------
    int

    Examples
    --------
    >>> co_resident([(0.0, 1.0), (0.5, 2.0), (1.0, 1.5), (3.0, 4.0)])
    3
    >>> co_resident([(0.0, 1.0), (2.0, 3.0)]), co_resident([])
    (1, 0)
    """
    edges = sorted(
        [(start, 0) for start, _ in windows] + [(end, 1) for _, end in windows]
    )  # at a tie, a start before an end
    most = open_now = 0
    for _, is_end in edges:
        open_now += -1 if is_end else 1
        most = max(most, open_now)
    return most


def stream_evidence(windows: list[tuple[float, float] | None], c: int) -> dict | None:
    """A band's co-residency from its streams, as the manifest keeps it: ``co_resident`` (see :func:`co_resident`), how
    many of its ``c`` requests had a live window (``timed``), and the windows on the run's clock (``live_s``).
    None when no request had one (every stream refused, untimed, or released in one burst).

    Parameters
    ----------
    windows : list of (float, float) or None
        Each of the band's requests' live window (see :func:`co_resident`), None where it had none.
    c : int
        The band's width, kept as ``of``.

    Returns
    -------
    dict or None

    Examples
    --------
    >>> stream_evidence([(0.0, 1.0), None, (0.5, 2.0)], 3)
    {'co_resident': 2, 'timed': 2, 'of': 3, 'live_s': [[0.0, 1.0], None, [0.5, 2.0]]}
    >>> stream_evidence([None], 1) is None
    True
    """
    timed = [w for w in windows if w is not None]
    if not timed:
        return None
    return {
        "co_resident": co_resident(timed),
        "timed": len(timed),
        "of": c,
        "live_s": [None if w is None else [round(w[0], 6), round(w[1], 6)] for w in windows],
    }


class MetricsPoller:
    """Samples a running-requests gauge while a band is in flight: ``concurrency`` GETs of /metrics in turn, each
    started ``interval`` seconds after the last (back to back when /metrics answers slower), so that a server whose
    /metrics takes a tenth of a second under load is still read several times during a band that lasts a few
    tenths. Each sample's time (the middle of its GET) is noted on the run's clock (``origin``)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        metric: str,
        interval: float = 0.01,
        origin: float | None = None,
        concurrency: int = 3,
    ) -> None:
        self.client, self.url, self.metric, self.interval = client, url, metric, interval
        self.origin = time.monotonic() if origin is None else origin
        self.concurrency = max(1, concurrency)
        self.samples: list[int] = []
        self.times: list[float] = []
        self.errors: list[str] = []
        self._tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> Self:
        self.samples, self.times, self.errors = [], [], []
        self._found: list[tuple[float, int]] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._poll(i * self.interval)) for i in range(self.concurrency)]
        return self

    async def __aexit__(self, *exc) -> None:
        # a GET begun while the band was in flight is read to its end (up to FINISH_S): under load /metrics can take
        # longer than a short band lasts, and its answer still shows the band's requests when the gauge lags them
        self._stop.set()
        _, pending = await asyncio.wait(self._tasks, timeout=self.FINISH_S)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._found.sort()
        self.times, self.samples = [t for t, _ in self._found], [v for _, v in self._found]

    FINISH_S = 1.0

    async def _poll(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), delay)
            return
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                async with asyncio.timeout(self.client.timeout.read):
                    response = await self.client.get(self.url)
                value = running_requests(response.text, self.metric) if response.status_code == 200 else None
                if value is None:
                    self.errors.append(
                        f"HTTP {response.status_code}"
                        if response.status_code != 200
                        else f"no {self.metric} in /metrics"
                    )
                else:
                    self._found.append(
                        (round((started + time.monotonic()) / 2 - self.origin, 6), value)
                    )  # the middle of the GET
            except (httpx.HTTPError, ValueError, TimeoutError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._stop.wait(), max(0.0, self.interval * self.concurrency - (time.monotonic() - started))
                )


def engine_growth(
    roles: dict[str, str], before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, dict] | None:
    """The engine's counters around a band or a reference, as the manifest keeps them: each role (see
    ``EngineProfile.engine_metrics``) with its metric's name and values before and after. None when either snapshot
    is missing or the server exports none of them.

    Parameters
    ----------
    roles : dict of str to str
        Each role's metric name on the engine (the profile's ``engine_metrics``).
    before, after : dict of str to float, optional
        The metrics read just before and just after (see :func:`metrics_snapshot`); None where /metrics did not answer.

    Returns
    -------
    dict of str to dict or None

    Examples
    --------
    >>> engine_growth({"generated": "g_total"}, {"g_total": 10.0}, {"g_total": 74.0})
    {'generated': {'metric': 'g_total', 'before': 10.0, 'after': 74.0}}
    >>> engine_growth({"generated": "g_total"}, None, {"g_total": 74.0}) is None
    True
    """
    if before is None or after is None:
        return None
    out = {
        role: {"metric": name, "before": before.get(name), "after": after.get(name)}
        for role, name in roles.items()
        if name in before or name in after
    }
    return out or None


def server_decode(engine: dict[str, dict] | None, unit: str) -> dict | None:
    """The server's own decode rate over a band's (or a reference's) requests: 1 / their mean time per output token,
    the engine's histogram (``tpot_sum`` / ``tpot_count``) diffed around them. Timed by the engine, it holds when the
    streams arrive in a rush. ``unit`` says what it averages over ("band" or "request"). None without the histogram
    or without a finished request with two tokens.

    Parameters
    ----------
    engine : dict of str to dict, optional
        The engine's counters around the band or reference (see :func:`engine_growth`).
    unit : str
        What the rate is over, kept as ``over``: ``band`` or ``request``.

    Returns
    -------
    dict or None

    Examples
    --------
    >>> engine = {"tpot_sum": {"metric": "t_sum", "before": 1.0, "after": 1.04}, "tpot_count": {"metric": "t_count", "before": 3, "after": 7}}
    >>> server_decode(engine, "band")  # 4 requests, 0.04 s of mean times per token: 0.01 s each, 100 tokens/s
    {'tok_s': 100.0, 'tpot_s': 0.01, 'requests': 4, 'over': 'band', 'metric': 't_sum / t_count'}
    """
    engine = engine or {}
    grown = {
        role: (engine[role]["after"] - engine[role]["before"])
        for role in ("tpot_sum", "tpot_count")
        if role in engine and engine[role]["before"] is not None and engine[role]["after"] is not None
    }
    if len(grown) < 2 or grown["tpot_count"] < 1 or grown["tpot_sum"] <= 0:
        return None
    tpot = grown["tpot_sum"] / grown["tpot_count"]
    return {
        "tok_s": round(1 / tpot, 6),
        "tpot_s": round(tpot, 9),
        "requests": round(grown["tpot_count"]),
        "over": unit,
        "metric": f"{engine['tpot_sum']['metric']} / {engine['tpot_count']['metric']}",
    }
