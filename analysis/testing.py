"""Assertions for pytest, in the style of ``polars.testing``: they pass quietly or raise ``AssertionError`` saying what differs.

- :func:`assert_batch_invariant` judges a run, a folder of runs, a server or a batched function by the rules of
  :func:`analysis.judge`, and passes only where ``bia certify`` exits 0: GREEN (AMBER too, when asked).
- :func:`assert_dumps_equal` compares two dumps request by request: the same tokens, and logprobs within ``ulp``.

Their own frames are hidden from pytest's traceback (``__tracebackhide__``): a failure shows the test's lines and the
message, not bia's source.

Examples
--------
A test file of an engine's suite::

    from analysis.testing import assert_batch_invariant

    def test_my_engine_is_batch_invariant():
        assert_batch_invariant(my_engine.generate, prompts=MY_PROMPTS, ladder=[1, 4, 8, 16])
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from .dumps import Dump, DumpError, read_dumps
from .metrics import float32_bits, ordered_bits
from .metrics import token_identity as _identity
from .report import run_directories
from .run import Run, RunError, RunLike, read_run
from .studies import VERDICTS, Judgement, judge, repro_step

__all__ = ["assert_batch_invariant", "assert_dumps_equal"]

_READS = "assert_batch_invariant reads run directories (bia probe, bia experiment, bia assemble) and folders of them"
_PROBE_OPTIONS = ("prompts", "ladder", "repeats", "output")


def assert_batch_invariant(
    subject: Any,
    *,
    allow_amber: bool = False,
    target_rate: float = 0.01,
    confidence: float = 0.95,
    prompts: Sequence[str] | None = None,
    ladder: Sequence[int] | None = None,
    repeats: int | None = None,
    output: str | os.PathLike[str] | None = None,
) -> Judgement:
    """Assert that batching leaves every request's tokens and logprob bits as they are alone, as ``bia certify`` does.

    It passes where ``bia certify`` exits 0: every run and arm GREEN, none parted from m=1 and enough batched
    requests to bound the divergence rate below ``target_rate``. AMBER (none parted, too few to bound the rate)
    fails, as certify's exit 8 does, unless ``allow_amber``.

    Parameters
    ----------
    subject : Run, path, URL, callable, or a list of runs and paths
        What ``bia certify`` takes: a run (:func:`analysis.read_run`), its directory, or a folder of run directories
        (judged together, each failing row reported); a server's base URL (``http://...``), probed first as
        ``bia probe`` does; or a batched ``generate(prompts)`` function, probed in process by
        :func:`analysis.probe_callable`.
    allow_amber : bool, default False
        Pass AMBER too: nothing parted, but too few batched requests to bound the rate (certify still exits 8).
    target_rate : float, default 0.01
        GREEN needs the one-sided upper bound on the divergence rate below this rate, in (0, 1].
    confidence : float, default 0.95
        The bound's confidence, in (0, 1).
    prompts, ladder, repeats
        What a URL or a callable is probed with: by default bia's two experiment prompts, c = 1, 4, 8, 16, once. A
        GREEN at 1% needs 299 distinct batch contexts: 11 prompts over that ladder make 308.
    output : path, optional
        Where a probe writes its run (a temporary folder by default, removed afterwards).

    Returns
    -------
    Judgement
        The judgement (:func:`analysis.judge`), when it passes.

    Raises
    ------
    AssertionError
        A RED or UNVERIFIED row, or AMBER without ``allow_amber``; for each such row: its verdict, the run and arm, why,
        the first request that parts, and the next step.
    FileNotFoundError
        A path that does not exist, named, so that ``pytest.raises(AssertionError)`` never passes on a typo.
    RunError
        A path that is not a run directory nor a folder holding one, or a run bia cannot read, named.
    CallableError, ProbeError
        What a probe raises (:func:`analysis.probe_callable`, ``bia probe``): a ``generate`` result without its fields,
        named by call and field, or a server that does not answer.
    TypeError, ValueError
        A subject of another type, probe options given with a run, or a bad ``target_rate``, ``confidence``,
        ``allow_amber``, ``prompts`` or ``ladder``.

    Examples
    --------
    A recorded run whose batched requests all match m=1, too few to bound the rate: AMBER, which passes when allowed.

    >>> assert_batch_invariant("data/experiment-cpu/row-invariant", allow_amber=True).verdict
    'AMBER'
    >>> assert_batch_invariant("data/experiment-cpu/row-invariant")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    AssertionError: Batch invariance assertion failed: AMBER for data/experiment-cpu/row-invariant (copies)
    [why] 0 of 56 batched requests part from m=1, every band seen formed; the 95% upper bound ... (243 more)
    [next] 243 more batched requests: bia experiment --prompts FILE of 11 prompts
    [allow] allow_amber=True passes AMBER, where bia certify exits 8
    >>> assert_batch_invariant("data/experiment-cpu/default")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    AssertionError: Batch invariance assertion failed: RED (co-batching) for data/experiment-cpu/default (copies)
    [why] 56 of 56 batched requests part from m=1 (0 in tokens, 56 only in bits); the first is p0 c=4 repeat 0 slot 0: ...
    [first] p0 c=4 repeat 0 slot 0: its logprob bits differ from ref #1 from token 1 (up to 127 ULP)
    [next] batch-invariant kernels: bia experiment --modes row-invariant; a repro for its maintainers: bia repro ...

    A batched function that ignores its batch, probed with 11 prompts at c = 1, 4, 8, 16: GREEN.

    >>> def generate(prompts):
    ...     return [{"token_ids": [ord(ch) for ch in p], "logprobs": [-0.5] * len(p)} for p in prompts]
    >>> assert_batch_invariant(generate, prompts=[f"Prompt {i}" for i in range(11)]).verdict
    'GREEN'
    """
    __tracebackhide__ = True  # pytest shows the test's lines and this message, not bia's source
    _check_options(allow_amber, target_rate, confidence)
    with tempfile.TemporaryDirectory(prefix="bia-assert-") as scratch:
        probed = Path(output) if output is not None else Path(scratch) / "run"
        runs = _runs_of(subject, probed, prompts=prompts, ladder=ladder, repeats=repeats, output=output)
        try:
            judgement = judge(runs, target_rate=target_rate, confidence=confidence)
        except (RunError, DumpError) as exc:  # captures no table can be built from: named, never bia's traceback
            raise RunError(f"{exc}; {_READS}") from None
    passing = {"GREEN", "AMBER"} if allow_amber else {"GREEN"}
    # the worst first: pytest's summary line shows the message's first line
    rows = sorted(
        (row for row in judgement.to_dicts() if row["verdict"] not in passing),
        key=lambda row: -VERDICTS.index(row["verdict"]),
    )
    if rows:
        raise AssertionError("\n".join(_failure(row) for row in rows))
    return judgement


def _check_options(allow_amber: Any, target_rate: Any, confidence: Any) -> None:
    """Bad options are refused before anything is probed."""
    __tracebackhide__ = True
    if not isinstance(allow_amber, bool):
        raise TypeError(f"allow_amber: expected True or False, got {allow_amber!r}")
    if target_rate is None:  # it once meant "AMBER passes"
        raise ValueError("target_rate: expected a rate in (0, 1], got None; allow_amber=True passes AMBER")
    if not _number(target_rate) or not 0 < target_rate <= 1:
        raise ValueError(f"target_rate: expected a rate in (0, 1], got {target_rate!r}")
    if not _number(confidence) or not 0 < confidence < 1:
        raise ValueError(f"confidence: expected a probability in (0, 1), got {confidence!r}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _runs_of(subject: Any, probed: Path, **options: Any) -> list[Any]:
    """The runs to judge: the subject itself, read from its directory or the folder that holds them, or probed into ``probed``."""
    __tracebackhide__ = True
    if (isinstance(subject, str) and re.match(r"[a-z][a-z0-9+.-]*://", subject, flags=re.I)) or callable(subject):
        return [_probe(subject, probed, **options)]
    given = [name for name in _PROBE_OPTIONS if options[name] is not None]
    if given:
        raise TypeError(f"{', '.join(given)}: what a URL or a generate function is probed with, not given with a run")
    if isinstance(subject, RunLike):
        return [subject]
    if isinstance(subject, (str, os.PathLike)):
        return _read(Path(subject))
    if isinstance(subject, (list, tuple)):
        others = [type(one).__name__ for one in subject if not isinstance(one, (RunLike, str, os.PathLike))]
        if subject and not others:
            return [run for one in subject for run in ([one] if isinstance(one, RunLike) else _read(Path(one)))]
        raise TypeError(
            "assert_batch_invariant takes a list of runs and run directories, "
            f"not {f'one holding a {others[0]}' if others else 'an empty one'}"
        )
    raise TypeError(
        "assert_batch_invariant takes a Run, a run directory or a folder of them (or a list of runs and directories), "
        f"a URL or a generate function, not {type(subject).__name__}"
    )


def _probe(subject: Any, probed: Path, *, prompts: Any, ladder: Any, repeats: Any, output: Any) -> Run:
    """A server (its http(s) URL) or a batched function, probed as ``bia probe`` and :func:`analysis.probe_callable` do."""
    __tracebackhide__ = True
    from .experiment import DEFAULT_PROMPTS
    from .probe import CallableError, ProbeError, probe, probe_callable

    for name, value in (("prompts", prompts), ("ladder", ladder)):
        if value is not None and (isinstance(value, (str, bytes)) or not isinstance(value, Sequence)):
            raise TypeError(f"{name}: expected a list, got {value!r}")
    texts = list(prompts) if prompts is not None else list(DEFAULT_PROMPTS)
    steps = tuple(ladder) if ladder is not None else (1, 4, 8, 16)
    times = repeats if repeats is not None else 1
    if not callable(subject) and not subject.lower().startswith(("http://", "https://")):
        raise ValueError(f"{subject}: assert_batch_invariant probes an http(s) URL")
    try:
        if callable(subject):
            return probe_callable(subject, texts, probed, ladder=steps, repeats=times)
        return read_run(asyncio.run(probe(subject, probed, prompts=texts, ladder=steps, repeats=times)))
    except (CallableError, ProbeError) as exc:  # a bad result or setting, or no server: its message, not bia's source
        raise exc.with_traceback(None) from None


def _read(path: Path) -> list[Run]:
    """A run directory, or every run directory inside a folder, read; a path that is neither is named."""
    __tracebackhide__ = True
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: no such run directory or folder (looked for in {Path.cwd()}); "
            "bia's bundled runs are analysis.default_runs(), from any folder"
        )
    folders = run_directories(path) if path.is_dir() else [path]
    if not folders:
        raise RunError(f"{path}: holds no run directory (a folder with manifest.json and captures/); {_READS}")
    try:
        return [read_run(folder) for folder in folders]
    except (RunError, DumpError) as exc:
        raise RunError(f"{exc}; {_READS}") from None


def _failure(row: dict[str, Any]) -> str:
    """A failing row in words: its verdict, run and arm, why, the first request that parts, and the next step."""
    cause = f" ({row['cause']})" if row["cause"] else ""
    lines = [
        f"Batch invariance assertion failed: {row['verdict']}{cause} for {row['run']} ({row['arm']})",
        f"[why] {row['reason']}",
    ]
    if row["first"]:
        lines.append(f"[first] {row['first']}")
    # a RED run with a directory (a probe's temporary run is gone by now) names its bug report on the same line: pytest's
    # output stays within 25 lines
    report = (
        f"; a repro for its maintainers: {row['repro'] or repro_step(row['run'])}"
        if row["verdict"] == "RED" and Path(row["run"]).is_dir()
        else ""
    )
    lines.append(f"[next] {row['next_step']}{report}")
    if row["verdict"] == "AMBER":
        lines.append("[allow] allow_amber=True passes AMBER, where bia certify exits 8")
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
    __tracebackhide__ = True  # pytest shows the test's lines and this message, not bia's source
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
