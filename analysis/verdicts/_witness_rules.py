"""The rules by which a perf041 witness of each version decides a band's result and a run's verdict.

``_witness`` re-derives every recorded result with these and keeps any disagreement; ``run.to_witness``
writes the verdict of a run it measured with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def derive_band_result(
    version: int, band: dict[str, Any], slots: Sequence[dict[str, Any]]
) -> tuple[str | None, str | None]:
    """Re-derive a band's result from its fields with the rules of witness ``version``.

    Parameters
    ----------
    version : int
        The witness format version: 1 compares ``divergence_at`` with ``declared_min``; 2 and 3 read the slots,
        the constant run and the intra-band agreement (3 also wants one slot per request of the band).
    band : dict of str to Any
        The band's fields (``c``, ``divergence_at``, ``declared_min``, ``m_formed``, ``intra_agree_to``,
        ``max_constant_run``, ``max_constant_run_declared``); a field the rule needs may be None.
    slots : sequence of dict of str to Any
        The band's slots, each with ``refused`` (None when the slot was answered); unused by version 1.

    Returns
    -------
    result : str or None
        ``PASS``, ``FAIL`` or ``UNMEASURABLE``; None when a field the rule needs is missing.
    note : str or None
        Which field was missing, when ``result`` is None.

    Examples
    --------
    >>> derive_band_result(1, {"c": 4, "divergence_at": 3, "declared_min": 64}, [])
    ('FAIL', None)
    >>> band = {"c": 4, "m_formed": 4, "declared_min": 64, "intra_agree_to": 128,
    ...         "max_constant_run": 1, "max_constant_run_declared": 16}
    >>> derive_band_result(2, band, [{"refused": None}] * 4)
    ('PASS', None)
    """
    if version == 1:
        if band["divergence_at"] is None or band["declared_min"] is None:
            return None, "v1 rule needs divergence_at and declared_min"
        return ("PASS" if band["divergence_at"] >= band["declared_min"] else "FAIL"), None
    c = band["c"]
    if not slots:
        return "UNMEASURABLE", None
    if any(slot["refused"] is not None for slot in slots):
        return "UNMEASURABLE", None
    if version == 3 and len(slots) != c:
        return "UNMEASURABLE", None
    if c > 1:
        if band["m_formed"] is None:
            return None, "m_formed not recorded"
        if band["m_formed"] < 2:
            return "UNMEASURABLE", None
    run, declared = band["max_constant_run"], band["max_constant_run_declared"]
    if declared is None or run is None:
        return None, "max_constant_run or max_constant_run_declared not recorded"
    if declared > 0 and run >= declared:
        return "FAIL", None
    if c > 1:
        if band["intra_agree_to"] is None or band["declared_min"] is None:
            return None, "intra_agree_to or declared_min not recorded"
        if band["intra_agree_to"] < band["declared_min"]:
            return "FAIL", None
    return "PASS", None


def derive_run_verdict(reference_stable: bool | None, bands: Sequence[tuple[int, str | None]]) -> str:
    """The run verdict from the reference's stability and the bands' ``(c, result)``.

    Parameters
    ----------
    reference_stable : bool or None
        Whether the c=1 reference repeated itself; None when not recorded (then no PASS).
    bands : sequence of (int, str or None)
        Each band's ``c`` and result.

    Returns
    -------
    str
        ``FAIL`` when any band failed; else ``PASS`` when the reference is stable, every band decided and one
        batched band (c > 1) at least passed; else ``UNMEASURABLE``.

    Examples
    --------
    >>> derive_run_verdict(True, [(1, "PASS"), (4, "PASS")])
    'PASS'
    >>> derive_run_verdict(True, [(1, "PASS")])
    'UNMEASURABLE'
    >>> derive_run_verdict(False, [(4, "FAIL")])
    'FAIL'
    """
    results = [result for _, result in bands]
    if "FAIL" in results:
        return "FAIL"
    decided_batched = any(c > 1 and result in ("PASS", "FAIL") for c, result in bands)
    if not reference_stable or "UNMEASURABLE" in results or None in results or not decided_batched:
        return "UNMEASURABLE"
    return "PASS"
