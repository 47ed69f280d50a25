"""The lowest layer: strict JSON, field errors, frames, output files, cells for people, the version."""

from ._cells import MISSING, cell, duration, few, pairs, percent, share
from ._fields import INT64_MAX, INT64_MIN, Fields, WitnessError
from ._frames import as_polars, build, check_backend, first_rows, progress, progress_bar, to_backend
from ._heap import trim_heap
from ._modes import (
    INVARIANT_MODES,
    KERNEL_MODES,
    MODE_ALIASES,
    PREFILL_DECODE_MODES,
    canonical_setting,
    kernel_mode_words,
    mode_as_asked,
)
from ._output import OutputExists, OutputUnwritable, build_folder, check_writable, claim_output, write_atomic
from ._rustfmt import format_number, format_percent_1, rust_debug_str, rust_is_blank
from ._strictjson import (
    MAX_DEPTH,
    NOT_JSON,
    DuplicateKeyError,
    NestingError,
    StrictJsonError,
    check_depth,
    duplicate_path,
    first_duplicate,
    loads_strict,
    not_json,
)
from ._version import __version__

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "INVARIANT_MODES",
    "KERNEL_MODES",
    "MAX_DEPTH",
    "MISSING",
    "MODE_ALIASES",
    "NOT_JSON",
    "PREFILL_DECODE_MODES",
    "DuplicateKeyError",
    "Fields",
    "NestingError",
    "OutputExists",
    "OutputUnwritable",
    "StrictJsonError",
    "WitnessError",
    "__version__",
    "as_polars",
    "build",
    "build_folder",
    "canonical_setting",
    "cell",
    "check_backend",
    "check_depth",
    "check_writable",
    "claim_output",
    "duplicate_path",
    "duration",
    "few",
    "first_duplicate",
    "first_rows",
    "format_number",
    "format_percent_1",
    "kernel_mode_words",
    "loads_strict",
    "mode_as_asked",
    "not_json",
    "pairs",
    "percent",
    "progress",
    "progress_bar",
    "rust_debug_str",
    "rust_is_blank",
    "share",
    "to_backend",
    "trim_heap",
    "write_atomic",
]
