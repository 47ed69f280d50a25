"""One model through several engines: where each engine's streams part from a reference engine's, and whether each
engine is batch invariant by itself.

The runs must hold the same prompts (same ids, same text), decoded greedily: torch, llama.cpp and vLLM serving bia's
one model, for example. Each engine's m=1 references and each of its bands are compared with the reference engine's
m=1 stream of the same prompt (:func:`analysis.slot_table` with a run as ``reference``), and each band with the
engine's own m=1 as well, which says whether the engine is batch invariant by itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import polars as pl

from ..metrics import parity
from ..run import RunError, RunLike, read_run, references, slot_table
from ._comparison import engine_label

_SCHEMA = {
    "engine": pl.String,
    "run": pl.String,
    "role": pl.String,
    "c": pl.Int64,
    "requests": pl.Int64,
    "token_identical": pl.Int64,
    "earliest_divergence": pl.Int64,
    "min_bitwise_prefix": pl.Int64,
    "max_ulp": pl.Int64,
    "max_abs_delta": pl.Float64,
    "own_m1_bit_identical": pl.Float64,
}


def engine_table(runs: Iterable[Any], *, reference: Any = 0) -> pl.DataFrame:
    """Per engine (run) and c, how its streams compare with the reference engine's m=1 streams, and with its own.

    Parameters
    ----------
    runs : iterable of Run or path
        One run per engine (or per engine setting), over the same prompts.
    reference : int, Run or path
        The reference engine: an index into ``runs`` (the first by default), or a run.

    Returns
    -------
    pl.DataFrame
        One row per run and role: ``role`` "m=1" is the run's ref #1 of each prompt (``c`` null), "band" one row per
        ``c``. Against the reference engine's ref #1 of the same prompt: ``requests``, ``token_identical`` (how many
        never part in tokens), ``earliest_divergence`` (null when none parts), ``min_bitwise_prefix`` (the shortest
        prefix of bit-identical logprobs), ``max_ulp`` and ``max_abs_delta`` (over the agreeing tokens).
        ``own_m1_bit_identical``: the share of the band's requests bit-identical to the run's own ref #1 (for the
        "m=1" row, whether its ref #2 is: run to run). Whether a run is batch invariant is :func:`analysis.judge`'s to say.

    Examples
    --------
    >>> table = engine_table(["data/experiment-cpu/default", "data/llamacpp-cpu/no-cache-prompt"])
    >>> table.filter(pl.col("role") == "m=1").select("engine", "token_identical", "min_bitwise_prefix").rows()
    [('bia torch (analysis.experiment) (default)', 2, 64), ('llama.cpp server (no-cache-prompt)', 2, 0)]
    """
    runs = [_as_run(r) for r in runs]
    if not runs:
        return pl.DataFrame(schema=_SCHEMA)
    base = runs[reference] if isinstance(reference, int) else _as_run(reference)
    for run in runs:
        _check_same_prompts(run, base)
    frames = [_engine_rows(run, base) for run in runs]
    return pl.concat(frames, how="vertical").select([pl.col(n).cast(t) for n, t in _SCHEMA.items()])


def _as_run(run: Any) -> Any:
    return run if isinstance(run, RunLike) else read_run(run)


def _prompt_texts(run: Any) -> dict[str, Any]:
    return {str(p.get("prompt_id")): p.get("text") for p in run.manifest.get("prompts", [])}


def _check_same_prompts(run: Any, base: Any) -> None:
    """Runs compared across engines must have sent the same text under each prompt id they share."""
    ours, theirs = _prompt_texts(run), _prompt_texts(base)
    for prompt in sorted(ours.keys() & theirs.keys()):
        if ours[prompt] is not None and theirs[prompt] is not None and ours[prompt] != theirs[prompt]:
            raise RunError(
                f"{run.path or 'assembled run'}: prompt {prompt!r} is {ours[prompt]!r}, but {base.path or 'the reference'} "
                f"sent {theirs[prompt]!r} under that id; engines are compared on the same prompts"
            )


def _engine_rows(run: Any, base: Any) -> pl.DataFrame:
    """The m=1 row and one row per c of one run, against ``base``'s ref #1 and its own."""
    label = engine_label(run)
    where = run.label
    against, own = slot_table(run, reference=base), slot_table(run)
    own_c = own.group_by("c").agg((pl.col("bitwise_prefix") == pl.col("length")).mean().alias("own_m1_bit_identical"))
    bands = (
        against.group_by("c")
        .agg(
            pl.len().alias("requests"),
            (~pl.col("diverged")).sum().alias("token_identical"),
            pl.col("divergence_at").filter(pl.col("diverged")).min().alias("earliest_divergence"),
            pl.col("bitwise_prefix").min().alias("min_bitwise_prefix"),
            pl.col("max_ulp").max(),
            pl.col("max_abs_delta").max(),
        )
        .join(own_c, on="c", how="left")
        .rename({"c": "c"})
        .sort("c")
        .with_columns(engine=pl.lit(label), run=pl.lit(where), role=pl.lit("band"))
    )
    return pl.concat([_reference_row(run, base, label, where), bands.select(list(_SCHEMA))], how="vertical_relaxed")


def _reference_row(run: Any, base: Any, label: str, where: str) -> pl.DataFrame:
    """The run's ref #1 of each prompt against ``base``'s, and against its own ref #2 (run to run)."""
    first, second, theirs = references(run, "ref1"), references(run, "ref2"), references(base, "ref1")
    compared = [parity.compare(theirs[p], first[p]) for p in sorted(first.keys() & theirs.keys())]
    alone = [parity.compare(first[p], second[p]) for p in sorted(first.keys() & second.keys())]
    parted = [cast(int, c.divergence_at) for c in compared if c.diverged]  # a diverged comparison has its divergence_at
    repeat_same = [c.bitwise_prefix == min(c.length, c.reference_length) for c in alone]
    return pl.DataFrame(
        [
            {
                "engine": label,
                "run": where,
                "role": "m=1",
                "c": None,
                "requests": len(compared),
                "token_identical": sum(not c.diverged for c in compared),
                "earliest_divergence": min(parted, default=None),
                "min_bitwise_prefix": min((c.bitwise_prefix for c in compared), default=None),
                "max_ulp": max((c.max_ulp for c in compared if c.max_ulp is not None), default=None),
                "max_abs_delta": max((c.max_abs_delta for c in compared if c.max_abs_delta is not None), default=None),
                "own_m1_bit_identical": sum(repeat_same) / len(repeat_same) if repeat_same else None,
            }
        ],
        schema=_SCHEMA,
    )


def default_engine_reference(runs: list[Any]) -> int:
    """Which of ``runs`` the report takes as the reference engine: torch in its default kernel mode, else the first.

    Parameters
    ----------
    runs : list of Run
        The runs, in the report's order.

    Returns
    -------
    int
        The reference run's index in ``runs``.

    Examples
    --------
    >>> default_engine_reference([read_run(p) for p in ("data/llamacpp-cpu/no-cache-prompt", "data/experiment-cpu/default")])
    1
    """
    for k, run in enumerate(runs):
        identity = run.manifest.get("identity") or {}
        if (
            "torch" in str(identity.get("engine") or "")
            and (run.manifest.get("effective") or {}).get("kernel_mode") == "default"
        ):
            return k
    return 0
