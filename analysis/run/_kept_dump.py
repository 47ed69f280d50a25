"""A streamed run's plan left on disk: its requests are read from the plan's Parquet file each time they are asked for,
and a reader that needs a few columns (:meth:`KeptDump.request_columns`) reads those alone, so that an open run holds no
row of its plan (at 516,000 requests the plan is 129 MB held, 10 MB kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from ..dumps import CANDIDATE_SCHEMA, TOKEN_SCHEMA, Dump, DumpError
from ._layout import RunError
from ._piecewise import _Kept


class KeptDump(Dump):
    """A dump without a token whose requests are kept in a Parquet file (a streamed run's plan).

    ``requests`` reads the file whole each time (nothing is held between readers); ``request_columns`` reads some
    columns. Each read names the sources where the captures are now (``captures``), not where they were when the plan
    was written (``old``). Given ``requests`` (as ``dataclasses.replace`` does), it is a dump holding those.
    """

    def __init__(
        self,
        tokens: Any = None,
        candidates: Any = None,
        requests: Any = None,
        formats: dict[str, list[str]] | None = None,
        skipped: list[DumpError] | None = None,
        backend: str = "polars",
        *,
        file: Path | None = None,
        old: str = "",
        captures: str = "",
    ) -> None:
        if requests is None and file is None:
            raise ValueError("KeptDump needs its plan's file or its requests")
        empty = {"tokens": pl.DataFrame(schema=TOKEN_SCHEMA), "candidates": pl.DataFrame(schema=CANDIDATE_SCHEMA)}
        given = {"tokens": tokens, "candidates": candidates}
        for name, value in {**empty, **{k: v for k, v in given.items() if v is not None}}.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "formats", formats or {})
        object.__setattr__(self, "skipped", skipped or [])
        object.__setattr__(self, "backend", backend)
        object.__setattr__(self, "_held", requests)
        object.__setattr__(self, "_file", file)
        object.__setattr__(self, "_where", (old, captures))

    _held: Any  # the requests given, or None: read from the file
    _file: Path | None
    _where: tuple[str, str]  # the captures folder the plan's sources name, and where the captures are now

    @property
    def requests(self) -> pl.DataFrame:
        """Every request, every column the plan keeps: read from its file (not held after)."""
        return self.request_columns(None)

    def request_columns(self, names: Sequence[str] | None, prompts: Sequence[str] | None = None) -> pl.DataFrame:
        """Only the requests' columns among ``names`` that the plan has, in that order (``None``: every column).

        Parameters
        ----------
        names : sequence of str or None
            The columns wanted; one the plan lacks is left out (a caller checks ``columns``).
        prompts : sequence of str, optional
            Only these prompts' requests (read with the filter: the rest are never held).

        Returns
        -------
        polars.DataFrame

        Raises
        ------
        RunError
            The plan's file cannot be read (removed or spoiled since the run was opened).
        """
        if self._held is not None or self._file is None:
            return _chosen(self._held, names, prompts)
        kept = _Kept(self._file, *self._where)  # the file a kept table is read from, its sources where they are now
        try:  # a scan reads only the columns chosen, and of them only these prompts' rows
            return _chosen(kept.scan(None), names, prompts).collect()
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise RunError(
                f"{self._file}: the run's plan cannot be read ({exc}); open the run again to work it out again"
            ) from None


def _chosen(frame, names: Sequence[str] | None, prompts: Sequence[str] | None):
    """The frame's (or scan's) columns among ``names``, of only ``prompts``' rows when given."""
    have = frame.collect_schema().names()
    if prompts is not None:
        frame = frame.filter(pl.col("prompt_id").is_in(list(prompts)))
    return frame if names is None else frame.select(n for n in dict.fromkeys(names) if n in have)


def request_columns(dump: Dump, names: Sequence[str], prompts: Sequence[str] | None = None) -> pl.DataFrame:
    """The columns among ``names`` that a dump's requests have, as a polars frame: a kept plan reads no other column.

    Parameters
    ----------
    dump : Dump
        A dump (its requests polars or pandas) or a :class:`KeptDump`.
    names : sequence of str
        The columns wanted.
    prompts : sequence of str, optional
        Only these prompts' requests.

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> from analysis import read_run
    >>> request_columns(read_run("data/experiment-cpu/default").dump, ["prompt_id", "no such column"]).columns
    ['prompt_id']
    """
    if isinstance(dump, KeptDump):
        return dump.request_columns(names, prompts)
    requests = dump.requests
    if not isinstance(requests, pl.DataFrame):  # pandas: only the columns wanted are converted
        wanted = [*names, *(["prompt_id"] if prompts is not None else [])]
        requests = pl.from_pandas(requests[[name for name in dict.fromkeys(wanted) if name in requests.columns]])
    return _chosen(requests, names, prompts)
