"""Reading perf041 witnesses (versions 1, 2, 3) and release markers into tidy frames: :class:`WitnessSet`.

Each source is parsed into rows (``_parse``), which re-derives every recorded result by the file's own
version's rules; the frames (``_schema``) are built once, at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import polars as pl

from ..core import as_polars, build, check_backend, to_backend
from ..core import progress as show_progress
from ..io import expand_sources, read_source_bytes
from ._parse import _Parsed, parse_document
from ._schema import BAND_SCHEMA, DISCREPANCY_SCHEMA, MARKER_SCHEMA, SLOT_SCHEMA, WITNESS_SCHEMA


@dataclass(frozen=True)
class WitnessSet:
    """Witnesses and markers read into tidy frames.

    Attributes
    ----------
    witnesses : frame
        One row per witness: identity, sampler, env knobs, reference, recorded and derived verdict.
    bands : frame
        One row per band, with the recorded and the re-derived result.
    slots : frame
        One row per slot (request) of a band.
    markers : frame
        One row per release marker.
    discrepancies : frame
        Every recorded value that disagrees with what the file's own rules derive.
    texts : dict
        The raw text of every source, for checks (such as V3) that read the file itself.
    """

    witnesses: Any
    bands: Any
    slots: Any
    markers: Any
    discrepancies: Any
    texts: dict[str, str]
    backend: str = "polars"

    def __repr__(self) -> str:  # "1 witness, 4 bands", as people count
        counts = ", ".join(
            f"{n} {name if n != 1 else _ONE[name]}" for name in _FRAME_NAMES for n in [len(getattr(self, name))]
        )
        return f"WitnessSet({counts}; backend={self.backend!r})"

    @property
    def sources(self) -> list[str]:
        """Every source read, in order."""
        return list(self.texts)

    def shape_checks(self, policy=None) -> dict[str, Any]:
        """The V3 verdict of every witness source (markers are not witnesses), by source.

        Parameters
        ----------
        policy : V3Policy, optional
            The constants; aprender's by default.

        Returns
        -------
        dict of str to ShapeVerdict
        """
        from ..verdicts import shape_check_text

        witness_sources = _column(self.witnesses, "source")
        return {s: shape_check_text(self.texts[s], source=s, policy=policy) for s in witness_sources}

    def each_witness(self):
        """Each witness file in the order read: its ``witnesses`` row (a dict) with its own slots and bands (polars frames).

        Examples
        --------
        >>> ws = read_witnesses("data/aprender-lambda/witness@464c168e62.json", progress=False)
        >>> [(w["witness_version"], slots.height, bands.height) for w, slots, bands in ws.each_witness()]
        [(2, 29, 4)]
        """
        polars_set = self.to_backend("polars")
        for witness in polars_set.witnesses.iter_rows(named=True):
            mine = pl.col("source") == witness["source"]
            yield witness, polars_set.slots.filter(mine), polars_set.bands.filter(mine)

    def to_backend(self, backend: str) -> WitnessSet:
        """The same set with every frame in ``backend`` ("polars" or "pandas").

        Parameters
        ----------
        backend : {"polars", "pandas"}
            The frames' library.

        Returns
        -------
        WitnessSet
        """
        frames = {name: as_polars(getattr(self, name)) for name in _FRAME_NAMES}
        return WitnessSet(**{n: to_backend(f, backend) for n, f in frames.items()}, texts=self.texts, backend=backend)


_FRAME_NAMES = ("witnesses", "bands", "slots", "markers", "discrepancies")
_ONE = {"witnesses": "witness", "bands": "band", "slots": "slot", "markers": "marker", "discrepancies": "discrepancy"}


def _column(frame: Any, name: str) -> list[Any]:
    return list(frame[name].to_list() if isinstance(frame, pl.DataFrame) else frame[name].tolist())


def read_witnesses(
    sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    backend: str = "polars",
    progress: bool | None = None,
    timeout: float | None = None,
    max_bytes: int | None = None,
) -> WitnessSet:
    """Read witnesses and release markers from files, folders, glob patterns or http(s) URLs.

    Parameters
    ----------
    sources : path, URL, or an iterable of them
        A folder contributes every ``*.json`` file under it.
    backend : {"polars", "pandas"}
        The type of the frames returned.
    progress : bool, optional
        Show a progress bar; by default only in a terminal and for more than one source.
    timeout, max_bytes : optional
        Limits for URL downloads (see :func:`analysis.fetch_url`).

    Returns
    -------
    WitnessSet

    Raises
    ------
    WitnessError
        A document that is not a well-formed witness or marker; the message names the file,
        the record and the field.

    Examples
    --------
    >>> ws = read_witnesses("data/aprender-lambda")
    >>> ws
    WitnessSet(3 witnesses, 12 bands, 87 slots, 2 markers, 0 discrepancies; backend='polars')
    >>> ws.witnesses.select("witness_version", "recorded_verdict").rows()
    [(1, 'FAIL'), (1, 'FAIL'), (2, 'PASS')]
    >>> ws.bands.filter(c=4)["result"].to_list()
    ['FAIL', 'FAIL', 'PASS']
    """
    check_backend(backend)
    fetch = {k: v for k, v in {"timeout": timeout, "max_bytes": max_bytes}.items() if v is not None}
    parsed, texts = _Parsed(), {}
    for source in show_progress(expand_sources(sources), progress, "reading witnesses"):
        raw = read_source_bytes(source, **fetch) if fetch else read_source_bytes(source)
        parsed.extend(parse_document(raw, source))
        texts[source] = raw.decode("utf-8")
    frames = {
        "witnesses": build(parsed.witnesses, WITNESS_SCHEMA),
        "bands": build(parsed.bands, BAND_SCHEMA),
        "slots": build(parsed.slots, SLOT_SCHEMA),
        "markers": build(parsed.markers, MARKER_SCHEMA),
        "discrepancies": build(parsed.discrepancies, DISCREPANCY_SCHEMA),
    }
    return WitnessSet(**{n: to_backend(f, backend) for n, f in frames.items()}, texts=texts, backend=backend)


def read_witness(source: str | os.PathLike[str], **options: Any) -> WitnessSet:
    """Read one source (a file, folder or URL); see :func:`read_witnesses` for the options.

    Parameters
    ----------
    source : str or os.PathLike
        A witness or marker file, a folder of them, a glob pattern or an http(s) URL.
    **options : Any
        The keyword arguments of ``read_witnesses``: ``backend``, ``progress``, ``timeout``, ``max_bytes``.

    Returns
    -------
    WitnessSet

    Examples
    --------
    >>> ws = read_witness("data/aprender-lambda/witness@464c168e62.json", backend="pandas")
    >>> ws.bands[["c", "result", "derived_result"]].values.tolist()
    [[1, 'PASS', 'PASS'], [4, 'PASS', 'PASS'], [8, 'PASS', 'PASS'], [16, 'PASS', 'PASS']]
    """
    return read_witnesses([source], **options)
