"""Parity of token streams: where a request parts from its reference, how close the call was, and
what a batch of identical requests agreed on.

Positions are 0-based everywhere: ``divergence_at = 3`` means tokens 0, 1 and 2 agree and token 3
differs (aprender writes the same number as "agree_to"; a study saying "identical for 3 tokens,
diverges at token 4" counts from 1).

A :class:`Stream` is one request's completion as the dump tables hold it; build them with
:func:`streams` and compare them with :func:`compare`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ...core import as_polars

NEAR_TIE_EPSILON = 0.05


@dataclass(frozen=True)
class Stream:
    """One request's completion tokens, in order.

    Attributes
    ----------
    key : tuple
        (source, record, choice_index) of the request in the dump.
    identities : tuple
        Per position, the token id when known, else ``(text, bytes)``.
    logprobs : tuple of float or None
        The sampled token's logprob (None for sentinels and missing values).
    candidates : tuple of tuple
        Per position, the delivered ``top_logprobs`` as ``(identity, logprob or None)``, in order.
    """

    key: tuple
    identities: tuple
    logprobs: tuple = ()
    candidates: tuple = ()

    def __post_init__(self) -> None:
        if not self.logprobs:  # tokens without values (text-only dumps)
            object.__setattr__(self, "logprobs", (None,) * len(self.identities))
        if len(self.logprobs) != len(self.identities):
            raise ValueError(f"{self.key}: {len(self.logprobs)} logprobs for {len(self.identities)} tokens")

    def __len__(self) -> int:
        return len(self.identities)


def _identity(token_id: Any, text: Any, data: Any) -> Any:
    return token_id if token_id is not None else (text, data)


def streams(tokens: Any, candidates: Any | None = None, *, segment: str = "completion") -> dict[tuple, Stream]:
    """Every request's completion stream in a dump's ``tokens`` (and ``candidates``) frames.

    Rows may come in any order: a stream is its request's tokens by ``position``, and each step's
    candidates are its ``top_logprobs`` list in delivered order.

    Parameters
    ----------
    tokens : DataFrame
        A dump's tokens (polars or pandas).
    candidates : DataFrame, optional
        Its candidates; without them the streams have none.
    segment : {"completion", "prompt"}, default "completion"
        Which tokens.

    Returns
    -------
    dict of tuple to Stream
        Keyed by (source, record, choice_index).

    Examples
    --------
    >>> import analysis
    >>> d = analysis.read_dump("tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json")
    >>> s = next(iter(streams(d.tokens, d.candidates).values()))
    >>> len(s), s.identities[:3]
    (10, (9707, 0, 2585))
    """
    key = ["source", "record", "choice_index"]
    tokens = as_polars(tokens).filter(pl.col("segment") == segment).sort(*key, "position").with_row_index("_row")
    steps: list[tuple[tuple[Any, float | None], ...]] = [()] * tokens.height  # per token row: (identity, logprob)s
    if candidates is not None:
        cands = (
            as_polars(candidates)
            .filter((pl.col("segment") == segment) & (pl.col("list_kind") == "top_logprobs"))
            .join(tokens.select(*key, "position", "_row"), on=[*key, "position"], how="inner", nulls_equal=True)
            .sort("_row", "list_index")
        )
        lists = cands.group_by("_row", maintain_order=True).agg(
            "cand_token_id", "cand_token_text", "cand_token_bytes", "cand_logprob"
        )
        for row, ids, texts, data, values in lists.iter_rows():  # one Python step per token, not per candidate row
            steps[row] = tuple(zip(map(_identity, ids, texts, data), values))
    columns = [tokens[name].to_list() for name in (*key, "token_id", "token_text", "token_bytes", "logprob")]
    out: dict[tuple, tuple[list, list, list]] = {}
    for row, (source, record, choice, token_id, text, data, logprob) in enumerate(zip(*columns)):
        ids, lps, cands_ = out.setdefault((source, record, choice), ([], [], []))
        ids.append(_identity(token_id, text, data))
        lps.append(logprob)
        cands_.append(steps[row])
    return {k: Stream(k, tuple(ids), tuple(lps), tuple(c)) for k, (ids, lps, c) in out.items()}


# --- one step ---------------------------------------------------------------------------------


def top2_margin(candidates: Iterable[tuple[Any, float | None]]) -> float | None:
    """Best minus second-best finite candidate logprob; None with fewer than two (never 0.0).

    Parameters
    ----------
    candidates : iterable of tuple of (object, float or None)
        (identity, logprob) pairs.

    Returns
    -------
    float or None

    Examples
    --------
    >>> top2_margin([("a", -0.1), ("b", -0.3), ("c", None)])
    0.19999999999999998
    >>> top2_margin([("a", -0.1), ("b", float("-inf"))]) is None
    True
    """
    values = sorted((v for _, v in candidates if v is not None and math.isfinite(v)), reverse=True)
    return values[0] - values[1] if len(values) >= 2 else None


def is_near_tie(margin: float | None, epsilon: float = NEAR_TIE_EPSILON) -> bool:
    """``0 <= margin < epsilon`` (half-open, as aprender's V3 check reads it).

    Parameters
    ----------
    margin : float or None
        A top-1 minus top-2 margin (None: unknown, never a near tie).
    epsilon : float, default 0.05
        The threshold (``NEAR_TIE_EPSILON``).

    Returns
    -------
    bool
    """
    return margin is not None and 0.0 <= margin < epsilon


def ulp_distance(a: float, b: float) -> int:
    """How many float32 values lie between ``a`` and ``b`` once both are cast to float32.

    Parameters
    ----------
    a, b : float
        The values.

    Returns
    -------
    int

    Examples
    --------
    >>> ulp_distance(1.0, float(np.nextafter(np.float32(1.0), np.float32(2.0))))
    1
    >>> ulp_distance(-0.0, 0.0), ulp_distance(-1.5, -1.5)
    (0, 0)
    """
    bits = np.array([a, b], dtype=np.float32).view(np.int32).astype(np.int64)
    ordered = np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)  # a line on which float order is integer order
    return int(abs(ordered[0] - ordered[1]))


def same_float32(a: float | None, b: float | None) -> bool:
    """Bitwise equality after casting to float32; two missing values are equal.

    Parameters
    ----------
    a, b : float or None
        The values.

    Returns
    -------
    bool
    """
    if a is None or b is None:
        return a is None and b is None
    return np.float32(a).view(np.int32) == np.float32(b).view(np.int32)


# --- two streams ------------------------------------------------------------------------------


def agreement(a: Sequence, b: Sequence) -> int:
    """How many leading tokens two identity sequences share.

    Parameters
    ----------
    a, b : sequence
        Token identities.

    Returns
    -------
    int

    Examples
    --------
    >>> agreement([1, 2, 3, 4], [1, 2, 9, 4]), agreement([1, 2], [1, 2, 3])
    (2, 2)
    """
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Comparison:
    """One stream against its reference. Positions are 0-based.

    Attributes
    ----------
    agree_to : int
        Leading tokens on which both agree.
    diverged : bool
        True when the streams part within their common length (False when one is only shorter).
    divergence_at : int or None
        The first differing position; None when they never part.
    bitwise_prefix : int
        Leading positions whose tokens agree and whose float32 logprobs are bit-identical.
    max_abs_delta, max_ulp : float, int or None
        Over the agreeing prefix, the largest ``|difference|`` of the sampled logprobs and its ULP distance.
    topk_order_changes, topk_set_changes : int
        Agreeing positions whose top-k candidate order, or set, differs.
    reference_margin, own_margin : float or None
        Top-1 minus top-2 at the divergence, in the reference and in this stream.
    in_reference_topk : bool or None
        Whether this stream's token at the divergence is among the reference's candidates there.
    near_tie : bool
        The reference margin at the divergence is below epsilon.
    """

    agree_to: int
    diverged: bool
    divergence_at: int | None
    bitwise_prefix: int
    max_abs_delta: float | None
    max_ulp: int | None
    topk_order_changes: int
    topk_set_changes: int
    reference_margin: float | None
    own_margin: float | None
    in_reference_topk: bool | None
    near_tie: bool
    length: int = 0
    reference_length: int = 0
    k3_mean: float | None = None
    k3_max: float | None = None
    kl_topk_mean: float | None = None
    kl_topk_max: float | None = None
    epsilon: float = field(default=NEAR_TIE_EPSILON, repr=False)


def compare(reference: Stream, other: Stream, *, epsilon: float = NEAR_TIE_EPSILON) -> Comparison:
    """Compare ``other`` with ``reference`` position by position.

    Parameters
    ----------
    reference : Stream
        The reference stream.
    other : Stream
        The stream compared with it.
    epsilon : float, default 0.05
        The near-tie epsilon: a divergence where the reference's top-1 margin is below it is a near tie
        (``NEAR_TIE_EPSILON``).

    Returns
    -------
    Comparison

    Examples
    --------
    >>> ref = Stream(("r",), (1, 2, 3), (-0.1, -0.2, -0.3), ((), (), ((3, -0.3), (4, -0.31))))
    >>> c = compare(ref, Stream(("b",), (1, 2, 4), (-0.1, -0.25, -0.31)))
    >>> c.divergence_at, c.bitwise_prefix, c.near_tie, c.in_reference_topk
    (2, 1, True, True)
    """
    agree = agreement(reference.identities, other.identities)
    diverged = agree < min(len(reference), len(other))
    bitwise = 0
    while bitwise < agree and same_float32(reference.logprobs[bitwise], other.logprobs[bitwise]):
        bitwise += 1
    deltas = [
        (abs(a - b), ulp_distance(a, b))
        for a, b in zip(reference.logprobs[:agree], other.logprobs[:agree])
        if a is not None and b is not None
    ]
    order = sets = 0
    for j in range(agree):
        ref_top = [c for c, _ in _cands(reference, j)]
        own_top = [c for c, _ in _cands(other, j)]
        if ref_top and own_top:
            order += ref_top != own_top
            sets += set(ref_top) != set(own_top)
    k3s = [k for a, b in zip(reference.logprobs[:agree], other.logprobs[:agree]) if (k := k3(a, b)) is not None]
    kls = [k for j in range(agree) if (k := topk_kl(_cands(reference, j), _cands(other, j))) is not None]
    ref_margin = own_margin = in_top = None
    if diverged:
        ref_cands, own_cands = _cands(reference, agree), _cands(other, agree)
        ref_margin, own_margin = top2_margin(ref_cands), top2_margin(own_cands)
        in_top = other.identities[agree] in {c for c, _ in ref_cands} if ref_cands else None
    return Comparison(
        agree_to=agree,
        diverged=diverged,
        divergence_at=agree if diverged else None,
        bitwise_prefix=bitwise,
        max_abs_delta=max((d for d, _ in deltas), default=None),
        max_ulp=max((u for _, u in deltas), default=None),
        topk_order_changes=order,
        topk_set_changes=sets,
        reference_margin=ref_margin,
        own_margin=own_margin,
        in_reference_topk=in_top,
        near_tie=is_near_tie(ref_margin, epsilon),
        length=len(other),
        reference_length=len(reference),
        k3_mean=sum(k3s) / len(k3s) if k3s else None,
        k3_max=max(k3s, default=None),
        kl_topk_mean=sum(kls) / len(kls) if kls else None,
        kl_topk_max=max(kls, default=None),
        epsilon=epsilon,
    )


def k3(reference_logprob: float | None, other_logprob: float | None) -> float | None:
    """prime-rl's per-token mismatch ``exp(d) - 1 - d`` with ``d = other - reference`` (the same token's
    logprob in two runs): 0 when they agree, positive otherwise, second order in ``d`` when small.

    Parameters
    ----------
    reference_logprob, other_logprob : float or None
        The token's logprob in each run.

    Returns
    -------
    float or None
        None when either is missing.

    Examples
    --------
    >>> k3(-0.5, -0.5)
    0.0
    >>> round(k3(math.log(0.5), math.log(0.4)), 6)  # d = ln 0.8: 0.8 - 1 - ln 0.8
    0.023144
    >>> k3(None, -0.5) is None
    True
    >>> k3(-800.0, -0.1)
    inf
    """
    if reference_logprob is None or other_logprob is None:
        return None
    d = other_logprob - reference_logprob
    try:
        return math.expm1(d) - d
    except (
        OverflowError
    ):  # d above ~709 (a token near -800 in the reference, likely in the other): exp(d) is beyond any float
        return math.inf


def topk_kl(reference: Sequence[tuple[Any, float | None]], other: Sequence[tuple[Any, float | None]]) -> float | None:
    """KL(reference || other) over the reference's top-k tokens plus one bucket for the rest of the vocabulary.

    Merging tokens into buckets never raises a KL, so this is a lower bound on the full KL. It needs
    every token of the reference's top-k in the other's list (their probability is unknown otherwise):
    None when one is missing or a list is empty. The first entry of a token counts (vLLM repeats the
    sampled token). The rest buckets are floored at 1e-12, since they come from a subtraction.

    Parameters
    ----------
    reference, other : sequence of tuple of (object, float or None)
        Each stream's (identity, logprob) candidates at one step.

    Returns
    -------
    float or None
        In nats.

    Examples
    --------
    >>> ref = [("A", math.log(0.5)), ("B", math.log(0.3))]  # the rest: 0.2
    >>> other = [("B", math.log(0.4)), ("A", math.log(0.4))]  # the rest: 0.2
    >>> round(topk_kl(ref, other), 5)  # 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4) + 0.2 ln(0.2/0.2)
    0.02527
    >>> topk_kl(ref, [("A", math.log(0.5))]) is None  # B is not in the other's list
    True
    """

    def probabilities(cands):
        out: dict[Any, float] = {}
        for token, value in cands:
            if token not in out and value is not None and math.isfinite(value):
                out[token] = math.exp(value)
        return out

    p, q = probabilities(reference), probabilities(other)
    if not p or any(token not in q for token in p):
        return None
    # The rest buckets come from a subtraction, so rounding can leave them at zero or a hair below: floor them.
    p_rest = max(1.0 - sum(p.values()), _REST_FLOOR)
    q_rest = max(1.0 - sum(q[token] for token in p), _REST_FLOOR)
    pairs = [(p[token], q[token]) for token in p] + [(p_rest, q_rest)]
    total = sum(a * math.log(a / b) for a, b in pairs if a > _REST_FLOOR and b > 0.0)
    if any(a > _REST_FLOOR and b <= 0.0 for a, b in pairs):  # a probability that underflowed to 0.0
        return math.inf
    return max(total, 0.0)


_REST_FLOOR = 1e-12


def _cands(stream: Stream, position: int) -> tuple:
    return stream.candidates[position] if position < len(stream.candidates) else ()
