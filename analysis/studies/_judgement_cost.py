"""The cost of batching in a judgement row: each c's decode rate per request against c=1's, in numbers and in words,
and what bia's row-invariant mode cost where a run in that mode was judged beside a RED one.

``cost`` compares each c's per-request decode rate with c=1's, both sides timed the same way (the streams' own
arrival times, or the server's own per-token timing), with a bootstrap interval where each side has three rates.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import polars as pl

from ..metrics import ratio_interval
from ._judgement_frame import SCHEMA

MIN_RATE_SAMPLES = 3  # rates a side needs before a ratio of medians gets an interval


def _origin_kind(origin: str | None) -> str | None:
    if origin is None:
        return None
    return "streams" if origin == "stream" else "server"


def _cost(states: pl.DataFrame) -> list[dict[str, Any]]:
    """Per c > 1, the median per-request decode rate over c=1's, both sides of one origin, with a bootstrap interval."""
    timed = states.filter(pl.col("decode_tok_s").is_not_null() & (pl.col("decode_tok_s") > 0)).with_columns(
        kind=pl.col("decode_rate_origin").map_elements(_origin_kind, return_dtype=pl.String)
    )
    rates = {(c, kind): group["decode_tok_s"].to_list() for (c, kind), group in timed.group_by("c", "kind")}
    out = []
    for c in sorted({c for c, _ in rates if c > 1}):
        kind = next((k for k in ("streams", "server") if rates.get((1, k)) and rates.get((c, k))), None)
        if kind is None:
            continue
        base, batched = rates[(1, kind)], rates[(c, kind)]
        if min(len(base), len(batched)) >= MIN_RATE_SAMPLES:
            ratio, low, high = ratio_interval(base, batched)
        else:
            ratio, low, high = statistics.median(batched) / statistics.median(base), None, None
        out.append(
            {
                "c": c,
                "ratio": ratio,
                "low": low,
                "high": high,
                "origin": kind,
                "base_rates": len(base),
                "rates": len(batched),
                "median": statistics.median(batched),
                "base_median": statistics.median(base),
            }
        )
    return out


def cost_words(cost: list[Mapping[str, Any]] | None) -> str | None:
    """A run's cost in words: each c's decode rate per request against c=1's, with its interval where it has one.

    Parameters
    ----------
    cost : list of Mapping of str to Any or None
        A row's ``cost_by_c``: per c, ``c``, ``ratio``, ``low`` and ``high`` (None without an interval) and ``origin``
        (``streams`` or the server's timings). None or empty gives None.

    Returns
    -------
    str or None

    Examples
    --------
    >>> cost_words([{"c": 4, "ratio": 0.9, "low": 0.8, "high": 1.01, "origin": "streams"}, {"c": 8, "ratio": 0.5, "low": None,
    ...             "high": None, "origin": "streams"}])
    'c=4 0.90× (0.80–1.01), c=8 0.50× of c=1’s decode rate per request (streams’ timings)'
    """
    if not cost:
        return None
    parts = [
        f"c={c['c']} {c['ratio']:.2f}×" + (f" ({c['low']:.2f}–{c['high']:.2f})" if c.get("low") is not None else "")
        for c in cost
    ]
    origins = sorted({c["origin"] for c in cost})
    timing = " and ".join("streams’ timings" if o == "streams" else "the server’s timings" for o in origins)
    return f"{', '.join(parts)} of c=1’s decode rate per request ({timing})"


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
