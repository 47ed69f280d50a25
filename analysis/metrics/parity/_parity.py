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
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from . import _columnar
from ..core._frames import as_polars
from ._rates import band_decode_rate, decode_rate, ratio_interval, request_decode_rates, wilson_interval

__all__ = ["Comparison", "Completions", "FLIP_EDGES", "NEAR_TIE_EPSILON", "Stream", "agreement", "avg_std_top1_prob", "band_decode_rate", "band_summary", "compare", "decode_rate", "div_index", "flip_curve", "fork_table", "is_near_tie", "k3", "longest_constant_run", "ratio_interval", "request_decode_rates", "same_float32", "std_at_acc", "step_margins", "streams", "tie_density", "top1_prob", "top2_margin", "topk_kl", "ulp_distance", "unique_completions", "wilson_interval"]

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
    steps = [()] * tokens.height
    if candidates is not None:
        cands = (as_polars(candidates).filter((pl.col("segment") == segment) & (pl.col("list_kind") == "top_logprobs"))
                 .join(tokens.select(*key, "position", "_row"), on=[*key, "position"], how="inner", nulls_equal=True)
                 .sort("_row", "list_index"))
        lists = cands.group_by("_row", maintain_order=True).agg("cand_token_id", "cand_token_text", "cand_token_bytes", "cand_logprob")
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
    """``0 <= margin < epsilon`` (half-open, as aprender's V3 check reads it)."""
    return margin is not None and 0.0 <= margin < epsilon


def ulp_distance(a: float, b: float) -> int:
    """How many float32 values lie between ``a`` and ``b`` once both are cast to float32.

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
    """Bitwise equality after casting to float32; two missing values are equal."""
    if a is None or b is None:
        return a is None and b is None
    return np.float32(a).view(np.int32) == np.float32(b).view(np.int32)


# --- two streams ------------------------------------------------------------------------------


def agreement(a: Sequence, b: Sequence) -> int:
    """How many leading tokens two identity sequences share.

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
    deltas = [(abs(a - b), ulp_distance(a, b)) for a, b in zip(reference.logprobs[:agree], other.logprobs[:agree]) if a is not None and b is not None]
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
    except OverflowError:  # d above ~709 (a token near -800 in the reference, likely in the other): exp(d) is beyond any float
        return math.inf


def topk_kl(reference: Sequence[tuple[Any, float | None]], other: Sequence[tuple[Any, float | None]]) -> float | None:
    """KL(reference || other) over the reference's top-k tokens plus one bucket for the rest of the vocabulary.

    Merging tokens into buckets never raises a KL, so this is a lower bound on the full KL. It needs
    every token of the reference's top-k in the other's list (their probability is unknown otherwise):
    None when one is missing or a list is empty. The first entry of a token counts (vLLM repeats the
    sampled token). The rest buckets are floored at 1e-12, since they come from a subtraction.

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


# --- a band of streams ----------------------------------------------------------------------------


def longest_constant_run(identities: Sequence) -> int:
    """The longest run of one repeated token (a frozen slot repeats one token).

    Examples
    --------
    >>> longest_constant_run([5, 5, 1, 7, 7, 7, 2]), longest_constant_run([])
    (3, 0)
    """
    best = run = 0
    previous = object()
    for token in identities:
        run = run + 1 if token == previous else 1
        best, previous = max(best, run), token
    return best


@dataclass(frozen=True)
class Completions:
    """How many different completions a set of identical requests produced."""

    n: int
    unique: int
    modal_count: int
    modal_share: float
    modal_interval: tuple[float, float]


def unique_completions(streams_: Iterable[Stream]) -> Completions:
    """Unique completions and the modal share, with its Wilson interval.

    Examples
    --------
    >>> c = unique_completions([Stream(("a",), (1, 2)), Stream(("b",), (1, 2)), Stream(("c",), (1, 3))])
    >>> c.unique, c.modal_count, round(c.modal_share, 3)
    (2, 2, 0.667)
    """
    counts = Counter(s.identities for s in streams_)
    n = sum(counts.values())
    modal = max(counts.values())
    return Completions(n, len(counts), modal, modal / n, wilson_interval(modal, n))


def fork_table(streams_: Sequence[Stream], at: int | None = None) -> list[tuple[Any, int]]:
    """At the first position where the streams disagree (or ``at``), each token taken and by how many.

    Examples
    --------
    >>> fork_table([Stream(("a",), (1, 2, 3)), Stream(("b",), (1, 2, 4)), Stream(("c",), (1, 2, 4))])
    [(4, 2), (3, 1)]
    """
    if at is None:
        at = min((agreement(streams_[0].identities, s.identities) for s in streams_[1:]), default=0)
    counts = Counter(s.identities[at] for s in streams_ if at < len(s))
    return counts.most_common()


def tie_density(margins: Iterable[float | None], thresholds: Sequence[float] = (1e-3, 1e-2, 1e-1)) -> dict[float, float]:
    """The fraction of steps (with a margin) whose top-1/top-2 margin is below each threshold.

    Examples
    --------
    >>> tie_density([0.0005, 0.02, 0.5, None])
    {0.001: 0.3333333333333333, 0.01: 0.3333333333333333, 0.1: 0.6666666666666666}
    """
    known = [m for m in margins if m is not None]
    if not known:
        return {t: math.nan for t in thresholds}
    return {t: sum(m < t for m in known) / len(known) for t in thresholds}


def step_margins(stream: Stream) -> list[float | None]:
    """The top-1 minus top-2 margin at every step of a stream."""
    return [top2_margin(c) for c in stream.candidates]


def band_summary(reference: Stream, slots: Sequence[Stream], *, epsilon: float = NEAR_TIE_EPSILON) -> dict[str, Any]:
    """Divergence from the reference over a band's slots, intra-batch agreement, frozen runs, completions.

    Examples
    --------
    >>> ref = Stream(("r",), (1, 2, 3, 4))
    >>> band = [Stream(("s0",), (1, 2, 3, 4)), Stream(("s1",), (1, 2, 9, 9))]
    >>> s = band_summary(ref, band)
    >>> s["divergence_min"], s["divergence_median"], s["divergence_max"], s["intra_agree_to"]
    (2, 3.0, 4, 2)
    """
    comparisons = [compare(reference, s, epsilon=epsilon) for s in slots]
    agree = [c.agree_to for c in comparisons]
    completions = unique_completions(slots)
    return {
        "n_slots": len(slots),
        "divergence_min": min(agree),
        "divergence_median": statistics.median(agree),
        "divergence_max": max(agree),
        "diverged_slots": sum(c.diverged for c in comparisons),
        "near_tie_slots": sum(c.near_tie for c in comparisons),
        "intra_agree_to": min(agreement(slots[0].identities, s.identities) for s in slots),
        "max_constant_run": max(longest_constant_run(s.identities) for s in slots),
        "unique_completions": completions.unique,
        "modal_share": completions.modal_share,
        "modal_share_low": completions.modal_interval[0],
        "modal_share_high": completions.modal_interval[1],
        "comparisons": comparisons,
    }


# --- P(flip | margin) ------------------------------------------------------------------------------


FLIP_EDGES = (0.0, 1e-3, 1e-2, 0.05, 0.1, 0.5, 1.0, math.inf)


def flip_curve(pairs: Iterable[tuple[Stream, Stream]], edges: Sequence[float] = FLIP_EDGES) -> pl.DataFrame:
    """Empirical P(flip | reference margin) over every step at risk.

    A step is at risk while the two streams still agree before it: steps 0 .. divergence_at of
    each (reference, other) pair, the last one a flip. Steps without a reference margin are left
    out. Bins are ``[edges[i], edges[i + 1])``. :func:`analysis.run.flip_table` gives the same
    for a whole run without building streams.

    Examples
    --------
    >>> ref = Stream(("r",), (1, 2), (), (((1, -0.1), (3, -0.1005)), ((2, -0.1), (4, -2.0))))
    >>> flip_curve([(ref, Stream(("b",), (3, 2)))]).filter(pl.col("steps") > 0).rows()
    [(0.0, 0.001, 1, 1, 1.0)]
    """
    margins, flips = [], []
    for reference, other in pairs:
        c = compare(reference, other)
        last = c.divergence_at if c.diverged else min(len(reference), len(other)) - 1
        for step in range(last + 1):
            margin = top2_margin(_cands(reference, step))
            if margin is not None:
                margins.append(margin)
                flips.append(c.diverged and step == c.divergence_at)
    return _columnar.flip_bins(pl.DataFrame({"margin": margins, "flip": flips}, schema={"margin": pl.Float64, "flip": pl.Boolean}), edges)


# --- decode rates -----------------------------------------------------------------------------------


# --- across configurations (Yuan et al.) --------------------------------------------------------------


def div_index(streams_: Sequence[Stream]) -> int:
    """Yuan et al.'s Div_Index: the first position (0-based) where any two of the streams differ.

    Streams that never part give their shortest length.

    Examples
    --------
    >>> div_index([Stream(("a",), (1, 2, 3)), Stream(("b",), (1, 2, 4)), Stream(("c",), (1, 5, 3))])
    1
    """
    if not streams_:
        raise ValueError("Div_Index needs at least one stream")
    return min((agreement(streams_[0].identities, s.identities) for s in streams_[1:]), default=len(streams_[0]))


def top1_prob(stream: Stream, position: int) -> float | None:
    """The top-1 probability at a step: the best finite candidate, else the sampled token's (greedy)."""
    values = [v for _, v in _cands(stream, position) if v is not None and math.isfinite(v)]
    if values:
        return math.exp(max(values))
    own = stream.logprobs[position] if position < len(stream.logprobs) else None
    return None if own is None else math.exp(own)


def avg_std_top1_prob(streams_: Sequence[Stream], upto: int | None = None) -> float | None:
    """Yuan et al.'s Avg_Std@top1_prob: the standard deviation of the top-1 probability across the
    streams (configurations), averaged over positions 0..Div_Index (population std, ddof 0).

    Examples
    --------
    >>> a = Stream(("a",), (1, 2), (math.log(0.9), math.log(0.5)))
    >>> b = Stream(("b",), (1, 2), (math.log(0.7), math.log(0.5)))
    >>> round(avg_std_top1_prob([a, b]), 6)  # std 0.1 at step 0, 0 at step 1
    0.05
    """
    last = div_index(streams_) if upto is None else upto
    stds = []
    for position in range(min(last + 1, min(len(s) for s in streams_))):
        probs = [top1_prob(s, position) for s in streams_]
        if all(p is not None for p in probs):
            stds.append(float(np.std(probs)))
    return sum(stds) / len(stds) if stds else None


def std_at_acc(accuracies: Sequence[float]) -> float | None:
    """Yuan et al.'s Std@Acc: the standard deviation of accuracy across configurations (population std, ddof 0).

    Examples
    --------
    >>> round(std_at_acc([0.5, 0.75, 1.0]), 6)  # mean 0.75; deviations -0.25, 0, 0.25
    0.204124
    >>> std_at_acc([]) is None
    True
    """
    return float(np.std(accuracies)) if accuracies else None
