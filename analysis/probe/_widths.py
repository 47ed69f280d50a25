"""Which batch the server formed during a band: its log from the band's offset, and its running-requests gauge."""

from __future__ import annotations

import asyncio
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

    Examples
    --------
    >>> text = 'vllm:prefix_cache_hits_total{model_name="a"} 12.0\\nvllm:x 1\\n'
    >>> metric_values(text, ["vllm:prefix_cache_hits_total", "vllm:y"])
    {'vllm:prefix_cache_hits_total': 12.0}
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted, out = set(names), {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def metrics_snapshot(client: httpx.AsyncClient, url: str, names: tuple[str, ...]) -> dict[str, float] | None:
    """The named metrics now, or None when /metrics does not answer."""
    try:
        async with asyncio.timeout(client.timeout.read):  # the whole GET, not each read: a trickling /metrics must not hold the band
            response = await client.get(url)
        return metric_values(response.text, names) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, TimeoutError):
        return None


def running_requests(text: str, metric: str) -> int | None:
    """The sum of a Prometheus gauge over its label sets (one per model served), None when absent.

    Examples
    --------
    >>> running_requests('vllm:num_requests_running{model_name="a"} 3.0\\n', "vllm:num_requests_running")
    3
    """
    value = metric_values(text, [metric]).get(metric)
    return None if value is None else round(value)


class MetricsPoller:
    """Samples a running-requests gauge every ``interval`` seconds while a band is in flight."""

    def __init__(self, client: httpx.AsyncClient, url: str, metric: str, interval: float = 0.05) -> None:
        self.client, self.url, self.metric, self.interval = client, url, metric, interval
        self.samples: list[int] = []
        self.errors: list[str] = []
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> Self:
        self.samples, self.errors = [], []
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _poll(self) -> None:
        while True:
            started = time.monotonic()
            try:
                async with asyncio.timeout(self.client.timeout.read):
                    response = await self.client.get(self.url)
                value = running_requests(response.text, self.metric) if response.status_code == 200 else None
                if value is None:
                    self.errors.append(f"HTTP {response.status_code}" if response.status_code != 200 else f"no {self.metric} in /metrics")
                else:
                    self.samples.append(value)
            except (httpx.HTTPError, ValueError, TimeoutError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
