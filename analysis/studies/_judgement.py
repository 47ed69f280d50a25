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
``cost`` compares each c's per-request decode rate with c=1's, both sides timed the same way (the streams' own
arrival times, or the server's own per-token timing), with a bootstrap interval where each side has three rates.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from ..core import cell
from ..metrics import divergence_bound, ratio_interval, requests_needed
from ..run import Run, RunLike, band_table, legacy_arm, read_run, reference_table, run_arms, slot_table
from ..run import ARM_WORDS, arm_words
from ._next_steps import next_step

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

# worst last: a run's (and a CI job's) verdict is the worst of its arms'
VERDICTS = ("GREEN", "AMBER", "UNVERIFIED", "RED")
# bia's exit codes 2, 3, 4 and 6 say the input was bad (docs/cli.md); 5 is a check that failed, as shape-check's NOT ADMISSIBLE
EXIT_CODES = {"GREEN": 0, "RED": 5, "UNVERIFIED": 7, "AMBER": 8}
BATCHED_ARMS = ("copies", "mixed")  # the arms whose bands batch the prompt; the others are controls sent alone
ALONE_ARMS = ("copies", "mixed", "repeat")  # arms whose c=1 requests are the prompt alone and cold, as m=1 is
MIN_RATE_SAMPLES = 3  # rates a side needs before a ratio of medians gets an interval

_FIRST = pl.Struct({"prompt_id": pl.String, "c": pl.Int64, "repeat": pl.Int64, "slot": pl.Int64, "role": pl.String, "parted": pl.String,
                    "position": pl.Int64, "max_ulp": pl.Int64})
_UNFORMED = pl.List(pl.Struct({"prompt_id": pl.String, "c": pl.Int64, "repeat": pl.Int64, "widest_seen": pl.Int64}))
_COST = pl.List(pl.Struct({"c": pl.Int64, "ratio": pl.Float64, "low": pl.Float64, "high": pl.Float64, "origin": pl.String,
                           "base_rates": pl.Int64, "rates": pl.Int64, "median": pl.Float64, "base_median": pl.Float64}))
SCHEMA: dict[str, PolarsDataType] = {
    "run": pl.String, "arm": pl.String, "engine": pl.String, "verdict": pl.String, "cause": pl.String, "reason": pl.String,
    "evidence": pl.String, "cost": pl.String, "first": pl.String, "max_ulp": pl.Int64, "next_step": pl.String,
    "requests": pl.Int64, "divergent": pl.Int64, "tokens_parted": pl.Int64, "bits_only": pl.Int64, "bits_unknown": pl.Int64,
    "alone": pl.Int64, "alone_parted": pl.Int64, "bands": pl.Int64, "bands_unformed": pl.Int64, "missing": pl.Int64,
    "cs_missing": pl.List(pl.Int64), "upper_bound": pl.Float64, "rule_of_three": pl.Float64, "target_rate": pl.Float64,
    "confidence": pl.Float64, "requests_needed": pl.Int64, "first_request": _FIRST, "unformed": _UNFORMED, "cost_by_c": _COST
}
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
    return Subject(run.label, run.manifest, [int(c) for c in run.ladder], lambda first, arm: _batched_cause(run, first, arm),
                   lambda: _cache_served(run))


class Judgement:
    """The judgement of one or more runs (or witness sets): one row per run and arm, with the columns :func:`analysis.judge` lists.

    It shows in Jupyter as the verdict card every report opens with (verdict, cause, reason in full, cost, next step),
    prints as one line per row, and converts with ``.frame`` (polars) and ``.to_dicts()``.

    Examples
    --------
    >>> from analysis import judge
    >>> j = judge("data/experiment-cpu/default")
    >>> j.verdict, j.exit_code, j.frame.select("arm", "cause").row(0)
    ('RED', 5, ('copies', 'co-batching'))
    """

    def __init__(self, frame: pl.DataFrame) -> None:
        self.frame = frame

    @property
    def verdict(self) -> str:
        """The worst verdict of every row (GREEN for none)."""
        return worst(self.frame["verdict"].to_list())

    @property
    def exit_code(self) -> int:
        """``bia certify``'s exit code for this judgement: 0 GREEN, 5 RED, 7 UNVERIFIED, 8 AMBER."""
        return EXIT_CODES[self.verdict]

    def to_dicts(self) -> list[dict[str, Any]]:
        """The rows as dictionaries (what ``certificate.json`` lists)."""
        return self.frame.to_dicts()

    def __len__(self) -> int:
        return self.frame.height

    def __getitem__(self, key: Any) -> Any:
        return self.frame[key]

    def __getattr__(self, name: str) -> Any:
        # a frame's methods (row, select, filter, ...) on its frame: certificate() returned a frame before it was a Judgement
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.frame, name)

    def __iter__(self):
        return iter(self.frame.iter_rows(named=True))

    def __add__(self, other: Judgement) -> Judgement:
        return Judgement(pl.concat([self.frame, other.frame], how="vertical"))

    def __repr__(self) -> str:
        lines = [f"{row['verdict']} {row['run']} ({row['arm']}): {row['reason']}" for row in self]
        return "\n".join(lines) if lines else "Judgement(nothing judged)"


def worst(verdicts: Iterable[str]) -> str:
    """The worst of several verdicts (RED over UNVERIFIED over AMBER over GREEN); GREEN for none.

    Parameters
    ----------
    verdicts : iterable of str
        Verdicts, each one of ``VERDICTS``.

    Returns
    -------
    str

    Examples
    --------
    >>> worst(["GREEN", "AMBER", "RED"]), worst([])
    ('RED', 'GREEN')
    """
    return max(verdicts, key=VERDICTS.index, default="GREEN")


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
    frames = [_judge_run(cast(Run, run) if isinstance(run, RunLike) else read_run(os.fspath(run)), target_rate, confidence, needed)
              for run in runs]
    frame = pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=SCHEMA)
    return Judgement(_with_measured_fix(frame))


# --- the evidence of one run ----------------------------------------------------------------------------


def _judge_run(run: Run, target_rate: float, confidence: float, needed: int) -> pl.DataFrame:
    slots = slot_table(run)
    refs = reference_table(run)
    bands = _formation(band_table(run))
    states = _states(slots)
    alone = _alone_states(refs, states)
    arms = [a for a in run_arms(run.manifest) if a in BATCHED_ARMS] or run_arms(run.manifest)[:1] or [legacy_arm(run.manifest)]
    missing = pl.DataFrame(run.missing(), schema={"prompt_id": pl.String, "role": pl.String, "c": pl.Int64, "slot": pl.Int64,
                                                  "repeat": pl.Int64, "arm": pl.String, "state": pl.String})
    subject = _subject(run)
    rows = [judge_arm(subject, arm, states.filter(pl.col("arm") == arm), alone, bands.filter(pl.col("arm") == arm),
                       missing.filter(pl.col("arm") == arm), target_rate, confidence, needed) for arm in arms]
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def _states(rows: pl.DataFrame) -> pl.DataFrame:
    """Each request against m=1: ``tokens_parted`` (a different token, or a different length), ``bits_parted`` (the same
    tokens, a logprob whose bits differ), ``bits_unknown`` (the same tokens, no step with a logprob on both sides to
    compare), ``at`` (where it parts)."""
    shorter = pl.col("length") != pl.col("reference_length")  # a stream that ends early took another token (its end) there
    tokens = (pl.col("diverged") | shorter).fill_null(True)
    # no step with a logprob on both sides (max_ulp null): the bits are unknown, not different
    unrecorded = pl.col("bitwise_prefix").is_null() | (pl.col("max_ulp").is_null() & (pl.col("length") > 0))
    bits = ~tokens & (pl.col("bitwise_prefix") < pl.col("length")).fill_null(False) & ~unrecorded
    at = (pl.when(pl.col("diverged")).then("divergence_at")
          .when(tokens).then(pl.min_horizontal("length", "reference_length"))
          .when(bits).then("bitwise_prefix"))
    return rows.with_columns(tokens_parted=tokens, bits_parted=bits, bits_unknown=~tokens & ~bits & unrecorded, position=at)


def _alone_states(refs: pl.DataFrame, states: pl.DataFrame) -> pl.DataFrame:
    """What the server does alone, run to run: each prompt's ref #2 against ref #1, then each request sent alone (c=1 of a
    batched arm or the repeat arm), in the order a reader is told of them (references first)."""
    columns = ["prompt_id", "c", "repeat", "slot", "role", "tokens_parted", "bits_parted", "position", "max_ulp"]
    second = _states(refs).select("prompt_id", c=pl.lit(None, pl.Int64), repeat=pl.lit(None, pl.Int64), slot=pl.lit(1, pl.Int64),
                                  role=pl.lit("ref #2"), tokens_parted="tokens_parted", bits_parted="bits_parted", position="position", max_ulp="max_ulp")
    sent_alone = states.filter((pl.col("c") == 1) & pl.col("arm").is_in(ALONE_ARMS)).sort(_ORDER).select(
        "prompt_id", c="c", repeat="repeat", slot="slot", role=pl.format("{} c=1", "arm"), tokens_parted="tokens_parted",
        bits_parted="bits_parted", position="position", max_ulp="max_ulp")
    return pl.concat([second.sort("prompt_id").select(columns), sent_alone.select(columns)], how="vertical_relaxed")


def _formation(bands: pl.DataFrame) -> pl.DataFrame:
    """Each band with ``widest_seen`` (the widest batch any of its width evidence shows) and ``formed``: c = 1, or c seen."""
    others = pl.col("width_evidence").str.extract_all(r"\d+").list.eval(pl.element().cast(pl.Int64)).list.max()
    seen = pl.max_horizontal("m_formed", others)
    return bands.with_columns(widest_seen=seen, formed=(pl.col("c") <= 1) | (seen >= pl.col("c")).fill_null(False))


# --- one arm's verdict ----------------------------------------------------------------------------------


def judge_arm(subject: Subject, arm: str, states: pl.DataFrame, alone: pl.DataFrame, bands: pl.DataFrame, missing: pl.DataFrame,
              target_rate: float, confidence: float, needed: int) -> dict[str, Any]:
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
        "run": subject.label, "arm": arm, "engine": subject.engine, "requests": batched.height, "divergent": divergent.height,
        "tokens_parted": int(batched["tokens_parted"].sum()), "bits_only": int(batched["bits_parted"].sum()),
        "bits_unknown": int(batched["bits_unknown"].sum()), "alone": alone.height, "alone_parted": alone_parted.height,
        "bands": bands.filter(pl.col("c") > 1).height, "bands_unformed": unformed.height,
        "missing": missing.filter((pl.col("c") > 1) & (pl.col("role") == "band")).height,
        "cs_missing": [c for c in ladder if c not in present], "target_rate": target_rate, "confidence": confidence,
        "requests_needed": needed, "max_ulp": batched["max_ulp"].max(), "cost_by_c": _cost(states),
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
        first_request = {"prompt_id": first["prompt_id"], "c": first["c"], "repeat": first["repeat"], "slot": first["slot"],
                         "role": f"{arm} c={first['c']}", "tokens_parted": first["tokens_parted"], "position": first["position"],
                         "max_ulp": first["max_ulp"]}
        row.update(verdict="RED", cause=subject.cause_of(first, arm), first_request=first_request)
        row["reason"] = _red_reason(row, first_request)
    else:
        gaps = _gaps(row, ladder, subject)
        if gaps:
            row.update(verdict="UNVERIFIED", cause="incomplete evidence", first_request=None,
                       reason="no request parts from m=1, but " + "; ".join(gaps))
        else:
            green = row["upper_bound"] < target_rate
            row.update(verdict="GREEN" if green else "AMBER", cause=None, first_request=None, reason=_bound_reason(row, green))
    first_request = row["first_request"]
    row["first"] = _first_words(first_request) if first_request else None
    if first_request:
        row["first_request"] = {**{k: first_request.get(k) for k in ("prompt_id", "c", "repeat", "slot", "role", "position", "max_ulp")},
                                "parted": "tokens" if first_request["tokens_parted"] else "bits"}
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
        gaps.append(f"{row['bands_unformed']} of {row['bands']} batched bands never seen formed at their c (the first {_where(band)}: {seen})")
    if row["bits_unknown"]:
        gaps.append(f"{row['bits_unknown']} of {row['requests']} batched requests have no logprobs recorded, so their bits are unknown")
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

    table = attribution_table(run).filter((pl.col("prompt_id") == first["prompt_id"]) & (pl.col("arm") == arm)
                                          & (pl.col("c") == first["c"]) & (pl.col("slot") == first["slot"])
                                          & pl.col("repeat").eq_missing(first["repeat"]))
    return table["cause"][0] if table.height else ("mixing" if arm == "mixed" else "co-batching")


# --- words -------------------------------------------------------------------------------------------


def _where(request: Mapping[str, Any]) -> str:
    """A band as people name it: its prompt, c and repeat (an assembled run's bands have no repeat)."""
    repeat = f" repeat {request['repeat']}" if request.get("repeat") is not None else ""
    return f"{request['prompt_id']} c={request['c']}{repeat}"


def _first_words(first: Mapping[str, Any]) -> str:
    """The first request that parts, in words: which, and how."""
    ulp = f" (up to {first['max_ulp']:,} ULP)" if first.get("max_ulp") else ""
    how = (f"its tokens part at token {first['position']}" if first["tokens_parted"]
           else f"its logprob bits differ from ref #1 from token {first['position']}{ulp}")
    if first["role"] == "ref #2":
        return f"{first['prompt_id']} ref #2, sent alone: {how}"
    if first["c"] == 1:
        arm = first["role"].split(" ")[0]
        return f"{first['prompt_id']} sent alone ({arm} c=1{_repeat(first)} slot {first['slot']}): {how}"
    return f"{_where(first)} slot {first['slot']}: {how}"


def _repeat(first: Mapping[str, Any]) -> str:
    return f" repeat {first['repeat']}" if first.get("repeat") is not None else ""


def _alone_reason(row: dict[str, Any], first: Mapping[str, Any]) -> str:
    what = "its prompt cache" if row["cause"] == "prompt cache" else "run to run"
    return (f"not reproducible alone ({what}): {row['alone_parted']} of {row['alone']} requests sent alone part from ref #1 of their "
            f"prompt, the first {_first_words(first)}; batching is not judged until the server repeats itself alone")


def _red_reason(row: dict[str, Any], first: Mapping[str, Any]) -> str:
    return (f"{row['divergent']} of {row['requests']} batched requests part from m=1 ({row['tokens_parted']} in tokens, "
            f"{row['bits_only']} only in bits); the first is {_first_words(first)}")


def _bound_reason(row: dict[str, Any], green: bool) -> str:
    n, needed, target = row["requests"], row["requests_needed"], rate_words(row["target_rate"])
    head = (f"0 of {n} batched requests part from m=1, every band seen formed; the {row['confidence']:.0%} upper bound on the "
            f"divergence rate is {rate_words(row['upper_bound'])}, ")
    if green:
        return head + f"below the {target} target"
    return head + f"not below the {target} target: {needed} batched requests would do ({needed - n} more)"


def _evidence(row: dict[str, Any]) -> str:
    formed = row["bands"] - row["bands_unformed"]
    bound = f"; bound {rate_words(row['upper_bound'])} at {row['confidence']:.0%}" if row["upper_bound"] is not None else ""
    alone = f"; alone: {row['alone'] - row['alone_parted']} of {row['alone']} match ref #1"
    return f"{row['requests']} batched requests, {formed} of {row['bands']} bands seen formed{bound} ({row['requests_needed']} needed){alone}"


def rate_words(value: float) -> str:
    """A rate in percent, with the digits a reader needs to see it against a target (0.997%, not 1%).

    Parameters
    ----------
    value : float
        A rate, as a fraction (0.01 for 1%).

    Returns
    -------
    str
    """
    return f"{value * 100:.3g}%"


# --- the cost of batching --------------------------------------------------------------------------------


def _origin_kind(origin: str | None) -> str | None:
    if origin is None:
        return None
    return "streams" if origin == "stream" else "server"


def _cost(states: pl.DataFrame) -> list[dict[str, Any]]:
    """Per c > 1, the median per-request decode rate over c=1's, both sides of one origin, with a bootstrap interval."""
    timed = states.filter(pl.col("decode_tok_s").is_not_null() & (pl.col("decode_tok_s") > 0)).with_columns(
        kind=pl.col("decode_rate_origin").map_elements(_origin_kind, return_dtype=pl.String))
    rates = {(c, kind): group["decode_tok_s"].to_list() for (c, kind), group in timed.group_by("c", "kind")}
    out = []
    for c in sorted({c for c, _ in rates if c > 1}):
        kind = next((k for k in ("streams", "server") if rates.get((1, k)) and rates.get((c, k))), None)
        if kind is None:
            continue
        base, batched = rates[(1, kind)], rates[(c, kind)]
        if min(len(base), len(batched)) >= MIN_RATE_SAMPLES:
            ratio, low, high = ratio_interval(base, batched)
        else:
            ratio, low, high = statistics.median(batched) / statistics.median(base), None, None
        out.append({"c": c, "ratio": ratio, "low": low, "high": high, "origin": kind, "base_rates": len(base), "rates": len(batched),
                    "median": statistics.median(batched), "base_median": statistics.median(base)})
    return out


def cost_words(cost: list[Mapping[str, Any]] | None) -> str | None:
    """A run's cost in words: each c's decode rate per request against c=1's, with its interval where it has one.

    Parameters
    ----------
    cost : list of Mapping of str to Any or None
        A row's ``cost_by_c``: per c, ``c``, ``ratio``, ``low`` and ``high`` (None without an interval) and ``origin``
        (``streams`` or the server's timings). None or empty gives None.

    Returns
    -------
    str or None

    Examples
    --------
    >>> cost_words([{"c": 4, "ratio": 0.9, "low": 0.8, "high": 1.01, "origin": "streams"}, {"c": 8, "ratio": 0.5, "low": None,
    ...             "high": None, "origin": "streams"}])
    'c=4 0.90× (0.80–1.01), c=8 0.50× of c=1’s decode rate per request (streams’ timings)'
    """
    if not cost:
        return None
    parts = [f"c={c['c']} {c['ratio']:.2f}×" + (f" ({c['low']:.2f}–{c['high']:.2f})" if c.get("low") is not None else "") for c in cost]
    origins = sorted({c["origin"] for c in cost})
    timing = " and ".join("streams’ timings" if o == "streams" else "the server’s timings" for o in origins)
    return f"{', '.join(parts)} of c=1’s decode rate per request ({timing})"


def _with_measured_fix(frame: pl.DataFrame) -> pl.DataFrame:
    """A RED row whose next step is bia's row-invariant mode, with what that mode cost where a row-invariant run was judged
    beside it (in the same folder): its median decode rate per request over the RED run's, at each c both timed alike."""
    rows = frame.to_dicts()
    fixes = {str(PurePath(r["run"]).parent): r for r in rows if PurePath(r["run"]).name == "row-invariant" and r["verdict"] in ("GREEN", "AMBER")}
    for row in rows:
        fix = fixes.get(str(PurePath(row["run"]).parent))
        if fix and row["verdict"] == "RED" and row["next_step"].endswith("--modes row-invariant"):
            measured = _rate_over(fix["cost_by_c"], row["cost_by_c"])
            if measured:
                row["next_step"] += f" (measured beside it, its decode rate over this run's: {measured})"
    return pl.DataFrame(rows, schema=SCHEMA, orient="row") if rows else frame


def _rate_over(fix: list[Mapping[str, Any]], red: list[Mapping[str, Any]]) -> str | None:
    """One run's median decode rate per request over another's at c=1 and each c, where both sides are timed the same way.

    Examples
    --------
    >>> a = [{"c": 4, "origin": "streams", "median": 90.0, "base_median": 110.0}]
    >>> _rate_over(a, [{"c": 4, "origin": "streams", "median": 100.0, "base_median": 100.0}])
    '1.10× at c=1, 0.90× at c=4'
    """
    theirs = {c["c"]: c for c in red}
    pairs = [(c, theirs[c["c"]]) for c in fix if c["c"] in theirs and theirs[c["c"]]["origin"] == c["origin"]]
    if not pairs:
        return None
    ratios = [("1", pairs[0][0]["base_median"] / pairs[0][1]["base_median"])]
    ratios += [(str(mine["c"]), mine["median"] / other["median"]) for mine, other in pairs]
    return ", ".join(f"{r:.2f}× at c={c}" for c, r in ratios)
