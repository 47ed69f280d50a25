"""Where data comes from: paths, globs and URLs with their limits, and the data shipped with bia."""

from ._bundled import PACKAGE, bundled, default_rl_pairs, default_runs, default_sources
from ._sources import (
    SourceError,
    SourceRepeated,
    expand_sources,
    fetch_url,
    is_url,
    local_path,
    read_source_bytes,
    same_sources,
)

__all__ = [
    "PACKAGE",
    "SourceError",
    "SourceRepeated",
    "bundled",
    "default_rl_pairs",
    "default_runs",
    "default_sources",
    "expand_sources",
    "fetch_url",
    "is_url",
    "local_path",
    "read_source_bytes",
    "same_sources",
]
