"""One judgement per run and arm: the verdict, its cause, evidence, cost and next step that every surface of bia renders.

The card's headline, the certificate and ``bia certify``'s exit code, the probe's closing line, the report's answer table
and its sections, the trend and the Jupyter views all show a row of :func:`judge`; none of them judges on its own. The
rules, in the order they are applied (``docs/verdicts.md`` states them for people):

1. **Reproducible alone first.** When a prompt's two m=1 references differ from each other, or a request sent alone
   (c = 1) differs from ref #1, the server is not deterministic even alone: the verdict is RED with the cause
   ``run-to-run`` (``prompt cache`` when the run's cache counters show the cache served the repeat), batching is not
   judged, and the first request named is one sent alone, never a batch.
2. **A batched request that parts is RED.** Only batched requests (c > 1) count toward the bound; the first that parts
   in tokens or in float32 logprob bits is named (smallest c, then prompt, repeat, slot), and its cause comes from the
   attribution ladder (:func:`analysis.attribution_table`: ``co-batching`` or ``mixing`` in a run without control arms).
3. **Complete evidence or UNVERIFIED.** GREEN and AMBER need a batched request at every c > 1 of the ladder, every
   request of those bands back, every band seen formed at its c and every logprob recorded; otherwise the verdict is
   UNVERIFIED, naming what is missing.
4. **The bound.** With none parted and the evidence complete: GREEN when the one-sided exact upper bound on the
   divergence rate over the batched requests is below the target, else AMBER with how many more requests would do.

``max_ulp`` is the one ULP figure of a run: the largest distance of a batched request's logprob from its m=1 reference.
``cost`` is each c's decode rate per request against c=1's (``_judgement_cost``). The row's object and columns are in
``_judgement_frame``, its sentences in ``_judgement_words``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import polars as pl

from ..metrics import divergence_bound, requests_needed
from ..run import Run, RunLike, band_table, legacy_arm, read_run, reference_table, run_arms, slot_table
from ._judgement_cost import _cost, _with_measured_fix, cost_words
from ._judgement_frame import SCHEMA, Judgement
from ._judgement_words import _alone_reason, _bound_reason, _evidence, _first_words, _red_reason, _where
from ._next_steps import next_step

BATCHED_ARMS = ("copies", "mixed")  # the arms whose bands batch the prompt; the others are controls sent alone
ALONE_ARMS = ("copies", "mixed", "repeat")  # arms whose c=1 requests are the prompt alone and cold, as m=1 is

_ORDER = ["c", "prompt_id", "repeat", "slot"]


@dataclass
class Subject:
    """What a verdict needs of a run beyond its tables: its name, manifest and ladder, and (asked only when needed) the cause
    of a batched request that parts and whether its cache served cached prompt tokens. Hand-made tests build one directly."""

    label: str
    manifest: Mapping[str, Any] = field(default_factory=dict)
    ladder: list[int] = field(default_factory=list)
    cause_of: Callable[[Mapping[str, Any], str], str] = lambda first, arm: "mixing" if arm == "mixed" else "co-batching"
    cache_served: Callable[[], bool] = lambda: False

    @property
    def engine(self) -> str:
        identity = self.manifest.get("identity") or {}
        return str(identity.get("engine") or self.manifest.get("producer") or "unknown engine")


def _subject(run: Run) -> Subject:
    return Subject(
        run.label,
        run.manifest,
        [int(c) for c in run.ladder],
        lambda first, arm: _batched_cause(run, first, arm),
        lambda: _cache_served(run),
    )


def judge_runs(runs: Any, *, target_rate: float = 0.01, confidence: float = 0.95) -> Judgement:
    """Judge runs batch invariant (:func:`analysis.judge` takes witness sets too): one row per run and arm, GREEN, AMBER, RED or UNVERIFIED, by the module's rules.

    Parameters
    ----------
    runs : Run, path, or an iterable of them
        The runs (run directories are read).
    target_rate : float
        The divergence rate the batched requests must bound themselves below to be GREEN, in (0, 1].
    confidence : float
        The confidence of the one-sided upper bound on the divergence rate, in (0, 1).

    Returns
    -------
    Judgement
        ``verdict``, ``cause``, ``reason`` (one sentence), ``evidence``, ``cost``, ``first``, ``max_ulp`` and ``next_step``
        in words, and the numbers behind them: ``requests`` (batched, c > 1), ``divergent`` (``tokens_parted`` plus
        ``bits_only``), ``bits_unknown``, ``alone`` and ``alone_parted`` (the m=1 references' second copies and the
        requests sent alone, against ref #1), ``bands``, ``bands_unformed``, ``missing`` requests, ``cs_missing``,
        ``upper_bound``, ``requests_needed``, ``first_request``, ``unformed`` and ``cost_by_c``.

    Examples
    --------
    >>> judge_runs("data/llamacpp-cpu/cache-prompt").frame.select("verdict", "cause", "first").row(0)
    ('RED', 'prompt cache', 'p0 ref #2, sent alone: its logprob bits differ from ref #1 from token 0 (up to 26 ULP)')
    >>> print(judge_runs("data/experiment-cpu/batch-invariant").frame["reason"][0])
    0 of 56 batched requests part from m=1, every band seen formed; the 95% upper bound on the divergence rate is 5.21%, not below the 1% target: 299 batched requests would do (243 more)
    """
    needed = requests_needed(target_rate, confidence)  # checks both arguments before any run is read
    if isinstance(runs, (RunLike, str, os.PathLike)):
        runs = [runs]
    frames = [
        _judge_run(
            cast(Run, run) if isinstance(run, RunLike) else read_run(os.fspath(run)), target_rate, confidence, needed
        )
        for run in runs
    ]
    frame = pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=SCHEMA)
    return Judgement(_with_measured_fix(frame))


# --- the evidence of one run ----------------------------------------------------------------------------


def _judge_run(run: Run, target_rate: float, confidence: float, needed: int) -> pl.DataFrame:
    slots = slot_table(run)
    refs = reference_table(run)
    bands = _formation(band_table(run))
    states = _states(slots)
    alone = _alone_states(refs, states)
    arms = (
        [a for a in run_arms(run.manifest) if a in BATCHED_ARMS]
        or run_arms(run.manifest)[:1]
        or [legacy_arm(run.manifest)]
    )
    missing = pl.DataFrame(
        run.missing(),
        schema={
            "prompt_id": pl.String,
            "role": pl.String,
            "c": pl.Int64,
            "slot": pl.Int64,
            "repeat": pl.Int64,
            "arm": pl.String,
            "state": pl.String,
        },
    )
    subject = _subject(run)
    rows = [
        judge_arm(
            subject,
            arm,
            states.filter(pl.col("arm") == arm),
            alone,
            bands.filter(pl.col("arm") == arm),
            missing.filter(pl.col("arm") == arm),
            target_rate,
            confidence,
            needed,
        )
        for arm in arms
    ]
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def _states(rows: pl.DataFrame) -> pl.DataFrame:
    """Each request against m=1: ``tokens_parted`` (a different token, or a different length), ``bits_parted`` (the same
    tokens, a logprob whose bits differ), ``bits_unknown`` (the same tokens, no step with a logprob on both sides to
    compare), ``at`` (where it parts)."""
    shorter = pl.col("length") != pl.col(
        "reference_length"
    )  # a stream that ends early took another token (its end) there
    tokens = (pl.col("diverged") | shorter).fill_null(True)
    # no step with a logprob on both sides (max_ulp null): the bits are unknown, not different
    unrecorded = pl.col("bitwise_prefix").is_null() | (pl.col("max_ulp").is_null() & (pl.col("length") > 0))
    bits = ~tokens & (pl.col("bitwise_prefix") < pl.col("length")).fill_null(False) & ~unrecorded
    at = (
        pl.when(pl.col("diverged"))
        .then("divergence_at")
        .when(tokens)
        .then(pl.min_horizontal("length", "reference_length"))
        .when(bits)
        .then("bitwise_prefix")
    )
    return rows.with_columns(
        tokens_parted=tokens, bits_parted=bits, bits_unknown=~tokens & ~bits & unrecorded, position=at
    )


def _alone_states(refs: pl.DataFrame, states: pl.DataFrame) -> pl.DataFrame:
    """What the server does alone, run to run: each prompt's ref #2 against ref #1, then each request sent alone (c=1 of a
    batched arm or the repeat arm), in the order a reader is told of them (references first)."""
    columns = ["prompt_id", "c", "repeat", "slot", "role", "tokens_parted", "bits_parted", "position", "max_ulp"]
    second = _states(refs).select(
        "prompt_id",
        c=pl.lit(None, pl.Int64),
        repeat=pl.lit(None, pl.Int64),
        slot=pl.lit(1, pl.Int64),
        role=pl.lit("ref #2"),
        tokens_parted="tokens_parted",
        bits_parted="bits_parted",
        position="position",
        max_ulp="max_ulp",
    )
    sent_alone = (
        states.filter((pl.col("c") == 1) & pl.col("arm").is_in(ALONE_ARMS))
        .sort(_ORDER)
        .select(
            "prompt_id",
            c="c",
            repeat="repeat",
            slot="slot",
            role=pl.format("{} c=1", "arm"),
            tokens_parted="tokens_parted",
            bits_parted="bits_parted",
            position="position",
            max_ulp="max_ulp",
        )
    )
    return pl.concat([second.sort("prompt_id").select(columns), sent_alone.select(columns)], how="vertical_relaxed")


def _formation(bands: pl.DataFrame) -> pl.DataFrame:
    """Each band with ``widest_seen`` (the widest batch any of its width evidence shows) and ``formed``: c = 1, or c seen."""
    others = pl.col("width_evidence").str.extract_all(r"\d+").list.eval(pl.element().cast(pl.Int64)).list.max()
    seen = pl.max_horizontal("m_formed", others)
    return bands.with_columns(widest_seen=seen, formed=(pl.col("c") <= 1) | (seen >= pl.col("c")).fill_null(False))


# --- one arm's verdict ----------------------------------------------------------------------------------


def judge_arm(
    subject: Subject,
    arm: str,
    states: pl.DataFrame,
    alone: pl.DataFrame,
    bands: pl.DataFrame,
    missing: pl.DataFrame,
    target_rate: float,
    confidence: float,
    needed: int,
) -> dict[str, Any]:
    """One arm's row (the columns of ``SCHEMA``) from its requests' states (:func:`_states` of slot rows), what was sent alone
    (:func:`_alone_states`), its bands (:func:`_formation`) and the requests its plan lacks (``Run.missing``'s rows).

    Parameters
    ----------
    subject : Subject
        The run's name, manifest, ladder and the causes it can name.
    arm : str
        The arm judged.
    states : polars.DataFrame
        The arm's requests, one row each: ``c``, ``tokens_parted``, ``bits_parted``, ``bits_unknown``, ``max_ulp``
        and where each part.
    alone : polars.DataFrame
        The requests sent alone (m=1), in the same columns.
    bands : polars.DataFrame
        The arm's bands: ``c``, ``prompt_id``, ``repeat``, ``formed`` and ``widest_seen``.
    missing : polars.DataFrame
        The requests the run's plan lacks: ``c`` and ``role`` at least.
    target_rate : float
        The divergence rate the batched requests must bound themselves below to be GREEN, in (0, 1].
    confidence : float
        The confidence of the one-sided upper bound on the divergence rate, in (0, 1).
    needed : int
        The batched requests needed for a GREEN at that rate and confidence with none parting.

    Returns
    -------
    dict of str to Any
    """
    batched = states.filter(pl.col("c") > 1).sort(_ORDER)
    parted = pl.col("tokens_parted") | pl.col("bits_parted")
    alone_parted = alone.filter(parted)
    divergent = batched.filter(parted)
    ladder = sorted({int(c) for c in subject.ladder if int(c) > 1})
    present = set(batched["c"].unique().to_list())
    unformed = bands.filter((pl.col("c") > 1) & ~pl.col("formed")).sort("c", "prompt_id", "repeat")
    row: dict[str, Any] = {
        "run": subject.label,
        "arm": arm,
        "engine": subject.engine,
        "requests": batched.height,
        "divergent": divergent.height,
        "tokens_parted": int(batched["tokens_parted"].sum()),
        "bits_only": int(batched["bits_parted"].sum()),
        "bits_unknown": int(batched["bits_unknown"].sum()),
        "alone": alone.height,
        "alone_parted": alone_parted.height,
        "bands": bands.filter(pl.col("c") > 1).height,
        "bands_unformed": unformed.height,
        "missing": missing.filter((pl.col("c") > 1) & (pl.col("role") == "band")).height,
        "cs_missing": [c for c in ladder if c not in present],
        "target_rate": target_rate,
        "confidence": confidence,
        "requests_needed": needed,
        "max_ulp": batched["max_ulp"].max(),
        "cost_by_c": _cost(states),
        "unformed": unformed.select("prompt_id", c="c", repeat="repeat", widest_seen="widest_seen").to_dicts(),
    }
    n = row["requests"]
    row["upper_bound"] = divergence_bound(row["divergent"], n, confidence) if n else None
    row["rule_of_three"] = 3 / n if n and not row["divergent"] and confidence == 0.95 else None
    if alone_parted.height:
        first = alone_parted.row(0, named=True)
        row.update(verdict="RED", cause=_alone_cause(subject), first_request=first)
        row["reason"] = _alone_reason(row, first)
    elif divergent.height:
        first = divergent.row(0, named=True)
        first_request = {
            "prompt_id": first["prompt_id"],
            "c": first["c"],
            "repeat": first["repeat"],
            "slot": first["slot"],
            "role": f"{arm} c={first['c']}",
            "tokens_parted": first["tokens_parted"],
            "position": first["position"],
            "max_ulp": first["max_ulp"],
        }
        row.update(verdict="RED", cause=subject.cause_of(first, arm), first_request=first_request)
        row["reason"] = _red_reason(row, first_request)
    else:
        gaps = _gaps(row, ladder, subject)
        if gaps:
            row.update(
                verdict="UNVERIFIED",
                cause="incomplete evidence",
                first_request=None,
                reason="no request parts from m=1, but " + "; ".join(gaps),
            )
        else:
            green = row["upper_bound"] < target_rate
            row.update(
                verdict="GREEN" if green else "AMBER", cause=None, first_request=None, reason=_bound_reason(row, green)
            )
    first_request = row["first_request"]
    row["first"] = _first_words(first_request) if first_request else None
    if first_request:
        row["first_request"] = {
            **{k: first_request.get(k) for k in ("prompt_id", "c", "repeat", "slot", "role", "position", "max_ulp")},
            "parted": "tokens" if first_request["tokens_parted"] else "bits",
        }
    row["evidence"] = _evidence(row)
    row["cost"] = cost_words(row["cost_by_c"])
    row["next_step"] = next_step(subject, row)
    return row


def _gaps(row: dict[str, Any], ladder: list[int], subject: Subject) -> list[str]:
    """What keeps a run with nothing parted from GREEN or AMBER, in words."""
    gaps = []
    if not ladder:
        gaps.append("its ladder holds no batch size above 1: nothing was batched")
    elif row["cs_missing"] and not row["requests"]:
        gaps.append("no batched request came back (c > 1): nothing to compare with m=1")
    elif row["cs_missing"]:
        gaps.append(f"no batched request at c={', '.join(str(c) for c in row['cs_missing'])} of its ladder")
    if row["missing"]:
        gaps.append(f"{row['missing']} batched request(s) of its plan never came back")
    elif subject.manifest.get("complete", True) is False:
        gaps.append("the run did not finish")
    if row["bands_unformed"]:
        band = row["unformed"][0]
        seen = f"the widest seen m={band['widest_seen']}" if band["widest_seen"] is not None else "no width seen"
        gaps.append(
            f"{row['bands_unformed']} of {row['bands']} batched bands never seen formed at their c (the first {_where(band)}: {seen})"
        )
    if row["bits_unknown"]:
        gaps.append(
            f"{row['bits_unknown']} of {row['requests']} batched requests have no logprobs recorded, so their bits are unknown"
        )
    return gaps


def _alone_cause(subject: Subject) -> str:
    """``prompt cache`` when the run's cache counters show cached prompt tokens served while it ran, else ``run-to-run``.
    (The cache arm's requests are no evidence of running alone, :data:`ALONE_ARMS`, so no first request is one of them.)"""
    return "prompt cache" if subject.cache_served() else "run-to-run"


_GREW = re.compile(r"(?:cached|cache_hits?)[\w:]*\s\+(\d+(?:\.\d+)?)")


def _cache_served(run: Run) -> bool:
    """Whether any band's cache counters grew (llama.cpp's cached prompt tokens, vLLM's prefix-cache hits)."""
    text = " ".join(filter(None, band_table(run)["prefix_cache"].to_list()))
    return any(float(n) > 0 for n in _GREW.findall(text))


def _batched_cause(run: Run, first: Mapping[str, Any], arm: str) -> str:
    """The attribution ladder's cause of the first batched request that parts."""
    from ._attribution import attribution_table

    table = attribution_table(run).filter(
        (pl.col("prompt_id") == first["prompt_id"])
        & (pl.col("arm") == arm)
        & (pl.col("c") == first["c"])
        & (pl.col("slot") == first["slot"])
        & pl.col("repeat").eq_missing(first["repeat"])
    )
    return table["cause"][0] if table.height else ("mixing" if arm == "mixed" else "co-batching")
