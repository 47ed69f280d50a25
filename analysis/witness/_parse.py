"""Parsing one witness (versions 1, 2, 3) or release marker document into plain row dicts.

Parsing (``_parse_*``) turns one JSON document into row dicts; the rules of the file's own version
re-derive every recorded band result and run verdict, and any disagreement is kept as a row of
``discrepancies`` rather than hidden. ``_read`` builds the frames from these rows, once, at the end.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..core import Fields, NestingError, StrictJsonError, WitnessError, loads_strict, not_json
from ..verdicts import derive_band_result, derive_run_verdict
from ._schema import ENV_KEYS, EXIT_TO_VERDICT, EXPECTED_PROBE, MARKER_KEYS


def _extra(fields: Fields) -> str | None:
    unused = fields.unused()
    return json.dumps(unused, sort_keys=True) if unused else None


def _text(value: Any) -> str:
    return "null" if value is None else str(value)


@dataclass
class _Parsed:
    """Rows from one source, before frames are built."""

    witnesses: list[dict[str, Any]] = field(default_factory=list)
    bands: list[dict[str, Any]] = field(default_factory=list)
    slots: list[dict[str, Any]] = field(default_factory=list)
    markers: list[dict[str, Any]] = field(default_factory=list)
    discrepancies: list[dict[str, Any]] = field(default_factory=list)

    def note(self, source: str, record: str, name: str, recorded: Any, derived: Any, rule: str) -> None:
        self.discrepancies.append(
            {
                "source": source,
                "record": record,
                "field": name,
                "recorded": _text(recorded),
                "derived": _text(derived),
                "rule": rule,
            }
        )

    def extend(self, other: _Parsed) -> None:
        for name in ("witnesses", "bands", "slots", "markers", "discrepancies"):
            getattr(self, name).extend(getattr(other, name))


# --- parsing --------------------------------------------------------------------------------


def _parse_slot(fields: Fields, *, version: int, band_index: int, c: int) -> dict[str, Any]:
    row = {
        "witness_version": version,
        "band_index": band_index,
        "c": c,
        "i": fields.int("i", required=True),
        "completion_tokens": fields.int("completion_tokens"),
        "finish_reason": fields.str("finish_reason"),
        "token_count_source": fields.str("token_count_source"),
        "agree_to": fields.int("agree_to"),
        "intra_agree_to": fields.int("intra_agree_to"),
        "constant_run": fields.int("constant_run"),
        "decode_tok_s": fields.number("decode_tok_s"),
        "refused": fields.str("refused"),
    }
    row["extra"] = _extra(fields)
    return row


def _parse_band(fields: Fields, *, version: int, index: int, parsed: _Parsed) -> dict[str, Any]:
    c = fields.int("c", required=True)
    record = fields.record = f"{fields.record} (c={c})"  # later errors name the band by its c
    band = {
        "band_index": index,
        "c": c,
        "m_formed": fields.int("m_formed"),
        "result": fields.str("result"),
        "divergence_at": fields.int("divergence_at"),
        "declared_min": fields.int("declared_min"),
        "top2_margin_at_divergence": fields.number("top2_margin_at_divergence"),
        "decode_tok_s": fields.number("decode_tok_s"),
        "intra_agree_to": fields.int("intra_agree_to"),
        "max_constant_run": fields.int("max_constant_run"),
        "max_constant_run_declared": fields.int("max_constant_run_declared"),
        "reason": fields.str("reason"),
    }
    raw_slots = fields.list("slots") or []
    slots = [
        _parse_slot(
            Fields(raw, source=fields.source, record=f"{record}.slots[{k}]"), version=version, band_index=index, c=c
        )
        for k, raw in enumerate(raw_slots)
    ]
    band["extra"] = _extra(fields)
    band["n_slots"] = len(slots)
    derived, note = derive_band_result(version, band, slots)
    band["derived_result"], band["derivation_note"] = derived, note
    band["result_agrees"] = None if derived is None else derived == band["result"]
    if band["result_agrees"] is False:
        parsed.note(fields.source, record, "result", band["result"], derived, f"band rule of witness_version {version}")
    _check_band_aggregates(band, slots, version, fields.source, record, parsed)
    parsed.slots.extend(slots)
    return band


def _check_band_aggregates(band, slots, version, source, record, parsed: _Parsed) -> None:
    """Band fields that summarise the slots must equal what the slots say."""
    checks = []
    if version in (1, 2) and slots and all(s["agree_to"] is not None for s in slots):
        checks.append(("divergence_at", min(s["agree_to"] for s in slots), "minimum of the slots' agree_to"))
    if version == 2 and slots and all(s["intra_agree_to"] is not None for s in slots):
        checks.append(
            ("intra_agree_to", min(s["intra_agree_to"] for s in slots), "minimum of the slots' intra_agree_to")
        )
    if version == 2 and slots and all(s["constant_run"] is not None for s in slots):
        checks.append(("max_constant_run", max(s["constant_run"] for s in slots), "maximum of the slots' constant_run"))
    if version == 3 and slots:
        rates = [s["decode_tok_s"] for s in slots]
        median = None if None in rates else statistics.median(rates)
        checks.append(("decode_tok_s", median, "median of the slots' decode_tok_s, null if any is null"))
    for name, derived, rule in checks:
        if band[name] != derived:
            parsed.note(source, record, name, band[name], derived, rule)


def _parse_reference(top: Fields, declared_min: int | None, parsed: _Parsed, extras: dict[str, Any]) -> dict[str, Any]:
    ref = top.child("reference", "$.reference")
    if ref is None:
        return {
            f"reference_{k}": None for k in ("stable", "tokens", "token_count_source", "self_divergence_at", "reason")
        }
    row: dict[str, Any] = {
        "reference_stable": ref.bool("stable"),
        "reference_tokens": ref.int("tokens"),
        "reference_token_count_source": ref.str("token_count_source"),
        "reference_self_divergence_at": ref.int("self_divergence_at"),
        "reference_reason": ref.str("reason"),
    }
    agree = row["reference_self_divergence_at"]
    if agree is not None and declared_min is not None and row["reference_stable"] is not None:
        derived = agree >= declared_min
        if derived != row["reference_stable"]:
            parsed.note(
                top.source,
                "$.reference",
                "stable",
                row["reference_stable"],
                derived,
                "self_divergence_at >= declared_min",
            )
    _keep_unused(ref, "reference", extras)
    return row


def _parse_witness(data: Any, source: str) -> _Parsed:
    parsed = _Parsed()
    top = Fields(data, source=source, record="$")
    version = top.int("witness_version", required=True)
    if version not in (1, 2, 3):
        raise WitnessError(source, "$", "witness_version", f"expected 1, 2 or 3, got {version}")
    extras: dict[str, Any] = {}
    row: dict[str, Any] = {"source": source, "witness_version": version, "probe": top.str("probe")}
    for name in ("host", "commit", "binary_sha256", "prompt_sha256"):
        row[name] = top.str(name)
    row.update(_parse_model(top, extras))
    row.update(_parse_sampler(top, version, extras))
    row["declared_min"] = top.int("declared_min")
    row.update(_parse_env(top))
    notes = top.list("notes")
    if notes is not None and not all(isinstance(n, str) for n in notes):
        raise WitnessError(source, "$", "notes", "expected a list of strings")
    row["notes"] = notes
    row.update(_parse_reference(top, row["declared_min"], parsed, extras))
    if row["probe"] is not None and row["probe"] not in EXPECTED_PROBE[version]:
        expected = " or ".join(EXPECTED_PROBE[version])
        parsed.note(source, "$", "probe", row["probe"], expected, f"witness_version {version} is written by {expected}")
    raw_bands = top.list("bands", required=True)
    bands = []
    for index, raw in enumerate(raw_bands):
        band = _parse_band(
            Fields(raw, source=source, record=f"$.bands[{index}]"), version=version, index=index, parsed=parsed
        )
        bands.append(band)
    row.update(_run_verdict(top, version, row, bands, parsed))
    row["n_bands"] = len(bands)
    extras.update(top.unused())
    row["extra"] = json.dumps(extras, sort_keys=True) if extras else None
    shared = {"source": source, "witness_version": version, "host": row["host"], "commit": row["commit"]}
    parsed.bands.extend({**shared, **band} for band in bands)
    for slot in parsed.slots:
        slot["source"] = source
    parsed.witnesses.append(row)
    return parsed


def _keep_unused(fields: Fields, name: str, extras: dict[str, Any]) -> None:
    """Keep a nested object's unknown fields under its name, so nothing read is dropped."""
    if fields.unused():
        extras[name] = fields.unused()


def _parse_model(top: Fields, extras: dict[str, Any]) -> dict[str, Any]:
    model = top.child("model", "$.model")
    if model is None:
        return {"model_path": None, "model_dir": None, "model_sha256": None}
    row = {"model_path": model.str("path"), "model_dir": model.str("dir"), "model_sha256": model.str("sha256")}
    _keep_unused(model, "model", extras)
    return row


def _parse_sampler(top: Fields, version: int, extras: dict[str, Any]) -> dict[str, Any]:
    sampler = top.child("sampler", "$.sampler")
    if sampler is None:
        return {"temperature": None, "seed": None, "ignore_eos": None, "max_tokens": None, "top_logprobs": None}
    tokens_key = "max_tokens" if version == 3 else "n_predict"
    row = {
        "temperature": sampler.number("temperature"),
        "seed": sampler.int("seed"),
        "ignore_eos": sampler.bool("ignore_eos"),
        "max_tokens": sampler.int(tokens_key),
        "top_logprobs": sampler.int("top_logprobs"),
    }
    _keep_unused(sampler, "sampler", extras)
    return row


def _parse_env(top: Fields) -> dict[str, Any]:
    env = top.child("env", "$.env")
    row: dict[str, str | None] = {f"env_{key}": None for key in ENV_KEYS}
    if env is None:
        return row
    for key in sorted({*ENV_KEYS, *env.obj}):
        row[f"env_{key}"] = env.str(key)
    return row


def _run_verdict(top: Fields, version: int, row, bands, parsed: _Parsed) -> dict[str, Any]:
    if version == 3:
        recorded_exit, recorded = None, top.str("result")
    else:
        recorded_exit = top.int("exit")
        recorded = None if recorded_exit is None else EXIT_TO_VERDICT.get(recorded_exit, f"exit {recorded_exit}")
    derived = derive_run_verdict(row["reference_stable"], [(b["c"], b["result"]) for b in bands])
    agrees = None if recorded is None else recorded == derived
    if agrees is False:
        field_name = "result" if version == 3 else "exit"
        parsed.note(
            top.source, "$", field_name, recorded, derived, "run verdict from the recorded band results and reference"
        )
    return {
        "recorded_exit": recorded_exit,
        "recorded_verdict": recorded,
        "derived_verdict": derived,
        "verdict_agrees": agrees,
    }


def _parse_marker(data: Any, source: str) -> _Parsed:
    parsed = _Parsed()
    top = Fields(data, source=source, record="$")
    started = top.str("started_utc")
    try:
        started_at = datetime.fromisoformat(started) if started is not None else None
    except ValueError:
        raise WitnessError(source, "$", "started_utc", f"expected an ISO 8601 time, got {started!r}") from None
    row: dict[str, Any] = {
        "source": source,
        "cc": top.str("cc"),
        "commit": top.str("commit"),
        "exit": top.int("exit"),
        "host": top.str("host"),
        "max_m": top.int("max_m"),
        "sha256": top.str("sha256"),
        "started_utc": started_at,
        "status": top.str("status"),
    }
    expected = EXIT_TO_VERDICT.get(row["exit"])
    row["status_agrees"] = None if expected is None or row["status"] is None else expected == row["status"]
    if row["status_agrees"] is False:
        parsed.note(source, "$", "status", row["status"], expected, "exit 0 PASS, 1 FAIL, 2 UNMEASURABLE")
    row["extra"] = _extra(top)
    parsed.markers.append(row)
    return parsed


def parse_document(raw: bytes, source: str) -> _Parsed:
    """Parse one witness or marker document from its bytes.

    Parameters
    ----------
    raw : bytes
        The document's bytes, UTF-8 strict JSON: a witness (with ``witness_version`` 1, 2 or 3) or a release
        marker (``cc``, ``max_m``, ``status``, ``started_utc``).
    source : str
        Its file or URL, for the rows and the errors.

    Returns
    -------
    _Parsed
        The rows of its witness, bands, slots, markers and discrepancies.

    Raises
    ------
    WitnessError
        The document is neither, or a field of it is malformed.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WitnessError(source, "$", None, f"not UTF-8 text ({exc})") from None
    if not text.strip():
        raise WitnessError(source, "$", None, "empty file")
    try:
        data = loads_strict(text)
    except NestingError as exc:
        raise WitnessError(source, "$", None, str(exc)) from None
    except StrictJsonError as exc:
        raise WitnessError(source, "$", None, not_json(exc)) from None
    if isinstance(data, dict) and "witness_version" in data:
        return _parse_witness(data, source)
    if isinstance(data, dict) and data.keys() >= MARKER_KEYS:
        return _parse_marker(data, source)
    raise WitnessError(
        source,
        "$",
        None,
        "neither a witness (no witness_version) nor a release marker (needs cc, max_m, status, started_utc)",
    )
