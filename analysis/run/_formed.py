"""A streamed run's ``m_formed`` entries held compactly: one entry per band of the run (its widths, gauge samples and
cache counters), each kept as its pickled bytes and read back as a new dict when asked for, so that an open run does not
hold them as Python objects (at 516,000 requests, 28,000 entries were 70 MB of dicts and lists, 14 MB as bytes).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload


class FormedEntries(Sequence):
    """A manifest's ``m_formed`` list, each entry kept as bytes and given back as a new dict (a reader may change it
    without changing the run's). It compares equal to the list it holds; ``json.dumps`` takes it with
    ``default=jsonable``.

    Examples
    --------
    >>> entries = FormedEntries([{"c": 4, "widths": [4, 3]}])
    >>> len(entries), entries[0], entries == [{"c": 4, "widths": [4, 3]}]
    (1, {'c': 4, 'widths': [4, 3]}, True)
    """

    __slots__ = ("_blobs",)

    def __init__(self, entries: Iterable[Any]) -> None:
        self._blobs = [pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL) for entry in entries]

    def __len__(self) -> int:
        return len(self._blobs)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [pickle.loads(blob) for blob in self._blobs[index]]  # bytes this object pickled
        return pickle.loads(self._blobs[index])  # bytes this object pickled

    def __iter__(self) -> Iterator[Any]:
        for blob in self._blobs:
            yield pickle.loads(blob)  # bytes this object pickled

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FormedEntries):
            return self._blobs == other._blobs or list(self) == list(other)
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __repr__(self) -> str:
        return repr(list(self))


def compact_formed(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with its ``m_formed`` list held as :class:`FormedEntries` (what a streamed run holds).

    Parameters
    ----------
    manifest : dict
        A run manifest, checked (``load_manifest``).

    Returns
    -------
    dict
        A new dict; the given one is left as it is.

    Examples
    --------
    >>> type(compact_formed({"m_formed": [{"c": 1}]})["m_formed"]).__name__
    'FormedEntries'
    """
    formed = manifest.get("m_formed")
    if not isinstance(formed, list):
        return manifest
    return {**manifest, "m_formed": FormedEntries(formed)}


def jsonable(value: Any) -> Any:
    """``json.dumps``' ``default`` for a manifest that may hold :class:`FormedEntries`: the list it holds.

    Parameters
    ----------
    value : object
        What ``json`` cannot write by itself.

    Returns
    -------
    list
        The entries, for a :class:`FormedEntries`.

    Raises
    ------
    TypeError
        Anything else, as ``json.dumps`` says it.

    Examples
    --------
    >>> import json
    >>> json.dumps({"m_formed": FormedEntries([{"c": 1}])}, default=jsonable)
    '{"m_formed": [{"c": 1}]}'
    """
    if isinstance(value, FormedEntries):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
