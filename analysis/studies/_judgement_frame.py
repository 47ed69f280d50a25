"""A judgement as a frame: the verdicts from best to worst, bia's exit code for each, the columns of a judgement row
(:data:`SCHEMA`) and the :class:`Judgement` object that holds the rows every surface renders."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

# worst last: a run's (and a CI job's) verdict is the worst of its arms'
VERDICTS = ("GREEN", "AMBER", "UNVERIFIED", "RED")
# bia's exit codes 2, 3, 4 and 6 say the input was bad (docs/cli.md); 5 is a check that failed, as shape-check's NOT ADMISSIBLE
EXIT_CODES = {"GREEN": 0, "RED": 5, "UNVERIFIED": 7, "AMBER": 8}

_FIRST = pl.Struct(
    {
        "prompt_id": pl.String,
        "c": pl.Int64,
        "repeat": pl.Int64,
        "slot": pl.Int64,
        "role": pl.String,
        "parted": pl.String,
        "position": pl.Int64,
        "max_ulp": pl.Int64,
    }
)
_UNFORMED = pl.List(pl.Struct({"prompt_id": pl.String, "c": pl.Int64, "repeat": pl.Int64, "widest_seen": pl.Int64}))
_COST = pl.List(
    pl.Struct(
        {
            "c": pl.Int64,
            "ratio": pl.Float64,
            "low": pl.Float64,
            "high": pl.Float64,
            "origin": pl.String,
            "base_rates": pl.Int64,
            "rates": pl.Int64,
            "median": pl.Float64,
            "base_median": pl.Float64,
        }
    )
)
#: What a verdict covers (``docs/verdicts.md``): the ladder and the widths measured, distinct prompts and batch contexts,
#: prompt and completion lengths, the sampling, the precision the logprobs were compared at, the arms.
DOMAIN = pl.Struct(
    {
        "ladder": pl.List(pl.Int64),
        "widths": pl.List(pl.Int64),
        "prompts": pl.Int64,
        "contexts": pl.Int64,
        "requests": pl.Int64,
        "prompt_tokens_min": pl.Int64,
        "prompt_tokens_max": pl.Int64,
        "completion_tokens_min": pl.Int64,
        "completion_tokens_max": pl.Int64,
        "sampling": pl.String,
        "precision": pl.String,
        "arms": pl.List(pl.String),
    }
)
SCHEMA: dict[str, PolarsDataType] = {
    "run": pl.String,
    "arm": pl.String,
    "engine": pl.String,
    "verdict": pl.String,
    "cause": pl.String,
    "reason": pl.String,
    "evidence": pl.String,
    "cost": pl.String,
    "first": pl.String,
    "max_ulp": pl.Int64,
    "next_step": pl.String,
    "repro": pl.String,
    "requests": pl.Int64,
    "contexts": pl.Int64,
    "prompts": pl.Int64,
    "divergent": pl.Int64,
    "tokens_parted": pl.Int64,
    "bits_only": pl.Int64,
    "bits_unknown": pl.Int64,
    "no_evidence": pl.Int64,
    "unjudged": pl.Int64,
    "refused": pl.Int64,
    "alone": pl.Int64,
    "alone_parted": pl.Int64,
    "alone_unknown": pl.Int64,
    "bands": pl.Int64,
    "bands_unformed": pl.Int64,
    "missing": pl.Int64,
    "cs_missing": pl.List(pl.Int64),
    "upper_bound": pl.Float64,
    "rule_of_three": pl.Float64,
    "target_rate": pl.Float64,
    "confidence": pl.Float64,
    "requests_needed": pl.Int64,
    "first_request": _FIRST,
    "unformed": _UNFORMED,
    "cost_by_c": _COST,
    "domain": DOMAIN,
}


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
