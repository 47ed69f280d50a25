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
``cost`` is each c's per-request decode rate over the c=1 baseline (``analysis.metrics.decode_cost``). The row's object and columns are in
``_judgement_frame``, its sentences in ``_judgement_words``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ..metrics import cost_by_c, divergence_bound
from ..run import SLOT_COLUMNS, Run, band_table, legacy_arm, reference_table, slot_table
from ._judgement_cost import cost_words, judged_arms
from ._judgement_domain import domain, sampling_words
from ._judgement_evidence import (
    STATE_COLUMNS,
    _alone_states,
    _formation,
    _states,
    cache_served_in,
    missing_frame,
    part_counts,
    precision_table,
    refused_requests,
    widest_precision,
)
from ._judgement_frame import SCHEMA
from ._judgement_words import _alone_reason, _bound_reason, _evidence, _first_words, _red_reason, _where
from ._next_steps import next_step, row_repro

_ORDER = ["c", "prompt_id", "repeat", "slot"]
# What a verdict reads of each batched request: its place, its context, its state's flags, and the domain's lengths.
_COUNTED = (
    *_ORDER,
    "context",
    "tokens_parted",
    "bits_parted",
    "bits_unknown",
    "no_evidence",
    "unjudged",
    "max_ulp",
    "length",
    "prompt_tokens",
)
# What the verdict reads of each request at all: the above, what its state is worked out from (``_states``) and its decode
# rate (``cost_by_c``). Filtered by arm, every column of every request would be the judgement's largest copy (at 516,000
# requests, 170 MB an arm, and again for the cost).
_TIMED = ("c", "decode_tok_s", "decode_rate_origin")  # what the decode cost reads of each request (``cost_by_c``)
_READ = (*_COUNTED, "arm", *STATE_COLUMNS, *_TIMED[1:])


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
        lambda first, arm: _batched_cause(
            run if run.pieces is None else run.prompt_run(first["prompt_id"]), first, arm
        ),
        lambda: _cache_served(run),
    )


# --- the evidence of one run ----------------------------------------------------------------------------


def _judge_run(run: Run, target_rate: float, confidence: float, needed: int) -> pl.DataFrame:
    missing = missing_frame(run.missing())  # before the slot table is read: the plan's join is not held beside it
    return judge_tables(
        _subject(run),
        # scanned, not read: each count below reads its columns a morsel at a time (at 516,000 requests, the slot
        # columns and their states were 250 MB held at once)
        slots=slot_table(run, columns=[c for c in dict.fromkeys(_READ) if c in SLOT_COLUMNS], lazy=True),
        refs=reference_table(run),
        bands=band_table(run),
        missing=missing,
        precision=widest_precision(precision_table(run)),
        target_rate=target_rate,
        confidence=confidence,
        needed=needed,
    )


def judge_tables(
    subject: Subject,
    *,
    slots: pl.DataFrame | pl.LazyFrame,
    refs: pl.DataFrame,
    bands: pl.DataFrame,
    missing: pl.DataFrame,
    precision: str,
    target_rate: float,
    confidence: float,
    needed: int,
) -> pl.DataFrame:
    """One run's rows, one per arm, from its tables: whole (a run read into memory) or merged from a study's partitions
    (:func:`judge_study`), so that both are judged by one piece of code.

    Parameters
    ----------
    subject : Subject
        The run's name and manifest, and the causes it can name.
    slots : polars.DataFrame or polars.LazyFrame
        Its slot table (:func:`analysis.run.slot_table`; a scan of it is counted a morsel at a time).
    refs, bands : polars.DataFrame
        Its reference and band tables (:func:`analysis.run.reference_table`, ``band_table``).
    missing : polars.DataFrame
        The requests its plan lacks (:func:`missing_frame` of ``Run.missing``).
    precision : str
        The precision its logprobs were recorded at (:func:`precision_compared`).
    target_rate, confidence : float
        The bound's target and confidence.
    needed : int
        The bit-identical distinct contexts the bound needs.

    Returns
    -------
    polars.DataFrame
        Rows of ``SCHEMA``.
    """
    manifest = subject.manifest
    bands = _formation(bands)
    scanned = slots.lazy()
    states = _states(scanned.select(c for c in dict.fromkeys(_READ) if c in scanned.collect_schema()))
    alone = _alone_states(refs, states)
    arms = judged_arms(manifest)
    legacy = legacy_arm(manifest)
    refused = refused_requests(manifest, legacy)
    # what no arm can do without: each prompt's references, and what was sent alone
    lacking = pl.concat(
        [
            missing.filter(pl.col("role") == "reference").select("prompt_id", "slot", how=pl.col("state")),
            refused.filter(pl.col("role") == "reference").select("prompt_id", "slot", how=pl.lit("refused")),
        ]
    ).unique()  # in any order: the words sort them
    shared = {
        "references_lacking": lacking,
        "run": {"sampling": sampling_words(manifest), "precision": precision},
    }
    rows = [
        judge_arm(
            subject,
            arm,
            states.filter(pl.col("arm") == arm),
            alone,
            bands.filter(pl.col("arm") == arm),
            pl.concat(
                [
                    missing.filter(pl.col("arm") == arm),
                    refused.filter(pl.col("arm") == arm).select(
                        *missing.columns[:-1], state=pl.format("refused: {}", "reason")
                    ),
                ]
            ),
            target_rate,
            confidence,
            needed,
            shared=shared,
        )
        for arm in arms
    ]
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


# --- one arm's verdict ----------------------------------------------------------------------------------


def judge_arm(
    subject: Subject,
    arm: str,
    states: pl.DataFrame | pl.LazyFrame,
    alone: pl.DataFrame,
    bands: pl.DataFrame,
    missing: pl.DataFrame,
    target_rate: float,
    confidence: float,
    needed: int,
    *,
    shared: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One arm's row (the columns of ``SCHEMA``) from its requests' states (:func:`_states` of slot rows), what was sent alone
    (:func:`_alone_states`), its bands (:func:`_formation`) and the requests its plan lacks (``Run.missing``'s rows, and the
    refused ones with a ``state`` that begins with "refused").

    Parameters
    ----------
    subject : Subject
        The run's name, manifest, ladder and the causes it can name.
    arm : str
        The arm judged.
    states : polars.DataFrame or polars.LazyFrame
        The arm's requests, one row each: ``c``, ``state`` and its flags (``tokens_parted``, ``bits_parted``, ...),
        ``context``, ``max_ulp`` and where each part. Only counts, extremes and first rows are read of them, each in one
        query: a scan of a kept slot table is read a morsel at a time, never held.
    alone : polars.DataFrame
        The requests sent alone (m=1), in the same columns.
    bands : polars.DataFrame
        The arm's bands: ``c``, ``prompt_id``, ``repeat``, ``formed``, ``contradicted`` and ``widest_seen``.
    missing : polars.DataFrame
        The requests the run's plan lacks or had refused: ``c``, ``role`` and ``state`` at least.
    target_rate : float
        The divergence rate the batched requests must bound themselves below to be GREEN, in (0, 1].
    confidence : float
        The confidence of the one-sided upper bound on the divergence rate, in (0, 1).
    needed : int
        The distinct batch contexts needed for a GREEN at that rate and confidence with none parting.
    shared : Mapping, optional
        What the run's arms share: ``references_lacking`` (prompts without a reference: ``prompt_id``, ``slot``, ``how``).

    Returns
    -------
    dict of str to Any
    """
    shared = shared or {}
    states = states.lazy()
    if "context" not in states.collect_schema():  # rows written by hand: each request its own context
        # formatted in memory: polars 2.1's streaming engine panics formatting strings of a frame of several chunks
        context = pl.format("{}/{}/{}/{}", "prompt_id", "c", "repeat", "slot")
        states = states.with_columns(context=context).collect().lazy()
    batched_rows = states.filter(pl.col("c") > 1)  # in no order: only the rows named first are sorted
    # The columns the counts and words read, never collected whole: every batched request would be the judgement's
    # largest copy.
    batched = batched_rows.select(c for c in _COUNTED if c in states.collect_schema())
    parted = pl.col("tokens_parted") | pl.col("bits_parted")
    alone_parted = alone.filter(parted)
    # Only the first divergent request is sorted out (a top-k), with all its columns: most requests of a run may part.
    first_divergent = batched_rows.filter(parted).sort(_ORDER, maintain_order=True).head(1).collect()
    ladder = sorted({int(c) for c in subject.ladder if int(c) > 1})
    # the bound counts distinct batch contexts: a repeat of the same context is checked, but is not a new trial
    spread = (
        batched.select(
            contexts=pl.col("context").n_unique(),
            parted_contexts=pl.col("context").filter(parted).n_unique(),
            prompts=pl.col("prompt_id").n_unique(),
            no_evidence=pl.col("no_evidence").sum(),
            unjudged=pl.col("unjudged").sum(),
            max_ulp=pl.col("max_ulp").max(),
            present=pl.col("c").unique().implode(),
        )
        .collect(engine="streaming")
        .row(0, named=True)
    )
    present = set(spread["present"])
    unformed = bands.filter((pl.col("c") > 1) & ~pl.col("formed")).sort("c", "prompt_id", "repeat")
    band_gaps = missing.filter((pl.col("c") > 1) & (pl.col("role") == "band"))
    refused = band_gaps.filter(pl.col("state").str.starts_with("refused"))
    row: dict[str, Any] = {
        "run": subject.label,
        "arm": arm,
        "engine": subject.engine,
        **part_counts(batched),
        "contexts": spread["contexts"],
        "prompts": spread["prompts"],
        "no_evidence": int(spread["no_evidence"]),
        "unjudged": int(spread["unjudged"]),
        "refused": refused.height,
        "alone": alone.height,
        "alone_parted": alone_parted.height,
        "alone_unknown": _alone_unknown(alone, shared.get("references_lacking")),
        "bands": bands.filter(pl.col("c") > 1).height,
        "bands_unformed": unformed.height,
        "missing": band_gaps.height - refused.height,
        "cs_missing": [c for c in ladder if c not in present],
        "target_rate": target_rate,
        "confidence": confidence,
        "requests_needed": needed,
        "max_ulp": spread["max_ulp"],
        "cost_by_c": cost_by_c(states.select(c for c in _TIMED if c in states.collect_schema()).collect()),
        "unformed": unformed.select("prompt_id", c="c", repeat="repeat", widest_seen="widest_seen").to_dicts(),
    }
    n, k = row["contexts"], spread["parted_contexts"]
    row["upper_bound"] = divergence_bound(k, n, confidence) if n else None
    row["rule_of_three"] = 3 / n if n and not k and confidence == 0.95 else None
    if alone_parted.height:
        first = alone_parted.row(0, named=True)
        row.update(verdict="RED", cause=_alone_cause(subject), first_request=first)
        row["reason"] = _alone_reason(row, first)
    elif first_divergent.height:
        first = first_divergent.row(0, named=True)
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
        gaps = _gaps(row, ladder, subject) + _evidence_gaps(row, batched, alone, refused, bands, shared)
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
    row["domain"] = domain(
        row,
        batched,
        bands,
        subject.ladder,
        **{"sampling": None, "precision": None, **shared.get("run", {})},
        arms=[arm],  # a row is one arm; the certificate's domain joins its rows' arms
    )
    row["cost"] = cost_words(row["cost_by_c"])
    row["next_step"] = next_step(subject, row)
    row["repro"] = row_repro(subject, row)
    return row


def _first_alone(request: Mapping[str, Any]) -> str:
    """A request sent alone as the reason names it: ``p0 ref #2``, or ``p0 copies c=1 repeat 1 slot 0``."""
    if request["role"] == "ref #2":
        return f"{request['prompt_id']} ref #2"
    repeat = f" repeat {request['repeat']}" if request["repeat"] is not None else ""
    return f"{request['prompt_id']} {request['role']}{repeat} slot {request['slot']}: {request['state']}"


def _alone_unknown(alone: pl.DataFrame, lacking: pl.DataFrame | None) -> int:
    """Requests sent alone with nothing to compare with ref #1 (bits unknown, no token), and each prompt's ref #2 that never
    came back or was refused: what leaves "the server repeats itself alone" unshown."""
    unknown = alone.filter(pl.col("state").is_in(["bits unknown", "no evidence"])).height
    second = lacking.filter(pl.col("slot") == 1).height if lacking is not None else 0
    return unknown + second


def _gaps(row: dict[str, Any], ladder: list[int], subject: Subject) -> list[str]:
    """What keeps a run with nothing parted from GREEN or AMBER, in words: the plan's gaps."""
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
    return gaps


def _evidence_gaps(
    row: dict[str, Any],
    batched: pl.LazyFrame,
    alone: pl.DataFrame,
    refused: pl.DataFrame,
    bands: pl.DataFrame,
    shared: Mapping[str, Any],
) -> list[str]:
    """What keeps it from GREEN or AMBER in the evidence itself: refused requests, prompts without a reference, requests
    with nothing compared or bits unknown (batched, or sent alone: the first named), width evidence that contradicts
    itself."""
    gaps = []
    if row["refused"]:
        first = refused.sort(_ORDER).row(0, named=True)
        gaps.append(
            f"{row['refused']} batched request(s) were refused or failed, so their bands are incomplete (the first "
            f"{_where(first)} slot {first['slot']}: {first['state'].removeprefix('refused: ')})"
        )
    lacking = shared.get("references_lacking")
    if lacking is not None and lacking.height:
        names = ", ".join(f"{p} ref #{s + 1} ({how})" for p, s, how in lacking.sort("prompt_id", "slot").rows()[:3])
        names += f" and {lacking.height - 3} more" if lacking.height > 3 else ""
        gaps.append(f"{lacking['prompt_id'].n_unique()} prompt(s) lack a reference, so they are unjudged: {names}")
    elif row["unjudged"]:
        unjudged = batched.filter(pl.col("unjudged")).select(pl.col("prompt_id").unique().sort().head(3)).collect()
        prompts = ", ".join(unjudged["prompt_id"].to_list())
        gaps.append(f"{row['unjudged']} batched request(s) have no ref #1 of their prompt to compare with ({prompts})")
    if row["no_evidence"]:
        first = batched.filter(pl.col("no_evidence")).sort(_ORDER).head(1).collect().row(0, named=True)
        gaps.append(
            f"{row['no_evidence']} of {row['requests']} batched requests have no token to compare (an empty completion on "
            f"either side; the first {_where(first)} slot {first['slot']})"
        )
    if row["bits_unknown"]:
        gaps.append(
            f"{row['bits_unknown']} of {row['requests']} batched requests have their bits unknown (a logprob not recorded, "
            "or null, NaN or infinite, on either side)"
        )
    if row["alone_unknown"]:
        unknown = alone.filter(pl.col("state").is_in(["bits unknown", "no evidence"]))
        named = f" (the first {_first_alone(unknown.row(0, named=True))})" if unknown.height else ""
        gaps.append(
            f"{row['alone_unknown']} request(s) sent alone have no token or bits to compare with ref #1 (or never came back)"
            f"{named}, so the server is not shown to repeat itself alone"
        )
    contradicted = bands.filter(pl.col("contradicted"))  # never a band of one: it is formed, so nothing contradicts it
    if contradicted.height:
        band = contradicted.sort("c", "prompt_id", "repeat").row(0, named=True)
        gaps.append(
            f"the width evidence of {contradicted.height} band(s) contradicts itself (the first {_where(band)}: the server's "
            f"own record says m={band['widest_seen']}, weaker evidence ({band['width_evidence']}) says more)"
        )
    return gaps


def _alone_cause(subject: Subject) -> str:
    """``prompt cache`` when the run's cache counters show cached prompt tokens served while it ran, else ``run-to-run``.
    (The cache arm's requests are no evidence of running alone, :data:`ALONE_ARMS`, so no first request is one of them.)"""
    return "prompt cache" if subject.cache_served() else "run-to-run"


def _cache_served(run: Run) -> bool:
    """Whether any band's cache counters grew (llama.cpp's cached prompt tokens, vLLM's prefix-cache hits)."""
    return cache_served_in(band_table(run))


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
