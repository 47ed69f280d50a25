"""The measures, in two families side by side: parity of token streams (:mod:`analysis.parity`; whole runs in columns,
decode rates, per-c counts, bounds on a divergence rate) and RL sampler-trainer mismatch. Each family is a folder;
the layers above import what they use from here, never from a private module of either."""

from . import parity
from .mismatch import SamplingMaskError, mismatch_summary, mismatch_table
from .parity import _columnar as columnar
from .parity._bounds import divergence_bound, requests_needed
from .parity._columnar import float32_bits, ordered_bits
from .parity._columnar_steps import _identity as token_identity
from .parity._counts import COUNTED_COLUMNS, bits_unrecorded, per_c_counts, run_counts
from .parity._decode_cost import MIN_RATE_SAMPLES, TIMING_WORDS, cost_by_c, decode_cost
from .parity._rates import ratio_interval

__all__ = [
    "COUNTED_COLUMNS",
    "MIN_RATE_SAMPLES",
    "TIMING_WORDS",
    "SamplingMaskError",
    "bits_unrecorded",
    "columnar",
    "cost_by_c",
    "decode_cost",
    "divergence_bound",
    "float32_bits",
    "mismatch_summary",
    "mismatch_table",
    "ordered_bits",
    "parity",
    "per_c_counts",
    "ratio_interval",
    "requests_needed",
    "run_counts",
    "token_identity",
]
