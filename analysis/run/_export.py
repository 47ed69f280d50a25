"""From a run to aprender's witness (``witness_version`` 3), by the probe's rules."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from ..core import claim_output, write_atomic
from ..metrics import columnar as _columnar
from ..metrics import parity
from ..verdicts import derive_run_verdict
from ._arms import main_arm
from ._layout import _DEFAULTS, RunError, band_widths
from ._steps import numbered_steps

if TYPE_CHECKING:  # the tables take any object shaped like a Run (RunLike); only type hints name the class
    from ._model import Run


def _refusal(row: Mapping[str, Any], n_predict: int) -> str | None:
    """Why a request cannot stand in a witness (``row`` a numbered request, with its stream's ``length``), else None."""
    if row["completion_tokens"] != n_predict:
        got = "none" if row["completion_tokens"] is None else row["completion_tokens"]
        return f"completion_tokens={got} != n_predict={n_predict} (PP-28)"
    if row["length"] != n_predict:
        return f"{row['length']} logprob entries != n_predict={n_predict}; the request must ask for logprobs"
    return None


def _env_strings(environment: Mapping[str, Any]) -> dict[str, str | None]:
    """A run's environment as a witness's ``env`` holds it: strings or null (aprender's kernel knobs), another value as
    JSON spells it (``true``, ``1``), so that bia reads back the witness it writes."""
    return {
        key: value if value is None or isinstance(value, str) else json.dumps(value, sort_keys=True)
        for key, value in environment.items()
    }


def to_witness(run: Run, prompt_id: str | None = None, *, repeat: int | None = None) -> dict[str, Any]:
    """An aprender ``witness_version`` 3 for one prompt of the run, by the probe's rules.

    ``bia shape-check`` reads it back, so a run bia collected is judged by aprender's V3.
    With repeated bands, ``repeat`` chooses which (the first by default). A run whose manifest records
    no ``sampler.max_tokens`` (one assembled from dumps) is a ``RunError``: aprender holds every request
    to that length.

    Parameters
    ----------
    run : Run
        The run, with ``sampler.max_tokens`` in its manifest.
    prompt_id : str, optional
        The prompt to write; may be left out only when the run holds one prompt.
    repeat : int, optional
        Which repeat of each band; the first recorded when None.

    Returns
    -------
    dict
        The witness document, ready for ``json.dumps``.

    Raises
    ------
    RunError
        No ``max_tokens`` recorded, or several prompts and no ``prompt_id``.
    """
    manifest = run.manifest
    steps, requests, _ = numbered_steps(run)
    prompts = sorted({p for p in requests["prompt_id"].to_list() if p is not None})
    if prompt_id is None:
        if len(prompts) != 1:
            raise RunError(f"the run holds prompts {prompts}; choose one with prompt_id=")
        prompt_id = prompts[0]
    requests = requests.filter(pl.col("prompt_id") == prompt_id)
    sampler = dict(manifest.get("sampler", {}))
    n_predict = int(sampler.get("max_tokens", sampler.get("n_predict", 0)) or 0)
    if (
        n_predict < 1
    ):  # aprender refuses every request whose completion_tokens is not n_predict (PP-28): 0 would refuse them all
        raise RunError(
            f"{run.label}: the manifest records no max_tokens (sampler.max_tokens), the length aprender's witness holds "
            "every request to (PP-28); a run assembled from dumps does not know it: give it in the manifest "
            "(assemble_dumps(..., manifest={'sampler': {'max_tokens': N}}))"
        )
    declared_min, max_run = run.declared_min, int(manifest.get("max_constant_run", _DEFAULTS["max_constant_run"]))
    refs = requests.filter(pl.col("role") == "reference").sort("slot").to_dicts()
    band_rows: dict[int, tuple[int | None, list[dict[str, Any]]]] = {}
    arm = main_arm(manifest)  # a witness holds one layout's bands: the copies arm's where the run has it
    for c in run.ladder:
        rows = requests.filter((pl.col("role") == "band") & (pl.col("c") == c) & (pl.col("arm") == arm))
        chosen = (
            repeat
            if repeat is not None
            else (cast(int, rows["repeat"].drop_nulls().min()) if rows["repeat"].drop_nulls().len() else None)
        )
        if chosen is not None:
            rows = rows.filter(pl.col("repeat") == chosen)
        band_rows[c] = (chosen, rows.sort("slot").to_dicts())
    facts = _pair_facts(steps, _witness_pairs(refs, [rows for _, rows in band_rows.values()]))
    reference = _reference(refs, facts, n_predict, declared_min)
    bands = []
    if reference["stable"]:
        runs = _constant_runs(run)
        for c, (chosen, band_requests) in band_rows.items():
            widths, evidence = band_widths(manifest, prompt_id, c, chosen, arm=arm)
            expected = 1 if arm == "mixed" else c  # needle: only the target is recorded
            band = _band(
                c,
                max(widths, default=None),
                band_requests,
                facts,
                runs,
                refs[0],
                n_predict,
                declared_min,
                max_run,
                expected,
            )
            bands.append(
                {**band, "m_formed_evidence": evidence}
            )  # log, metrics, engine or streams (see band_widths); aprender ignores it
    result = derive_run_verdict(reference["stable"], [(b["c"], b["result"]) for b in bands])
    prompt_text = next(
        (p.get("text") for p in manifest.get("prompts", []) if str(p.get("prompt_id")) == prompt_id), None
    )
    identity = manifest.get("identity", {})
    return {
        "witness_version": 3,
        "probe": "bia",
        "host": identity.get("host"),
        "commit": identity.get("commit"),
        "binary_sha256": identity.get("binary_sha256"),
        "prompt_sha256": hashlib.sha256(prompt_text.encode()).hexdigest()
        if isinstance(prompt_text, str)
        else identity.get("prompt_sha256"),
        "model": {
            "path": (identity.get("model") or {}).get("path"),
            "sha256": (identity.get("model") or {}).get("sha256"),
        },
        "sampler": sampler,
        "declared_min": declared_min,
        "env": _env_strings(manifest.get("environment") or {}),
        "reference": reference,
        "bands": bands,
        "result": result,
    }


def _witness_pairs(refs: list[dict], bands: list[list[dict]]) -> list[tuple[int, int]]:
    """The comparisons a witness needs: ref #1 against ref #2, and per band ref #1 against slot 0 and slot 0 against every slot."""
    if len(refs) < 2:
        return []
    pairs = [(refs[0]["req"], refs[1]["req"])]
    for rows in bands:
        if rows:
            pairs += [(refs[0]["req"], rows[0]["req"])] + [(rows[0]["req"], row["req"]) for row in rows]
    return pairs


def _pair_facts(steps: _columnar.Steps, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], dict[str, Any]]:
    """:func:`analysis.parity.compare` of each (reference, other) request pair, computed in one query."""
    frame = pl.DataFrame(pairs, schema={"ref": pl.Int64, "other": pl.Int64}, orient="row").unique(maintain_order=True)
    frame = frame.with_row_index("pair").with_columns(pl.col("pair").cast(pl.Int64))
    compared = frame.join(_columnar.compare_pairs(steps, frame, epsilon=parity.NEAR_TIE_EPSILON), on="pair")
    return {(row["ref"], row["other"]): row for row in compared.iter_rows(named=True)}


def _constant_runs(run: Run) -> dict[int, int]:
    """The longest run of one repeated token of every request, by request number (built once per run)."""
    if "constant_runs" not in run._cache:
        steps, _, _ = numbered_steps(run)
        runs = _columnar.constant_runs(steps)
        run._cache["constant_runs"] = dict(zip(runs["req"].to_list(), runs["max_constant_run"].to_list()))
    return run._cache["constant_runs"]


def _reference(refs: list[dict], facts: dict, n_predict: int, declared_min: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "stable": False,
        "tokens": refs[0]["completion_tokens"] if refs else None,
        "self_divergence_at": None,
    }
    if len(refs) < 2:
        out["reason"] = f"the run holds {len(refs)} m=1 reference(s); two are needed"
        return out
    for label, row in (("ref#1", refs[0]), ("ref#2", refs[1])):
        why = _refusal(row, n_predict)
        if why:
            out["reason"] = f"{label}: {why}"
            return out
    agree = facts[(refs[0]["req"], refs[1]["req"])]["agree_to"]
    out["self_divergence_at"] = agree
    if agree < declared_min:
        out["reason"] = (
            f"the two m=1 references diverge at token {agree} < declared_min {declared_min}; "
            "a batched difference could not be laid at batching's door"
        )
    else:
        out["stable"] = True
    return out


def _band(c, m_formed, rows, facts, runs, ref_row, n_predict, declared_min, max_run, expected) -> dict[str, Any]:
    slots = []
    for i, row in enumerate(rows):
        slots.append(
            {
                "i": i,
                "completion_tokens": row["completion_tokens"],
                "finish_reason": row["finish_reason"],
                "refused": _refusal(row, n_predict),
                "decode_tok_s": row["decode_tok_s"],
                "decode_rate_origin": row.get("decode_rate_origin"),
            }
        )
    band = {
        "c": c,
        "m_formed": m_formed,
        "result": "UNMEASURABLE",
        "divergence_at": None,
        "intra_agree_to": None,
        "max_constant_run": None,
        "declared_min": declared_min,
        "max_constant_run_declared": max_run,
        "reason": None,
        "decode_tok_s": parity.band_decode_rate([s["decode_tok_s"] for s in slots]),
        "slots": slots,
    }
    refusals = [f"slot {s['i']}: {s['refused']}" for s in slots if s["refused"]]
    if len(slots) != expected:
        band["reason"] = f"fired c={c} requests, {len(slots)} of the {expected} recorded came back"
    elif refusals:
        band["reason"] = "; ".join(refusals)
    elif c > 1 and m_formed is None:
        band["reason"] = (
            "no batch width was observed in this band's window (no server log line, no running-requests gauge sample), "
            "so whether the batched path ran is unknown"
        )
    elif c > 1 and m_formed < 2:
        band["reason"] = (
            f"no batch with m>1 formed in this band's window (max m={m_formed}); the batched path was never exercised, "
            "so nothing about it was witnessed"
        )
    if band["reason"]:
        return band
    first = facts[(ref_row["req"], rows[0]["req"])]
    band["divergence_at"] = first[
        "agree_to"
    ]  # aprender: reference against slot 0; the shorter length when they never part
    if first["diverged"] and first["reference_margin"] is not None:
        band["top2_margin_at_divergence"] = first["reference_margin"]
    band["intra_agree_to"] = min(facts[(rows[0]["req"], row["req"])]["agree_to"] for row in rows)
    band["max_constant_run"] = max(runs[row["req"]] for row in rows)
    reasons = []
    if max_run > 0 and band["max_constant_run"] >= max_run:
        reasons.append(
            f"a slot repeated one token {band['max_constant_run']} times, at or above max_constant_run={max_run} (#2753 signature)"
        )
    if band["intra_agree_to"] < declared_min:
        reasons.append(f"slots of one batch disagree at token {band['intra_agree_to']} < declared_min={declared_min}")
    band["result"] = "FAIL" if reasons else "PASS"
    band["reason"] = "; ".join(reasons) or None
    return band


def write_witness(run: Run, path: str | os.PathLike[str] | None = None, *, force: bool = False, **options: Any) -> Path:
    """Write :func:`to_witness` as JSON (``witness.json`` in the run directory by default); an existing
    file is refused unless ``force``.

    Parameters
    ----------
    run : Run
        The run.
    path : str or os.PathLike, optional
        The file to write; ``witness.json`` in the run directory when None (an assembled run, with no
        directory, needs one).
    force : bool, default False
        Replace an existing file.
    **options : Any
        Passed to ``to_witness``: ``prompt_id`` and ``repeat``.

    Returns
    -------
    Path
        The file written.
    """
    if path is None:
        if run.path is None:
            raise RunError("an assembled run needs an explicit path for its witness")
        path = run.path / "witness.json"
    path = claim_output(path, force=force, what="the witness")
    write_atomic(path, json.dumps(to_witness(run, **options), indent=2, sort_keys=True))
    return path
