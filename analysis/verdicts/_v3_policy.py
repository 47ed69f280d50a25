"""The constants of aprender's V3 serving-shape check: :class:`V3Policy`, and the error of a policy that cannot be one.

``V3Policy()`` is aprender's; a team can read its own model and bands from a TOML or JSON file
(:meth:`V3Policy.from_file`) and run the same rules with them.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import NestingError, StrictJsonError, first_duplicate, loads_strict, not_json


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
