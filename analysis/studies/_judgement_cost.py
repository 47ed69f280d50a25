"""The cost of batching in a judgement row: each c's decode rate per request against c=1's, in numbers and in words,
and what bia's row-invariant mode cost where a run in that mode was judged beside a RED one.

``cost`` compares each c's per-request decode rate with one c=1 baseline, both sides timed the same way: the one
definition of ``analysis.metrics.decode_cost``, which every surface renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import polars as pl

from ..metrics import TIMING_WORDS, decode_cost
from ..run import legacy_arm, run_arms, slot_table
from ._judgement_evidence import BATCHED_ARMS
from ._judgement_frame import SCHEMA

RATIO_HEADING = "per-request decode rate vs c=1"  # the column every table shows a c's ratio under

RATIO_WORDS = (
    "The per-request decode rate vs c=1 is each c's median per-request decode rate over the c=1 baseline: the median "
    "per-request decode rate of the same arm's c=1 requests (each the prompt sent alone), both sides timed one way (the "
    "streams' own arrival times where a c=1 stream was timed so, else the server's). It is each request's rate, not the "
    "server's: below 1× a request decodes slower than alone while the server may serve more tokens per second in all."
)  # the definition, as the report states it beside the ratios (docs/glossary.md has the same)


def ratio_cell(ratio: float | None) -> str:
    """A ratio to the c=1 baseline as every table shows it: ``0.80×``; ``—`` where unmeasured.

    Parameters
    ----------
    ratio : float or None
        The ratio.

    Returns
    -------
    str

    Examples
    --------
    >>> ratio_cell(3.2999), ratio_cell(None)
    ('3.30×', '—')
    """
    return "—" if ratio is None else f"{ratio:.2f}×"


def judged_arms(manifest: Mapping[str, Any]) -> list[str]:
    """The arms a run's judgement has a row for: its batched arms (copies, mixed), else its first arm.

    Parameters
    ----------
    manifest : Mapping of str to Any
        The run's manifest.

    Returns
    -------
    list of str
    """
    return [a for a in run_arms(manifest) if a in BATCHED_ARMS] or run_arms(manifest)[:1] or [legacy_arm(manifest)]


def run_decode_cost(run: Any) -> pl.DataFrame:
    """``analysis.metrics.decode_cost`` of a run's first judged arm (copies where it has one): the figures that runs
    and engines side by side and the trend show per run, the same as the answer's row for that arm.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    polars.DataFrame
        ``decode_cost``'s columns, one row per c timed like the baseline (c=1 included).
    """
    arm = judged_arms(run.manifest)[0]
    timed = slot_table(run, columns=["arm", "c", "decode_tok_s", "decode_rate_origin"])
    return decode_cost(timed.filter(pl.col("arm") == arm))


def cost_words(cost: list[Mapping[str, Any]] | None) -> str | None:
    """A run's cost in words: each c's per-request decode rate over the c=1 baseline, with its interval where it has one,
    and what the baseline is.

    Parameters
    ----------
    cost : list of Mapping of str to Any or None
        A row's ``cost_by_c`` (:func:`analysis.metrics.cost_by_c`): per c, ``c``, ``ratio``, ``low`` and ``high`` (None
        without an interval), ``origin`` (the timing), ``base_median`` and ``base_rates``. None or empty gives None.

    Returns
    -------
    str or None

    Examples
    --------
    >>> cost_words([{"c": 4, "ratio": 0.9, "low": 0.8, "high": 1.01, "origin": "streams", "base_median": 30.84, "base_rates": 3},
    ...             {"c": 8, "ratio": 0.5, "low": None, "high": None, "origin": "streams", "base_median": 30.84, "base_rates": 3}])
    'c=4 0.90× (0.80–1.01), c=8 0.50× the per-request decode rate at c=1 (baseline 30.8 tok/s: the median of 3 c=1 requests, streams’ timings)'
    """
    if not cost:
        return None
    parts = [
        f"c={c['c']} {ratio_cell(c['ratio'])}"
        + (f" ({c['low']:.2f}–{c['high']:.2f})" if c.get("low") is not None else "")
        for c in cost
    ]
    return f"{', '.join(parts)} the per-request decode rate at c=1 ({baseline_words(cost[0])})"


def baseline_words(cost: Mapping[str, Any]) -> str:
    """The c=1 baseline a ratio of ``cost_by_c`` is over, in words: its rate, how many requests and how they were timed.

    Parameters
    ----------
    cost : Mapping of str to Any
        One c of a ``cost_by_c`` (every c of a row shares the baseline).

    Returns
    -------
    str

    Examples
    --------
    >>> baseline_words({"base_median": 1180.4, "base_rates": 1, "origin": "server"})
    'baseline 1,180 tok/s: the median of 1 c=1 request, the server’s timings'
    """
    n = cost["base_rates"]
    rate = f"{cost['base_median']:,.0f}" if cost["base_median"] >= 100 else f"{cost['base_median']:.3g}"
    timing = TIMING_WORDS.get(cost["origin"], cost["origin"])
    return f"baseline {rate} tok/s: the median of {n} c=1 request{'' if n == 1 else 's'}, {timing}"


def _with_measured_fix(frame: pl.DataFrame) -> pl.DataFrame:
    """A RED row whose next step is bia's row-invariant mode, with what that mode cost where a row-invariant run was judged
    beside it (in the same folder): its median decode rate per request over the RED run's, at each c both timed alike."""
    rows = frame.to_dicts()
    fixes = {
        str(PurePath(r["run"]).parent): r
        for r in rows
        if PurePath(r["run"]).name == "row-invariant" and r["verdict"] in ("GREEN", "AMBER")
    }
    for row in rows:
        fix = fixes.get(str(PurePath(row["run"]).parent))
        if fix and row["verdict"] == "RED" and row["next_step"].endswith("--modes row-invariant"):
            measured = _rate_over(fix["cost_by_c"], row["cost_by_c"])
            if measured:
                row["next_step"] += f" (measured beside it, its decode rate over this run's: {measured})"
    return pl.DataFrame(rows, schema=SCHEMA, orient="row") if rows else frame


def _rate_over(fix: list[Mapping[str, Any]], red: list[Mapping[str, Any]]) -> str | None:
    """One run's median decode rate per request over another's at c=1 and each c, where both sides are timed the same way.

    Examples
    --------
    >>> a = [{"c": 4, "origin": "streams", "median": 90.0, "base_median": 110.0}]
    >>> _rate_over(a, [{"c": 4, "origin": "streams", "median": 100.0, "base_median": 100.0}])
    '1.10× at c=1, 0.90× at c=4'
    """
    theirs = {c["c"]: c for c in red}
    pairs = [(c, theirs[c["c"]]) for c in fix if c["c"] in theirs and theirs[c["c"]]["origin"] == c["origin"]]
    if not pairs:
        return None
    ratios = [("1", pairs[0][0]["base_median"] / pairs[0][1]["base_median"])]
    ratios += [(str(mine["c"]), mine["median"] / other["median"]) for mine, other in pairs]
    return ", ".join(f"{r:.2f}× at c={c}" for c, r in ratios)
