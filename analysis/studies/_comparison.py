"""Runs side by side (one experiment's kernel modes, or engines): the parity each bought against m=1 and what it cost."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import polars as pl


def mode_comparison(runs: Iterable[Any], *, reference: Any = "ref1") -> pl.DataFrame:
    """Runs side by side (for example one experiment's kernel modes): the parity each bought against the
    m=1 reference and what it cost in decode rate, per run and band, as the Thinking Machines study
    compares them. The rates are ``analysis.metrics.decode_cost``'s, the answer's: ``median_decode_tok_s`` is the
    median per-request decode rate of the run's first judged arm at c, timed like its c=1 baseline, and
    ``decode_vs_c1`` that over the baseline; ``rate_vs_default`` is the median over that of the ``default``-mode run in
    the same folder at the same c, both timed alike (null without one).

    Parameters
    ----------
    runs : iterable of Run
        The runs; each is named by its label and its ``effective.kernel_mode`` (else its engine).
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with, as ``slot_table`` takes it.

    Returns
    -------
    polars.DataFrame
        One row per run and c: ``run``, ``kernel_mode``, ``c``, ``requests``, ``bit_identical_share``,
        ``token_flips``, ``max_ulp``, ``median_decode_tok_s`` (tokens per second), ``decode_origin`` (its timing),
        ``decode_vs_c1`` and ``rate_vs_default``.
    """
    from ..run import slot_table
    from ._judgement_cost import run_decode_cost

    rows = []
    for run in runs:
        slots = slot_table(run, reference=reference)
        mode = (run.manifest.get("effective") or {}).get("kernel_mode") or engine_label(run)
        cost = {r["c"]: r for r in run_decode_cost(run).iter_rows(named=True)}
        for (c,), group in slots.group_by(["c"], maintain_order=True):
            rate = cost.get(c) or {}
            rows.append(
                {
                    "run": run.label,
                    "kernel_mode": mode,
                    "c": c,
                    "requests": group.height,
                    "bit_identical_share": float(cast(float, (group["bitwise_prefix"] == group["length"]).mean())),
                    "token_flips": int(group["diverged"].sum()),
                    "max_ulp": group["max_ulp"].max(),
                    "median_decode_tok_s": rate.get("median"),
                    "decode_origin": rate.get("origin"),
                    "decode_vs_c1": rate.get("ratio"),
                }
            )
    if not rows:
        return pl.DataFrame(schema={"run": pl.String, "c": pl.Int64})
    _against_default(rows)
    return pl.DataFrame(rows).sort("c", "run")


def _against_default(rows: list[dict]) -> None:
    """Set each row's ``rate_vs_default``: its median rate over the default-mode run's beside it at the same c, both
    timed alike."""
    folder = lambda row: (str(Path(row["run"]).parent), row["c"], row["decode_origin"])  # noqa: E731
    base = {folder(r): r["median_decode_tok_s"] for r in rows if r["kernel_mode"] == "default"}
    for row in rows:
        default_rate, rate = base.get(folder(row)), row["median_decode_tok_s"]
        row["rate_vs_default"] = rate / default_rate if rate is not None and default_rate else None


def engine_label(run) -> str:
    """What served a run that names no kernel mode: the engine the probe detected, else the run's folder.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    str
    """
    engine = (run.manifest.get("identity") or {}).get("engine")
    folder = Path(run.path).name if run.path else "run"
    return f"{engine} ({folder})" if engine else folder
