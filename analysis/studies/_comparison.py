"""Runs side by side (one experiment's kernel modes, or engines): the parity each bought against m=1 and what it cost."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import polars as pl


def mode_comparison(runs: Iterable[Any], *, reference: Any = "ref1") -> pl.DataFrame:
    """Runs side by side (for example one experiment's kernel modes): the parity each bought against the
    m=1 reference and what it cost in decode rate, per run and band, as the Thinking Machines study
    compares them. ``rate_vs_default`` is the run's median per-request decode rate over that of the
    ``default``-mode run in the same folder at the same c (null without one).

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
        ``token_flips``, ``max_ulp``, ``median_decode_tok_s`` (tokens per second) and ``rate_vs_default``.
    """
    from ..run import slot_table

    rows = []
    for run in runs:
        slots = slot_table(run, reference=reference)
        mode = (run.manifest.get("effective") or {}).get("kernel_mode") or engine_label(run)
        for (c,), group in slots.group_by(["c"], maintain_order=True):
            rates = group["decode_tok_s"].drop_nulls()
            rows.append(
                {
                    "run": run.label,
                    "kernel_mode": mode,
                    "c": c,
                    "requests": group.height,
                    "bit_identical_share": float(cast(float, (group["bitwise_prefix"] == group["length"]).mean())),
                    "token_flips": int(group["diverged"].sum()),
                    "max_ulp": group["max_ulp"].max(),
                    "median_decode_tok_s": float(cast(float, rates.median())) if rates.len() else None,
                }
            )
    if not rows:
        return pl.DataFrame(schema={"run": pl.String, "c": pl.Int64})
    _against_default(rows)
    return pl.DataFrame(rows).sort("c", "run")


def _against_default(rows: list[dict]) -> None:
    """Set each row's ``rate_vs_default``: its median rate over the default-mode run's beside it at the same c."""
    folder = lambda row: str(Path(row["run"]).parent)  # noqa: E731
    base = {(folder(r), r["c"]): r["median_decode_tok_s"] for r in rows if r["kernel_mode"] == "default"}
    for row in rows:
        default_rate, rate = base.get((folder(row), row["c"])), row["median_decode_tok_s"]
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
