"""Edges of analysis.metrics.parity._columnar (the kit: _columnar_steps, _columnar_pairs, _columnar_bands) that
mutation testing found unpinned (issue 16).

Every expected value here was worked out by hand (the arithmetic is in the comments); frames are
compared whole, dtypes included, and computed floats with ``pytest.approx`` (rel=1e-12 unless said).
"""

from __future__ import annotations

import math
import struct
import warnings

import numpy as np
import pandas as pd
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analysis.metrics.parity._columnar import (
    COMPARISON_SCHEMA,
    agreements,
    band_rate,
    build_steps,
    compare_pairs,
    constant_runs,
    decode_rate,
    flip_bins,
    float32_bits,
    ordered_bits,
    sequences,
    wilson,
)
from analysis.metrics.parity._columnar_pairs import _topk_kl
from analysis.metrics.parity._columnar_steps import _identity, _lazy
from analysis.dumps._schema import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA, conform

ln = math.log
INF = math.inf
PACK = 2**31  # _columnar_steps._PACK
F32_ONE_UP = float(np.nextafter(np.float32(1.0), np.float32(2.0)))  # 1 + 2**-23: one float32 step above 1.0


def approx(x):
    return pytest.approx(x, rel=1e-12)


def _token(prefix: str, token) -> dict:
    """A token given as an int id or as a (text, bytes) pair."""
    if isinstance(token, tuple):
        return {f"{prefix}token_text": token[0], f"{prefix}token_bytes": token[1]}
    return {f"{prefix}token_id": token}


def _frame(rows: list[dict], schema: dict) -> pl.DataFrame:
    return pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema) if rows else pl.DataFrame(schema=schema)


def frames(streams: dict, *, flags=None, source: str = "s") -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(tokens, candidates, requests) of one dump: ``streams`` maps a record to its steps (token, logprob, [(candidate, logprob), ...]).

    ``flags`` maps (record, step) to the candidates' ``is_duplicate`` values; unset, they are null (frames built by hand).
    """
    tokens, cands, requests = [], [], []
    for record, steps in streams.items():
        requests.append({"source": source, "record": record, "choice_index": 0})
        for position, (token, logprob, listed) in enumerate(steps):
            key = {"source": source, "record": record, "choice_index": 0, "segment": "completion", "position": position}
            tokens.append({**key, **_token("", token), "logprob": logprob})
            dup = (flags or {}).get((record, position), [None] * len(listed))
            cands += [{**key, "list_kind": "top_logprobs", "list_index": i, **_token("cand_", t), "cand_logprob": v, "is_duplicate": d}
                      for i, ((t, v), d) in enumerate(zip(listed, dup))]
    return _frame(tokens, TOKEN_SCHEMA), _frame(cands, CANDIDATE_SCHEMA), _frame(requests, REQUEST_SCHEMA)


def steps_of(streams: dict, **kw):
    return build_steps([frames(streams, **kw)])


def pairs(*rows: tuple[int, int, int]) -> pl.DataFrame:
    return pl.DataFrame(list(rows), schema={"pair": pl.Int64, "ref": pl.Int64, "other": pl.Int64}, orient="row")


def compared(ref: list, other: list, *, epsilon: float = 0.05) -> dict:
    """compare_pairs of one pair: request 0 the reference, request 1 the other."""
    return compare_pairs(steps_of({0: ref, 1: other}), pairs((0, 0, 1)), epsilon=epsilon).row(0, named=True)


def plain(ids: list, logprob: float = -0.5) -> list:
    """Steps with these tokens, one logprob, no candidates."""
    return [(t, logprob, []) for t in ids]


# --- identities and float bits -------------------------------------------------------------------


def test_identity_is_the_id_else_hex_text_and_bytes_with_dashes_for_missing_parts():
    df = pl.DataFrame({"i": [7, 8, None, None, None, None, None], "t": [None, "x", "a", "a", None, "é", None],
                       "b": [None, b"x", b"a", None, b"\xff", None, None]}, schema={"i": pl.Int64, "t": pl.String, "b": pl.Binary})
    # "a" is 0x61, "é" is UTF-8 c3 a9; an id wins over any text
    assert df.select(x=_identity("i", "t", "b", False))["x"].to_list() == ["#7", "#8", "$61:61", "$61:-", "$-:ff", "$c3a9:-", "$-:-"]
    got = df.select(x=_identity("i", "t", "b", True))["x"]
    assert got.dtype == pl.Int64 and got.to_list() == [7, 8, None, None, None, None, None]


def test_float32_bits_and_the_ordered_line():
    df = pl.DataFrame({"v": [0.0, -0.0, 1.0, -1.0, 0.1, -0.5, None]}, schema={"v": pl.Float64})
    out = df.select(bits=float32_bits(pl.col("v"))).with_columns(ordered=ordered_bits(pl.col("bits")))
    # 1.0f = 0x3F800000 = 1065353216; -1.0f = 0xBF800000 - 2**32 = -1082130432; -0.0f = 0x80000000 - 2**32 = -2**31;
    # 0.1f = 0x3DCCCCCD = 1036831949; -0.5f = 0xBF000000 - 2**32 = -1090519040
    assert out.schema == pl.Schema({"bits": pl.Int64, "ordered": pl.Int64})
    assert out["bits"].to_list() == [0, -2**31, 1065353216, -1082130432, 1036831949, -1090519040, None]
    # negatives fold onto -(bits & 0x7FFFFFFF): -0.0 meets 0.0, -1.0 -> -1065353216, -0.5 -> -0x3F000000
    assert out["ordered"].to_list() == [0, 0, 1065353216, -1065353216, 1036831949, -1056964608, None]


def test_lazy_reads_pandas_with_the_schema_types_and_passes_polars_through():
    got = _lazy(pd.DataFrame({"a": [1.0, None]}), {"a": pl.Int64})  # pandas holds an int column with a gap as float
    assert isinstance(got, pl.LazyFrame)
    assert_frame_equal(got.collect(), pl.DataFrame({"a": [1, None]}, schema={"a": pl.Int64}))
    lazy = pl.LazyFrame({"a": [1.5]})
    assert _lazy(lazy, {"a": pl.Int64}) is lazy
    assert_frame_equal(_lazy(pl.DataFrame({"a": [1.5]}), {"a": pl.Int64}).collect(), pl.DataFrame({"a": [1.5]}))


# --- build_steps ---------------------------------------------------------------------------------


def _hand_dump():
    """Record 0: two tokens (positions 3 and 7, rows reversed), the first with three candidates (one null);
    record 1: one token with no logprob and one candidate; record 2: no tokens. Plus rows that must be left out."""
    tokens, cands, requests = frames({0: [(5, -0.5, [(5, -0.5), (6, -0.75), (7, None)]), (6, -0.25, [])],
                                      1: [(5, None, [(6, -1.0)])], 2: []})
    tokens = tokens.with_columns(position=pl.col("position") * 4 + 3).reverse()  # positions 3, 7 (record 0) and 3 (record 1)
    cands = cands.with_columns(position=pl.col("position") * 4 + 3).reverse()
    base = {"source": "s", "choice_index": 0, "position": 3}
    extra_tokens = conform(pl.DataFrame([{**base, "record": 0, "segment": "prompt", "token_id": 9, "logprob": -9.0},
                                         {**base, "record": 9, "segment": "completion", "token_id": 9, "logprob": -9.0}]), TOKEN_SCHEMA)
    extra_cands = conform(pl.DataFrame([{**base, "record": 0, "segment": "completion", "list_kind": "sampling_support", "list_index": 0,
                                         "cand_token_id": 9, "cand_logprob": -9.0},
                                        {**base, "record": 0, "segment": "prompt", "list_kind": "top_logprobs", "list_index": 0,
                                         "cand_token_id": 9, "cand_logprob": -9.0},
                                        {**base, "record": 0, "position": 4, "segment": "completion", "list_kind": "top_logprobs",
                                         "list_index": 0, "cand_token_id": 9, "cand_logprob": -9.0}]), CANDIDATE_SCHEMA)
    return pl.concat([extra_tokens, tokens]), pl.concat([cands, extra_cands]), requests


def test_build_steps_frames_by_hand():
    steps = build_steps([_hand_dump()])
    i64, f64 = pl.Int64, pl.Float64
    want_steps = pl.DataFrame(
        [(0, 0, 0, 3, 5, None, None, 5, -0.5, -1090519040, -1056964608, 3, [5, 6, 7], -0.5, 0.25),  # margin -0.5 - -0.75
         (0, 1, 1, 7, 6, None, None, 6, -0.25, -1098907648, -1048576000, 0, None, None, None),  # -0.25f = 0xBE800000
         (1, 0, 2, 3, 5, None, None, 5, None, None, None, 1, [6], -1.0, None)],  # one finite candidate: no margin
        schema={"req": i64, "idx": i64, "step": i64, "position": i64, "token_id": i64, "token_text": pl.String, "token_bytes": pl.Binary,
                "ident": i64, "logprob": f64, "bits": i64, "ordered": i64, "n_cands": i64, "cand_list": pl.List(i64), "top1": f64, "margin": f64},
        orient="row")
    assert_frame_equal(steps.steps.drop("bits64", "cand_sig", "cand_sig_text", "cand_ids", "cand_unknown"), want_steps)
    assert steps.steps["cand_unknown"].to_list() == [True, None, False]  # record 0 token 0 lists a candidate without a value
    # the recorded bits: the float64 each value was read as (-0.5 = 0xBFE0000000000000), null for a value not recorded
    as_int = lambda value: struct.unpack("<q", struct.pack("<d", value))[0]  # noqa: E731
    assert steps.steps["bits64"].to_list() == [as_int(-0.5), as_int(-0.25), None] and as_int(-0.5) == -0x4020000000000000
    # the alternatives' signature: one number for the finite (token, bits) pairs, whatever their order; none without a list
    signatures = steps.steps["cand_sig"].to_list()
    assert signatures[1] is None and None not in (signatures[0], signatures[2]) and signatures[0] != signatures[2]
    tokens, cands, requests = _hand_dump()
    shuffled = build_steps([(tokens, cands.with_columns(list_index=2 - pl.col("list_index")), requests)])
    assert shuffled.steps["cand_sig"].to_list() == signatures
    moved = build_steps([(tokens, cands.with_columns(cand_logprob=pl.when(pl.col("cand_token_id") == 6).then(-0.75 - 1e-12)
                                                                .otherwise(pl.col("cand_logprob"))), requests)])
    assert moved.steps["cand_sig"].to_list()[0] != signatures[0]  # one alternative's bits moved: another signature
    # key = step * 2**31 + id; the null candidate is not finite, so not a first entry
    want_cands = pl.DataFrame([(0, 0, 0, 5, -0.5, 5, True), (0, 0, 0, 6, -0.75, 6, True), (0, 0, 0, 7, None, 7, False),
                               (1, 0, 2, 6, -1.0, 2 * PACK + 6, True)],
                              schema={"req": i64, "idx": i64, "step": i64, "ident": i64, "logprob": f64, "key": i64, "first": pl.Boolean},
                              orient="row")
    assert_frame_equal(steps.cands, want_cands)
    want_requests = pl.DataFrame([(0, 0, "s", 0, 0, 2), (1, 0, "s", 1, 0, 1), (2, 0, "s", 2, 0, 0)],
                                 schema={"req": i64, "part": i64, "source": pl.String, "record": i64, "choice_index": i64, "length": i64},
                                 orient="row")
    assert_frame_equal(steps.requests, want_requests)
    want_firsts = pl.DataFrame([(0, 0, 0, 5, 5, math.exp(-0.5)), (0, 0, 0, 6, 6, math.exp(-0.75)), (1, 0, 2, 6, 2 * PACK + 6, math.exp(-1.0))],
                               schema={"req": i64, "idx": i64, "step": i64, "ident": i64, "key": i64, "prob": f64}, orient="row")
    assert_frame_equal(steps.firsts, want_firsts, check_exact=False, rel_tol=1e-15)
    assert steps.packed is True


def test_build_steps_reads_pandas_and_lazy_frames_alike():
    tokens, cands, requests = _hand_dump()
    want = build_steps([(tokens, cands, requests)])
    for got in (build_steps([(tokens.to_pandas(), cands.to_pandas(), requests.to_pandas())]),
                build_steps([(tokens.lazy(), cands.lazy(), requests.lazy())], engine="in-memory")):
        assert_frame_equal(got.steps, want.steps)
        assert_frame_equal(got.cands, want.cands)
        assert_frame_equal(got.requests, want.requests)


def test_pandas_frames_take_the_schema_types_where_pandas_holds_a_gap_as_float():
    tokens, cands, requests = frames({0: [(1, -0.5, [(("a", b"a"), -0.5), (2, -1.0)])], 1: []})
    # a request without a record, and a candidate without an id: pandas reads both columns as floats
    requests = pl.concat([requests, conform(pl.DataFrame({"source": ["s"], "record": [None], "choice_index": [0]}), REQUEST_SCHEMA)])
    got = build_steps([(tokens.to_pandas(), cands.to_pandas(), requests.to_pandas())])
    assert got.requests.select("record", "length").rows() == [(0, 1), (1, 0), (None, 0)] and got.requests.schema["record"] == pl.Int64
    assert got.steps["cand_list"].to_list() == [["$61:61", "#2"]]  # "#2", not "#2.0"


def test_parts_and_sources_number_requests_apart_and_duplicate_request_rows_once():
    a = frames({0: plain([1])}, source="a")
    b = frames({0: plain([2, 3])}, source="b")
    twice = (a[0], a[1], pl.concat([a[2], a[2]]))  # the same request listed twice is one request
    steps = build_steps([twice, b, a])  # part 2 repeats part 0's keys: still a request of its own
    assert steps.requests.select("part", "source", "record", "req", "length").rows() == [(0, "a", 0, 0, 1), (1, "b", 0, 1, 2), (2, "a", 0, 2, 1)]
    assert steps.steps.select("req", "idx", "step", "ident").rows() == [(0, 0, 0, 1), (1, 0, 1, 2), (1, 1, 2, 3), (2, 0, 3, 1)]
    # two sources in one part, same record: two requests
    tokens = pl.concat([a[0], b[0]])
    both = build_steps([(tokens, a[1], pl.concat([a[2], b[2]]))])
    assert both.requests.select("source", "req", "length").rows() == [("a", 0, 1), ("b", 1, 2)]


def test_text_identities_are_strings_and_not_packed():
    steps = steps_of({0: [(("a", b"a"), -0.5, [(("a", b"a"), -0.5), (3, -1.0)])], 1: [(4, -0.5, [(("b", None), -1.0)])]})
    assert steps.packed is False
    assert steps.steps["ident"].to_list() == ["$61:61", "#4"]
    assert steps.cands.select("ident", "key", "first").rows() == [("$61:61", None, True), ("#3", None, True), ("$62:-", None, True)]
    assert steps.cands.schema["key"] == pl.Int64
    assert steps.steps["cand_list"].to_list() == [["$61:61", "#3"], ["$62:-"]]


@pytest.mark.parametrize("token_text, cand_text", [(True, False), (False, True)])
def test_one_token_without_an_id_on_either_side_makes_every_identity_a_string(token_text, cand_text):
    token = ("t", b"t") if token_text else 1
    cand = ("c", b"c") if cand_text else 2
    steps = steps_of({0: [(token, -0.5, [(cand, -0.5)])], 1: [(1, -0.5, [(2, -0.5)])]})
    assert steps.steps.schema["ident"] == pl.String and steps.cands.schema["ident"] == pl.String
    assert steps.packed is False


@pytest.mark.parametrize("ids, packed", [([0, PACK - 1], True), ([1, PACK], False), ([-1, 5], False)])
def test_keys_are_packed_only_when_every_candidate_id_fits_31_bits(ids, packed):
    steps = steps_of({0: [(ids[0], -0.5, [(ids[0], -0.5), (ids[1], -1.0)])]})
    assert steps.packed is packed
    assert steps.steps.schema["ident"] == pl.Int64
    want = [ids[0], ids[1]] if packed else [None, None]  # step 0: key = 0 * 2**31 + id
    assert steps.cands["key"].to_list() == want


def test_one_candidate_is_enough_to_pack():
    assert steps_of({0: [(1, -0.5, [(1, -0.5)])], 1: plain([2])}).packed is True


def test_no_candidates_is_not_packed_and_every_step_has_an_empty_list():
    steps = steps_of({0: plain([1, 2]), 1: []})
    assert steps.packed is False and steps.cands.height == 0 and steps.firsts.height == 0
    assert steps.steps.select("n_cands", "cand_list", "top1", "margin").rows() == [(0, None, None, None), (0, None, None, None)]
    assert steps.requests["length"].to_list() == [2, 0]


@pytest.mark.parametrize("text", [False, True])
def test_first_entries_without_reader_flags_are_the_first_finite_entry_of_each_token_per_step(text):
    a, b = (("a", b"a"), ("b", b"b")) if text else (1, 2)
    listed = [(a, None), (a, -0.5), (b, -1.0), (a, -0.25), (b, -INF)]
    steps = steps_of({0: [(a, -0.5, listed), (a, -0.5, [(a, -0.5)])], 1: [(a, -0.5, [(a, -0.5), (b, -0.5)])]})
    assert steps.packed is not text
    # a's null entry is not finite; a's second finite entry and b's -inf are not first; a again at step 1 and in request 1: first there
    assert steps.cands["first"].to_list() == [False, True, True, False, False, True, True, True]
    assert steps.firsts.select("req", "idx", "step").rows() == [(0, 0, 0), (0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 0, 2)]


def test_reader_flags_with_no_duplicate_are_trusted():
    listed = [(1, -0.5), (1, -0.25)]  # a reader that saw no token twice: every finite entry is first
    steps = steps_of({0: [(1, -0.5, listed)]}, flags={(0, 0): [False, False]})
    assert steps.cands["first"].to_list() == [True, True]


@pytest.mark.parametrize("flags", [[False, True, False], [None, False, False], [True, False, False]])
def test_any_flag_set_or_missing_makes_the_first_entries_found_by_identity(flags):
    steps = steps_of({0: [(1, -0.5, [(1, -0.5), (1, -0.25), (2, -1.0)])]}, flags={(0, 0): flags})
    assert steps.cands["first"].to_list() == [True, False, True]


def test_margin_is_top1_minus_the_second_finite_value_duplicates_included():
    steps = steps_of({0: [(1, -0.5, [(3, -2.0), (1, -0.5), (2, None), (4, -0.75)]),  # sorted finite: -0.5, -0.75, -2.0 -> 0.25
                          (1, -0.5, [(1, -INF), (2, -1.0)]),  # one finite value: no margin
                          (1, -0.5, [(1, -0.5), (1, -0.5)]),  # the same token twice: margin 0
                          (1, -0.5, [(1, None), (2, -1.5), (3, -1.0)])]})  # a null first: -1.0 - -1.5
    assert steps.steps.select("n_cands", "top1", "margin").rows() == [(4, -0.5, 0.25), (2, -1.0, None), (2, -0.5, 0.0), (3, -1.0, 0.5)]


def test_candidate_rows_in_any_order_are_numbered_by_their_token_and_sorted_by_list_index():
    tokens, cands, requests = frames({0: [(1, -0.5, [(1, -0.5), (2, -1.0), (3, -2.0)]), (2, -0.5, [(2, -0.5), (4, -1.0)])]})
    interleaved = cands[[0, 3, 1, 4, 2]]  # step 0, step 1, step 0, step 1, step 0
    reversed_lists = cands[[2, 1, 0, 4, 3]]  # each list's rows backwards
    want = build_steps([(tokens, cands, requests)])
    assert want.steps["cand_list"].to_list() == [[1, 2, 3], [2, 4]]
    for shuffled in (interleaved, reversed_lists, cands.reverse()):
        got = build_steps([(tokens, shuffled, requests)])
        assert_frame_equal(got.cands, want.cands)
        assert_frame_equal(got.steps, want.steps)


def test_candidates_of_a_position_without_a_token_are_dropped():
    tokens, cands, requests = frames({0: [(1, -0.5, [(1, -0.5)]), (2, -0.5, [(2, -0.5)])]})
    steps = build_steps([(tokens.filter(pl.col("position") == 1), cands, requests)])
    assert steps.cands.select("idx", "step", "ident").rows() == [(0, 0, 2)]
    steps = build_steps([(tokens.filter(pl.col("position") == 0), cands, requests)])
    assert steps.cands.select("idx", "step", "ident").rows() == [(0, 0, 1)]


# --- two streams ---------------------------------------------------------------------------------


def test_agreements_by_hand():
    steps = steps_of({0: plain([1, 2, 3, 4]), 1: plain([1, 2, 3, 4]), 2: plain([1, 9, 3, 8]), 3: plain([1, 2]), 4: [], 5: plain([9]),
                      6: plain([1, 2, 3, 4, 5])})
    got = agreements(steps, pairs((0, 0, 1), (1, 0, 2), (2, 0, 3), (3, 0, 4), (4, 0, 5), (5, 0, 6), (6, 0, 99), (7, 3, 0))).sort("pair")
    # equal: 4; parts at 1 and 3: 1; a prefix: its length 2; empty: 0; parts at 0: 0; longer: 4; unknown request: 0; shorter ref: 2
    assert_frame_equal(got, pl.DataFrame({"pair": [0, 1, 2, 3, 4, 5, 6, 7], "agree_to": [4, 1, 2, 0, 0, 4, 0, 2]}))


def test_no_pairs_gives_an_empty_comparison_table():
    steps = steps_of({0: plain([1])})
    assert_frame_equal(compare_pairs(steps, pairs(), epsilon=0.05), pl.DataFrame(schema=COMPARISON_SCHEMA))


FORK_REF = [(1, -0.5, [(1, -0.5), (2, -1.5)]), (2, -1.0, [(2, -1.0), (3, -1.25)]), (3, -0.25, [(3, -0.25), (4, -0.5)]), (5, -0.1, [])]
FORK_OTHER = [(1, -0.5, [(1, -0.5), (2, -1.5)]), (2, -0.5, [(3, -1.25), (2, -1.0)]), (4, -0.5, [(4, -0.5), (3, -0.625)]), (5, -0.1, [])]


def test_a_fork_compared_by_hand():
    got = compared(FORK_REF, FORK_OTHER, epsilon=0.3)
    k3 = math.expm1(0.5) - 0.5  # step 1: d = -0.5 - -1.0 = 0.5; step 0: d = 0, k3 0
    assert got == {
        "pair": 0, "agree_to": 2, "diverged": True, "divergence_at": 2,
        "bitwise_prefix": 1,  # step 1's logprobs differ
        "max_abs_delta": 0.5,
        "max_ulp": 8388608,  # -1.0f and -0.5f: one binade, 2**23 steps
        "topk_order_changes": 1, "topk_set_changes": 0,  # step 1: the same two tokens in the other order
        "reference_margin": 0.25, "own_margin": 0.125,  # -0.25 - -0.5; -0.5 - -0.625
        "in_reference_topk": True,  # token 4 is in the reference's list [3, 4]
        "near_tie": True,  # 0 <= 0.25 < 0.3
        "length": 4, "reference_length": 4,
        "k3_mean": approx(k3 / 2), "k3_max": approx(k3),
        "kl_topk_mean": 0.0, "kl_topk_max": 0.0,  # both lists hold the same values at steps 0 and 1
    }


def test_the_comparison_table_has_the_schema_types_and_is_sorted_by_pair():
    steps = steps_of({0: FORK_REF, 1: FORK_OTHER, 2: FORK_REF})
    got = compare_pairs(steps, pairs((1, 0, 1), (0, 0, 2)), epsilon=0.05)
    assert got.schema == pl.Schema(COMPARISON_SCHEMA)
    assert got.select("pair", "agree_to", "diverged", "near_tie").rows() == [(0, 4, False, False), (1, 2, True, False)]


def test_identical_streams_never_diverge():
    got = compared(FORK_REF, FORK_REF)
    assert got == {"pair": 0, "agree_to": 4, "diverged": False, "divergence_at": None, "bitwise_prefix": 4, "max_abs_delta": 0.0, "max_ulp": 0,
                   "topk_order_changes": 0, "topk_set_changes": 0, "reference_margin": None, "own_margin": None, "in_reference_topk": None,
                   "near_tie": False, "length": 4, "reference_length": 4, "k3_mean": 0.0, "k3_max": 0.0, "kl_topk_mean": 0.0, "kl_topk_max": 0.0}


@pytest.mark.parametrize("cut", [0, 2])
def test_a_shorter_stream_agrees_to_its_length_and_does_not_diverge(cut):
    got = compared(FORK_REF, FORK_REF[:cut])
    assert (got["agree_to"], got["diverged"], got["divergence_at"], got["bitwise_prefix"]) == (cut, False, None, cut)
    assert (got["length"], got["reference_length"]) == (cut, 4)
    got = compared(FORK_REF[:cut], FORK_REF)
    assert (got["agree_to"], got["diverged"], got["length"], got["reference_length"]) == (cut, False, 4, cut)


def test_an_empty_or_unknown_other_has_length_zero_and_nothing_measured():
    steps = steps_of({0: FORK_REF, 1: []})
    for other in (1, 99):
        got = compare_pairs(steps, pairs((0, 0, other)), epsilon=0.05).row(0, named=True)
        assert got == {"pair": 0, "agree_to": 0, "diverged": False, "divergence_at": None, "bitwise_prefix": 0, "max_abs_delta": None,
                       "max_ulp": None, "topk_order_changes": 0, "topk_set_changes": 0, "reference_margin": None, "own_margin": None,
                       "in_reference_topk": None, "near_tie": False, "length": 0, "reference_length": 4, "k3_mean": None, "k3_max": None,
                       "kl_topk_mean": None, "kl_topk_max": None}
    got = compare_pairs(steps, pairs((0, 99, 0)), epsilon=0.05).row(0, named=True)
    assert (got["agree_to"], got["length"], got["reference_length"]) == (0, 4, 0)


def test_a_fork_at_step_zero_measures_only_the_fork():
    got = compared(FORK_REF, FORK_OTHER[2:], epsilon=0.3)  # token 4 against token 1
    assert got == {"pair": 0, "agree_to": 0, "diverged": True, "divergence_at": 0, "bitwise_prefix": 0, "max_abs_delta": None, "max_ulp": None,
                   "topk_order_changes": 0, "topk_set_changes": 0,
                   "reference_margin": 1.0, "own_margin": 0.125,  # -0.5 - -1.5; -0.5 - -0.625
                   "in_reference_topk": False,  # 4 is not in [1, 2]
                   "near_tie": False,  # 1.0 >= 0.3
                   "length": 2, "reference_length": 4, "k3_mean": None, "k3_max": None, "kl_topk_mean": None, "kl_topk_max": None}


def test_bits_differ_at_minus_zero_and_at_a_missing_value_but_not_at_two_missing_values():
    ref = [(1, 0.0, []), (1, None, []), (1, -0.0, []), (1, None, []), (1, -1.0, [])]
    other = [(1, 0.0, []), (1, None, []), (1, 0.0, []), (1, -0.5, []), (1, -1.0, [])]
    got = compared(ref, other)
    # step 1: null and null are the same bits; step 2: -0.0 and 0.0 are not (0 apart on the ordered line)
    assert (got["bitwise_prefix"], got["max_abs_delta"], got["max_ulp"]) == (2, 0.0, 0)
    got = compared(ref[:1] + ref[3:], other[:1] + other[3:])  # step 1 here: null against -0.5, the only difference
    assert (got["bitwise_prefix"], got["max_abs_delta"], got["max_ulp"], got["k3_mean"]) == (1, 0.0, 0, 0.0)


def test_deltas_take_the_largest_absolute_difference_over_steps_with_both_values():
    ref = [(1, -1.0, []), (1, -1.0, []), (1, None, []), (1, -0.5, [])]
    other = [(1, -1.0, []), (1, F32_ONE_UP * -1.0, []), (1, -9.0, []), (1, -2.0, [])]
    got = compared(ref, other)
    # step 1: one float32 step below -1.0 (1 ulp, |d| = 2**-23); step 2: one side null, left out; step 3: |-2.0 - -0.5| = 1.5
    # ulps of step 3: ordered(-0.5f) - ordered(-2.0f) = -0x3F000000 + 0x40000000 = 2**24 (two binades)
    assert (got["bitwise_prefix"], got["max_abs_delta"], got["max_ulp"]) == (1, 1.5, 2**24)
    # k3 at d = 0, 2**-23 (about 2**-47), -1.5: mean of three
    k3s = [0.0, math.expm1(-2**-23) + 2**-23, math.expm1(-1.5) + 1.5]
    assert (got["k3_mean"], got["k3_max"]) == (approx(sum(k3s) / 3), approx(k3s[2]))


def test_k3_of_a_logprob_far_below_the_other_is_inf_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = compared([(1, -800.0, [])], [(1, 0.0, [])])  # d = 800: exp(800) overflows
    assert (got["k3_mean"], got["k3_max"]) == (INF, INF)


def test_order_changes_and_set_changes_count_listed_steps_apart():
    ref = [(1, -0.5, [(1, -0.5), (2, -1.0)]),  # s0: set {1, 2} against {1, 3}: order and set
           (1, -0.5, [(2, -0.5), (3, -1.0)]),  # s1: the same set reordered: order only
           (1, -0.5, [(1, -0.5)]),  # s2: only the reference lists: neither
           (1, -0.5, []),  # s3: only the other lists: neither
           (1, -0.5, [(1, -0.5), (2, -1.0)]),  # s4: the same list: neither
           (1, -0.5, [(1, -0.5), (1, -0.6), (2, -1.0)]),  # s5: duplicates, the same set {1, 2}: order only
           (1, -0.5, [(1, -0.5)])]  # s6: one candidate each, different: order and set
    other = [(1, -0.5, [(1, -0.5), (3, -1.0)]), (1, -0.5, [(3, -1.0), (2, -0.5)]), (1, -0.5, []), (1, -0.5, [(1, -0.5)]),
             (1, -0.5, [(1, -0.5), (2, -1.0)]), (1, -0.5, [(1, -0.5), (2, -1.0), (2, -1.1)]), (1, -0.5, [(2, -0.5)])]
    got = compared(ref, other)
    assert (got["agree_to"], got["topk_order_changes"], got["topk_set_changes"]) == (7, 4, 2)


@pytest.mark.parametrize("epsilon, near", [(0.25, False), (0.25000001, True), (1.0, True)])
def test_near_tie_is_half_open_at_epsilon(epsilon, near):
    got = compared(FORK_REF, FORK_OTHER, epsilon=epsilon)  # reference margin at the fork: exactly 0.25
    assert (got["reference_margin"], got["near_tie"]) == (0.25, near)


def test_a_zero_margin_is_a_near_tie_and_a_missing_one_is_not():
    tied = [(1, -0.5, []), (3, -0.5, [(3, -0.5), (4, -0.5)])]
    got = compared(tied, plain([1, 4]), epsilon=1e-9)
    assert (got["reference_margin"], got["own_margin"], got["in_reference_topk"], got["near_tie"]) == (0.0, None, True, True)
    unlisted = [(1, -0.5, []), (3, -0.5, [])]
    got = compared(unlisted, [(1, -0.5, []), (4, -0.5, [(4, -0.5), (5, -0.75)])], epsilon=1.0)
    # the reference has no candidates at the fork: no margin, no membership, no tie
    assert (got["reference_margin"], got["own_margin"], got["in_reference_topk"], got["near_tie"]) == (None, 0.25, None, False)


@pytest.mark.parametrize("listed, inside", [([(4, -0.5)], True), ([(3, -0.5)], False), ([(3, None), (4, None)], True)])
def test_in_reference_topk_reads_the_whole_list_even_one_candidate_or_null_values(listed, inside):
    got = compared([(1, -0.5, []), (3, -0.5, listed)], plain([1, 4]))
    assert (got["divergence_at"], got["in_reference_topk"], got["reference_margin"]) == (1, inside, None)


# --- _topk_kl ------------------------------------------------------------------------------------

KL_STEPS = [  # (reference's list, other's list, KL worked out by hand or None for no value)
    ([("A", ln(0.5)), ("B", ln(0.25))], [("B", ln(0.5)), ("A", ln(0.25))], 0.25 * ln(2)),  # 0.5 ln 2 + 0.25 ln 0.5 + rest 0.25 ln 1
    ([("A", ln(0.5))], [("A", ln(0.25))], 0.5 * ln(4 / 3)),  # 0.5 ln 2 + rest 0.5 ln(0.5/0.75)
    ([("A", 0.0)], [("A", ln(0.5))], ln(2)),  # 1 ln 2; the reference's rest is floored at 1e-12 and counts nothing
    ([("A", ln(0.5))], [("A", 0.0)], 0.5 * ln(2.5e11)),  # 0.5 ln 0.5 + 0.5 ln(0.5/1e-12): the other's rest floored
    ([("A", ln(0.5))], [("A", -800.0)], INF),  # q underflows to 0.0
    ([("A", -800.0), ("B", ln(0.5))], [("A", -800.0), ("B", ln(0.5))], 0.0),  # p underflows too: A counts nothing
    ([("A", -800.0), ("B", ln(0.5))], [("A", ln(0.5)), ("B", ln(0.5))], 0.5 * ln(5e11)),  # B 0; rest 0.5 ln(0.5/1e-12)
    ([("A", ln(0.5)), ("B", ln(0.5))], [("A", 0.0), ("B", 0.0)], 0.0),  # -ln 2 + 0 (rest at the floor): clipped to 0
    ([("A", ln(0.5)), ("C", ln(0.25))], [("A", ln(0.5)), ("B", ln(0.25))], None),  # C missing from the other's list
    ([], [("A", ln(0.5))], None),  # the reference lists nothing
    ([("A", ln(0.5))], [], None),  # the other lists nothing
    ([("A", None), ("A", ln(0.5)), ("A", ln(0.25))], [("A", ln(0.25))], 0.5 * ln(4 / 3)),  # A's first finite entry counts: as row 1
    ([("A", ln(0.5))], [("B", ln(0.25)), ("A", ln(0.5))], 0.0),  # the other's B is not in the rest sums: 0.5 ln 1 + 0.5 ln 1
    ([("A", ln(0.5))], [("A", None)], None),  # the other's A has no value: missing
]
KINDS = {"packed": {"A": 1, "B": 2, "C": 3}, "wide": {"A": PACK + 1, "B": PACK + 2, "C": PACK + 3},
         "text": {"A": ("a", b"a"), "B": ("b", b"b"), "C": ("c", b"c")}}


@pytest.mark.parametrize("kind", list(KINDS))
def test_topk_kl_by_hand_on_packed_and_unpacked_keys(kind):
    name = KINDS[kind]
    ref = [(1, -0.5, [(name[t], v) for t, v in r]) for r, _, _ in KL_STEPS]
    other = [(1, -0.5, [(name[t], v) for t, v in o]) for _, o, _ in KL_STEPS]
    filler = [(7, -0.5, [(name["A"], ln(0.9)), (name["B"], ln(0.1))])]  # request 0: its steps come before the pair's
    steps = steps_of({0: filler, 1: ref, 2: other})
    assert steps.packed is (kind == "packed")
    at = pl.DataFrame({"pair": [4] * len(KL_STEPS), "ref": [1] * len(KL_STEPS), "other": [2] * len(KL_STEPS), "idx": range(len(KL_STEPS))},
                      schema={"pair": pl.Int64, "ref": pl.Int64, "other": pl.Int64, "idx": pl.Int64})
    got = _topk_kl(steps, at).sort("idx")
    assert got.schema == pl.Schema({"pair": pl.Int64, "idx": pl.Int64, "kl": pl.Float64})
    want = [(4, i, kl) for i, (_, _, kl) in enumerate(KL_STEPS) if kl is not None]
    assert got.rows() == [(p, i, approx(kl)) for p, i, kl in want]


def test_topk_kl_looks_candidates_up_at_the_other_streams_own_step():
    # request 0 lists A at step 0; request 1 lists B at step 0 and A only at step 1: A is missing at request 1's step 0
    steps = steps_of({0: [(1, -0.5, [(1, ln(0.5))])], 1: [(1, -0.5, [(2, ln(0.5))]), (1, -0.5, [(1, ln(0.5))])]})
    at = pl.DataFrame({"pair": [0, 1, 2], "ref": [0, 1, 0], "other": [1, 1, 0], "idx": [0, 1, 0]})
    assert _topk_kl(steps, at).sort("pair").rows() == [(1, 1, 0.0), (2, 0, 0.0)]


def test_kl_mean_and_max_in_the_comparison():
    ref = [(1, -0.5, [(1, ln(0.5)), (2, ln(0.25))]), (1, -0.5, [(1, ln(0.5))]), (1, -0.5, [(3, ln(0.5))]), (1, -0.5, [(1, 0.0)])]
    other = [(1, -0.5, [(2, ln(0.5)), (1, ln(0.25))]), (1, -0.5, [(1, ln(0.25))]), (1, -0.5, [(1, ln(0.5))]), (2, -0.5, [(1, ln(0.5))])]
    got = compared(ref, other)  # steps 0 and 1 count (step 2: 3 missing; step 3: the fork)
    kls = [0.25 * ln(2), 0.5 * ln(4 / 3)]
    assert (got["agree_to"], got["kl_topk_mean"], got["kl_topk_max"]) == (3, approx(sum(kls) / 2), approx(kls[0]))


# --- one stream, bands, curves -------------------------------------------------------------------


def test_constant_runs_per_request_and_zero_without_tokens():
    steps = steps_of({0: plain([1, 1, 2, 2, 2, 1]), 1: [], 2: plain([1]), 3: plain([1, 1])})
    assert_frame_equal(constant_runs(steps), pl.DataFrame({"req": [0, 1, 2, 3], "max_constant_run": [3, 0, 1, 2]}))


def test_sequences_in_step_order_and_empty_without_tokens():
    tokens, cands, requests = frames({0: plain([3, 1, 2]), 1: []})
    steps = build_steps([(tokens.reverse(), cands, requests)])
    want = pl.DataFrame({"req": [0, 1], "sequence": [[3, 1, 2], []]}, schema={"req": pl.Int64, "sequence": pl.List(pl.Int64)})
    assert_frame_equal(sequences(steps), want)
    text = steps_of({0: [], 1: plain([("a", None)])})
    want = pl.DataFrame({"req": [0, 1], "sequence": [[], ["$61:-"]]}, schema={"req": pl.Int64, "sequence": pl.List(pl.String)})
    assert_frame_equal(sequences(text), want)


def _wilson(successes, trials, **kw) -> list[tuple[float, float]]:
    low, high = wilson(pl.col("s"), pl.col("n"), **kw)
    return pl.DataFrame({"s": successes, "n": trials}, schema={"s": pl.Float64, "n": pl.Float64}).select(low=low, high=high).rows()


def test_wilson_by_hand():
    # p = 1/4, n = 4, z = 2: centre (0.25 + 4/8)/(1 + 4/4) = 0.375; half 2 sqrt(0.1875/4 + 4/64)/2 = sqrt(0.109375) = 0.33071891388307384
    (low, high), = _wilson([1.0], [4.0], z=2.0)
    assert (low, high) == (approx(0.375 - 0.33071891388307384), approx(0.375 + 0.33071891388307384))
    # p = 1/2, n = 10, z = 1.959963984540054 (z^2 = 3.841458820694124): centre 0.5; half z sqrt(0.025 + z^2/400)/(1 + z^2/10)
    (low, high), = _wilson([5.0], [10.0])
    assert (low, high) == (pytest.approx(0.2365930905, rel=1e-9), pytest.approx(0.7634069095, rel=1e-9))


def test_wilson_clips_rounding_at_zero_and_one():
    # unclipped, 0 of 21 gives centre - half = -1.4e-17 and 16 of 16 gives centre + half = 1 + 2**-52
    assert _wilson([0.0, 16.0], [21.0, 16.0]) == [(0.0, approx(0.154639018924847)), (approx(0.8063923194655637), 1.0)]


def test_decode_rate_needs_a_live_stream_two_tokens_two_chunks_and_time():
    rows = [(3, 0.5, 1.5, 3, True),  # 2 tokens after the first over 1 s: 2.0
            (2, 0.5, 1.0, 2, True),  # the least measurable: 1 / 0.5 = 2.0
            (1, 0.5, 1.5, 3, True), (3, 0.5, 1.5, 1, True),  # one token, one chunk
            (3, 0.5, 1.5, 3, None), (3, 0.5, 1.5, 3, False),  # not known live
            (3, 0.5, 0.5, 3, True), (3, 0.6, 0.5, 3, True),  # no time, time backwards
            (None, 0.5, 1.5, 3, True), (3, None, 1.5, 3, True)]
    df = pl.DataFrame(rows, schema={"n": pl.Int64, "a": pl.Float64, "b": pl.Float64, "c": pl.Int64, "live": pl.Boolean}, orient="row")
    got = df.select(r=decode_rate(pl.col("n"), pl.col("a"), pl.col("b"), pl.col("c"), pl.col("live")))["r"]
    assert got.dtype == pl.Float64
    assert got.to_list() == [2.0, 2.0, None, None, None, None, None, None, None, None]


def test_band_rate_is_the_median_or_null_when_a_slot_is_untimed():
    df = pl.DataFrame({"g": [0, 0, 0, 1, 1, 2, 3, 3], "r": [1.0, 3.0, 2.0, 1.0, None, 5.0, 1.0, 2.0]})
    got = df.group_by("g", maintain_order=True).agg(rate=band_rate(pl.col("r")))
    assert got.rows() == [(0, 2.0), (1, None), (2, 5.0), (3, 1.5)]
    assert pl.DataFrame({"r": []}, schema={"r": pl.Float64}).select(band_rate(pl.col("r"))).item() is None


def test_flip_bins_are_half_open_and_count_only_margins_inside_the_edges():
    at_risk = pl.DataFrame({"margin": [0.0, 0.25, 0.5, 0.75, 1.0, -0.1, 2.0, 0.5],
                            "flip": [True, False, True, True, True, True, True, False]})
    got = flip_bins(at_risk, [0.0, 0.5, 1.0, 1.5])
    # [0, 0.5): 0.0 (flip), 0.25; [0.5, 1): 0.5 (flip), 0.75 (flip), 0.5; [1, 1.5): 1.0 (flip); -0.1 and 2.0 outside
    want = pl.DataFrame({"margin_low": [0.0, 0.5, 1.0], "margin_high": [0.5, 1.0, 1.5], "steps": [2, 3, 1], "flips": [1, 2, 1],
                         "p_flip": [0.5, 2 / 3, 1.0]})
    assert_frame_equal(got, want)


def test_flip_bins_leave_an_empty_bin_and_an_edge_margin_out():
    at_risk = pl.DataFrame({"margin": [0.5, 1.0], "flip": [False, True]})
    got = flip_bins(at_risk, [0, 0.5, 1])  # 1.0 is the last edge: outside; [0, 0.5) is empty
    assert_frame_equal(got, pl.DataFrame({"margin_low": [0.0, 0.5], "margin_high": [0.5, 1.0], "steps": [0, 1], "flips": [0, 0],
                                          "p_flip": [None, 0.0]}))
    none = flip_bins(pl.DataFrame({"margin": [], "flip": []}, schema={"margin": pl.Float64, "flip": pl.Boolean}), [0.0, 1.0])
    assert_frame_equal(none, pl.DataFrame({"margin_low": [0.0], "margin_high": [1.0], "steps": [0], "flips": [0], "p_flip": [None]},
                                          schema_overrides={"p_flip": pl.Float64}))
