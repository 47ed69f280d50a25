"""Values as engines send them: sentinels, placeholders and the error every loader raises."""

from __future__ import annotations

import math
import re
from typing import Any

# vLLM clamps -inf (and fills a missing sampled entry) with this; it is never a number.
SENTINEL_9999 = -9999.0
# llama.cpp returns the lowest float32 for probability 0.
FLOAT32_LOWEST = -3.4028234663852886e38
# A logprob above this is not a log-probability (servers print float32 values as doubles).
MAX_LOGPROB = 1e-6

STATUSES = ("ok", "sentinel_9999", "null_in_source", "neg_inf", "float_lowest", "nonfinite", "zero_prob", "missing")

_PLACEHOLDER = re.compile(r"token_id:(-?\d+)\Z")


class DumpError(ValueError):
    """A dump that cannot be read as its format says.

    The message names the source, the record (line, event or request), the field, and what was
    expected; the same parts are attributes.
    """

    others: list[DumpError]  # only on the error that stands for several sources (``_read._all_failures``): the rest

    def __init__(self, source: str, record: str, field: str | None, problem: str) -> None:
        self.source, self.record, self.field, self.problem = source, record, field, problem
        where = f"{record}.{field}" if field else record
        super().__init__(f"{source}: {where}: {problem}")


def placeholder_id(text: Any) -> int | None:
    """The id in vLLM's ``token_id:N`` placeholder, else None.

    Parameters
    ----------
    text : object
        A token's text.

    Returns
    -------
    int or None

    Examples
    --------
    >>> placeholder_id("token_id:151645"), placeholder_id("Hello")
    (151645, None)
    """
    if isinstance(text, str) and text.startswith("token_id:"):
        match = _PLACEHOLDER.match(text)
        if match:
            return int(match.group(1))
    return None


def classify_logprob(raw: Any) -> tuple[float | None, str]:
    """Map a raw logprob as received to ``(logprob or None, value_status)``.

    Sentinels never reach the numeric column: -9999, null, -inf, float32 lowest and other
    non-finite values each give None with their own status.

    Parameters
    ----------
    raw : object
        A number, or None.

    Returns
    -------
    tuple of (float or None, str)

    Examples
    --------
    >>> classify_logprob(-0.5), classify_logprob(-9999.0), classify_logprob(None)
    ((-0.5, 'ok'), (None, 'sentinel_9999'), (None, 'null_in_source'))
    >>> classify_logprob(float("-inf")), classify_logprob(-3.4028234663852886e38)
    ((None, 'neg_inf'), (None, 'float_lowest'))
    """
    if raw is None:
        return None, "null_in_source"
    value = float(raw)
    if value == SENTINEL_9999:
        return None, "sentinel_9999"
    if math.isnan(value) or value == math.inf:
        return None, "nonfinite"
    if value == -math.inf:
        return None, "neg_inf"
    if value <= FLOAT32_LOWEST:
        return None, "float_lowest"
    return value, "ok"


def classify_prob(raw: Any) -> tuple[float | None, float | None, str]:
    """Map a raw probability to ``(logprob, prob, value_status)``; probability 0 has no logprob.

    Parameters
    ----------
    raw : object
        A number, or None.

    Returns
    -------
    tuple of (float or None, float or None, str)

    Examples
    --------
    >>> classify_prob(0.5)[2], classify_prob(0.0), classify_prob(None)
    ('ok', (None, 0.0, 'zero_prob'), (None, None, 'null_in_source'))
    """
    if raw is None:
        return None, None, "null_in_source"
    value = float(raw)
    if not math.isfinite(value):
        return None, None, "nonfinite"
    if value == 0.0:
        return None, 0.0, "zero_prob"
    if value < 0:
        return None, value, "nonfinite"
    return math.log(value), value, "ok"


def is_number(value: Any) -> bool:
    """A JSON number (not a bool).

    Parameters
    ----------
    value : object
        A parsed JSON value.

    Returns
    -------
    bool
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool)
