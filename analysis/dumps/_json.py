"""JSON for dumps: orjson for speed, the standard library for what Python itself writes
(NaN, Infinity, -Infinity from ``json.dumps``), which the classifier then marks non-finite."""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: bytes | str) -> Any:
    """Parse JSON; raises ValueError with the parser's message.

    Examples
    --------
    >>> loads(b'{"logprob": -Infinity}')
    {'logprob': -inf}
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
