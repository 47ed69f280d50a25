"""The compiled per-token pass (analysis.metrics.mismatch._mismatch_kernel, numba) against the numpy pass it replaces
(_mismatch_blocks.block_sums): the same per-run sums and block rows, and the same table and summary end to end,
up to the order of the additions (numpy adds pairwise, the loop in turn)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import mismatch_summary, mismatch_table
from analysis.metrics.mismatch import _mismatch_blocks
from analysis.metrics.mismatch._mismatch import Constants

kernel = pytest.importorskip("analysis.metrics.mismatch._mismatch_kernel")
if not kernel.AVAILABLE:
    pytest.skip("numba is not installed (pip install 'bia[fast]')", allow_module_level=True)

RUN_FIELDS = len(_mismatch_blocks.run_fields(True))
ROW_FIELDS = len(_mismatch_blocks.ROW_FIELDS)


def _tokens(rng, sequences: int, key=int) -> pl.DataFrame:
    lengths = rng.integers(1, 40, sequences)
    n = int(lengths.sum())
    r = -rng.exponential(0.7, n)
    # most tokens a few 1e-3 apart, some far off, a few past the log-ratio clip of 20 (verl's, slime's, SkyRL's, miles')
    t = r + rng.normal(0, 1e-3, n) + (rng.random(n) < 0.05) * rng.normal(0, 2.0, n) + (rng.random(n) < 0.01) * 25.0
    mask = rng.random(n) < 0.8
    mask[np.cumsum(lengths)[:3] - 1] = False  # some sequences end on unmasked tokens
    keys = np.repeat(np.arange(sequences), lengths)
    return pl.DataFrame({
        "sequence": [key(k) for k in keys] if key is not int else keys, "position": np.arange(n),
        "rollout_logprob": pl.Series(r, dtype=pl.Float32), "trainer_logprob": t, "mask": mask,
        "advantage": np.repeat(rng.normal(0, 1, sequences), lengths)})


def _same(a, b):
    # the same value up to the order of additions; a None (no masked token) on both sides
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
        return (a is None and b is None) or (isinstance(b, float) and math.isnan(b))
    return a == pytest.approx(b, rel=1e-11, abs=1e-13)


@pytest.mark.parametrize("key", [int, str], ids=["integer key: the loop finds the runs", "string key: polars does"])
@pytest.mark.parametrize("rollout_is", ["sequence", "token"])
def test_compiled_and_numpy_passes_agree(monkeypatch, key, rollout_is):
    tokens = _tokens(np.random.default_rng(7), 300, key)
    # blocks of 64 rows and batches of 1000: sequences cut across both
    monkeypatch.setattr(_mismatch_blocks, "BLOCK_ROWS", 64)
    out = {}
    for compiled in (True, False):
        monkeypatch.setattr(_mismatch_blocks, "COMPILED", compiled)
        out[compiled] = (mismatch_table(tokens, chunk_size=1000),
                         mismatch_summary(tokens, chunk_size=1000, verl_rollout_is=rollout_is).row(0, named=True))
    table, numpy_table = out[True][0], out[False][0]
    assert table["sequence"].to_list() == numpy_table["sequence"].to_list()
    for name in table.columns[1:]:
        assert all(_same(a, b) for a, b in zip(table[name].to_list(), numpy_table[name].to_list())), name
    summary, numpy_summary = out[True][1], out[False][1]
    assert summary.keys() == numpy_summary.keys()
    for name in summary:
        assert _same(summary[name], numpy_summary[name]), (name, summary[name], numpy_summary[name])


def test_block_sums_agree_with_support_and_nan():
    rng = np.random.default_rng(3)
    n = 200
    r = -rng.exponential(0.7, n)
    t = r + rng.normal(0, 0.5, n)
    mask, support = rng.random(n) < 0.7, rng.random(n) < 0.5
    advantage = rng.normal(0, 1, n)
    starts = np.array([0, 5, 6, 60, 61, 150])  # one block of 200 rows; run 1 is a single row
    c = Constants(verl_rollout_is="token")
    firsts, runs, rows = kernel.batch_sums(None, starts, 1 << 14, mask, r, t, advantage, support, c, RUN_FIELDS, ROW_FIELDS)
    numpy_runs, numpy_row = _mismatch_blocks.block_sums(starts, mask, r, t, advantage, support, c)
    assert firsts.tolist() == starts.tolist()
    np.testing.assert_allclose(runs, numpy_runs, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(rows[0], numpy_row, rtol=1e-12, atol=1e-14)
    # a NaN logprob on a loss-masked token: numpy's max and min give NaN, and so does the loop
    r[np.flatnonzero(mask)[10]] = np.nan
    _, _, rows = kernel.batch_sums(None, starts, 1 << 14, mask, r, t, advantage, support, c, RUN_FIELDS, ROW_FIELDS)
    _, numpy_row = _mismatch_blocks.block_sums(starts, mask, r, t, advantage, support, c)
    assert np.isnan(rows[0, -4:]).all() and np.isnan(numpy_row[-4:]).all()


def test_a_run_by_hand():
    # keys 4, 4, 4 | 5 in blocks of 2 rows: runs at rows 0 and 2 (a block's first row starts one), 3 (key 5).
    # Tokens: rho = exp(t - r) = 2, 1, 1/2 (all masked), the last row not masked.
    r = np.log([0.25, 0.5, 0.8, 1.0])
    t = np.log([0.5, 0.5, 0.4, 1.0])
    mask = np.array([True, True, True, False])
    firsts, runs, rows = kernel.batch_sums(np.array([4, 4, 4, 5]), None, 2, mask, r, t, None, None, Constants(), 13, ROW_FIELDS)
    assert firsts.tolist() == [0, 2, 3]
    fields = dict(zip(_mismatch_blocks.run_fields(False), runs))
    assert fields["n_rows"].tolist() == [2, 1, 1] and fields["n"].tolist() == [2, 1, 0]
    assert fields["s_tis"] == pytest.approx([3.0, 0.5, 0.0], rel=1e-15)  # Σρ: 2 + 1 | 1/2 | none
    # K3 = ρ − 1 − δ: (1 − ln 2) + 0 | −1/2 + ln 2
    assert fields["s_k3"] == pytest.approx([1 - math.log(2), math.log(2) - 0.5, 0.0], rel=1e-12)
    block0, block1 = (dict(zip(_mismatch_blocks.ROW_FIELDS, row)) for row in rows)
    assert (block0["n"], block1["n"]) == (2, 1)
    assert block0["max_absd"] == pytest.approx(math.log(2)) and block0["min_absd"] == 0.0
    assert block0["m2_absd"] == pytest.approx(math.log(2) ** 2 / 2)  # |δ| = ln 2, 0 about their mean ln 2 / 2
    assert block1["m2_absd"] == 0.0 and block1["max_absd"] == pytest.approx(math.log(2))


def test_batches_of_several_arrow_chunks_are_summed_chunk_by_chunk(monkeypatch, tmp_path):
    # A Parquet file of 250-row row groups read in batches of 1000 rows: each batch holds several Arrow chunks, which
    # the compiled pass sums one by one where they lie (blocks counted from each chunk's start); a frame concatenated
    # without rechunking does the same in memory. Both must give the numpy pass's values, which rechunks each batch.
    tokens = _tokens(np.random.default_rng(11), 400)
    path = tmp_path / "step.parquet"
    tokens.write_parquet(path, row_group_size=250)
    pieces = pl.concat([tokens.slice(i, 333) for i in range(0, tokens.height, 333)], rechunk=False)
    assert pieces.n_chunks() > 1
    monkeypatch.setattr(_mismatch_blocks, "BLOCK_ROWS", 64)
    for data in (str(path), pieces):
        out = {}
        for compiled in (True, False):
            monkeypatch.setattr(_mismatch_blocks, "COMPILED", compiled)
            out[compiled] = mismatch_summary(data, chunk_size=1000).row(0, named=True)
        assert out[True]["bia:tokens"] == tokens.height
        for name in out[True]:
            assert _same(out[True][name], out[False][name]), (data if isinstance(data, str) else "concat", name)


def test_the_numpy_pass_runs_when_the_compiled_one_is_switched_off(monkeypatch):
    # COMPILED = False is how the tests compare the two passes: it must not reach the compiled one at all
    def compiled(*args, **kwargs):
        raise AssertionError("the compiled pass ran")

    monkeypatch.setattr(kernel, "batch_sums", compiled)
    tokens = _tokens(np.random.default_rng(3), 20)
    with pytest.raises(AssertionError, match="the compiled pass ran"):
        mismatch_summary(tokens)
    monkeypatch.setattr(_mismatch_blocks, "COMPILED", False)
    assert mismatch_summary(tokens)["bia:tokens"].item() == tokens.height


def test_prime_rl_counts_with_a_zero_or_null_advantage_and_a_nan_in_one_quantity_only():
    # prime-rl masks a token when Δp = p − q > high with a positive advantage and when Δp < −low otherwise: an advantage
    # of exactly 0 or NaN (a null) takes the second branch and counts in neither n_ph nor n_pl. The loop computes this
    # with 0/1 products; numpy with np.where. Rows 0-3: Δp = +0.5, −0.5, +0.5, −0.5 with advantages 1, 0, NaN, −1.
    p, q = np.array([0.75, 0.25, 0.75, 0.25]), np.array([0.25, 0.75, 0.25, 0.75])
    r, t = np.log(q), np.log(p)
    advantage = np.array([1.0, 0.0, np.nan, -1.0])
    mask = np.ones(4, dtype=bool)
    c = Constants()
    firsts, runs, rows = kernel.batch_sums(None, np.array([0]), 1 << 14, mask, r, t, advantage, None, c, RUN_FIELDS, ROW_FIELDS)
    fields = dict(zip(_mismatch_blocks.run_fields(True), runs[:, 0]))
    # dropped: row 0 (positive, Δp > 0.2), row 1 (zero: Δp < −0.2), row 3 (negative, Δp < −0.2); row 2 (NaN: Δp > 0) kept
    assert (fields["n_pm"], fields["n_ph"], fields["n_pl"]) == (3.0, 1.0, 1.0)
    numpy_runs, numpy_row = _mismatch_blocks.block_sums(np.array([0]), mask, r, t, advantage, None, c)
    np.testing.assert_allclose(runs[:, 0], numpy_runs[:, 0], rtol=1e-12, atol=1e-14)
    # t = r = 800 on one token: δ and K3 are 0 there, but p = q = inf and |p − q| is NaN; only its extreme is NaN
    r, t = np.array([800.0, -1.0, -2.0]), np.array([800.0, -1.5, -2.0])
    _, _, rows = kernel.batch_sums(None, np.array([0]), 1 << 14, np.ones(3, dtype=bool), r, t, None, None, c, 13, ROW_FIELDS)
    _, numpy_row = _mismatch_blocks.block_sums(np.array([0]), np.ones(3, dtype=bool), r, t, None, None, c)
    got, want = dict(zip(_mismatch_blocks.ROW_FIELDS, rows[0])), dict(zip(_mismatch_blocks.ROW_FIELDS, numpy_row))
    assert math.isnan(got["max_x"]) and math.isnan(want["max_x"])
    for name in ("max_absd", "max_k3", "min_absd"):
        assert got[name] == pytest.approx(want[name], rel=1e-15), name
    assert (got["max_absd"], got["min_absd"]) == (0.5, 0.0)


@settings(max_examples=examples(200), deadline=None)
@given(a=st.floats(allow_nan=False), b=st.floats(allow_nan=False))
def test_the_extremes_integer_order_is_the_floats_order(a, b):
    # the loop takes maxima and minima on the floats' bits as integers (it vectorises): that order must be the floats'
    # own, negatives, zeros of either sign, subnormals and infinities included, and the key must give the float back
    ka, kb = kernel._ordered(a), kernel._ordered(b)
    if a < b:
        assert ka < kb
    elif a > b:
        assert ka > kb
    else:  # equal floats: the same key, but for 0.0 and -0.0, which differ in bits and are both given back
        assert ka == kb or (a == 0.0 and b == 0.0)
    assert math.copysign(1.0, kernel._unordered(ka)) == math.copysign(1.0, a) and kernel._unordered(ka) == a


def test_extremes_of_a_block_whose_k3_are_all_negative():
    # ρ − 1 − δ rounds below 0 for some tiny δ: a block of such tokens has a negative maximum K3, which numpy gives
    r = np.zeros(8)
    t = np.array([2.739233746429086e-09, -4.6042657247225936e-09, 8.255111545554435e-09, 8.701448475755365e-09,
                  7.148085531751389e-09, 7.263578446997732e-09, -7.514334470008722e-09, 3.412488293872606e-09])
    k3 = (np.exp(t - r) - 1.0) - (t - r)
    assert (k3 < 0).all()
    mask = np.ones(8, dtype=bool)
    _, _, rows = kernel.batch_sums(None, np.array([0]), 1 << 14, mask, r, t, None, None, Constants(), 13, ROW_FIELDS)
    got = dict(zip(_mismatch_blocks.ROW_FIELDS, rows[0]))
    assert got["max_k3"] == k3.max() < 0
    assert got["max_absd"] == np.abs(t).max() and got["min_absd"] == np.abs(t).min()
