"""The V3 rules in aprender's order and wording, and the witness they read as aprender's serde reads it.

``_parse`` reads a witness with the types and limits of aprender's witness struct (a field of the wrong
type, a u32 out of range, a repeated known field: unreadable, so RED); ``_Rules`` holds one policy's rules,
each returning its reason texts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from ..core import format_number, format_percent_1, rust_debug_str, rust_is_blank
from ._v3_policy import V3Policy

_U32_MAX = 2**32 - 1
_IDENTITY_FIELDS = ("binary_sha256", "commit", "host", "prompt_sha256")
_WITNESS_FIELDS = frozenset({"model", "bands", *_IDENTITY_FIELDS})
_MODEL_FIELDS = frozenset({"path", "sha256"})
_BAND_FIELDS = frozenset(
    {"c", "result", "m_formed", "divergence_at", "declared_min", "top2_margin_at_divergence", "decode_tok_s"}
)


class _Unreadable(Exception):
    """A witness serde would refuse to deserialize: RED, never NOT ADMISSIBLE."""


@dataclass(frozen=True)
class _Band:
    c: int
    result: str | None
    m_formed: int | None
    divergence_at: int | None
    declared_min: int | None
    margin: float | None
    decode_tok_s: float | None


@dataclass(frozen=True)
class _Witness:
    model_path: str | None
    model_sha256: str | None
    identity: dict[str, str | None]
    bands: list[_Band] | None


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, str):
        return f"string {json.dumps(value)}"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{format_number(value)}`"
    if isinstance(value, list):
        return "a sequence"
    return "a map"


def _object(value: Any, where: str, known: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _Unreadable(f"{where}: invalid type: {_describe(value)}, expected an object")
    duplicated = sorted(known & getattr(value, "duplicates", frozenset()))
    if duplicated:
        raise _Unreadable(f"{where}: duplicate field `{duplicated[0]}`")
    return value


def _u32(obj: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> int | None:
    if key not in obj and required:
        raise _Unreadable(f"{where}: missing field `{key}`")
    value = obj.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Unreadable(f"{where}.{key}: invalid type: {_describe(value)}, expected a non-negative integer")
    if not 0 <= value <= _U32_MAX:  # the field is a u32 in aprender's witness struct
        raise _Unreadable(
            f"{where}.{key}: invalid value: {_describe(value)}, expected a non-negative integer of at most {_U32_MAX} (u32)"
        )
    return value


def _f64(obj: Mapping[str, Any], key: str, where: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Unreadable(f"{where}.{key}: invalid type: {_describe(value)}, expected a number")
    try:
        return float(value)
    except OverflowError:  # an integer beyond a double (from a parsed dict; the strict parser refuses it)
        raise _Unreadable(
            f"{where}.{key}: invalid value: {_describe(value)}, expected a number within an f64's range"
        ) from None


def _str(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _Unreadable(f"{where}.{key}: invalid type: {_describe(value)}, expected a string")


def _parse(data: Any) -> _Witness:
    top = _object(data, "witness", _WITNESS_FIELDS)
    model_path = model_sha = None
    if top.get("model") is not None:
        model = _object(top["model"], "model", _MODEL_FIELDS)
        model_path, model_sha = _str(model, "path", "model"), _str(model, "sha256", "model")
    identity = {name: _str(top, name, "witness") for name in _IDENTITY_FIELDS}
    raw_bands = top.get("bands")
    bands = None
    if raw_bands is not None:
        if not isinstance(raw_bands, list):
            raise _Unreadable(f"bands: invalid type: {_describe(raw_bands)}, expected a sequence")
        bands = [_parse_band(raw, f"bands[{i}]") for i, raw in enumerate(raw_bands)]
    return _Witness(model_path, model_sha, identity, bands)


def _parse_band(raw: Any, where: str) -> _Band:
    band = _object(raw, where, _BAND_FIELDS)
    return _Band(
        c=cast(int, _u32(band, "c", where, required=True)),  # required: never None
        result=_str(band, "result", where),
        m_formed=_u32(band, "m_formed", where),
        divergence_at=_u32(band, "divergence_at", where),
        declared_min=_u32(band, "declared_min", where),
        margin=_f64(band, "top2_margin_at_divergence", where),
        decode_tok_s=_f64(band, "decode_tok_s", where),
    )


def _ascii_lower(text: str) -> str:
    return "".join(ch.lower() if ch.isascii() else ch for ch in text)


class _Rules:
    """The rules of one policy, each returning reason texts in aprender's order."""

    def __init__(self, policy: V3Policy) -> None:
        self.p = policy

    def model(self, w: _Witness) -> list[str]:
        path = w.model_path or ""
        out = []
        if not _ascii_lower(path).startswith(_ascii_lower(self.p.model_prefix)):
            out.append(f"model {rust_debug_str(path)} is not the blessed {self.p.model_label}")
        if w.model_sha256 is None or rust_is_blank(w.model_sha256):
            out.append("model sha256 missing")
        return out

    @staticmethod
    def identity(w: _Witness) -> list[str]:
        return [
            f"identity field {name} missing"
            for name, value in w.identity.items()
            if value is None or rust_is_blank(value)
        ]

    def near_tie(self, margin: float) -> bool:
        return 0.0 <= margin < self.p.near_tie_epsilon

    def bands(self, bands: list[_Band]) -> list[str]:
        by_c: dict[int, list[_Band]] = {}
        for band in bands:
            by_c.setdefault(band.c, []).append(band)
        out = []
        for c in self.p.bands:
            copies = by_c.get(c, [])
            if not copies:
                out.append(f"band c={c} not measured")
            if len(copies) > 1:
                out.append(f"band c={c} recorded {len(copies)} times; a witness has one band per c")
            for band in copies:
                out.extend(self.band(band))
        out.extend(self.cap(by_c))
        out.extend(self.s7(by_c))
        return out

    def band(self, band: _Band) -> list[str]:
        c, floor = band.c, self.p.declared_min_floor
        out = []
        if band.result != "PASS":
            out.append(f"c={c}: perf041 result {band.result if band.result is not None else 'not recorded'}")
        if band.m_formed is None:
            out.append(f"c={c}: m_formed not recorded (shape not shown)")
        elif band.m_formed != c:
            out.append(f"c={c}: m_formed {band.m_formed} != c (shape not served)")
        if band.declared_min is not None and band.declared_min < floor:
            out.append(
                f"c={c}: declared_min {band.declared_min} is below the floor of {floor} (witness.min_agree_tokens)"
            )
        divergence = self.divergence(band)
        if divergence:
            out.append(divergence)
        return out

    def divergence(self, band: _Band) -> str | None:
        c, at, least = band.c, band.divergence_at, band.declared_min
        if least is None:
            return f"c={c}: declared_min not recorded, so agreement with m=1 cannot be checked"
        if at is None:
            if band.result == "PASS":
                return f"c={c}: divergence_at not recorded on a PASS band, so agreement with m=1 is unmeasured"
            return None
        if at >= least:
            return None
        if band.margin is None:
            return f"c={c}: diverges from m=1 at {at} < {least} with no near-tie margin recorded"
        if self.near_tie(band.margin):
            return None
        return (
            f"c={c}: diverges from m=1 at {at} < {least}; the recorded top-2 margin "
            f"{format_number(band.margin)} is not a near-tie "
            f"(needs 0 <= margin < {format_number(self.p.near_tie_epsilon)})"
        )

    def admitted_by_near_tie(self, band: _Band) -> bool:
        if band.declared_min is None or band.divergence_at is None or band.margin is None:
            return False
        return band.divergence_at < band.declared_min and self.near_tie(band.margin)

    def cap(self, by_c: dict[int, list[_Band]]) -> list[str]:
        batched = self.p.batched_bands
        tied = [f"c={b.c}" for c in batched for b in by_c.get(c, []) if self.admitted_by_near_tie(b)]
        if len(tied) <= self.p.near_tie_cap:
            return []
        names = "c=" + ", ".join(str(c) for c in batched)
        return [
            f"near-tie cap: {len(tied)} batched bands ({', '.join(tied)}) are admitted only by a "
            f"near-tie margin; at most {self.p.near_tie_cap} of {names} may be"
        ]

    def s7(self, by_c: dict[int, list[_Band]]) -> list[str]:
        base_c, batched_c = self.p.s7_base_c, self.p.s7_batched_c
        base, batched = by_c.get(base_c, []), by_c.get(batched_c, [])
        if len(base) != 1 or len(batched) != 1:
            return []

        def rate(band: _Band) -> float | None:
            return band.decode_tok_s if band.decode_tok_s is not None and band.decode_tok_s > 0 else None

        d1, d4 = rate(base[0]), rate(batched[0])
        if d1 is None or d4 is None:
            missing = [name for name, r in ((f"c={base_c}", d1), (f"c={batched_c}", d4)) if r is None]
            return [
                f"S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at {' and '.join(missing)}"
            ]
        if d4 >= self.p.s7_ratio * d1:
            return []
        return [
            f"S7 (FALSIFY-CB-004): per-request decode at c={batched_c} is {format_number(d4)} tok/s, "
            f"{format_percent_1(100.0 * d4 / d1)}% of c={base_c}'s {format_number(d1)} tok/s; "
            f"needs at least {format_number(100.0 * self.p.s7_ratio)}%"
        ]
