"""A history's three frames, the series its entries fall in, and the :class:`History` object that holds them.

A :class:`History` is three frames keyed by time, host, engine, model, server commit and settings:

- ``entries``: one row per witness or run, with its verdict (:func:`analysis.judge`'s) and settings;
- ``bands``: one row per entry and batch size c: the earliest divergence from m=1, the share of
  requests bit-identical and token-identical to m=1, unique completions, the median decode rate and
  the c/c=1 decode ratio with its interval;
- ``markers``: aprender's release markers (server commit, when, status, widest batch formed).

A series is one host, engine and model run with one set of the settings that change results:
``series_settings`` (in ``entries`` and ``bands``, derived from ``settings`` when read) names them as
``key=value, ...``: a run's :data:`RESULT_SETTINGS` (kernel mode, dtype, device, layout, prompt cache
and the like), a witness's environment switches. A change of them starts another series, so it is
never taken for a regression.

:meth:`History.regressions` applies :data:`REGRESSION_RULES` (``analysis.verdicts``), rules kept as data.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from ..verdicts import REGRESSION_RULES, SERIES, Rule, regressions

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

ENTRY_SCHEMA: dict[str, PolarsDataType] = {
    "entry": pl.String,
    "kind": pl.String,
    "source": pl.String,
    "time": pl.Datetime("us", "UTC"),
    "time_origin": pl.String,
    "host": pl.String,
    "engine": pl.String,
    "model": pl.String,
    "commit": pl.String,
    "settings": pl.String,
    "verdict": pl.String,
    "appended": pl.Datetime("us", "UTC"),
}
BAND_SCHEMA: dict[str, PolarsDataType] = {
    "entry": pl.String,
    "time": pl.Datetime("us", "UTC"),
    "host": pl.String,
    "engine": pl.String,
    "model": pl.String,
    "commit": pl.String,
    "c": pl.Int64,
    "requests": pl.Int64,
    "earliest_divergence": pl.Int64,
    "bit_identical_share": pl.Float64,
    "token_identical_share": pl.Float64,
    "unique_completions": pl.Int64,
    "decode_tok_s": pl.Float64,
    "decode_ratio": pl.Float64,
    "decode_ratio_low": pl.Float64,
    "decode_ratio_high": pl.Float64,
    "result": pl.String,
}
MARKER_SCHEMA: dict[str, PolarsDataType] = {
    "entry": pl.String,
    "source": pl.String,
    "time": pl.Datetime("us", "UTC"),
    "host": pl.String,
    "commit": pl.String,
    "status": pl.String,
    "max_m": pl.Int64,
    "cc": pl.String,
}


# The settings of a run that change its results (from its manifest's requested and effective settings,
# the effective winning): a run with other values of them is in another series. Settings that do not
# change what is computed (the server log, the log pattern, streaming) or that name a version
# (llama.cpp's build_info, vLLM's version: what a regression is looked for across) are left out.
RESULT_SETTINGS = (
    "kernel_mode",
    "dtype",
    "device",
    "layout",
    "batch_invariant",
    "deterministic_inference",
    "prompt_cache",
    "radix_cache_disabled",
    "attention_backend",
    "tp_size",
)


def series_settings(kind: str | None, settings: str | None) -> str | None:
    """The settings that put an entry in its series, as ``key=value, ...``; None when it has none.

    A run's are its :data:`RESULT_SETTINGS` in that order; a witness's are all its environment
    switches (aprender's ``env``: each changes what the server computes), by name.

    Parameters
    ----------
    kind : str or None
        The entry's kind: ``run`` keeps its result settings only; anything else keeps every setting.
    settings : str or None
        The entry's settings as a JSON object; None, empty or malformed text has none.

    Returns
    -------
    str or None

    Examples
    --------
    >>> series_settings("run", '{"server_log": "serve.log", "layout": "copies", "kernel_mode": "fixed-tiles", "dtype": "float32"}')
    'kernel_mode=fixed-tiles, dtype=float32, layout=copies'
    >>> series_settings("witness", '{"FP8_DECODE": "1", "CUDA_BATCH_WINDOW_MS": "200"}')
    'CUDA_BATCH_WINDOW_MS=200, FP8_DECODE=1'
    >>> series_settings("run", '{"stream": true}') is None
    True
    """
    try:
        values = json.loads(settings) if settings else {}
    except ValueError:
        values = {}
    if not isinstance(values, dict):
        values = {}
    names = RESULT_SETTINGS if kind == "run" else sorted(values)
    shown = [f"{name}={_setting(values[name])}" for name in names if values.get(name) is not None]
    return ", ".join(shown) or None


def _setting(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class History:
    """Entries, bands and markers over time (see the module docstring)."""

    entries: pl.DataFrame
    bands: pl.DataFrame
    markers: pl.DataFrame

    def __repr__(self) -> str:
        series = self.entries.select(SERIES).unique().height
        return f"History({self.entries.height} entries in {series} series, {self.bands.height} bands, {self.markers.height} markers)"

    def regressions(self, rules: Iterable[Rule] = REGRESSION_RULES) -> pl.DataFrame:
        """Each place a rule finds a band that was good and is not: the last good and the first bad
        entry of its series (host, engine, model, series_settings) and c, and the server commits between them.

        Parameters
        ----------
        rules : iterable of Rule, default REGRESSION_RULES
            The rules to apply.

        Returns
        -------
        polars.DataFrame
            One row per regression: the rule, the series and c, the last good and first bad entries and the commits
            between them; empty, with its columns, when none.
        """
        return regressions(self.bands, self.markers, rules)


def _history_of(entries: pl.DataFrame, bands: pl.DataFrame, markers: pl.DataFrame) -> History:
    """A History of these rows, each entry (and each entry's band at c) once, in time order, each entry
    and band with its ``series_settings`` (derived here, so a history folder written before them has them too)."""
    entries = entries.unique("entry", keep="first", maintain_order=True)
    entries = entries.with_columns(
        pl.Series(
            "series_settings",
            [series_settings(kind, settings) for kind, settings in entries.select("kind", "settings").iter_rows()],
            dtype=pl.String,
        )
    )
    bands = bands.unique(["entry", "c"], keep="first", maintain_order=True).join(
        entries.select("entry", "series_settings"), on="entry", how="left", maintain_order="left"
    )
    return History(
        entries.sort("time"),
        bands.sort("time", "c"),
        markers.unique("entry", keep="first", maintain_order=True).sort("time"),
    )
