"""A certificate per run and arm: GREEN, AMBER, RED or UNVERIFIED, with the bound on the divergence rate behind it.

- RED: a request's tokens or its float32 logprob bits part from m=1 (ref #1 of its prompt). The first such
  request is named (smallest c, then prompt, repeat, slot), with whether its tokens parted or only its bits.
- UNVERIFIED: nothing parted, but the evidence cannot carry a certificate: a band of c > 1 whose batch was
  never seen formed at its c (no width evidence reached c: the band's requests may never have shared a
  batch), a request whose logprobs were not recorded (its bits unknown), or no batched request at all.
- GREEN: every request bit-identical to m=1, every batch seen formed, and enough requests that the one-sided
  upper bound on the divergence rate (:func:`analysis.divergence_bound`, exact Clopper-Pearson) is below the
  target rate.
- AMBER: as GREEN, but too few requests for that bound; the certificate says how many would do.

A band of c = 1 is one request alone: there is no batch to see formed, so it needs no width evidence.
Every batched request of the arm counts toward n, c = 1 included: each is compared with m=1.
"""

from __future__ import annotations

import os
from typing import Any

import polars as pl

from ..metrics._bounds import divergence_bound, requests_needed
from ..run import Run, band_table, legacy_arm, read_run, references, slot_table

# worst last: a run's (and a CI job's) verdict is the worst of its arms'
VERDICTS = ("GREEN", "AMBER", "UNVERIFIED", "RED")
# bia's exit codes 2, 3, 4 and 6 say the input was bad (docs/cli.md); 5 is a check that failed, as shape-check's NOT ADMISSIBLE
EXIT_CODES = {"GREEN": 0, "RED": 5, "UNVERIFIED": 7, "AMBER": 8}
_ORDER = ["band_c", "prompt_id", "repeat", "slot"]
_FIRST = pl.Struct({"prompt_id": pl.String, "band_c": pl.Int64, "repeat": pl.Int64, "slot": pl.Int64, "parted": pl.String,
                    "at": pl.Int64, "max_ulp": pl.Int64})
_UNFORMED = pl.List(pl.Struct({"prompt_id": pl.String, "band_c": pl.Int64, "repeat": pl.Int64, "widest_seen": pl.Int64}))
SCHEMA = {"run": pl.String, "arm": pl.String, "verdict": pl.String, "requests": pl.Int64, "divergent": pl.Int64,
          "tokens_parted": pl.Int64, "bits_only": pl.Int64, "bits_unknown": pl.Int64, "bands": pl.Int64, "bands_unformed": pl.Int64,
          "upper_bound": pl.Float64, "rule_of_three": pl.Float64, "target_rate": pl.Float64, "confidence": pl.Float64,
          "requests_needed": pl.Int64, "first": _FIRST, "unformed": _UNFORMED, "reason": pl.String}


def layout_arm(run: Run) -> str:
    """The arm a run without an ``arm`` column is, by the runs' own rule (:func:`analysis.run.legacy_arm`):
    ``mixed`` for the needle layout (what the mixed arm fires), else ``copies``.

    Examples
    --------
    >>> from analysis import read_run
    >>> layout_arm(read_run("data/llamacpp-cpu/no-cache-prompt"))
    'copies'
    """
    return legacy_arm(run.manifest)


def _with_arm(frame: pl.DataFrame, run: Run) -> pl.DataFrame:
    """``frame`` (slot rows) with its string ``arm`` column: its own, else its requests', else the run's layout.

    Runs gain an ``arm`` column per request and band with issue 24's arms; until then a run is one arm named after its
    layout. This and :func:`_band_arms` are the only places that read arms, so that change lands here alone.
    """
    if "arm" in frame.columns:
        return frame
    requests = run.requests
    if "arm" in requests.columns and {"source", "record"} <= set(frame.columns):
        arms = requests.select("source", "record", "arm").unique(["source", "record"], keep="first")
        return frame.join(arms, on=["source", "record"], how="left", maintain_order="left")
    return frame.with_columns(arm=pl.lit(layout_arm(run), dtype=pl.String))


def _band_arms(bands: pl.DataFrame, states: pl.DataFrame) -> pl.DataFrame:
    """The bands with their ``arm``: their own column, else the arms of their requests (a band whose requests were fired in
    two arms stands in each), so that every arm's requests meet their bands' width evidence."""
    if "arm" in bands.columns:
        return bands
    arms = states.select("arm", "prompt_id", "band_c", "repeat").unique(maintain_order=True)
    return bands.join(arms, on=["prompt_id", "band_c", "repeat"], how="inner", nulls_equal=True, maintain_order="left")


def request_states(slots: pl.DataFrame, reference_lengths: pl.DataFrame) -> pl.DataFrame:
    """Each batched request against m=1: ``tokens_parted`` (a different token, or a different length), ``bits_parted`` (the
    same tokens, a logprob whose bits differ), ``bits_unknown`` (the same tokens, no logprob recorded to compare), and
    ``at``, the token where it parts (null when it does not)."""
    rows = slots.join(reference_lengths, on="prompt_id", how="left")
    shorter = pl.col("length") != pl.col("reference_length")  # a stream that ends early took another token (its end) there
    tokens = (pl.col("diverged") | shorter).fill_null(True)
    bits = ~tokens & (pl.col("bitwise_prefix") < pl.col("length")).fill_null(False)
    unrecorded = pl.col("bitwise_prefix").is_null() | (pl.col("max_ulp").is_null() & (pl.col("length") > 0))
    at = (pl.when(pl.col("diverged")).then("divergence_at")
          .when(tokens).then(pl.min_horizontal("length", "reference_length"))
          .when(bits).then("bitwise_prefix"))
    return rows.with_columns(tokens_parted=tokens, bits_parted=bits, bits_unknown=~tokens & ~bits & unrecorded, at=at)


def band_formation(bands: pl.DataFrame) -> pl.DataFrame:
    """Each band with ``widest_seen`` (the widest batch any of its width evidence shows: ``m_formed`` and the widths
    ``width_evidence`` gives for the other kinds, "metrics; streams 14") and ``formed``: c = 1, or a width of c seen."""
    others = pl.col("width_evidence").str.extract_all(r"\d+").list.eval(pl.element().cast(pl.Int64)).list.max()
    seen = pl.max_horizontal("m_formed", others)
    return bands.with_columns(widest_seen=seen, formed=(pl.col("band_c") <= 1) | (seen >= pl.col("band_c")).fill_null(False))


def certificate(run: Any, *, target_rate: float = 0.01, confidence: float = 0.95) -> pl.DataFrame:
    """The certificate of one run: a verdict per arm, GREEN, AMBER, RED or UNVERIFIED (see the module's words).

    Parameters
    ----------
    run : Run or path
        The run (a run directory is read).
    target_rate : float
        The divergence rate the run must bound itself below to be GREEN, in (0, 1].
    confidence : float
        The confidence of the one-sided upper bound on the divergence rate.

    Returns
    -------
    pl.DataFrame
        One row per arm: ``verdict``; ``requests`` compared with m=1, ``divergent`` among them (``tokens_parted`` plus
        ``bits_only``), ``bits_unknown``; ``bands`` and ``bands_unformed`` (of c > 1, never seen formed at their c);
        ``upper_bound`` (exact, one-sided) and ``rule_of_three`` (3/n, with 0 divergences at 95%); ``requests_needed``
        for the target; ``first`` (the first request that parts: prompt, c, repeat, slot, ``parted`` "tokens" or
        "bits", ``at`` the token, ``max_ulp``); ``unformed`` (each band never seen formed, with the widest width seen);
        ``reason``, one sentence.

    Examples
    --------
    >>> certificate("data/llamacpp-cpu/no-cache-prompt").select("arm", "verdict", "requests", "divergent", "tokens_parted").row(0)
    ('copies', 'RED', 58, 56, 0)
    >>> print(certificate("data/experiment-cpu/batch-invariant")["reason"][0])
    0 of 58 requests part from m=1 and every batch was seen formed; the 95% upper bound on the divergence rate is 5.03%, not below the 1% target: 299 requests would do (241 more)
    """
    needed = requests_needed(target_rate, confidence)  # checks both arguments before any table is built
    if not isinstance(run, Run):
        run = read_run(os.fspath(run))
    lengths = pl.DataFrame([(prompt, len(stream)) for prompt, stream in references(run, "ref1").items()],
                           schema={"prompt_id": pl.String, "reference_length": pl.Int64}, orient="row")
    states = request_states(_with_arm(slot_table(run), run), lengths)
    bands = band_formation(_band_arms(band_table(run), states))
    return judge(states, bands, target_rate=target_rate, confidence=confidence, needed=needed,
                 name=str(run.path) if run.path else "assembled run")


def judge(states: pl.DataFrame, bands: pl.DataFrame, *, target_rate: float, confidence: float, needed: int, name: str) -> pl.DataFrame:
    """The verdict per arm from :func:`request_states` and :func:`band_formation` (each with ``arm``)."""
    parted = pl.col("tokens_parted") | pl.col("bits_parted")
    per_arm = states.sort(_ORDER).group_by("arm", maintain_order=True).agg(
        requests=pl.len().cast(pl.Int64), tokens_parted=pl.col("tokens_parted").sum().cast(pl.Int64),
        bits_only=pl.col("bits_parted").sum().cast(pl.Int64), bits_unknown=pl.col("bits_unknown").sum().cast(pl.Int64),
        first=pl.struct("prompt_id", "band_c", "repeat", "slot", parted=pl.when("tokens_parted").then(pl.lit("tokens")).otherwise(pl.lit("bits")),
                        at="at", max_ulp="max_ulp").filter(parted).first())
    unformed = bands.filter(~pl.col("formed")).sort("band_c", "prompt_id", "repeat")
    per_band = bands.group_by("arm").agg(bands=pl.len().cast(pl.Int64)).join(
        unformed.group_by("arm").agg(unformed=pl.struct("prompt_id", "band_c", "repeat", "widest_seen")), on="arm", how="left")
    table = (per_arm.join(per_band, on="arm", how="full", coalesce=True, maintain_order="left")
             .with_columns(pl.col("requests", "tokens_parted", "bits_only", "bits_unknown", "bands").fill_null(0),
                           pl.col("unformed").fill_null(pl.lit([], dtype=_UNFORMED)))
             .with_columns(divergent=pl.col("tokens_parted") + pl.col("bits_only"), bands_unformed=pl.col("unformed").list.len().cast(pl.Int64)))
    rows = [_verdict(row, target_rate, confidence, needed) | {"run": name} for row in table.sort("arm").iter_rows(named=True)]  # one per arm
    return pl.DataFrame(rows, schema=SCHEMA, orient="row") if rows else pl.DataFrame(schema=SCHEMA)


def _verdict(row: dict[str, Any], target_rate: float, confidence: float, needed: int) -> dict[str, Any]:
    """One arm's verdict, bounds and reason from its counts."""
    n, divergent = row["requests"], row["divergent"]
    upper = divergence_bound(divergent, n, confidence) if n else None
    three = divergence_bound(0, n, confidence, "rule-of-three") if n and not divergent and confidence == 0.95 else None
    if divergent:
        verdict, reason = "RED", _red_reason(row)
    elif not n:
        verdict, reason = "UNVERIFIED", "no batched request came back: nothing to compare with m=1"
    elif row["bands_unformed"] or row["bits_unknown"]:
        verdict, reason = "UNVERIFIED", _unverified_reason(row)
    else:
        verdict = "GREEN" if upper < target_rate else "AMBER"
        bound = f"the {confidence:.0%} upper bound on the divergence rate is {_rate(upper)}"
        reason = f"0 of {n} requests part from m=1 and every batch was seen formed; {bound}, "
        reason += (f"below the {_rate(target_rate)} target" if verdict == "GREEN"
                   else f"not below the {_rate(target_rate)} target: {needed} requests would do ({needed - n} more)")
    return {**row, "verdict": verdict, "upper_bound": upper, "rule_of_three": three, "target_rate": target_rate, "confidence": confidence,
            "requests_needed": needed, "reason": reason}


def _red_reason(row: dict[str, Any]) -> str:
    first = row["first"]
    how = (f"its tokens part at token {first['at']}" if first["parted"] == "tokens"
           else f"only its logprob bits differ, from token {first['at']}" + (f" (up to {first['max_ulp']:,} ULP)" if first["max_ulp"] else ""))
    return (f"{row['divergent']} of {row['requests']} requests part from m=1 ({row['tokens_parted']} in tokens, {row['bits_only']} only in bits); "
            f"the first is {_where(first)} slot {first['slot']}: {how}")


def _unverified_reason(row: dict[str, Any]) -> str:
    parts = []
    if row["bands_unformed"]:
        band = row["unformed"][0]
        seen = f"the widest seen m={band['widest_seen']}" if band["widest_seen"] is not None else "no width seen"
        parts.append(f"{row['bands_unformed']} of {row['bands']} bands never seen formed at their c (the first {_where(band)}: {seen})")
    if row["bits_unknown"]:
        parts.append(f"{row['bits_unknown']} of {row['requests']} requests have no logprobs recorded, so their bits are unknown")
    return f"no request parts from m=1, but {' and '.join(parts)}"


def _where(request: dict[str, Any]) -> str:
    """A band as people name it: its prompt, c and repeat (an assembled run's bands have no repeat)."""
    repeat = f" repeat {request['repeat']}" if request["repeat"] is not None else ""
    return f"{request['prompt_id']} c={request['band_c']}{repeat}"


def _rate(value: float) -> str:
    """A rate in percent, with the digits a reader needs to see it against a target (0.997%, not 1%)."""
    return f"{value * 100:.3g}%"


CERTIFICATE_VERSION = 1


def certificate_document(tables: list[pl.DataFrame], *, target_rate: float, confidence: float) -> dict[str, Any]:
    """``certificate.json``: the verdict over every run and arm (the worst), its exit code, and each arm's row of :func:`certificate`.

    Examples
    --------
    >>> doc = certificate_document([certificate("data/llamacpp-cpu/cache-prompt")], target_rate=0.01, confidence=0.95)
    >>> doc["verdict"], doc["exit_code"], doc["requests_needed"], doc["arms"][0]["first"]["parted"]
    ('RED', 5, 299, 'bits')
    """
    arms = [row for table in tables for row in table.iter_rows(named=True)]
    verdict = worst([arm["verdict"] for arm in arms])
    return {"certificate_version": CERTIFICATE_VERSION, "verdict": verdict, "exit_code": EXIT_CODES[verdict], "target_rate": target_rate,
            "confidence": confidence, "bound": "one-sided exact Clopper-Pearson upper bound on the divergence rate",
            "requests_needed": requests_needed(target_rate, confidence), "arms": arms}


def worst(verdicts: list[str]) -> str:
    """The worst of several verdicts (RED over UNVERIFIED over AMBER over GREEN); GREEN for none.

    Examples
    --------
    >>> worst(["GREEN", "AMBER", "RED"]), worst([])
    ('RED', 'GREEN')
    """
    return max(verdicts, key=VERDICTS.index, default="GREEN")
