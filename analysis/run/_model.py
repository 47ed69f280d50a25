"""The :class:`Run` object: a run's manifest and its captures in the dump schema."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..dumps import REQUEST_SCHEMA, Dump
from ..metrics import parity
from ._arms import REFERENCE_ARM, legacy_arm, with_arm_column
from ._derived import _capture_stamps, _derived_record, _write_derived
from ._kept_dump import KeptDump, request_columns
from ._layout import _DEFAULTS, RunError, plan

# What names one planned request (Run.missing), and how many planned requests are joined at a time.
_PLAN_KEYS = {
    "prompt_id": pl.String,
    "role": pl.String,
    "c": pl.Int64,
    "slot": pl.Int64,
    "repeat": pl.Int64,
    "arm": pl.String,
}
_MISSING_ROWS = 65_536


@dataclass(frozen=True)
class Run:
    """A run's manifest and its captures in the dump schema (requests carry prompt, role, band, slot)."""

    manifest: dict[str, Any]
    dump: Dump
    path: Path | None = None
    # A streamed run's pieces (``read_run(path, stream=True)``): ``dump`` then holds every request and no token, and the
    # tables are computed a piece at a time (analysis.run._piecewise). None for a run held whole.
    pieces: Any = field(default=None, repr=False, compare=False)
    # What the tables derive once per run (numbered steps, streams): a run's frames never change.
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Every request carries the control arm it was fired in (analysis.run._arms): the tables group by it. A kept
        # plan's requests carry it already (analysis.run._pieces.plan_run), and are not read here.
        if isinstance(self.dump, KeptDump):
            return
        requests = with_arm_column(self.dump.requests, self.manifest)
        if requests is not self.dump.requests:
            object.__setattr__(self, "dump", dataclasses.replace(self.dump, requests=requests))

    @property
    def ladder(self) -> list[int]:
        return list(self.manifest.get("ladder", _DEFAULTS["ladder"]))

    @property
    def declared_min(self) -> int:
        return int(self.manifest.get("declared_min", _DEFAULTS["declared_min"]))

    def streams(self) -> dict[tuple, parity.Stream]:
        """Every request's completion stream, keyed by (source, record, choice_index) (built once per run)."""
        if self.pieces is not None:
            return self.collected().streams()
        if "streams" not in self._cache:
            self._cache["streams"] = parity.streams(self.dump.tokens, self.dump.candidates)
        return self._cache["streams"]

    @property
    def requests(self) -> pl.DataFrame:
        """The requests with their decode rates (built once per run; a streamed run's plan carries them, worked out
        before its envelopes were left with its pieces; a plan kept on disk is read from there each time, not held)."""
        if isinstance(self.dump, KeptDump):
            return self.dump.requests
        if "requests" not in self._cache:
            requests = self.dump.requests
            planned = "decode_rate_origin" in requests.columns and "extra" not in requests.columns
            self._cache["requests"] = requests if planned else parity.request_decode_rates(requests)
        return self._cache["requests"]

    def request_columns(self, *names: str, prompts: Sequence[str] | None = None) -> pl.DataFrame:
        """The columns among ``names`` that the run's requests have (the dump's, without decode rates worked out), as a
        polars frame: a streamed run's plan reads no other column from where it is kept.

        Parameters
        ----------
        *names : str
            The columns wanted; one the requests lack is left out.
        prompts : sequence of str, optional
            Only these prompts' requests (a kept plan is read with the filter).

        Returns
        -------
        polars.DataFrame

        Examples
        --------
        >>> from analysis import read_run
        >>> read_run("data/experiment-cpu/default", stream=True).request_columns("prompt_id", "c").columns
        ['prompt_id', 'c']
        """
        return request_columns(self.dump, names, prompts)

    @property
    def tokens(self) -> Any:
        """Every scored position of every request (the dump's ``tokens`` frame; a streamed run's pieces collected)."""
        return self.collected().dump.tokens

    @property
    def candidates(self) -> Any:
        """Every top-k candidate of every position (the dump's ``candidates`` frame; a streamed run's pieces collected)."""
        return self.collected().dump.candidates

    def collected(self) -> Run:
        """The run held whole: itself, or a streamed run's pieces read into one run (the same frames ``read_run`` gives
        without ``stream``), read once."""
        if self.pieces is None:
            return self
        if "collected" not in self._cache:
            self._cache["collected"] = self.pieces.collected(self)
        return self._cache["collected"]

    def restricted(self, prompts: set[str]) -> Run:
        """The run of these prompts' requests with their tokens, held whole (from their pieces when streamed).

        Parameters
        ----------
        prompts : set of str
            The prompt ids.

        Returns
        -------
        Run

        Examples
        --------
        >>> from analysis import read_run
        >>> read_run("data/experiment-cpu/default", stream=True).restricted({"p1"}).requests["prompt_id"].unique().to_list()
        ['p1']
        """
        if self.pieces is not None:
            return self.pieces.restricted(prompts)
        keys = ["source", "record", "choice_index"]
        mine = self.dump.requests.filter(pl.col("prompt_id").is_in(sorted(prompts)))
        tokens, candidates = (
            frame.join(mine.select(keys), on=keys, how="semi", nulls_equal=True)
            for frame in (self.dump.tokens, self.dump.candidates)
        )
        return Run(
            self.manifest,
            dataclasses.replace(self.dump, tokens=tokens, candidates=candidates, requests=mine),
            self.path,
        )

    def prompt_run(self, prompt_id: str) -> Run:
        """The run of one prompt's requests with their tokens: from its piece when the run is streamed.

        Parameters
        ----------
        prompt_id : str
            The prompt.

        Returns
        -------
        Run

        Examples
        --------
        >>> from analysis import read_run
        >>> read_run("data/experiment-cpu/default").prompt_run("p0").requests.height
        31
        """
        return self.restricted({prompt_id})

    def without_pieces(self) -> Run:
        """The run's requests without a token, as a run held whole (what a table of no request is computed from); a
        streamed run's plan without a request has every column a piece's requests have."""
        if self.pieces is not None and not self.dump.requests.height:
            return Run(
                self.manifest, dataclasses.replace(self.dump, requests=pl.DataFrame(schema=REQUEST_SCHEMA)), self.path
            )
        return Run(self.manifest, self.dump, self.path)

    @property
    def label(self) -> str:
        """What reports call the run: its manifest's ``label`` when it has one (``bia report`` names the run it assembles
        from dumps by what it was given, as its scratch folder is gone once the report is written), else its path.

        Examples
        --------
        >>> from analysis import read_run
        >>> read_run("data/experiment-cpu/default").label
        'data/experiment-cpu/default'
        """
        return str(self.manifest.get("label") or self.path or "assembled run")

    @property
    def prompts(self) -> list[str]:
        """The prompt ids the captures hold, sorted."""
        ids = self.request_columns("prompt_id")["prompt_id"]
        # sorted as Python sorts str: by code point, as their UTF-8 bytes sort
        return ids.drop_nulls().unique().sort().to_list()

    def __repr__(self) -> str:
        engine = (
            (self.manifest.get("identity") or {}).get("engine") or self.manifest.get("producer") or "unknown engine"
        )
        state = "complete" if self.manifest.get("complete", True) else "incomplete"
        return (
            f"Run({str(self.path) if self.path else 'assembled'!r}: {engine}, {len(self.prompts)} prompt(s), ladder {self.ladder}, "
            f"{self.request_columns('record').height} requests, {state})"
        )

    def missing(self) -> list[dict[str, Any]]:
        """The requests the run's plan calls for that the captures lack and no refusal explains
        (what an interrupted probe did not finish). ``state`` says whether the request was in
        flight when the probe stopped (its partial bytes are under ``partial/``) or never sent.

        Examples
        --------
        >>> from analysis import read_dumps
        >>> run = Run({"ladder": [1], "prompts": [{"prompt_id": "p"}]}, read_dumps([]))
        >>> [(m["role"], m["state"]) for m in run.missing()]
        [('reference', 'not sent'), ('reference', 'not sent'), ('band', 'not sent')]
        """
        if "missing" not in self._cache:  # the judgement, the card and the detail ask: the plan joined once
            self._cache["missing"] = self._missing()
        return [dict(request) for request in self._cache["missing"]]

    def _missing(self) -> list[dict[str, Any]]:
        """The planned requests the captures lack, a group of the plan's prompts at a time: each group's planned rows
        against its prompts' requests, so that the join holds a group's keys and not the run's (at 516,000 requests
        the whole join was 170 MB)."""
        legacy = legacy_arm(self.manifest)
        refused = pl.DataFrame(
            [
                (
                    r.get("prompt_id"),
                    r.get("role"),
                    r.get("c"),
                    r.get("slot"),
                    r.get("repeat") or 0,
                    r.get("arm", REFERENCE_ARM if r.get("role") == "reference" else legacy),
                )
                for r in self.manifest.get("refused", [])
            ],
            schema=_PLAN_KEYS,
            orient="row",
            strict=False,
        )
        passed = pl.DataFrame(
            [(str(s.get("prompt_id")), s.get("slot")) for s in self.manifest.get("prefill_skipped", [])],
            schema={"prompt_id": pl.String, "slot": pl.Int64},
            orient="row",
            strict=False,
        ).with_columns(role=pl.lit("prefill"))  # positions no request can word
        out = []
        for units in self._planned_groups():
            planned = pl.DataFrame(
                {
                    "prompt_id": [u.prompt_id for u in units],
                    "role": [u.role for u in units],
                    "c": [u.c for u in units],
                    "slot": [list(u.slots) for u in units],
                    "repeat": [u.repeat for u in units],
                    "arm": [u.arm or (REFERENCE_ARM if u.role == "reference" else legacy) for u in units],
                    "unit": range(len(units)),
                },
                schema={**_PLAN_KEYS, "slot": pl.List(pl.Int64), "unit": pl.Int64},
            ).explode("slot")  # one row per planned request, in the plan's order
            have = pl.concat([self._request_keys(planned["prompt_id"].unique().to_list()), refused])
            lacking = planned.join(have, on=list(_PLAN_KEYS), how="anti", nulls_equal=True, maintain_order="left").join(
                passed, on=["prompt_id", "slot", "role"], how="anti", nulls_equal=True, maintain_order="left"
            )
            for row in lacking.iter_rows(named=True):  # the requests the captures lack: few, each a file to look for
                unit = units[row.pop("unit")]
                partial = (
                    self.path is not None and (self.path / "partial" / f"{unit.capture_name(row['slot'])}.sse").exists()
                )
                out.append({**row, "state": "in flight when the probe stopped" if partial else "not sent"})
        return out

    def _planned_groups(self) -> Iterator[list[Any]]:
        """The plan's units (:func:`plan`) in its order, a group of whole prompts of about ``_MISSING_ROWS`` planned
        requests at a time; a prompt whose references disagree (``skipped``) has its references alone, no band by
        design."""
        skipped = {entry.get("prompt_id") for entry in self.manifest.get("skipped", [])}
        group: list[Any] = []
        rows = 0
        for prompt in self.manifest.get("prompts", []):
            units = plan({**self.manifest, "prompts": [prompt]})
            group += [u for u in units if u.role == "reference" or u.prompt_id not in skipped]
            rows += sum(len(u.slots) for u in units)
            if rows >= _MISSING_ROWS:
                yield group
                group, rows = [], 0
        if group:
            yield group

    def _request_keys(self, prompts: list[str]) -> pl.DataFrame:
        """What names each of these prompts' requests in the plan (``_PLAN_KEYS``), as the plan's rows are typed."""
        requests = self.request_columns(*_PLAN_KEYS, prompts=prompts)
        arm = pl.col("arm") if "arm" in requests.columns else pl.lit(None, pl.String)
        return requests.select(
            *[pl.col(k).cast(t) for k, t in _PLAN_KEYS.items() if k not in ("repeat", "arm")],
            repeat=pl.col("repeat").fill_null(0).cast(pl.Int64),  # repeat null: 0
            arm=arm.cast(pl.String),
        )

    def write_derived(self) -> Path:
        """Write the Parquet tables under ``derived/`` with the size and sha256 of every capture file
        they were parsed from, so that :func:`read_run` opens them instead of parsing the captures
        again for as long as the captures are unchanged (needs a run directory)."""
        if self.path is None:
            raise RunError("an assembled run has no directory to write into")
        return _write_derived(self, _capture_stamps(self.path / "captures", _derived_record(self.path / "derived")))
