"""Parity metrics as polars queries: every stream is a set of rows, every comparison a join.

The per-stream functions in :mod:`analysis.parity` (``compare``, ``topk_kl``, ...) define each
measure on two Python streams; this kit computes the same measures for every request of a run
at once, as joins of each request to its reference on the step index, group-bys and window
functions, with no Python per token or per candidate. ``tests/test_columnar.py`` checks the two
agree on random streams.

The frames here:

``steps``
    One row per completion token of a request: ``req`` (the request's number), ``idx`` (its
    0-based step: the rank of its ``position``, as a :class:`~analysis.parity.Stream` counts),
    ``ident`` (the token's identity: its id, else its text and bytes), ``logprob``, ``bits`` (its
    float32 bits), ``bits64`` (its bits as recorded, null when it is unknown) and ``ordered`` (the float32 bits moved onto
    a line where float order is integer order),
    and from its top-k list:
    ``n_cands``, ``cand_list`` (identities in delivered order),
    ``top1`` (the best finite logprob), ``margin`` (top-1 minus top-2) and ``cand_sig`` and
    ``cand_sig_text`` (the alternatives' tokens, by id and by text, with their recorded bits, as one order-free number),
    ``cand_ids`` (every alternative has an id) and ``cand_unknown`` (one has no finite value).
``cands``
    One row per delivered ``top_logprobs`` candidate: ``req``, ``idx``, ``ident``, ``logprob``,
    ``first`` (the first finite entry of its identity in its list: the one a KL counts).
``pairs``
    What to compare: ``pair``, ``ref`` and ``other`` (request numbers).

This module is the kit's face (``analysis.metrics.columnar``): the frames are built in ``_columnar_steps``, pairs of
streams compared in ``_columnar_pairs``, single streams and bands measured in ``_columnar_bands``.
"""

from ._columnar_bands import band_rate, constant_runs, decode_rate, flip_bins, sequences, wilson
from ._columnar_pairs import COMPARISON_SCHEMA, EVIDENCE_SCHEMA, REST_FLOOR, agreements, compare_pairs, evidence_pairs
from ._columnar_steps import REQUEST_KEY, Steps, build_steps, float32_bits, of_requests, ordered_bits, recorded_bits

__all__ = [
    "COMPARISON_SCHEMA",
    "EVIDENCE_SCHEMA",
    "REQUEST_KEY",
    "REST_FLOOR",
    "Steps",
    "agreements",
    "band_rate",
    "build_steps",
    "compare_pairs",
    "constant_runs",
    "decode_rate",
    "evidence_pairs",
    "flip_bins",
    "float32_bits",
    "of_requests",
    "ordered_bits",
    "recorded_bits",
    "sequences",
    "wilson",
]
