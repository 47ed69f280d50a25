"""The drift before the fork: per batched request and step, ``|delta logprob|`` against the reference
(:func:`drift_table`), and per batch size, the largest of it at each step (:func:`drift_envelope`, :func:`drift_by_c`), what
the drift figure draws of a run of many requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ..metrics import parity
from ._piecewise import piecewise
from ._slot_tables import _slot_comparisons
from ._steps import numbered_steps

if TYPE_CHECKING:  # the tables take any object shaped like a Run (RunLike); only type hints name the class
    from ._model import Run


@piecewise("drift", eager=False)
def drift_table(run: Run, *, reference: str | Run = "ref1") -> pl.DataFrame:
    """Per batched request and step before its fork, ``|delta logprob|`` against the reference (``label``, ``step``, ``abs_delta``).

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with: ref #1 or ref #2 of its prompt in this run, or ref #1 of the same
        prompt in another run.

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> from analysis import read_run
    >>> drift = drift_table(read_run("data/experiment-cpu/default"))
    >>> drift.row(0), drift["abs_delta"].max() > 0  # c=1 matches ref #1 bit for bit; some batched request drifts
    (('p0 c=1 slot 0', 0, 0.0), True)
    """
    slots = _slot_comparisons(run, parity.NEAR_TIE_EPSILON, reference)
    steps = numbered_steps(run, reference)[0]
    side = steps.steps.select("req", "idx", "logprob")
    joined = (
        slots.select("pair", "ref", "other", "agree_to", label=pl.format("{} c={} slot {}", "prompt_id", "c", "slot"))
        .join(side.rename({"req": "ref", "logprob": "lp_r"}), on="ref")
        .join(side.rename({"req": "other", "logprob": "lp_o"}), on=["other", "idx"])
        .filter((pl.col("idx") < pl.col("agree_to")) & pl.col("lp_r").is_not_null() & pl.col("lp_o").is_not_null())
    )
    return joined.sort("pair", "idx").select("label", step="idx", abs_delta=(pl.col("lp_r") - pl.col("lp_o")).abs())


_ENVELOPE_SCHEMA = {
    "c": pl.Int64,
    "step": pl.Int64,
    "abs_delta": pl.Float64,
    "requests": pl.Int64,
    "worst_label": pl.String,
    "worst_step": pl.Int64,
}


def drift_with_c(deltas: pl.DataFrame) -> pl.DataFrame:
    """:func:`drift_table`'s rows with the batch size ``c`` each label names ("p0 c=4 slot 2"); rows that have ``c`` as
    they are.

    Parameters
    ----------
    deltas : polars.DataFrame
        Rows with ``label``, or with ``c``.

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> drift_with_c(pl.DataFrame({"label": ["p0 c=4 slot 2", "p0 ref #2"]}))["c"].to_list()
    [4, None]
    """
    if "c" in deltas.columns:
        return deltas
    return deltas.with_columns(c=pl.col("label").str.extract(r"c=(\d+) slot \d+$", 1).cast(pl.Int64))


def drift_envelope(deltas: pl.DataFrame) -> pl.DataFrame:
    """The drift before the fork per batch size c, as the drift figure draws it past a few requests: at each step, the
    largest ``|delta logprob|`` over that c's requests and how many have the step; and one row per c with a null step:
    its requests, its largest drift and the request and step of it (the lowest step, then label, among equals).

    Parameters
    ----------
    deltas : polars.DataFrame
        :func:`drift_table`'s rows (``label``, ``step``, ``abs_delta``), with ``c`` or a label that names it ("p0 c=4
        slot 2").

    Returns
    -------
    polars.DataFrame
        ``c``, ``step`` (null on a c's own row), ``abs_delta``, ``requests``, ``worst_label`` and ``worst_step`` (on a c's
        own row), sorted by c and step, each c's own row first.

    Examples
    --------
    >>> deltas = pl.DataFrame({"label": ["p0 c=4 slot 0", "p0 c=4 slot 0", "p1 c=4 slot 1"], "step": [0, 1, 0],
    ...                        "abs_delta": [0.0, 0.5, 0.5]})
    >>> drift_envelope(deltas).rows()
    [(4, None, 0.5, 2, 'p1 c=4 slot 1', 0), (4, 0, 0.5, 2, None, None), (4, 1, 0.5, 1, None, None)]
    """
    deltas = drift_with_c(deltas)
    worst = ["abs_delta", "step", "label"]
    per_c = deltas.group_by("c").agg(
        step=pl.lit(None, pl.Int64),
        abs_delta=pl.col("abs_delta").max(),
        requests=pl.col("label").n_unique(),
        worst_label=pl.col("label").sort_by(worst, descending=[True, False, False]).first(),
        worst_step=pl.col("step").sort_by(worst, descending=[True, False, False]).first(),
    )
    per_step = deltas.group_by("c", "step").agg(
        abs_delta=pl.col("abs_delta").max(), requests=pl.col("label").n_unique()
    )
    return _envelope(pl.concat([per_c, per_step], how="diagonal_relaxed"))


def _envelope(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.select([pl.col(n).cast(t) for n, t in _ENVELOPE_SCHEMA.items()]).sort("c", "step", nulls_last=False)


def _merge_envelopes(rows: pl.DataFrame) -> pl.DataFrame:
    """The pieces' envelopes as the run's: a piece holds its own prompts' requests, so requests add up and the largest
    drift is the largest of the pieces'."""
    worst = ["abs_delta", "worst_step", "worst_label"]
    merged = rows.group_by("c", "step").agg(
        abs_delta=pl.col("abs_delta").max(),
        requests=pl.col("requests").sum(),
        worst_label=pl.col("worst_label").sort_by(worst, descending=[True, False, False]).first(),
        worst_step=pl.col("worst_step").sort_by(worst, descending=[True, False, False]).first(),
    )
    return _envelope(merged)


@piecewise("drift_by_c", merge=_merge_envelopes)
def drift_by_c(run: Run, *, reference: str | Run = "ref1") -> pl.DataFrame:
    """:func:`drift_envelope` of the run's :func:`drift_table`: what the drift figure draws of a run of many requests, at
    a size set by its steps and batch sizes, not by its requests.

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with.

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> from analysis import read_run
    >>> drift_by_c(read_run("data/experiment-cpu/default")).filter(pl.col("step").is_null()).select("c", "requests").rows()
    [(1, 2), (4, 8), (8, 16), (16, 32)]
    """
    return drift_envelope(drift_table(run, reference=reference))
