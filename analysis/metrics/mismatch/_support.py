"""Sampling masks: the renderers' rules on a recorded support, and prime-rl's replay of the trainer's logprob on it.

The sampler keeps a support S per step (the tokens whose processed logit is finite after temperature,
top-k, top-p, min-p); with vLLM's ``processed_logprobs`` the sampled token's logprob is renormalized
over S. prime-rl's trainer replays the mask (PrimeIntellect-ai/prime-rl @ 559b4477): where the row is
non-empty and holds the label, ``t = z_y/T − logsumexp_{v∈S}(z_v/T)``. From the trainer's
full-vocabulary logprobs ``t_v`` of the ids in S (at the same temperature) that is
``t_y − logsumexp_{v∈S} t_v``, which is what :func:`replay` computes.

Token columns: ``token_id`` (the sampled id), ``support_ids`` (list of ids, null where no mask was
recorded), optionally ``support_logprobs`` (the sampler's, parallel to the ids) and
``trainer_support_logprobs`` (the trainer's full-vocabulary logprobs of the same ids).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from polars.expr.whenthen import ChainedThen, Then

#: The renderers client's tolerance on Σ exp(logprob) over a recorded support.
SUM_TOLERANCE = 1e-4

#: rule name -> what it says, in the order they are checked.
RULES = {
    "empty_row": "an empty support row",
    "repeated_id": "the support row repeats an id",
    "sampled_id_missing": "the sampled id is missing from its support",
    "logprobs_not_parallel": "the support's logprobs are not parallel to its ids",
    "probabilities_do_not_sum_to_1": f"the support's probabilities do not sum to 1 within {SUM_TOLERANCE:g}",
    "trainer_support_missing": "the trainer's logprobs of the support ids are missing",
}


class SamplingMaskError(ValueError):
    """A recorded sampling support that breaks the renderers' rules, or that the trainer's logprobs cannot replay.

    Attributes
    ----------
    rule : str
        One of the rules (``RULES`` in the mask checker): ``empty_row``, ``repeated_id``, ``sampled_id_missing``,
        ``logprobs_not_parallel``, ``probabilities_do_not_sum_to_1``, ``trainer_support_missing``.
    sequence, position
        The first token that breaks it.

    Examples
    --------
    >>> str(SamplingMaskError("empty_row", "s0", 3))
    "sampling mask rule 'empty_row' broken at sequence 's0', position 3: an empty support row"
    """

    def __init__(self, rule: str, sequence, position, detail: str = ""):
        self.rule, self.sequence, self.position = rule, sequence, position
        super().__init__(
            f"sampling mask rule {rule!r} broken at sequence {sequence!r}, position {position}: {RULES[rule]}{detail}"
        )


def _logsumexp(column: str) -> pl.Expr:
    e = pl.element()
    return pl.col(column).list.eval((e - e.max()).exp().sum().log() + e.max()).list.first()


def violations(tokens: pl.LazyFrame, *, replay: bool) -> pl.LazyFrame:
    """The tokens with a support that breaks a rule, with a ``rule`` column naming the first it breaks.

    Parameters
    ----------
    tokens : polars.LazyFrame
        The token frame, with ``support_ids`` and ``token_id``.
    replay : bool
        Also check that the trainer's logprobs on the support are there, one per id.

    Returns
    -------
    polars.LazyFrame

    Examples
    --------
    >>> tokens = pl.LazyFrame({"sequence": [0, 0], "position": [0, 1], "token_id": [1, 1],
    ...                        "support_ids": [[0, 1], [0, 0]]})
    >>> violations(tokens, replay=False).select("position", "rule").collect().rows()
    [(1, 'repeated_id')]
    """
    names = tokens.collect_schema().names()
    ids = pl.col("support_ids")
    n = ids.list.len()
    checks = [
        ("empty_row", n == 0),
        ("repeated_id", ids.list.n_unique() != n),
        ("sampled_id_missing", ~ids.list.contains(pl.col("token_id"))),
    ]
    if "support_logprobs" in names:
        lp = pl.col("support_logprobs")
        checks.append(("logprobs_not_parallel", lp.is_not_null() & (lp.list.len() != n)))
        total = lp.list.eval(pl.element().exp()).list.sum()
        checks.append(("probabilities_do_not_sum_to_1", lp.is_not_null() & ((total - 1.0).abs() > SUM_TOLERANCE)))
    if replay:
        trainer = (
            pl.col("trainer_support_logprobs")
            if "trainer_support_logprobs" in names
            else pl.lit(None, pl.List(pl.Float64))
        )
        checks.append(
            (
                "trainer_support_missing",
                trainer.is_null() | (trainer.list.len() != n) | trainer.list.eval(pl.element().is_null()).list.any(),
            )
        )
    rule: Then | ChainedThen = pl.when(checks[0][1]).then(pl.lit(checks[0][0]))
    for name, broken in checks[1:]:
        rule = rule.when(broken).then(pl.lit(name))
    return tokens.filter(ids.is_not_null()).with_columns(rule=rule).filter(pl.col("rule").is_not_null())


def replay(tokens: pl.LazyFrame) -> pl.LazyFrame:
    """The trainer's logprob renormalized on the sampler's support where one was recorded; ``has_support`` says where.

    ``trainer_logprob_full`` keeps the full-vocabulary value. Rows without a support keep theirs.

    Parameters
    ----------
    tokens : polars.LazyFrame
        The token frame, with ``support_ids`` and ``trainer_support_logprobs``.

    Returns
    -------
    polars.LazyFrame

    Examples
    --------
    >>> import math
    >>> full = [2.05, 0.98, 0.5, -1.0, -3.0]  # the spec's trainer logits, T = 1
    >>> lse = math.log(sum(math.exp(z) for z in full))
    >>> tokens = pl.LazyFrame({"trainer_logprob": [0.98 - lse], "support_ids": [[0, 1]],
    ...                        "trainer_support_logprobs": [[2.05 - lse, 0.98 - lse]]})
    >>> round(replay(tokens).collect()["trainer_logprob"].item(), 6)
    -1.364912
    """
    has = pl.col("support_ids").is_not_null()
    return tokens.with_columns(
        trainer_logprob=pl.when(has)
        .then(pl.col("trainer_logprob") - _logsumexp("trainer_support_logprobs"))
        .otherwise(pl.col("trainer_logprob")),
        trainer_logprob_full=pl.col("trainer_logprob"),
        has_support=has,
    )


def check_and_replay(tokens: pl.LazyFrame, *, replay_support: bool = True) -> pl.LazyFrame:
    """Refuse a support that breaks a rule (:class:`SamplingMaskError`), then replay the trainer's logprob on it.

    A frame without ``support_ids`` comes back with ``has_support`` false everywhere. With
    ``replay_support=False`` the trainer's logprob is taken as already on the support (prime-rl's own export).

    Parameters
    ----------
    tokens : polars.LazyFrame
        The token frame, with ``support_ids`` (and ``token_id``, ``support_logprobs``, ``trainer_support_logprobs``)
        where a support was recorded.
    replay_support : bool, default True
        Replay the trainer's logprob on the support.

    Returns
    -------
    polars.LazyFrame

    Examples
    --------
    >>> tokens = pl.LazyFrame({"sequence": ["a"], "position": [4], "token_id": [7], "support_ids": [[]],
    ...                        "trainer_logprob": [-1.0]}, schema_overrides={"support_ids": pl.List(pl.Int64)})
    >>> check_and_replay(tokens)
    Traceback (most recent call last):
    ...
    analysis.SamplingMaskError: sampling mask rule 'empty_row' broken at sequence 'a', position 4: an empty support row
    """
    if "support_ids" not in tokens.collect_schema().names():
        return tokens.with_columns(has_support=pl.lit(False))
    bad = (
        violations(tokens, replay=replay_support)
        .select("sequence", "position", "rule")
        .head(1)
        .collect(engine="streaming")
    )
    if bad.height:
        sequence, position, rule = bad.row(0)
        raise SamplingMaskError(rule, sequence, position)
    if replay_support:
        return replay(tokens)
    return tokens.with_columns(has_support=pl.col("support_ids").is_not_null())
