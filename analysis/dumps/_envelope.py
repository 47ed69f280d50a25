"""The capture envelope: the keys bia's capture writes around one response or stream (``{response|sse, band_c,
slot, prompt_id, role, repeat, sample_key, t_sent, arrival_times, format}``), and the :class:`Meta` one line's gives.

Below both the general reader and the columnar fast path, which read the same envelope.
"""

from __future__ import annotations

import hashlib

from ._kit import Meta

ENVELOPE_KEYS = {"response", "sse", "format", "band_c", "slot", "prompt_id", "role", "repeat", "sample_key", "t_sent", "arrival_times"}
# Other envelope keys go to requests.extra; "logprobs_mode" there also sets vLLM offline semantics.


def envelope_meta(line: dict, record: int, raw: bytes) -> Meta:
    """The batch context and timing of one envelope line (its other keys kept as ``extra``)."""
    extra = {k: v for k, v in line.items() if k not in ENVELOPE_KEYS}
    return Meta(record=record, sample_key=line.get("sample_key"), band_c=line.get("band_c"), slot=line.get("slot"),
                prompt_id=None if line.get("prompt_id") is None else str(line["prompt_id"]), role=line.get("role"), repeat=line.get("repeat"),
                t_sent=line.get("t_sent"),
                arrivals=line.get("arrival_times"), raw_sha256=hashlib.sha256(raw).hexdigest(), extra=extra)
