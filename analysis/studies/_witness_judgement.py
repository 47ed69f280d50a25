"""The judgement of a witness file, by the rules of :mod:`analysis.studies._judgement`: one row per witness, arm ``witness``.

A witness keeps each request's tokens (how far it agrees with m=1), not its logprobs, so its bits are never known: a
witness in which nothing parts is UNVERIFIED ("tokens identical, bits not recorded"), never GREEN. When its two m=1
references part before the reference length (``reference_self_divergence_at``) or a request sent alone parts, it is RED
for run-to-run drift; else the first batched request that parts makes it RED for co-batching.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from ..metrics import cost_by_c, divergence_bound, requests_needed
from ._judgement_cost import cost_words
from ._judgement_frame import SCHEMA, Judgement

_CAUSE_STEP = {
    "run-to-run": "make it repeat itself alone (no prompt cache, deterministic kernels), then record again",
    "co-batching": "batch-invariant kernels or build, then record again",
}


def judge_witnesses(ws: Any, *, target_rate: float = 0.01, confidence: float = 0.95) -> Judgement:
    """One row per witness file of a witness set (markers carry no verdict), in the order they were read.

    Parameters
    ----------
    ws : WitnessSet
        The witnesses.
    target_rate : float, default 0.01
        The divergence rate the batched requests must bound themselves below to be GREEN, in (0, 1].
    confidence : float, default 0.95
        The confidence of the one-sided upper bound on the divergence rate, in (0, 1).

    Returns
    -------
    Judgement

    Examples
    --------
    >>> from analysis import read_witnesses
    >>> j = judge_witnesses(read_witnesses("data/aprender-lambda"))
    >>> j.frame.select("run", "verdict", "cause").rows()  # doctest: +NORMALIZE_WHITESPACE
    [('data/aprender-lambda/witness-v3.0-rule.json', 'RED', 'run-to-run'),
     ('data/aprender-lambda/witness-variant-batched-prefill-0.json', 'RED', 'co-batching'),
     ('data/aprender-lambda/witness@464c168e62.json', 'RED', 'run-to-run')]
    """
    needed = requests_needed(target_rate, confidence)
    rows = [
        _judge_witness(witness, slots, bands, target_rate, confidence, needed)
        for witness, slots, bands in ws.each_witness()
    ]
    return Judgement(pl.DataFrame(rows, schema=SCHEMA, orient="row") if rows else pl.DataFrame(schema=SCHEMA))


def _span(witness: dict[str, Any]) -> int | None:
    """The token the witness's two m=1 references part at, when they part before its reference length; else None."""
    at, tokens = witness["reference_self_divergence_at"], witness["reference_tokens"]
    return at if at is not None and tokens is not None and at < tokens else None


def _judge_witness(
    witness: dict[str, Any],
    slots: pl.DataFrame,
    bands: pl.DataFrame,
    target_rate: float,
    confidence: float,
    needed: int,
) -> dict[str, Any]:
    # a slot parts where it and its reference stop agreeing before the longer of the two ends: a slot that ends while its
    # reference goes on has parted at that token (and one that goes on past its reference's end, there). No reference
    # length (a witness without its reference): each slot's own length; a literal, as fill_null(None) raises
    reference = pl.lit(witness["reference_tokens"])
    length = pl.max_horizontal(pl.col("completion_tokens").fill_null(reference), reference)
    judged = (
        slots.filter(pl.col("refused").is_null())
        .with_columns(parted=(pl.col("agree_to") < length).fill_null(False))
        .sort("c", "i")
    )
    batched, alone = judged.filter(pl.col("c") > 1), judged.filter(pl.col("c") == 1)
    span = _span(witness)
    expected = int(bands.filter(pl.col("c") > 1)["c"].sum()) if bands.height else 0
    unformed = bands.filter((pl.col("c") > 1) & ~(pl.col("m_formed") >= pl.col("c")).fill_null(False))
    divergent = batched.filter("parted")
    row: dict[str, Any] = {
        "run": witness["source"],
        "arm": "witness",
        "engine": f"aprender (witness_version {witness['witness_version']})",
        "requests": batched.height,
        "contexts": batched.height,  # a witness's slots: one context each (c, slot), its one prompt
        "prompts": 1 if batched.height else 0,
        "divergent": divergent.height,
        "tokens_parted": divergent.height,
        "bits_only": 0,
        "bits_unknown": batched.height - divergent.height,
        "alone": alone.height + (1 if witness["reference_tokens"] else 0),
        "alone_parted": int(alone["parted"].sum()) + (1 if span is not None else 0),
        "bands": bands.filter(pl.col("c") > 1).height,
        "bands_unformed": unformed.height,
        "missing": max(0, expected - batched.height),
        "cs_missing": [],
        "upper_bound": divergence_bound(divergent.height, batched.height, confidence) if batched.height else None,
        "rule_of_three": None,
        "target_rate": target_rate,
        "confidence": confidence,
        "requests_needed": needed,
        "max_ulp": None,
        "cost_by_c": _cost(bands),
        "unformed": [
            {"prompt_id": None, "c": c, "repeat": None, "widest_seen": m}
            for c, m in unformed.select("c", "m_formed").iter_rows()
        ],
    }
    if row["alone_parted"]:
        first_alone = alone.filter("parted")
        if span is not None:
            first = {"c": None, "slot": 1, "role": "ref #2", "position": span}
            words = f"the two m=1 references part at token {span} of {witness['reference_tokens']}"
        else:
            hit = first_alone.row(0, named=True)
            first = {"c": 1, "slot": hit["i"], "role": "c=1", "position": hit["agree_to"]}
            words = f"the request sent alone (c=1 slot {hit['i']}) parts from m=1 at token {hit['agree_to']}"
        early = divergent.filter(pl.col("agree_to") < span) if span is not None else divergent.clear()
        before = (
            f" ({early.height} batched requests part earlier than that, the first at c={early['c'][0]} token {early['agree_to'][0]})"
            if early.height
            else ""
        )
        row.update(
            verdict="RED",
            cause="run-to-run",
            first=words,
            reason=f"not reproducible alone (run to run): {words}{before}; batching is not judged until the server repeats itself alone",
        )
    elif divergent.height:
        hit = divergent.row(0, named=True)
        first = {"c": hit["c"], "slot": hit["i"], "role": f"c={hit['c']}", "position": hit["agree_to"]}
        words = f"c={hit['c']} slot {hit['i']}: its tokens part at token {hit['agree_to']}"
        row.update(
            verdict="RED",
            cause="co-batching",
            first=words,
            reason=f"{divergent.height} of {batched.height} batched requests part from m=1 in tokens; the first is {words}",
        )
    else:
        first = None
        gaps = [
            f"a witness records tokens, not logprob bits: {batched.height} batched requests token-identical to m=1, their bits unknown"
        ]
        if unformed.height:
            gaps.append(f"{unformed.height} of {row['bands']} batched bands never seen formed at their c")
        if row["missing"]:
            gaps.append(f"{row['missing']} batched request(s) absent or refused")
        row.update(
            verdict="UNVERIFIED",
            cause="incomplete evidence",
            first=None,
            reason="no request parts from m=1, but " + "; ".join(gaps),
        )
    row["first_request"] = (
        None if first is None else {"prompt_id": None, "repeat": None, "max_ulp": None, "parted": "tokens", **first}
    )
    row["evidence"] = (
        f"{row['requests']} batched requests, {row['bands'] - row['bands_unformed']} of {row['bands']} bands seen formed; "
        "tokens only (a witness keeps no logprobs)"
    )
    row["cost"] = cost_words(row["cost_by_c"])
    row["next_step"] = _CAUSE_STEP.get(row["cause"], "record logprobs: bia probe keeps every logprob's bits")
    return row


def _cost(bands: pl.DataFrame) -> list[dict[str, Any]]:
    """Each c's band decode rate over c=1's, as the witness recorded them (one rate a band: no interval)."""
    return cost_by_c(bands.select("c", "decode_tok_s", decode_rate_origin=pl.lit("witness")))
