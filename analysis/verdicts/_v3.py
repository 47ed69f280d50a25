"""aprender's V3 serving-shape check (``apr test llm shape-check``), restated exactly: its answer and its entry points.

The rules, their order and their texts are aprender's own (its ``apr test llm shape-check``,
github.com/paiml/aprender); they live in ``_v3_rules``. The constants live in :class:`V3Policy`
(``_v3_policy``) so a team can run the same rules with its own model or bands; ``V3Policy()`` is
aprender's. This module holds the answer (:class:`ShapeVerdict`, with the CLI's exit codes) and the
check of a file or URL, of JSON text and of a parsed document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..core import StrictJsonError, loads_strict, rust_is_blank
from ._v3_policy import PolicyError, V3Policy
from ._v3_rules import _parse, _Rules, _Unreadable

__all__ = [
    "EXIT_ADMISSIBLE",
    "EXIT_MISSING",
    "EXIT_NOT_ADMISSIBLE",
    "EXIT_RED",
    "PolicyError",
    "ShapeVerdict",
    "Status",
    "V3Policy",
    "shape_check",
    "shape_check_data",
    "shape_check_text",
]

Status = Literal["ADMISSIBLE", "NOT ADMISSIBLE", "RED"]

EXIT_ADMISSIBLE = 0
EXIT_MISSING = 3
EXIT_RED = 4
EXIT_NOT_ADMISSIBLE = 5


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
        return {"ADMISSIBLE": EXIT_ADMISSIBLE, "NOT ADMISSIBLE": EXIT_NOT_ADMISSIBLE}.get(self.status, EXIT_RED)

    def stdout_lines(self) -> list[str]:
        """What the CLI prints on stdout: the verdict line and one line per reason (none for RED)."""
        if self.status == "RED":
            return []
        return [f"V3 shape check {self.source}: {self.status}", *(f"  - {r}" for r in self.reasons)]

    def __str__(self) -> str:
        if self.status == "RED":
            return self.reasons[0]
        return "\n".join(self.stdout_lines())

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
        import polars as pl

        from ..core import to_backend

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
