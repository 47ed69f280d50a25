"""``bia probe``: fire the same greedy request alone and in batches of c at a live server and write a run.

Per prompt: two m=1 references one after the other, then for each c of the ladder c requests
released together (``repeats`` times, interleaved across c): c copies of the prompt, or in the
``needle`` layout the prompt at a seeded position among c - 1 fillers, or in the ``rotating`` layout c - 1 copies and a
companion that moves each repeat. A band whose width evidence shows a batch narrower than its c is fired again
(``refire``), its last attempt kept. With ``observer`` each band is fired a second time without logprobs, so
:func:`analysis.run.observer_table` can compare texts.

Nothing is lost. The manifest is written first and rewritten (atomically) after every band. Each
request's raw bytes and the arrival time of every SSE event (a monotonic clock, seconds since the
request was sent) go to ``partial/`` as they arrive; when the request ends they move into
``captures/requests.jsonl`` in bia's capture envelope. A request that cannot count (an HTTP error,
a reset, a request past its whole-request deadline, a cut or malformed stream, an error event) is
listed under ``refused`` with its reason, its bytes kept in ``refused.jsonl`` (an HTTP error's first
64 KiB); its band is then unmeasurable and the run goes on. Settings no run can be made of, and a
server whose first answer is no chat stream with logprobs, stop the probe first.
A run stopped midway (Ctrl-C, a crash, a kill) is read by :func:`analysis.run.read_run`, whose
``missing()`` lists what it lacks, and :func:`probe` with ``resume=True`` finishes it: bands left
unfinished are fired again whole, and what they had written moves to ``superseded/``.

Which batch the server formed: the lines its log gained during the band (aprender's
``Batch m=N done`` by default), and the engine's running-requests gauge sampled on ``/metrics``
while the band is in flight. Every width seen is kept, not only the largest.

The engine (vLLM, SGLang, llama.cpp, apr serve, bia serve, or a plain OpenAI-compatible server) is
detected from read-only endpoints, or given; it decides the body's extras (``ignore_eos``, vLLM's
token ids as ``token_id:N``) and the gauge. What was chosen and why is in the manifest.

How a server is probed is one :class:`ProbeSettings`, which :func:`probe`, :func:`dry_run`, :func:`certify_server` and
``bia probe`` share (each also takes its fields as keywords). This module is the package's face: the code lives in its
private modules, by what it does (``_settings``, ``_probe``, ``_fire``, ``_manifest``, ``_requests``, ``_capture``,
``_widths``, ``_bands``, ``_engines``, ``_checks``, ``_arms``, ``_rundir``, ``_callable``, ``_certify``, ``_summary``).
"""

from __future__ import annotations

from ._bands import DEFAULT_FILLERS, band_rows
from ._callable import CallableError, probe_callable
from ._capture import EventClock, fetch_stream, stream_problem
from ._certify import certify_server, planned_repeats
from ._engines import PROFILES, Detection, EngineProfile, ServerUnreachable, detect_engine, wait_for_server
from ._fire import ServerGone
from ._manifest import expectation_notes
from ._probe import DRY_RUN_TIMEOUT_S, dry_run, probe
from ._requests import KEEPALIVE_EXPIRY_S, request_body
from ._rundir import NoRunToResume, ProbeError, RunUnreadable
from ._settings import ProbeSettings
from ._summary import result_line
from ._widths import BATCH_LINE, LogWatcher, MetricsPoller, co_resident, running_requests

__all__ = [
    "BATCH_LINE",
    "DEFAULT_FILLERS",
    "DRY_RUN_TIMEOUT_S",
    "KEEPALIVE_EXPIRY_S",
    "PROFILES",
    "CallableError",
    "Detection",
    "EngineProfile",
    "EventClock",
    "LogWatcher",
    "MetricsPoller",
    "NoRunToResume",
    "ProbeError",
    "ProbeSettings",
    "RunUnreadable",
    "ServerGone",
    "ServerUnreachable",
    "band_rows",
    "certify_server",
    "co_resident",
    "detect_engine",
    "dry_run",
    "expectation_notes",
    "fetch_stream",
    "planned_repeats",
    "probe",
    "probe_callable",
    "request_body",
    "result_line",
    "running_requests",
    "stream_problem",
    "wait_for_server",
]
