"""Per-c counts behind every verdict card (analysis.metrics.parity._counts), on rows built by hand with the answers worked out."""

from __future__ import annotations

import polars as pl

from analysis.metrics.parity._counts import per_c_counts, run_counts

COLUMNS = ["c", "requests", "bitwise", "bits_known", "same", "parted", "near_tie", "no_margin", "first", "first_where"]


def test_per_c_counts_by_hand():
    rows = pl.DataFrame({
        # c=4 first: the result is sorted by c
        "c":             [4,     4,     4,     4,     1],
        "bitwise":       [True,  False, None,  False, True],
        "diverged":      [False, True,  True,  True,  False],
        "divergence_at": [1,     7,     3,     5,     None],   # a request that did not part can carry a position: not "first"
        "near_tie":      [True,  True,  False, False, False],  # a near-tie counts only where the request parted
        "margin_known":  [True,  True,  False, False, False],  # so does a missing margin
        "where":         ["a",   "b",   "c",   "d",   "e"],
    })
    counts = per_c_counts(rows)
    assert counts.columns == COLUMNS and all(dtype == (pl.String if name == "first_where" else pl.Int64)
                                             for name, dtype in counts.schema.items())
    assert counts.rows() == [
        (1, 1, 1, 1, 1, 0, 0, 0, None, None),
        # c=4: one of three known bits identical; one of four token-identical; three parted, one at a near-tie, two
        # without a margin; the earliest parting is at token 3, by "c"
        (4, 4, 1, 3, 1, 3, 1, 2, 3, "c"),
    ]


def test_the_first_parting_names_the_earliest_request_whatever_the_row_order():
    rows = pl.DataFrame({"c": [2, 2, 2], "bitwise": [False] * 3, "diverged": [True] * 3, "divergence_at": [9, 4, 6],
                         "near_tie": [False] * 3, "margin_known": [True] * 3, "where": ["x", "y", "z"]})
    assert per_c_counts(rows).select("first", "first_where").row(0) == (4, "y")


def test_run_counts_reads_a_slot_table():
    slots = pl.DataFrame({
        "c": [4, 4, 4, 4], "prompt_id": ["p0", "p0", "p0", "p1"], "slot": [0, 1, 2, 0],
        "bitwise_prefix": [10, 10, 2, None], "length": [10, 10, 10, 10],   # identical twice, then not, then unknown
        "max_ulp": [0, 0, 1, None],                                          # logprobs on both sides where the tokens agree
        "diverged": [False, False, True, False], "divergence_at": [None, None, 2, None],
        "near_tie": [False, False, True, False],                            # the one that parted did so at a near-tie
        "reference_margin": [0.3, None, 0.01, 0.2],                         # a missing margin counts only where a request parted
    }, schema_overrides={"divergence_at": pl.Int64, "bitwise_prefix": pl.Int64})
    assert run_counts(slots).rows() == [(4, 4, 2, 3, 3, 1, 1, 0, 2, "p0 slot 2")]


def test_run_counts_calls_the_bits_of_equal_tokens_without_logprobs_unknown():
    # an MLPerf accuracy log: tokens only. Equal tokens (max_ulp null: no logprob pair) are unknown bits, not equal bits; a request
    # that parts in tokens is known not to be bit-identical; an empty output against an empty reference has nothing to differ
    slots = pl.DataFrame({
        "c": [8, 8, 8], "prompt_id": ["qsl0", "qsl1", "qsl2"], "slot": [0, 0, 0],
        "bitwise_prefix": [6, 3, 0], "length": [6, 6, 0], "max_ulp": [None, None, None],
        "diverged": [False, True, False], "divergence_at": [None, 3, None], "near_tie": [False] * 3, "reference_margin": [None] * 3,
    }, schema_overrides={"divergence_at": pl.Int64, "max_ulp": pl.Int64, "reference_margin": pl.Float64})
    assert run_counts(slots).select("requests", "bitwise", "bits_known", "same", "parted").row(0) == (3, 1, 2, 2, 1)
