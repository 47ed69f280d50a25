"""aprender's V3 serving-shape check (``apr test llm shape-check``), restated exactly.

The rules, their order and their texts are aprender's own (its ``apr test llm shape-check``,
github.com/paiml/aprender). The
constants live in :class:`V3Policy` so a team can run the same rules with its own model or
bands; ``V3Policy()`` is aprender's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from ..core import NestingError, StrictJsonError, first_duplicate, loads_strict, not_json
from ..core import render
from ..core import format_number, format_percent_1, rust_debug_str, rust_is_blank

Status = Literal["ADMISSIBLE", "NOT ADMISSIBLE", "RED"]

EXIT_ADMISSIBLE = 0
EXIT_MISSING = 3
EXIT_RED = 4
EXIT_NOT_ADMISSIBLE = 5

_U32_MAX = 2**32 - 1
_IDENTITY_FIELDS = ("binary_sha256", "commit", "host", "prompt_sha256")
_WITNESS_FIELDS = frozenset({"model", "bands", *_IDENTITY_FIELDS})
_MODEL_FIELDS = frozenset({"path", "sha256"})
_BAND_FIELDS = frozenset(
    {"c", "result", "m_formed", "divergence_at", "declared_min", "top2_margin_at_divergence", "decode_tok_s"}
)


class PolicyError(ValueError):
    """A policy file or override that cannot define a V3 policy."""


@dataclass(frozen=True)
class V3Policy:
    """The constants of the V3 check. The defaults are aprender's and reproduce it exactly.

    Parameters
    ----------
    model_prefix : str
        S1: the model file name must start with this, compared without ASCII case.
    model_label : str
        The model's name in the S1 reason text.
    bands : tuple of int
        S2: the batch sizes a witness must hold, each exactly once.
    near_tie_epsilon : float
        S5: a margin explains a divergence iff ``0 <= margin < near_tie_epsilon``.
    near_tie_cap : int
        At most this many batched bands (c > 1) may be admitted through the near-tie clause.
    declared_min_floor : int
        A band's ``declared_min`` below this is a reason.
    s7_ratio : float
        S7: decode rate at ``s7_batched_c`` must be at least this fraction of ``s7_base_c``'s.
    s7_base_c, s7_batched_c : int
        The two bands S7 compares.

    Examples
    --------
    >>> V3Policy().bands
    (1, 4, 8, 16)
    >>> V3Policy(model_prefix="llama-3.1-8b").model_label
    'llama-3.1-8b'
    """

    model_prefix: str = "qwen3.5-4b"
    model_label: str = ""
    bands: tuple[int, ...] = (1, 4, 8, 16)
    near_tie_epsilon: float = 0.05
    near_tie_cap: int = 1
    declared_min_floor: int = 64
    s7_ratio: float = 0.5
    s7_base_c: int = 1
    s7_batched_c: int = 4

    def __post_init__(self) -> None:
        for name in ("model_prefix", "model_label"):
            if not isinstance(getattr(self, name), str):
                raise PolicyError(f"{name} must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.bands, (list, tuple)):
            raise PolicyError(f"bands must be a list of batch sizes, got {self.bands!r}")
        if not self.model_label:
            label = "Qwen3.5-4B" if self.model_prefix == "qwen3.5-4b" else self.model_prefix
            object.__setattr__(self, "model_label", label)
        object.__setattr__(self, "bands", tuple(self.bands))
        for c in self.bands:
            _require_int("bands", c)
        if not self.bands or len(set(self.bands)) != len(self.bands):
            raise PolicyError(f"bands must be distinct batch sizes, got {self.bands!r}")
        for name in ("near_tie_cap", "declared_min_floor", "s7_base_c", "s7_batched_c"):
            _require_int(name, getattr(self, name))
        for name in ("near_tie_epsilon", "s7_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise PolicyError(f"{name} must be a finite number >= 0, got {value!r}")
            object.__setattr__(self, name, float(value))

    @property
    def batched_bands(self) -> tuple[int, ...]:
        """The policy's bands with c > 1, which the near-tie cap counts."""
        return tuple(c for c in self.bands if c > 1)

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> V3Policy:
        """Read a policy from a TOML or JSON file whose keys are this class's fields.

        Parameters
        ----------
        path : str or Path
            The file: ``.toml`` is read as TOML, anything else as strict JSON.
        **overrides : Any
            Fields that replace the file's; one given as None leaves the file's value.

        Returns
        -------
        V3Policy

        Raises
        ------
        PolicyError
            The file is not valid TOML or JSON, repeats a key, names an unknown field or gives a field a bad value.

        Examples
        --------
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "policy.toml"
        >>> _ = p.write_text('model_prefix = "llama-3.1-8b"\\nbands = [1, 2, 4]\\n')
        >>> V3Policy.from_file(p).bands
        (1, 2, 4)
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise PolicyError(f"{path}: not a valid policy file: not UTF-8 text (byte {exc.start})") from None
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else loads_strict(text)
        except (tomllib.TOMLDecodeError, NestingError) as exc:
            raise PolicyError(f"{path}: not a valid policy file: {exc}") from None
        except StrictJsonError as exc:  # in the words every JSON reader uses
            raise PolicyError(f"{path}: not a valid policy file: {not_json(exc)}") from None
        except RecursionError:  # tomllib recurses into nested arrays and tables
            raise PolicyError(f"{path}: not a valid policy file: nested too deep") from None
        if not isinstance(data, dict):
            raise PolicyError(f"{path}: a policy file holds one table of fields")
        repeated = first_duplicate(data)
        if repeated is not None:
            raise PolicyError(f"{path}: {repeated} is given more than once")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_mapping(data, source=str(path))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "policy") -> V3Policy:
        """Build a policy from a mapping of field names, refusing unknown keys.

        Parameters
        ----------
        data : Mapping of str to Any
            Field names to values.
        source : str, default "policy"
            Where the fields came from, for the error.

        Returns
        -------
        V3Policy

        Raises
        ------
        PolicyError
            An unknown key, or a value a field refuses.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PolicyError(f"{source}: unknown policy fields {unknown}; known: {sorted(known)}")
        try:
            return cls(**dict(data))
        except PolicyError as exc:
            raise PolicyError(f"{source}: {exc}") from None


def _require_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PolicyError(f"{name} must hold non-negative integers, got {value!r}")


@dataclass(frozen=True)
class ShapeVerdict:
    """The V3 check's answer for one witness.

    Prints as the lines ``apr test llm shape-check`` writes, renders as HTML in Jupyter, and
    converts to a frame of reasons.

    Attributes
    ----------
    status : {"ADMISSIBLE", "NOT ADMISSIBLE", "RED"}
    reasons : tuple of str
        Every failed rule in aprender's order and wording; for RED, the one RED text.
    source : str or None
        Where the witness came from, as given.
    """

    status: Status
    reasons: tuple[str, ...] = ()
    source: str | None = None
    policy: V3Policy = field(default_factory=V3Policy, repr=False)

    @property
    def admissible(self) -> bool:
        """True when every rule holds."""
        return self.status == "ADMISSIBLE"

    @property
    def exit_code(self) -> int:
        """The CLI's exit code: 0 admissible, 5 not admissible, 4 unreadable (RED)."""
        return {"ADMISSIBLE": EXIT_ADMISSIBLE, "NOT ADMISSIBLE": EXIT_NOT_ADMISSIBLE}.get(
            self.status, EXIT_RED
        )

    def stdout_lines(self) -> list[str]:
        """What the CLI prints on stdout: the verdict line and one line per reason (none for RED)."""
        if self.status == "RED":
            return []
        return [f"V3 shape check {self.source}: {self.status}", *(f"  - {r}" for r in self.reasons)]

    def __str__(self) -> str:
        if self.status == "RED":
            return self.reasons[0]
        return "\n".join(self.stdout_lines())

    def _repr_html_(self) -> str:
        return render("verdict.html.j2", verdict=self)

    def to_frame(self, backend: str = "polars") -> Any:
        """One row per reason: source, status, rule order and text.

        Parameters
        ----------
        backend : {"polars", "pandas"}, default "polars"
            The frame's library.

        Returns
        -------
        polars.DataFrame or pandas.DataFrame
            ``source``, ``status``, ``order`` (0 first) and ``reason``; no row for an admissible witness.
        """
        from ..core import to_backend

        import polars as pl

        frame = pl.DataFrame(
            {
                "source": [self.source] * len(self.reasons),
                "status": [self.status] * len(self.reasons),
                "order": list(range(len(self.reasons))),
                "reason": list(self.reasons),
            },
            schema={"source": pl.String, "status": pl.String, "order": pl.Int64, "reason": pl.String},
        )
        return to_backend(frame, backend)


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
        raise _Unreadable(f"{where}.{key}: invalid value: {_describe(value)}, expected a non-negative integer of at most {_U32_MAX} (u32)")
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
        raise _Unreadable(f"{where}.{key}: invalid value: {_describe(value)}, expected a number within an f64's range") from None


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
            out.append(f"c={c}: declared_min {band.declared_min} is below the floor of {floor} (witness.min_agree_tokens)")
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
            return [f"S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at {' and '.join(missing)}"]
        if d4 >= self.p.s7_ratio * d1:
            return []
        return [
            f"S7 (FALSIFY-CB-004): per-request decode at c={batched_c} is {format_number(d4)} tok/s, "
            f"{format_percent_1(100.0 * d4 / d1)}% of c={base_c}'s {format_number(d1)} tok/s; "
            f"needs at least {format_number(100.0 * self.p.s7_ratio)}%"
        ]


def shape_check_data(data: Any, *, source: str | None = None, policy: V3Policy | None = None) -> ShapeVerdict:
    """Run the V3 check on an already parsed witness (a dict from JSON).

    Parameters
    ----------
    data : Any
        The parsed witness; anything but a witness object gives a RED verdict, never an error.
    source : str, optional
        Where it came from, kept on the verdict.
    policy : V3Policy, optional
        The constants; aprender's by default.

    Returns
    -------
    ShapeVerdict

    Examples
    --------
    >>> shape_check_data({}).status
    'RED'
    """
    policy = policy or V3Policy()
    try:
        witness = _parse(data)
    except _Unreadable as exc:
        return ShapeVerdict("RED", (f"RED: unreadable witness: {exc}",), source, policy)
    if not witness.bands:
        return ShapeVerdict("RED", ("RED: the witness measured no bands",), source, policy)
    rules = _Rules(policy)
    reasons = [*rules.model(witness), *rules.identity(witness), *rules.bands(witness.bands)]
    return ShapeVerdict("NOT ADMISSIBLE" if reasons else "ADMISSIBLE", tuple(reasons), source, policy)


def shape_check_text(text: str, *, source: str | None = None, policy: V3Policy | None = None) -> ShapeVerdict:
    """Run the V3 check on witness JSON text.

    Parameters
    ----------
    text : str
        The witness JSON; empty, malformed or strict-JSON-refused text gives a RED verdict, never an error.
    source : str, optional
        Where it came from, kept on the verdict.
    policy : V3Policy, optional
        The constants; aprender's by default.

    Returns
    -------
    ShapeVerdict

    Examples
    --------
    >>> shape_check_text("  ").reasons
    ('RED: empty witness',)
    >>> shape_check_text("{}").reasons
    ('RED: the witness measured no bands',)
    """
    policy = policy or V3Policy()
    if rust_is_blank(text):
        return ShapeVerdict("RED", ("RED: empty witness",), source, policy)
    try:
        data = loads_strict(text)
    except StrictJsonError as exc:
        return ShapeVerdict("RED", (f"RED: unreadable witness: {exc}",), source, policy)
    return shape_check_data(data, source=source, policy=policy)


def shape_check(source: str | Path, *, policy: V3Policy | None = None) -> ShapeVerdict:
    """Run aprender's V3 serving-shape check on a witness file or http(s) URL.

    Parameters
    ----------
    source : str or Path
        A witness file, or an http(s) URL (fetched through the local cache).
    policy : V3Policy, optional
        The constants; aprender's by default.

    Returns
    -------
    ShapeVerdict

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        The path is missing or a directory (the CLI exits 3).

    Examples
    --------
    >>> v = shape_check("data/aprender-lambda/witness@464c168e62.json")
    >>> v.status, v.exit_code, len(v.reasons)
    ('NOT ADMISSIBLE', 5, 5)
    >>> print(v.reasons[0])
    model "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" is not the blessed Qwen3.5-4B
    """
    from ..io import read_source_bytes

    label = str(source)
    raw = read_source_bytes(source)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ShapeVerdict("RED", (f"RED: cannot read witness {label}: {exc}",), label, policy or V3Policy())
    return shape_check_text(text, source=label, policy=policy)
