"""Assertions for pytest, in the style of ``polars.testing``: they pass quietly or raise ``AssertionError`` saying what differs.

- :func:`assert_batch_invariant` judges a run (or probes a callable or a server first) by the rules of
  :func:`analysis.judge`, and fails on a request that parts from m=1, naming the first one, where and by how much.
- :func:`assert_dumps_equal` compares two dumps request by request: the same tokens, and logprobs within ``ulp``.

Examples
--------
A test file of an engine's suite::

    from analysis.testing import assert_batch_invariant

    def test_my_engine_is_batch_invariant():
        assert_batch_invariant(my_engine.generate, prompts=["The capital of France is"], ladder=[1, 4, 8])
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from .dumps import Dump, read_dumps
from .metrics import float32_bits, ordered_bits
from .metrics import token_identity as _identity
from .run import Run, read_run
from .studies import Judgement, judge

__all__ = ["assert_batch_invariant", "assert_dumps_equal"]

_FAILING = {"RED", "UNVERIFIED"}


def assert_batch_invariant(
    subject: Run | str | os.PathLike[str] | Callable[[list[str]], Any],
    *,
    target_rate: float | None = None,
    confidence: float = 0.95,
    prompts: Sequence[str] | None = None,
    ladder: Sequence[int] = (1, 4, 8, 16),
    repeats: int = 1,
    output: str | os.PathLike[str] | None = None,
) -> Judgement:
    """Assert that batching leaves every request's tokens and logprob bits as they are alone.

    Parameters
    ----------
    subject : Run, path, URL or callable
        A run (:func:`analysis.read_run`) or its directory; a server's base URL (``http://...``), probed first as
        ``bia probe`` does; or a batched ``generate(prompts)`` function, probed in process by :func:`analysis.probe_callable`.
    target_rate : float, optional
        Also require the verdict GREEN: enough bit-identical batched requests to bound the divergence rate below this
        (at ``confidence``). Without it, AMBER (none parts, too few to bound the rate) passes.
    confidence : float
        The bound's confidence.
    prompts, ladder, repeats
        What a URL or a callable is probed with (by default bia's two experiment prompts at c = 1, 4, 8, 16).
    output : path, optional
        Where a probe writes its run (a temporary folder by default, removed afterwards).

    Returns
    -------
    Judgement
        The judgement, when it passes.

    Raises
    ------
    AssertionError
        A RED or UNVERIFIED row (or AMBER with ``target_rate``): its verdict, the run and arm, why, the first request that
        parts, and the next step.

    Examples
    --------
    >>> assert_batch_invariant("data/experiment-cpu/row-invariant").verdict
    'AMBER'
    >>> assert_batch_invariant("data/experiment-cpu/default")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    AssertionError: Batch invariance assertion failed: RED (co-batching) for data/experiment-cpu/default (copies)
    [why] 56 of 56 batched requests part from m=1 (0 in tokens, 56 only in bits); the first is p0 c=4 repeat 0 slot 0: ...
    [first] p0 c=4 repeat 0 slot 0: its logprob bits differ from ref #1 from token 1 (up to 127 ULP)
    [next] batch-invariant kernels: bia experiment --modes row-invariant
    """
    with tempfile.TemporaryDirectory(prefix="bia-assert-") as scratch:
        run = _run_of(subject, Path(output) if output is not None else Path(scratch) / "run", prompts, ladder, repeats)
        judgement = judge(run, target_rate=target_rate if target_rate is not None else 0.01, confidence=confidence)
    failing = _FAILING | ({"AMBER"} if target_rate is not None else set())
    rows = [row for row in judgement.to_dicts() if row["verdict"] in failing]
    if rows:
        raise AssertionError("\n".join(_failure(row) for row in rows))
    return judgement


def _run_of(subject: Any, output: Path, prompts: Sequence[str] | None, ladder: Sequence[int], repeats: int) -> Run:
    """The run to judge: the subject itself, read from its directory, or probed into ``output``."""
    from .experiment import DEFAULT_PROMPTS

    texts = list(prompts) if prompts is not None else list(DEFAULT_PROMPTS)
    if isinstance(subject, Run):
        return subject
    if isinstance(subject, str) and subject.startswith(("http://", "https://")):
        from .probe import probe

        return read_run(asyncio.run(probe(subject, output, prompts=texts, ladder=tuple(ladder), repeats=repeats)))
    if isinstance(subject, (str, os.PathLike)):
        return read_run(subject)
    if callable(subject):
        from .probe import probe_callable

        return probe_callable(subject, texts, output, ladder=ladder, repeats=repeats)
    raise TypeError(
        f"assert_batch_invariant takes a Run, a run directory, a URL or a generate function, not {type(subject).__name__}"
    )


def _failure(row: dict[str, Any]) -> str:
    cause = f" ({row['cause']})" if row["cause"] else ""
    lines = [
        f"Batch invariance assertion failed: {row['verdict']}{cause} for {row['run']} ({row['arm']})",
        f"[why] {row['reason']}",
    ]
    if row["first"]:
        lines.append(f"[first] {row['first']}")
    lines.append(f"[next] {row['next_step']}")
    return "\n".join(lines)


def assert_dumps_equal(
    left: Dump | str | os.PathLike[str], right: Dump | str | os.PathLike[str], *, ulp: int = 0
) -> None:
    """Assert that two dumps hold the same completions: request by request (in source order), the same tokens, and
    float32 logprobs no more than ``ulp`` units in the last place apart (0: bit for bit).

    Parameters
    ----------
    left, right : Dump or path
        Dumps (:func:`analysis.read_dumps`) or what it reads: files or folders of any format bia reads.
    ulp : int
        The largest logprob difference allowed, in float32 ULPs.

    Raises
    ------
    AssertionError
        Another number of requests, or the first request whose length, tokens or logprobs differ: which request (its
        position and source on each side), at which token, and the two values.

    Examples
    --------
    >>> run = "data/experiment-cpu/default/captures"
    >>> assert_dumps_equal(run, run)
    >>> assert_dumps_equal(run, "data/experiment-cpu/fixed-tiles/captures")  # other kernels: even a request alone moves
    Traceback (most recent call last):
    AssertionError: Dumps are different (request 1 of 62: logprob at token 1 is 2 ULP apart, more than 0)
    [left] data/experiment-cpu/default/captures/requests.jsonl record 1: 'a' (id 97), logprob -1.3162351846694946
    [right] data/experiment-cpu/fixed-tiles/captures/requests.jsonl record 1: 'a' (id 97), logprob -1.3162349462509155
    >>> assert_dumps_equal(run, "data/experiment-cpu/fixed-tiles/captures", ulp=200)
    """
    if isinstance(ulp, bool) or not isinstance(ulp, int) or ulp < 0:
        raise ValueError(f"ulp: expected an integer >= 0, got {ulp!r}")
    a, b = (side if isinstance(side, Dump) else read_dumps(side) for side in (left, right))
    ra, rb = _ordered_requests(a), _ordered_requests(b)
    if ra.height != rb.height:
        raise AssertionError(f"Dumps are different (number of requests)\n[left] {ra.height}\n[right] {rb.height}")
    ta, tb = _completion(a, ra), _completion(b, rb)
    lengths = (
        ta.group_by("request")
        .len()
        .join(tb.group_by("request").len(), on="request", how="full", coalesce=True, suffix="_b")
    )
    both = ta.join(tb, on=["request", "position"], how="inner", suffix="_b").with_columns(
        ulps=(ordered_bits(float32_bits(pl.col("logprob"))) - ordered_bits(float32_bits(pl.col("logprob_b")))).abs()
    )
    problems = pl.concat(
        [
            both.filter(pl.col("ident") != pl.col("ident_b")).select(
                "request", "position", kind=pl.lit(0), ulps=pl.lit(None, pl.Int64)
            ),
            both.filter(pl.col("ulps") > ulp).select("request", "position", kind=pl.lit(1), ulps="ulps"),
            both.filter(pl.col("logprob").is_null() != pl.col("logprob_b").is_null()).select(
                "request", "position", kind=pl.lit(2), ulps=pl.lit(None, pl.Int64)
            ),
            lengths.filter(pl.col("len").fill_null(0) != pl.col("len_b").fill_null(0)).select(
                "request",
                position=pl.min_horizontal(pl.col("len").fill_null(0), pl.col("len_b").fill_null(0)).cast(pl.Int64),
                kind=pl.lit(3),
                ulps=pl.lit(None, pl.Int64),
            ),
        ]
    ).sort("request", "position", "kind")
    if problems.height:
        raise AssertionError(_difference(problems.row(0, named=True), ra, rb, ta, tb, ulp))


def _ordered_requests(dump: Dump) -> pl.DataFrame:
    requests = dump.requests if isinstance(dump.requests, pl.DataFrame) else pl.from_pandas(dump.requests)
    return (
        requests.select("source", "record", "choice_index")
        .sort("source", "record", "choice_index")
        .with_row_index("request")
    )


def _completion(dump: Dump, requests: pl.DataFrame) -> pl.DataFrame:
    """Each request's completion tokens: its ordinal, the position, the token's identity and its logprob."""
    tokens = dump.tokens if isinstance(dump.tokens, pl.DataFrame) else pl.from_pandas(dump.tokens)
    return (
        tokens.filter(pl.col("segment") == "completion")
        .join(requests, on=["source", "record", "choice_index"])
        .select(
            "request",
            "position",
            "logprob",
            "token_id",
            "token_text",
            ident=_identity("token_id", "token_text", "token_bytes", False),
        )
    )


def _difference(
    first: dict[str, Any], ra: pl.DataFrame, rb: pl.DataFrame, ta: pl.DataFrame, tb: pl.DataFrame, ulp: int
) -> str:
    request, at = first["request"], first["position"]
    what = {
        0: f"tokens part at token {at}",
        1: f"logprob at token {at} is {first['ulps']} ULP apart, more than {ulp}",
        2: f"token {at} has a logprob on one side only",
        3: f"one side ends at token {at}",
    }[first["kind"]]

    def side(requests: pl.DataFrame, tokens: pl.DataFrame) -> str:
        where = requests.row(request, named=True)
        token = tokens.filter((pl.col("request") == request) & (pl.col("position") == at))
        value = (
            f"{token['token_text'][0]!r} (id {token['token_id'][0]}), logprob {token['logprob'][0]!r}"
            if token.height
            else "no token there"
        )
        return f"{where['source']} record {where['record']}: {value}"

    return f"Dumps are different (request {request + 1} of {ra.height}: {what})\n[left] {side(ra, ta)}\n[right] {side(rb, tb)}"
