"""The certificate on each run's verdict card: one line per arm, its GREEN, AMBER, RED or UNVERIFIED verdict and why."""

from __future__ import annotations

from typing import Any

from ..studies._certificate import certificate

CARD_TARGET_RATE = 0.01  # the card certifies against bia certify's default target, and says so
_CSS = {"GREEN": "pass", "AMBER": "warn", "UNVERIFIED": "warn", "RED": "fail"}


def certificate_lines(run: Any, *, target_rate: float = CARD_TARGET_RATE, confidence: float = 0.95) -> list[tuple[str, str, str]]:
    """The card's certificate lines: (question, answer, css) per arm, as ``bia certify`` words them.

    Parameters
    ----------
    run : Run
        The run on the card.
    target_rate, confidence : float
        As :func:`analysis.certificate` takes them.

    Returns
    -------
    list of (str, str, str)
        ``("certificate (ARM)", "VERDICT: reason.", css)``, css ``pass`` for GREEN, ``warn`` for AMBER and UNVERIFIED,
        ``fail`` for RED; none for a run without batched requests.

    Examples
    --------
    >>> from analysis import read_run
    >>> question, answer, css = certificate_lines(read_run("data/llamacpp-cpu/cache-prompt"))[0]
    >>> question, answer[:60], css
    ('certificate (copies)', 'RED at a 1% target: 58 of 58 requests part from m=1 (0 in to', 'fail')
    """
    table = certificate(run, target_rate=target_rate, confidence=confidence)
    return [(f"certificate ({arm})", f"{verdict} at a {target_rate * 100:g}% target: {reason}.", _CSS[verdict])
            for arm, verdict, reason in table.select("arm", "verdict", "reason").iter_rows()]


def with_certificate(review: Any, run: Any) -> Any:
    """A run's verdict card (``analysis.views._review.Review``) with its certificate lines first."""
    review.lines[0:0] = certificate_lines(run)
    return review
