"""Frames are polars inside; conversion to pandas happens only at the edge."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

BACKENDS = ("polars", "pandas")

T = TypeVar("T")


def check_backend(backend: str) -> str:
    """Validate a ``backend=`` argument.

    Examples
    --------
    >>> check_backend("pandas")
    'pandas'
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def to_backend(frame: pl.DataFrame, backend: str) -> Any:
    """Return ``frame`` as the requested backend's frame (pandas through pyarrow)."""
    if check_backend(backend) == "polars":
        return frame
    return frame.to_pandas(use_pyarrow_extension_array=False)


def as_polars(frame: Any) -> pl.DataFrame:
    """A polars frame as it is, a pandas frame converted (for functions that accept either)."""
    return frame if isinstance(frame, pl.DataFrame) else pl.from_pandas(frame)


def progress(items: list[T], show: bool | None, desc: str, unit: str = "file") -> Iterable[T]:
    """``items`` with a progress bar (and its ETA) on stderr: when asked, else only in a terminal and for more than one item.

    Executed notebooks never get one, since their stderr is not a terminal.
    """
    if not (show if show is not None else (sys.stderr.isatty() and len(items) > 1)):
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit=unit, file=sys.stderr)


def progress_bar(total: int, show: bool | None, unit: str):
    """A bar over ``total`` units (and its ETA) on stderr: when asked, else only in a terminal; ``update(n)`` advances it."""
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, disable=not (sys.stderr.isatty() if show is None else show), file=sys.stderr)


def build(rows: Sequence[Mapping[str, Any]], schema: Mapping[str, PolarsDataType]) -> pl.DataFrame:
    """Build a frame with a fixed schema; columns beyond the schema (found in rows) come after it.

    An empty ``rows`` still gives every column, so downstream code never meets a missing one.
    """
    extra: dict[str, PolarsDataType] = {}
    for row in rows:
        for key in row:
            if key not in schema and key not in extra:
                extra[key] = pl.String
    full = {**schema, **extra}
    columns = {name: [row.get(name) for row in rows] for name in full}
    return pl.DataFrame(columns, schema=full, strict=True)
