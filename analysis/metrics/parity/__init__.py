"""Parity of token streams, one family of the measures: where a request parts from its reference, how close the call
was, what a batch of identical requests agreed on; over whole runs in columns (``_columnar``), with decode rates
(``_rates``), per-c counts (``_counts``) and bounds on a divergence rate (``_bounds``) beside them.

This face is the public ``analysis.parity``, which re-exports exactly its ``__all__``: a pair of streams in
``_parity``, a band of them in ``_bands``, decode rates in ``_rates``. The family's other names that the layers above
use (counts, bounds, the columnar kit) are named by ``analysis.metrics``.
"""

from ._bands import (
    FLIP_EDGES,
    Completions,
    avg_std_top1_prob,
    band_summary,
    div_index,
    flip_curve,
    fork_table,
    longest_constant_run,
    std_at_acc,
    step_margins,
    tie_density,
    top1_prob,
    unique_completions,
)
from ._parity import (
    NEAR_TIE_EPSILON,
    Comparison,
    Stream,
    agreement,
    compare,
    is_near_tie,
    k3,
    same_float32,
    streams,
    top2_margin,
    topk_kl,
    ulp_distance,
)
from ._rates import band_decode_rate, decode_rate, ratio_interval, request_decode_rates, wilson_interval

__all__ = [
    "FLIP_EDGES",
    "NEAR_TIE_EPSILON",
    "Comparison",
    "Completions",
    "Stream",
    "agreement",
    "avg_std_top1_prob",
    "band_decode_rate",
    "band_summary",
    "compare",
    "decode_rate",
    "div_index",
    "flip_curve",
    "fork_table",
    "is_near_tie",
    "k3",
    "longest_constant_run",
    "ratio_interval",
    "request_decode_rates",
    "same_float32",
    "std_at_acc",
    "step_margins",
    "streams",
    "tie_density",
    "top1_prob",
    "top2_margin",
    "topk_kl",
    "ulp_distance",
    "unique_completions",
    "wilson_interval",
]
