"""Shrinking a case against the live server while it still parts: each candidate fired as small probe runs (one per try)
and judged by :func:`analysis.judge`, within a budget of requests and seconds, with a journal a resumed shrink replays."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..core import duration
from ..probe import probe
from ..run import read_run, slot_table
from ..studies import judge
from ._case import ALONE_CAUSES, Case, case_settings, cold_template, prompt_pieces


@dataclass
class Outcome:
    """A candidate's tries: how many parted (as its judgement says) of how many were fired, each try's run and row."""

    case: Case
    parted: int = 0
    tried: int = 0
    runs: list[str] = field(default_factory=list)
    firsts: list[dict[str, Any] | None] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        """Parted in every try, and every try was fired: a repro; a part in only some tries is none."""
        return self.tried > 0 and self.parted == self.tried

    @property
    def flaky(self) -> bool:
        return 0 < self.parted < self.tried

    @property
    def position(self) -> int:
        """The latest token where a try first parted: ``max_tokens`` must reach it in every try."""
        return max(int(f["position"]) for f in self.firsts if f and f.get("position") is not None)

    def record(self) -> dict[str, Any]:
        return {
            "case": self.case.key,
            "parted": self.parted,
            "tried": self.tried,
            "runs": self.runs,
            "firsts": self.firsts,
            "rows": self.rows,
        }


class OutOfBudget(Exception):
    """The next try would spend more requests or seconds than the shrink was given."""


class Shrinker:
    """Tries candidates against one server, ``tries`` times each, in run directories under ``folder``; every outcome goes to
    ``journal`` (``shrink.json``), from which a resumed shrink takes the outcomes of candidates it has tried already."""

    def __init__(
        self,
        url: str,
        manifest: Mapping[str, Any],
        folder: Path,
        *,
        tries: int,
        max_requests: int,
        max_time: float,
        timeout: float,
        api_key: str | None,
        say: Callable[[str], Any],
    ) -> None:
        self.url, self.manifest, self.folder = url, manifest, folder
        self.tries, self.max_requests, self.max_time = tries, max_requests, max_time
        self.timeout, self.api_key, self.say = timeout, api_key, say
        self.requests, self.started = 0, time.monotonic()
        self.journal = folder / "shrink.json"
        self.known: dict[str, dict[str, Any]] = {}
        self.tried: list[Outcome] = []
        self.engine_said = False
        if self.journal.is_file():  # a resumed shrink: what was tried before is not fired again
            for entry in json.loads(self.journal.read_text(encoding="utf-8")).get("candidates", []):
                self.known[entry["case"]] = entry

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def attempt(self, case: Case, expect: Callable[[dict[str, Any], Path], dict[str, Any] | None]) -> Outcome:
        """Fire ``case`` up to ``tries`` times, stopping at the first try that does not part; ``expect`` takes a try's
        judgement row and run directory and returns its first parting request of the kind shrunk (batched, or alone), or
        None.

        Parameters
        ----------
        case : Case
            The candidate.
        expect : callable
            :func:`batched_part` or :func:`alone_part`.

        Returns
        -------
        Outcome
        """
        if case.key in self.known:
            entry = self.known[case.key]
            outcome = Outcome(case, entry["parted"], entry["tried"], entry["runs"], entry["firsts"], entry["rows"])
            self._tell(outcome, " (from the journal)")
            self.tried.append(outcome)
            return outcome
        outcome = Outcome(case)
        for _ in range(self.tries):
            # two references and one band; alone on an engine whose cache a request can skip, the cache arm's primer too
            cost = 2 + (case.c if not case.alone_only else 2 if cold_template(self.manifest) else 1)
            if self.requests + cost > self.max_requests or self.seconds > self.max_time:
                if outcome.tried:  # a candidate cut short holds no verdict: not journalled, so a resume tries it whole
                    self.tried.append(outcome)
                raise OutOfBudget(
                    f"{self.requests} requests and {duration(self.seconds)} spent of --max-requests {self.max_requests}"
                    f" and --max-time {duration(self.max_time)}"
                )
            run_dir = (
                self.folder
                / "tries"
                / f"{len(list((self.folder / 'tries').glob('*'))) if (self.folder / 'tries').is_dir() else 0:03d}"
            )
            settings = case_settings(case, self.manifest, timeout=self.timeout, api_key=self.api_key)
            asyncio.run(probe(self.url, run_dir, settings, say=self._engine_line))
            self.requests += _fired(run_dir)
            row = judge(run_dir).to_dicts()[0]
            first = expect(row, run_dir)
            outcome.tried += 1
            outcome.parted += first is not None
            outcome.runs.append(str(run_dir.relative_to(self.folder)))
            outcome.firsts.append(first)
            outcome.rows.append({k: row[k] for k in ("verdict", "cause", "first", "reason")})
            if first is None:
                break
        self._tell(outcome)
        self.tried.append(outcome)
        self.known[case.key] = outcome.record()
        self._save()
        return outcome

    def _engine_line(self, line: str) -> None:
        if not self.engine_said and line.startswith("engine:"):
            self.say(f"repro: {line}")
            self.engine_said = True

    def _tell(self, outcome: Outcome, note: str = "") -> None:
        self.say(
            f"repro: {outcome.case.words}: parted in {outcome.parted} of {outcome.tried} tries{note} "
            f"({self.requests} requests, {duration(self.seconds)})"
        )

    def _save(self) -> None:
        text = json.dumps({"candidates": list(self.known.values())}, indent=1)
        partial = self.journal.with_suffix(".json.partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(self.journal)  # atomic: an interrupted shrink leaves the journal it had


def _fired(run_dir: Path) -> int:
    """The completions a try's run requested: its kept and refused requests, and every band attempt set aside."""
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    kept = (
        sum(1 for _ in (run_dir / "captures" / "requests.jsonl").open())
        if (run_dir / "captures" / "requests.jsonl").is_file()
        else 0
    )
    again = sum(int(e.get("c") or 0) * (len(e.get("attempts") or [1]) - 1) for e in manifest.get("m_formed") or [])
    return kept + len(manifest.get("refused") or []) + again


def batched_part(row: Mapping[str, Any], run_dir: Path | None = None) -> dict[str, Any] | None:
    """A try's first batched request that parts (a part seen alone is no batch repro).

    Parameters
    ----------
    row : mapping
        The try's judgement row.
    run_dir : path, optional
        The try's run (unused: the judgement names the batched request).

    Returns
    -------
    dict or None
    """
    first = row.get("first_request")
    return (
        first
        if row["verdict"] == "RED" and row["cause"] not in ALONE_CAUSES and first and (first["c"] or 0) > 1
        else None
    )


def alone_part(row: Mapping[str, Any], run_dir: Path | None = None) -> dict[str, Any] | None:
    """A try's request sent alone that parts from ref #1: the judgement's rule 1 (the references or a request alone part),
    else, in a try with the cache arm, its request on the warm cache when that parts from ref #1 (sent cold): the
    judgement names no part there, since the cache arm is a control, but that part is the repro.

    Parameters
    ----------
    row : mapping
        The try's judgement row.
    run_dir : path, optional
        The try's run, read for its cache arm.

    Returns
    -------
    dict or None
        A ``first_request`` as the judgement writes it (the cache arm's: ``role`` ``"cache c=1"``).
    """
    first = row.get("first_request")
    if row["verdict"] == "RED" and row["cause"] in ALONE_CAUSES and first:
        return first
    run = read_run(run_dir) if run_dir is not None else None
    if run is None or "cache" not in (run.manifest.get("arms") or []):
        return None
    warm = slot_table(run).filter(pl.col("arm") == "cache").sort("repeat", "slot")
    parts = warm.with_columns(position=pl.min_horizontal("parted_at", "bits_differ_at")).filter(
        pl.col("position").is_not_null()
    )
    if not parts.height:
        return None
    hit = parts.row(0, named=True)
    return {
        "prompt_id": hit["prompt_id"],
        "c": 1,
        "repeat": hit["repeat"],
        "slot": hit["slot"],
        "role": "cache c=1",
        "parted": "tokens" if hit["parted_at"] == hit["position"] else "bits",
        "position": int(hit["position"]),
        "max_ulp": hit["max_ulp"],
    }


def shrink(start: Case, shrinker: Shrinker, ladder: list[int]) -> tuple[Outcome | None, list[str], str | None]:
    """The smallest case that still parts in every try, from ``start``: the smallest c of ``ladder`` (down to 2), the
    batch of copies (no other prompt), the fewest ``max_tokens`` reaching the parting token, the shortest prompt prefix
    (ddmin-style: drop the last half of its words, then quarters, ... while it parts), and ``max_tokens`` once more.
    A part seen alone shrinks alone (the same request twice): its length and prompt only.

    Parameters
    ----------
    start : Case
        The run's own case.
    shrinker : Shrinker
        The server, budget and journal the candidates are tried with.
    ladder : list of int
        The run's batch sizes: the c tried, from 2 up to the start's.

    Returns
    -------
    best : Outcome or None
        The smallest case that parted in every try; None when no case did.
    steps : list of str
        What each step tried and kept, in words.
    stopped : str or None
        Why shrinking stopped before its end (the budget), else None.
    """
    expect = alone_part if start.alone_only else batched_part
    steps: list[str] = []
    best: Outcome | None = None
    try:
        if start.alone_only:
            outcome = shrinker.attempt(start, expect)
            best = outcome if outcome.holds else None
            steps.append(f"alone, twice: parted in {outcome.parted} of {outcome.tried} tries")
        else:
            sizes = sorted({2, *(c for c in ladder if 2 < c <= start.c)})
            for c in sizes:  # the smallest c first: the first that holds is kept
                outcome = shrinker.attempt(start.replace(c=c), expect)
                steps.append(f"c={c}: parted in {outcome.parted} of {outcome.tried} tries")
                if outcome.holds:
                    best = outcome
                    break
            if best is not None and best.case.layout != "copies":
                outcome = shrinker.attempt(best.case.replace(layout="copies"), expect)
                steps.append(
                    f"copies of the prompt instead of the run's {best.case.layout} companions: parted in "
                    f"{outcome.parted} of {outcome.tried} tries"
                )
                best = outcome if outcome.holds else best
        if best is None:
            return None, steps, None
        best = _fewest_tokens(best, shrinker, expect, steps)
        best = _shortest_prefix(best, shrinker, expect, steps)
        best = _fewest_tokens(best, shrinker, expect, steps)
    except OutOfBudget as exc:
        steps.append(f"stopped: {exc}")
        return best, steps, str(exc)
    return best, steps, None


def _fewest_tokens(best: Outcome, shrinker: Shrinker, expect, steps: list[str]) -> Outcome:
    """The fewest ``max_tokens`` that still part: the parting token's own count first, then bisection up to the known."""
    low, high = best.position + 1, best.case.max_tokens
    middle = low  # the parting token's own count: usually enough, since the rows step together up to it
    while low < high:
        outcome = shrinker.attempt(best.case.replace(max_tokens=middle), expect)
        steps.append(f"max_tokens={middle}: parted in {outcome.parted} of {outcome.tried} tries")
        if outcome.holds:
            best, high = outcome, middle
        else:
            low = middle + 1
        middle = (low + high) // 2
    return best


def _shortest_prefix(best: Outcome, shrinker: Shrinker, expect, steps: list[str]) -> Outcome:
    """The shortest prefix of the prompt's words that still parts: the last ``chunk`` words dropped while that parts, the
    chunk halved when it does not (ddmin's granularity, over prefixes)."""
    pieces = prompt_pieces(best.case.prompt)
    chunk = len(pieces) // 2
    while chunk >= 1 and len(pieces) > 1:
        kept = pieces[: max(1, len(pieces) - chunk)]
        outcome = shrinker.attempt(best.case.replace(prompt="".join(kept).rstrip()), expect)
        steps.append(f"prompt of {len(kept)} words: parted in {outcome.parted} of {outcome.tried} tries")
        if outcome.holds:
            best, pieces = outcome, kept
            chunk = min(chunk, len(pieces) // 2)
        else:
            chunk //= 2
    return best
