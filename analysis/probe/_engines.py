"""Engine profiles: what each server family takes in the request body and where it counts running requests.

Detection only reads (GET): ``/v1/models`` (``owned_by`` names vLLM, SGLang and llama.cpp), then
each engine's own endpoint (``/version`` for vLLM, ``/server_info`` or the older ``/get_server_info`` for
SGLang, ``/props`` for llama.cpp, ``/health`` for bia serve) and the metric names on
``/metrics``. What it found is kept as evidence and shown, so a wrong guess can be seen and
overridden with ``engine=``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..core import duration
from ._rundir import ProbeError


def _tls_mismatch(error: Exception) -> bool:
    """Whether a connection failed in the TLS handshake because the other side spoke plain HTTP (OpenSSL's words for it)."""
    said = str(error).upper()
    return any(
        sign in said for sign in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL", "RECORD_LAYER_FAILURE")
    )


class ServerUnreachable(ProbeError):
    """Nothing answers at the server's address (the connection is refused, the host not found, or no connection within the
    time-out): no engine to detect, no request fired."""


@dataclass(frozen=True)
class EngineProfile:
    """How to ask one engine family for a greedy, scored stream, and where its batch widths show.

    Attributes
    ----------
    name : str
        Short name, as ``bia probe --engine`` takes it.
    label : str
        How the engine is named to people.
    body : dict
        Fields added to aprender's greedy body (``ignore_eos`` where the engine takes it, vLLM's
        ``return_tokens_as_token_ids``).
    running_metric : str or None
        The Prometheus gauge of requests running in the batch, sampled during each band.
    info_paths : tuple of str
        Endpoints that describe the server's configuration (the first that answers is kept).
    settings : dict
        Effective settings read from that description: name -> path of keys into its JSON.
    cache_metrics : tuple of str
        Prefix-cache counters and gauges read before and after each band: a cache hit is a
        confound, so a band that hit the cache says so.
    cold : dict or None
        Fields that make one request skip the prompt cache (a cold prefill), for the m=1 references
        and the repeat and prefill arms of a run with arms; ``"{salt}"`` in a value becomes a string
        unique to the request. None where the engine takes no such field: the cache arm is refused.
    prefill : str or None
        How the prefill arm words "the prompt, then the first j completion tokens" for this engine:
        ``"assistant"`` (the tokens as a last assistant message, which the server continues),
        ``"continue"`` (the same, with vLLM's ``continue_final_message``), ``"concat"`` (appended to
        the prompt: bia serve applies no chat template). None where it cannot: the arm is refused.
    engine_metrics : dict
        The engine's own counters, read before and after each band and each reference, by role:
        ``generated`` (tokens generated), ``steps`` (engine steps that produced output),
        ``tpot_sum`` and ``tpot_count`` (a histogram of each finished request's mean time per
        output token, timed by the engine). Their growth is evidence that survives a front end
        lagging its engine: the batch width (generated / steps, see
        ``analysis.run.width_evidence``) and the server's decode rate.
    """

    name: str
    label: str
    body: dict[str, Any] = field(default_factory=dict)
    running_metric: str | None = None
    info_paths: tuple[str, ...] = ()
    settings: dict[str, tuple[str, ...]] = field(default_factory=dict)
    cache_metrics: tuple[str, ...] = ()
    cold: dict[str, Any] | None = None
    prefill: str | None = None
    engine_metrics: dict[str, str] = field(default_factory=dict)

    def effective(self, info: Any) -> dict[str, Any]:
        """The settings this server reports about itself, from its description (missing ones left out).

        Parameters
        ----------
        info : object
            The server's description as JSON (what its first answering ``info_paths`` endpoint gave), or None.

        Returns
        -------
        dict of str to object

        Examples
        --------
        >>> PROFILES["sglang"].effective({"enable_deterministic_inference": True, "tp_size": 1})
        {'deterministic_inference': True, 'tp_size': 1}
        """
        out = {}
        for name, path in self.settings.items():
            value = info
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                out[name] = value
        return out


# Where each engine's names come from (checked 2026-11-30 against each engine's source; a name a
# server does not export is simply absent from its snapshot, so names of older releases may stay):
# - vLLM (V1 engine): vllm/v1/metrics/loggers.py, PrometheusStatLogger: the gauge vllm:num_requests_running
#   and the counters vllm:prefix_cache_hits / vllm:prefix_cache_queries (tokens; exported with _total,
#   since v0.9). vllm:gpu_prefix_cache_hit_rate is the V0 engine's gauge (deprecated in 0.8, gone with V0),
#   kept for old servers. GET /version answers {"version": ...} (vllm/entrypoints/.../basic.py); /v1/models
#   says owned_by "vllm" (ModelCard). The engine's counters, same file: vllm:generation_tokens (counter,
#   IterationStats.num_generation_tokens per step), vllm:iteration_tokens_total (histogram, one observation per
#   engine step with output: vllm/v1/engine/async_llm.py makes IterationStats only when a step has outputs),
#   vllm:request_time_per_output_token_seconds (histogram of each finished request's decode time / (tokens - 1),
#   from the engine core's own timestamps: vllm/v1/metrics/stats.py, update_from_finished_request).
# - SGLang: python/sglang/srt/observability/metrics_collector.py: the gauges sglang:num_running_reqs and
#   sglang:cache_hit_rate, the counters sglang:cached_tokens_total and sglang:prompt_tokens_total (labelled by
#   cache_source in newer releases; the labels are summed). Server info: /server_info (current) and
#   /get_server_info (deprecated, still served), the server's arguments at top level (http_server.py).
# - Cold requests and the prefill arm: vLLM takes cache_salt (a salted request shares no cached block) and
#   continue_final_message with add_generation_prompt false (vllm/entrypoints/openai/protocol.py); llama.cpp takes
#   cache_prompt per request (tools/server/server-schema.cpp) and continues a last assistant message; it returns no
#   logprobs for prompt tokens (no prompt_logprobs, and /completions refuses echo), so the prefill arm scores
#   position j as the one token asked for after a prompt holding the first j. SGLang's prompt logprobs
#   (logprob_start_len) are on its native /generate, which bia probe does not speak: the arm is refused there.
# - llama.cpp: tools/server/server-task.cpp (the llama.cpp llama-cpp-python 0.3.36 vendors, upstream
#   0c1e570): "llamacpp:" before the gauge requests_processing and the counters prompt_tokens_total (now
#   "excluding cached tokens") and prompt_tokens_cached_total (newer than tools/server/README.md's table,
#   absent from older builds); /props has total_slots and build_info; /v1/models says owned_by "llamacpp".
PROFILES: dict[str, EngineProfile] = {
    profile.name: profile
    for profile in (
        EngineProfile(
            "vllm",
            "vLLM",
            {"ignore_eos": True, "return_tokens_as_token_ids": True},
            "vllm:num_requests_running",
            ("/version",),
            {"version": ("version",)},
            ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_hit_rate"),
            {"cache_salt": "{salt}"},
            "continue",
            {
                "generated": "vllm:generation_tokens_total",
                "steps": "vllm:iteration_tokens_total_count",
                "tpot_sum": "vllm:request_time_per_output_token_seconds_sum",
                "tpot_count": "vllm:request_time_per_output_token_seconds_count",
            },
        ),
        EngineProfile(
            "sglang",
            "SGLang",
            {"ignore_eos": True},
            "sglang:num_running_reqs",
            ("/server_info", "/get_server_info"),
            {
                "deterministic_inference": ("enable_deterministic_inference",),
                "radix_cache_disabled": ("disable_radix_cache",),
                "attention_backend": ("attention_backend",),
                "max_running_requests": ("max_running_requests",),
                "tp_size": ("tp_size",),
                "dtype": ("dtype",),
            },
            ("sglang:cache_hit_rate", "sglang:cached_tokens_total", "sglang:prompt_tokens_total"),
        ),
        EngineProfile(
            "llamacpp",
            "llama.cpp server",
            {"ignore_eos": True},
            "llamacpp:requests_processing",
            ("/props",),
            {"total_slots": ("total_slots",), "build_info": ("build_info",)},
            ("llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_tokens_total"),
            {"cache_prompt": False},
            "assistant",
        ),
        EngineProfile("apr", "apr serve (aprender)", {"ignore_eos": True}, None),
        EngineProfile(
            "bia",
            "bia serve",
            {"ignore_eos": True},
            "bia:num_requests_running",
            ("/health",),
            {
                "kernel_mode": ("kernel_mode",),
                "dtype": ("dtype",),
                "device": ("device",),
                "batch_window_ms": ("batch_window_ms",),
                "max_batch": ("max_batch",),
            },
            (),
            {},
            "concat",
        ),
        EngineProfile("openai", "a plain OpenAI-compatible server", {}, None),
    )
}

_OWNERS = {
    "vllm": "vllm",
    "sglang": "sglang",
    "llamacpp": "llamacpp",
    "llama.cpp": "llamacpp",
    "apr": "apr",
    "aprender": "apr",
    "bia": "bia",
}
_METRIC_PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "llamacpp:": "llamacpp", "bia:": "bia"}


@dataclass(frozen=True)
class Detection:
    """The profile chosen for a server, the model it serves, and what showed it."""

    profile: EngineProfile
    model: str | None
    evidence: tuple[str, ...]
    metrics: bool  # the server answers /metrics
    info_path: str | None = None  # where the server described its configuration
    info: Any = None  # that description, as JSON

    def describe(self) -> str:
        """One line for people: the engine, why, and what the probe will do with it.

        Examples
        --------
        >>> Detection(PROFILES["vllm"], "m", ("GET /v1/models: owned_by 'vllm'",), True).describe()
        "engine: vLLM (GET /v1/models: owned_by 'vllm'); model 'm'; body adds ignore_eos, return_tokens_as_token_ids; widths also from /metrics vllm:num_requests_running"
        """
        why = "; ".join(self.evidence) or "nothing identified the engine"
        adds = ", ".join(self.profile.body) or "nothing"
        line = f"engine: {self.profile.label} ({why}); model {self.model!r}; body adds {adds}"
        if self.metrics and self.profile.running_metric:
            line += f"; widths also from /metrics {self.profile.running_metric}"
        return line


async def _get(client: httpx.AsyncClient, url: str, as_json: bool = True) -> tuple[int | None, Any]:
    """A GET's status (None when nothing answered, or not within the client's time-out: then the error in place of the body) and
    its JSON body (None unless a 200 with JSON; its text when ``as_json`` is false)."""
    try:
        async with asyncio.timeout(
            client.timeout.read
        ):  # the whole GET: httpx's time-out is per read, and a trickle never trips it
            response = await client.get(url)
    except (httpx.HTTPError, TimeoutError) as exc:
        return None, exc
    if response.status_code != 200:
        return response.status_code, None
    if not as_json:
        return 200, response.text
    try:
        return 200, response.json()
    except ValueError:
        return 200, None


async def _get_json(client: httpx.AsyncClient, url: str) -> Any:
    status, body = await _get(client, url)
    return body if status == 200 else None


_STARTING = {502, 503, 504}  # a proxy before a server still loading, or llama.cpp's "Loading model"


async def wait_for_server(
    client: httpx.AsyncClient, base_url: str, seconds: float, *, on_wait: Callable[[], None] | None = None
) -> float:
    """Wait until the server at ``base_url`` answers ``GET /v1/models`` with anything but "starting", for at most ``seconds``.

    A server that is starting refuses the connection, or answers 502, 503 or 504 while its model loads; any other
    answer (a 404 included) means it is up, and what it says is for :func:`detect_engine` to read.

    Parameters
    ----------
    client : httpx.AsyncClient
        The client the GET requests are sent with.
    base_url : str
        The server's base URL (no ``/v1/...``).
    seconds : float
        The longest wait; 0 asks once.
    on_wait : callable, optional
        Called once, when the first answer says the server is not up yet (to say that it waits).

    Returns
    -------
    float
        The seconds waited (0.0 when it answered at once).

    Raises
    ------
    ServerUnreachable
        Still no connection, or still starting, after ``seconds``.

    Examples
    --------
    >>> import asyncio
    >>> calls = []
    >>> def answer(request):
    ...     calls.append(request.url.path)
    ...     return httpx.Response(503 if len(calls) < 3 else 200, json={"data": []})
    >>> async def main():
    ...     async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
    ...         return await wait_for_server(client, "http://gpu-box:8000", 10, on_wait=lambda: print("waiting"))
    >>> waited = asyncio.run(main())
    waiting
    >>> len(calls), waited > 0
    (3, True)
    """
    base = base_url.rstrip("/")
    loop = asyncio.get_running_loop()
    started = loop.time()
    said = False
    while True:
        status, body = await _get(client, f"{base}/v1/models")
        refused = isinstance(body, (httpx.ConnectError, httpx.ConnectTimeout))
        if not refused and status not in _STARTING:
            return loop.time() - started
        waited = loop.time() - started
        if waited >= seconds:
            why = f"{type(body).__name__}: {body or 'no connection'}" if refused else f"HTTP {status}, starting"
            raise ServerUnreachable(
                f"nothing answers at {base} after {duration(round(waited))} ({why}); is the server running, on this host "
                "and port? "
                "(--wait SECONDS waits longer for one that is starting)"
            )
        if not said and on_wait is not None:
            on_wait()
        said = True
        await asyncio.sleep(min(0.5, max(0.0, seconds - waited)))


async def detect_engine(
    client: httpx.AsyncClient, base_url: str, engine: str = "auto", model: str | None = None
) -> Detection:
    """Choose the engine profile of the server at ``base_url`` (or take ``engine`` as given) and find its model.

    :class:`ServerUnreachable` when no connection can be made to it at all.

    Parameters
    ----------
    client : httpx.AsyncClient
        The client the GET requests are sent with.
    base_url : str
        The server's base URL (no ``/v1/...``).
    engine : str, default "auto"
        ``auto`` (detected from ``/v1/models``, each engine's own endpoint, then the metric names on ``/metrics``), or a
        key of ``PROFILES`` to take as given.
    model : str, optional
        The model name to send; the server's first model by default.

    Returns
    -------
    Detection

    Raises
    ------
    ServerUnreachable
        No connection can be made to the server, or an https:// address answered in plain HTTP.
    ValueError
        An ``engine`` that is neither ``auto`` nor a known profile.

    Examples
    --------
    >>> import asyncio
    >>> def answer(request):
    ...     if request.url.path == "/v1/models":
    ...         return httpx.Response(200, json={"data": [{"id": "qwen", "owned_by": "sglang"}]})
    ...     return httpx.Response(404)
    >>> async def main():
    ...     async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
    ...         return await detect_engine(client, "http://gpu-box:30000")
    >>> found = asyncio.run(main())
    >>> found.profile.name, found.model, found.evidence
    ('sglang', 'qwen', ("GET /v1/models: owned_by 'sglang'",))
    """
    if engine != "auto" and engine not in PROFILES:
        raise ValueError(f"engine must be 'auto' or one of {sorted(PROFILES)}, got {engine!r}")
    base = base_url.rstrip("/")
    evidence: list[str] = []
    votes: list[str] = []
    status, models = await _get(client, f"{base}/v1/models")
    if isinstance(models, httpx.ConnectError) and base.startswith("https://") and _tls_mismatch(models):
        raise ServerUnreachable(
            f"the server at {base} answered, but not in TLS ({models}): it speaks plain HTTP; give "
            f"http://{base.removeprefix('https://')}"
        )
    if isinstance(
        models, (httpx.ConnectError, httpx.ConnectTimeout)
    ):  # no connection at all, not a server slow to answer
        raise ServerUnreachable(
            f"nothing answers at {base} ({type(models).__name__}: {models or 'no connection'}); "
            "is the server running, on this host and port?"
        )
    if status in (401, 403):
        evidence.append(f"GET /v1/models: HTTP {status}, the server wants credentials (give --api-key)")
    entries = models.get("data") if isinstance(models, dict) else None
    if isinstance(entries, list) and entries and isinstance(entries[0], dict):
        model = model or (entries[0].get("id") if isinstance(entries[0].get("id"), str) else None)
        owner = str(entries[0].get("owned_by", "")).lower()
        if owner in _OWNERS:
            votes.append(_OWNERS[owner])
            evidence.append(f"GET /v1/models: owned_by {owner!r}")
    metrics_text = await _metrics_text(client, base)
    if engine == "auto" and not votes:
        votes += await _own_endpoints(client, base, evidence)
    if engine == "auto" and not votes and metrics_text:
        for prefix, name in _METRIC_PREFIXES.items():
            if f"\n{prefix}" in f"\n{metrics_text}":
                votes.append(name)
                evidence.append(f"GET /metrics: metric names start with {prefix!r}")
                break
    if engine != "auto":
        chosen = PROFILES[engine]
        evidence = [f"chosen by the caller (engine={engine!r})"]
    else:
        chosen = PROFILES[votes[0]] if votes else PROFILES["openai"]
    info_path, info = None, None
    for path in chosen.info_paths:
        info = await _get_json(client, f"{base}{path}")
        if info is not None:
            info_path = path
            break
    return Detection(chosen, model, tuple(evidence), metrics_text is not None, info_path, info)


async def _own_endpoints(client: httpx.AsyncClient, base: str, evidence: list[str]) -> list[str]:
    """Each engine's own informational endpoint, tried when /v1/models named no owner."""
    version = await _get_json(client, f"{base}/version")
    if isinstance(version, dict) and set(version) == {"version"}:
        evidence.append("GET /version answers {'version': ...} as vLLM does")
        return ["vllm"]
    for path in ("/server_info", "/get_server_info"):
        info = await _get_json(client, f"{base}{path}")
        if isinstance(info, dict) and ("tp_size" in info or "model_path" in info):
            evidence.append(f"GET {path} answers as SGLang does")
            return ["sglang"]
    props = await _get_json(client, f"{base}/props")
    if isinstance(props, dict) and "default_generation_settings" in props:
        evidence.append("GET /props answers as llama.cpp's server does")
        return ["llamacpp"]
    health = await _get_json(client, f"{base}/health")
    if isinstance(health, dict) and health.get("server") == "bia serve":
        evidence.append("GET /health names bia serve")
        return ["bia"]
    return []


async def _metrics_text(client: httpx.AsyncClient, base: str) -> str | None:
    status, text = await _get(client, f"{base}/metrics", as_json=False)
    return text if status == 200 else None
