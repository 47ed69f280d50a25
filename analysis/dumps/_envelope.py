"""The capture envelope: the keys bia's capture writes around one response or stream (``{response|sse, c,
slot, prompt_id, role, repeat, sample_key, t_sent, arrival_times, format}``), and the :class:`Meta` one line's gives.

Below both the general reader and the columnar fast path, which read the same envelope.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ._kit import Meta

LEGACY_KEYS = {"band_c": "c"}  # legacy: run_version 1 captures named the envelope's c band_c
ENVELOPE_KEYS = {
    "response",
    "sse",
    "format",
    "c",
    "slot",
    "prompt_id",
    "role",
    "repeat",
    "sample_key",
    "t_sent",
    "arrival_times",
    *LEGACY_KEYS,
}
# Other envelope keys go to requests.extra; "logprobs_mode" there also sets vLLM offline semantics.


def envelope_c(line: dict) -> Any:
    """The envelope's concurrency: ``c``, or the legacy ``band_c`` of run_version 1 captures.

    Parameters
    ----------
    line : dict
        One capture line's envelope.

    Returns
    -------
    Any
        The value as written, unchecked as every envelope value is here (the reader checks it), or None when
        neither key is there.

    Examples
    --------
    >>> envelope_c({"c": 4}), envelope_c({"band_c": 8}), envelope_c({})  # the second: a legacy envelope
    (4, 8, None)
    """
    return line["c"] if "c" in line else line.get("band_c")  # legacy key of run_version 1


def envelope_meta(line: dict, record: int, raw: bytes) -> Meta:
    """The batch context and timing of one envelope line (its other keys kept as ``extra``).

    Parameters
    ----------
    line : dict
        The parsed envelope line (``sample_key``, ``c``, ``slot``, ``prompt_id``, ``role``, ``repeat``, ``t_sent``,
        ``arrival_times``, ...).
    record : int
        Its record number in the file.
    raw : bytes
        The payload's bytes, whose SHA-256 is kept.

    Returns
    -------
    Meta
    """
    extra = {k: v for k, v in line.items() if k not in ENVELOPE_KEYS}
    return Meta(
        record=record,
        sample_key=line.get("sample_key"),
        c=envelope_c(line),
        slot=line.get("slot"),
        prompt_id=None if line.get("prompt_id") is None else str(line["prompt_id"]),
        role=line.get("role"),
        repeat=line.get("repeat"),
        t_sent=line.get("t_sent"),
        arrivals=line.get("arrival_times"),
        raw_sha256=hashlib.sha256(raw).hexdigest(),
        extra=extra,
    )
