"""Why a request parts from m=1: the first control arm of a fixed ladder that reproduces its divergence.

A run probed with arms (:mod:`analysis.run._arms`) holds, beside its batched requests, controls that
each change one thing from "alone, cold" m=1. For every request that parts from ref #1 of its prompt
(in bits or in tokens), :func:`attribution_table` names as its cause the first rung of
``LADDER`` whose control parts from m=1 at or before the request's own first differing step:

=============  ===================  ===============================================================
cause          control (arm)        what the control changes from m=1
=============  ===================  ===============================================================
run-to-run     repeat               nothing: the request alone and cold again
cache state    cache                a warm prompt cache (the same prompt just before)
prefill path   prefill              position j scored at the end of a prefill instead of decoded
shared prefix  prefix               a cache holding a prefix of the prompt
co-batching    copies (same c)      c copies of the request decoding together
mixing         mixed (same c)       c - 1 other prompts decoding with it
=============  ===================  ===============================================================

A control "reproduces" a divergence when its earliest part (the first step whose logprob bits or
token differ from m=1) comes no later than the request's: a control that only parts later cannot
explain what came first. A divergence no control reproduces is listed with the cause ``unexplained``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ..run import RunError, numbered_steps, piecewise, slot_table

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

    from ..run import Run

# (cause, the arm whose requests are its control, whether the control must be at the request's own c)
LADDER = (
    ("run-to-run", "repeat", False),
    ("cache state", "cache", False),
    ("prefill path", "prefill", False),
    ("shared prefix", "prefix", False),
    ("co-batching", "copies", True),
    ("mixing", "mixed", True),
)
UNEXPLAINED = "unexplained"

_PREFILL_SCHEMA: dict[str, PolarsDataType] = {
    "prompt_id": pl.String,
    "position": pl.Int64,
    "reference_logprob": pl.Float64,
    "prefill_logprob": pl.Float64,
    "same_token": pl.Boolean,
    "same_bits": pl.Boolean,
    "ulp": pl.Int64,
}
_CONTROL_SCHEMA: dict[str, PolarsDataType] = {
    "prompt_id": pl.String,
    "rung": pl.Int64,
    "c": pl.Int64,
    "control_part": pl.Int64,
    "evidence_arm": pl.String,
    "evidence_c": pl.Int64,
    "evidence_repeat": pl.Int64,
    "evidence_slot": pl.Int64,
    "evidence_kind": pl.String,
}
ATTRIBUTION_SCHEMA = {
    "prompt_id": pl.String,
    "arm": pl.String,
    "c": pl.Int64,
    "repeat": pl.Int64,
    "slot": pl.Int64,
    "kind": pl.String,
    "bitwise_prefix": pl.Int64,
    "divergence_at": pl.Int64,
    "max_ulp": pl.Int64,
    "cause": pl.String,
    "evidence_arm": pl.String,
    "evidence_c": pl.Int64,
    "evidence_repeat": pl.Int64,
    "evidence_slot": pl.Int64,
    "evidence_part": pl.Int64,
    "evidence_kind": pl.String,
}


@piecewise("prefill")
def prefill_table(run: Run) -> pl.DataFrame:
    """The prefill arm against decode: per prompt and completion position j, ref #1's decode-time logprob of its
    token j beside the logprob the prefill arm's request scored for position j (the one token asked for after a
    prompt holding ref #1's first j tokens), whether the token and its float32 bits are the same, and the ULPs apart.

    Empty for a run without the prefill arm.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    polars.DataFrame
        ``prompt_id``, ``position``, ``reference_logprob``, ``prefill_logprob``, ``same_token``, ``same_bits`` and ``ulp``.

    Examples
    --------
    >>> from analysis import read_run
    >>> prefill_table(read_run("data/experiment-cpu/default")).height
    0
    """
    steps, requests, refs = numbered_steps(run)
    asked = (
        requests.filter(pl.col("role") == "prefill")
        .select("prompt_id", position=pl.col("slot"), req="req")
        .join(refs, on="prompt_id")
    )
    if asked.height == 0:
        return pl.DataFrame(schema=_PREFILL_SCHEMA)
    side = steps.steps.select("req", "idx", "ident", "logprob", "bits", "ordered")
    joined = asked.join(side.filter(pl.col("idx") == 0).drop("idx"), on="req", how="inner").join(
        side.rename({"req": "ref", "idx": "position"}), on=["ref", "position"], how="inner", suffix="_ref"
    )
    return (
        joined.sort("prompt_id", "position")
        .select(
            "prompt_id",
            "position",
            reference_logprob="logprob_ref",
            prefill_logprob="logprob",
            same_token=pl.col("ident") == pl.col("ident_ref"),
            same_bits=pl.col("bits") == pl.col("bits_ref"),
            ulp=(pl.col("ordered") - pl.col("ordered_ref")).abs(),
        )
        .cast(pl.Schema(_PREFILL_SCHEMA))
    )


def attribution_table(run: Run) -> pl.DataFrame:
    """Each request of a run that parts from m=1, with the first control of ``LADDER`` that reproduces it.

    One row per batched request (of any arm) whose logprob bits or tokens part from ref #1 of its
    prompt: where (``bitwise_prefix``: steps equal bit for bit; ``divergence_at``: the first token
    that differs, null when only bits do), ``kind`` (``"tokens"`` or ``"bits"``), the ``cause`` and
    the evidence: the control request that parts earliest (its arm, c, repeat, slot, the step where
    it parts, ``evidence_part``, and whether its tokens or only bits part). A divergence no control
    reproduces has the cause ``"unexplained"`` and no evidence. A run without arms has only its
    copies (or, in the needle layout, mixed) bands, so only co-batching (or mixing) can be named.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    polars.DataFrame

    Raises
    ------
    RunError
        ``run`` is not a Run (a manifest that is no dict).

    Examples
    --------
    >>> from analysis import read_run
    >>> table = attribution_table(read_run("data/experiment-cpu/default"))  # a run without arms: only co-batching can be named
    >>> sorted(set(table["cause"]))
    ['co-batching']
    """
    if not isinstance(run.manifest, dict):
        raise RunError("attribution_table needs a Run")
    slots = slot_table(run).with_columns(parted=pl.col("bitwise_prefix") < pl.col("length"))
    return _attribute(slots, prefill_table(run))


def _attribute(slots: pl.DataFrame, prefill: pl.DataFrame) -> pl.DataFrame:
    """The ladder over a slot table (with ``parted``) and a prefill table: what :func:`attribution_table` returns."""
    parted = slots.filter("parted").with_columns(
        kind=pl.when(pl.col("divergence_at").is_not_null()).then(pl.lit("tokens")).otherwise(pl.lit("bits"))
    )
    controls = _controls(parted, prefill)
    at_c = [arm for _, arm, same_c in LADDER if same_c]
    candidates = (
        parted.select("prompt_id", "arm", "c", "repeat", "slot", "bitwise_prefix")
        .with_row_index("row")
        .join(controls, on="prompt_id", how="inner", suffix="_control")
        .filter(pl.col("control_part") <= pl.col("bitwise_prefix"))
        .filter(~pl.col("evidence_arm").is_in(at_c) | (pl.col("c_control") == pl.col("c")))
        .sort("row", "rung", "control_part", "evidence_c", "evidence_repeat", "evidence_slot")
        .unique("row", keep="first", maintain_order=True)
    )
    causes = [name for name, _, _ in LADDER]
    chosen = candidates.select(
        "row",
        cause=pl.col("rung").replace_strict(list(range(len(causes))), causes, return_dtype=pl.String),
        evidence_arm="evidence_arm",
        evidence_c="evidence_c",
        evidence_repeat="evidence_repeat",
        evidence_slot="evidence_slot",
        evidence_part="control_part",
        evidence_kind="evidence_kind",
    )
    table = (
        parted.with_row_index("row")
        .join(chosen, on="row", how="left", maintain_order="left")
        .with_columns(pl.col("cause").fill_null(UNEXPLAINED))
    )
    return table.select([pl.col(name).cast(dtype) for name, dtype in ATTRIBUTION_SCHEMA.items()])


def _controls(parted: pl.DataFrame, prefill: pl.DataFrame) -> pl.DataFrame:
    """Every control request that parts from m=1, as a rung of the ladder: where it parts (``control_part``) and which request it is."""
    rung_of = {arm: index for index, (_, arm, _) in enumerate(LADDER)}
    from_slots = parted.filter(pl.col("arm").is_in(list(rung_of)) & (pl.col("arm") != "prefill")).select(
        "prompt_id",
        rung=pl.col("arm").replace_strict(list(rung_of), list(rung_of.values()), return_dtype=pl.Int64),
        c="c",
        control_part="bitwise_prefix",
        evidence_arm="arm",
        evidence_c="c",
        evidence_repeat="repeat",
        evidence_slot="slot",
        evidence_kind="kind",
    )
    differs = prefill.filter(~pl.col("same_bits") | ~pl.col("same_token"))
    from_prefill = differs.select(
        "prompt_id",
        rung=pl.lit(rung_of["prefill"], pl.Int64),
        c=pl.lit(None, pl.Int64),
        control_part="position",
        evidence_arm=pl.lit("prefill"),
        evidence_c=pl.lit(None, pl.Int64),
        evidence_repeat=pl.lit(0, pl.Int64),
        evidence_slot="position",
        evidence_kind=pl.when(pl.col("same_token")).then(pl.lit("bits")).otherwise(pl.lit("tokens")),
    )
    return pl.concat([from_slots.cast(pl.Schema(_CONTROL_SCHEMA)), from_prefill.cast(pl.Schema(_CONTROL_SCHEMA))])


def attribution_shares(table: pl.DataFrame) -> pl.DataFrame:
    """How much of the drift each cause accounts for, per c: of the requests at c that part from m=1, how many
    each cause explains (``requests``) and their share (``share``), causes in ladder order.

    Parameters
    ----------
    table : polars.DataFrame
        An attribution table (``c`` and ``cause`` at least).

    Returns
    -------
    polars.DataFrame
        ``c``, ``cause``, ``requests`` and ``share`` (of that c's parting requests, 0 to 1).

    Examples
    --------
    >>> table = pl.DataFrame({"c": [1, 4, 4, 4], "cause": ["cache state", "cache state", "co-batching", "unexplained"]})
    >>> attribution_shares(table).rows()
    [(1, 'cache state', 1, 1.0), (4, 'cache state', 1, 0.3333333333333333), (4, 'co-batching', 1, 0.3333333333333333), (4, 'unexplained', 1, 0.3333333333333333)]
    """
    order = [name for name, _, _ in LADDER] + [UNEXPLAINED]
    counted = table.group_by("c", "cause").agg(requests=pl.len().cast(pl.Int64))
    return (
        counted.with_columns(
            share=pl.col("requests") / pl.col("requests").sum().over("c"),
            _order=pl.col("cause").replace_strict(
                order, list(range(len(order))), default=len(order), return_dtype=pl.Int64
            ),
        )
        .sort("c", "_order")
        .drop("_order")
    )
