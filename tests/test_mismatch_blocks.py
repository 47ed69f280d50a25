"""The per-token pass of the mismatch metrics (analysis.metrics.mismatch._mismatch_blocks): sequences cut across numpy blocks
and batches, runs without a loss-masked token, float32 input, the token-level IS sums, and the batch-wide moments
(the Pearson correlation, the standard deviations) against numpy."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import mismatch_summary, mismatch_table
from analysis.metrics.mismatch import _mismatch_blocks

LN = math.log

# every test on both per-token passes, compiled and numpy (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("per_token_pass")

# Seven rows, cut into blocks of 3 (BLOCK_ROWS patched): block 0 = rows 0-2, block 1 = rows 3-5, block 2 = row 6.
# A: one masked token, rho = 1 (0.5 -> 0.5). B: no masked token, in the middle of block 0.
# C: rho = 3 (0.25 -> 0.75) in block 0 and rho = 1/4 (0.8 -> 0.2) in block 1: cut across blocks.
# D: two rows, none masked, ending block 1. E: one row, not masked: block 2 has no masked token at all.
ROWS = [("A", 0, LN(0.5), LN(0.5), True), ("B", 0, None, None, False), ("C", 0, LN(0.25), LN(0.75), True),
        ("C", 1, LN(0.8), LN(0.2), True), ("D", 0, -1.0, -1.0, False), ("D", 1, -1.0, -1.0, False), ("E", 0, -2.0, -3.0, False)]
STEP = pl.DataFrame(ROWS, schema={"sequence": pl.String, "position": pl.Int64, "rollout_logprob": pl.Float64,
                                  "trainer_logprob": pl.Float64, "mask": pl.Boolean}, orient="row")


def test_runs_cut_across_blocks_and_runs_without_a_masked_token(monkeypatch):
    whole = mismatch_summary(STEP)
    monkeypatch.setattr(_mismatch_blocks, "BLOCK_ROWS", 3)
    table = mismatch_table(STEP)
    assert table["sequence"].to_list() == ["A", "B", "C", "D", "E"]  # first-seen order
    assert table["tokens"].to_list() == [1, 1, 2, 2, 1] and table["masked_tokens"].to_list() == [1, 0, 2, 0, 0]
    # C: K1 = mean(r - t) = (-ln 3 + ln 4) / 2; K3 = mean(rho - 1 - delta) = ((2 - ln 3) + (-0.75 + ln 4)) / 2
    k1 = table["k1"].to_list()
    assert k1[0] == 0.0 and k1[1] is None and k1[2] == pytest.approx(LN(4 / 3) / 2, rel=1e-12) and k1[3:] == [None, None]
    assert table["k3"][2] == pytest.approx((2 - LN(3) + LN(4) - 0.75) / 2, rel=1e-12)
    s = mismatch_summary(STEP).row(0, named=True)
    assert (s["bia:sequences"], s["bia:tokens"], s["bia:masked_tokens"]) == (5, 7, 3)
    # over the three masked tokens: delta = 0, ln 3, -ln 4; |delta| max ln 4, min 0; K3 max 2 - ln 3 (0.90 > ln 4 - 0.75 = 0.64)
    assert s["openrlhf:vllm_kl"] == pytest.approx(LN(4 / 3) / 3, rel=1e-12)
    assert s["skyrl:policy/rollout_train_logprobs_abs_diff_max"] == pytest.approx(LN(4), rel=1e-12)
    assert s["skyrl:policy/rollout_train_logprobs_abs_diff_min"] == 0.0
    assert s["prime-rl:mismatch_kl/all/max"] == pytest.approx(2 - LN(3), rel=1e-12)
    # exp t = 0.5, 0.75, 0.2 against exp r = 0.5, 0.25, 0.8
    assert s["verl:training/rollout_actor_probs_pearson_corr"] == pytest.approx(np.corrcoef([0.5, 0.75, 0.2], [0.5, 0.25, 0.8])[0, 1], rel=1e-12)
    for name in whole.columns:  # cut into blocks or not: the same values
        assert (s[name] is None) == (whole[name].item() is None), name
        if s[name] is not None:
            assert s[name] == pytest.approx(whole[name].item(), rel=1e-12, abs=1e-15), name


def test_token_level_weights_are_summed_only_for_the_token_level():
    seqs, glob = _mismatch_blocks.partials(STEP.lazy())
    assert math.isnan(glob["s_w"].item()) and math.isnan(glob["n_hi"].item())  # the sequence level never reads them
    c = _mismatch_blocks.Constants(verl_rollout_is="token")
    glob = _mismatch_blocks.partials(STEP.lazy(), c)[1].row(0, named=True)
    # rho = 1, 3, 1/4: w = min(rho, 2) = 1, 2, 1/4; one above 2, one below 1/2
    assert (glob["s_w"], glob["s_w2"], glob["n_hi"], glob["n_lo"]) == pytest.approx((3.25, 1 + 4 + 1 / 16, 1, 1), rel=1e-12)
    assert glob["n_sky"] == 1 and glob["s_rho_c"] == pytest.approx(4.25, rel=1e-12)
    assert seqs["sequence"].to_list() == ["A", "B", "C", "D", "E"]


def test_float32_logprobs_give_the_values_of_their_float64_widening():
    narrow = STEP.with_columns(pl.col("rollout_logprob", "trainer_logprob").cast(pl.Float32))
    wide = narrow.with_columns(pl.col("rollout_logprob", "trainer_logprob").cast(pl.Float64))
    assert mismatch_summary(narrow).equals(mismatch_summary(wide))
    assert mismatch_table(narrow).equals(mismatch_table(wide))


def test_no_token_at_all():
    s = mismatch_summary(STEP.head(0)).row(0, named=True)
    assert (s["bia:sequences"], s["bia:tokens"], s["bia:masked_tokens"]) == (0, 0, 0)
    assert s["verl:rollout_corr/kl"] is None and s["skyrl:policy/rollout_train_logprobs_abs_diff_max"] is None
    assert mismatch_table(STEP.head(0)).height == 0
    # an empty table keeps the key's type, and the counts stay integers
    assert mismatch_table(STEP.head(0)).schema["sequence"] == pl.String
    assert all(type(s[name]) is int for name in ("bia:sequences", "bia:tokens", "bia:masked_tokens"))


def test_an_empty_parquet_file_has_no_token(tmp_path):
    # a file of no rows has no piece: the pipeline runs with nothing to read (and no warm-up to wait for)
    path = tmp_path / "empty.parquet"
    STEP.head(0).write_parquet(path)
    s = mismatch_summary(str(path)).row(0, named=True)
    assert (s["bia:sequences"], s["bia:tokens"], s["bia:masked_tokens"]) == (0, 0, 0)
    assert _mismatch_blocks.piece_partials([]) == []


def test_per_sequence_counts_are_integers():
    # the pass sums counts in float64 arrays; the table gives them as integers
    table = mismatch_table(STEP)
    assert [table.schema[name] for name in ("tokens", "masked_tokens", "support_tokens")] == [pl.Int64] * 3
    assert table["tokens"].to_list() == [1, 1, 2, 2, 1] and table["masked_tokens"].to_list() == [1, 0, 2, 0, 0]


def test_a_block_of_unmasked_rows_only_has_no_extremes():
    runs, row = _mismatch_blocks.block_sums(np.array([0, 1]), np.array([False, False]), np.zeros(2), np.zeros(2), None, None)
    row = dict(zip(_mismatch_blocks.ROW_FIELDS, row.tolist()))
    assert row["n"] == 0 and math.isnan(row["max_absd"]) and row["g_p"] == 0.0 and row["m2_p"] == 0.0
    assert dict(zip(_mismatch_blocks.run_fields(False), runs))["n_rows"].tolist() == [1.0, 1.0]


token = st.tuples(st.floats(-6.0, 0.0), st.floats(-2.5, 2.5), st.booleans())


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(token, min_size=1, max_size=6), min_size=1, max_size=6), st.integers(1, 7), st.integers(1, 9))
def test_blocks_and_batches_do_not_change_the_moments(monkeypatch, seqs, block_rows, chunk_size):
    rows = [(f"s{i}", j, r, min(r + d, 0.0), m) for i, toks in enumerate(seqs) for j, (r, d, m) in enumerate(toks)]
    step = pl.DataFrame(rows, schema=STEP.schema, orient="row")
    whole = mismatch_summary(step).row(0, named=True)
    monkeypatch.setattr(_mismatch_blocks, "BLOCK_ROWS", block_rows)
    cut = mismatch_summary(step, chunk_size=chunk_size).row(0, named=True)
    for name, value in whole.items():
        assert (cut[name] is None) == (value is None), name
        if value is not None:
            assert cut[name] == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True), name
    on = step.filter("mask")
    t, r = on["trainer_logprob"].to_numpy(), on["rollout_logprob"].to_numpy()
    if on.height > 1:  # numpy's own, over the flattened masked tokens
        x = np.abs(np.exp(t) - np.exp(r))
        assert cut["verl:training/rollout_probs_diff_std"] == pytest.approx(x.std(ddof=1), rel=1e-9, abs=1e-12)
        assert cut["skyrl:policy/rollout_train_logprobs_abs_diff_std"] == pytest.approx(np.abs(t - r).std(ddof=1), rel=1e-9, abs=1e-12)
        p, q = np.exp(t), np.exp(r)
        if p.std() > 1e-6 and q.std() > 1e-6:
            assert cut["verl:training/rollout_actor_probs_pearson_corr"] == pytest.approx(np.corrcoef(p, q)[0, 1], rel=1e-7, abs=1e-9)


def test_clip_counts_at_their_thresholds_count_nothing():
    # Every token has t = r (delta = 0, rho = exp(0) = 1 exactly, p - q = 0) and every threshold sits exactly there:
    # each framework counts only ratios strictly past its clip (rho > 1, rho < 1, p - q > 0, p - q < -0), so every
    # clip and mask count is 0. A ">=" anywhere would count all four tokens.
    tokens = pl.DataFrame({"sequence": ["a", "a", "b", "b"], "position": [0, 1, 0, 1], "rollout_logprob": [-0.5, -1.0, -0.25, -2.0],
                           "trainer_logprob": [-0.5, -1.0, -0.25, -2.0], "mask": [True] * 4, "advantage": [1.0, 1.0, -1.0, 0.0]})
    s = mismatch_summary(tokens, slime_tis_clip=1.0, slime_tis_clip_low=1.0, verl_is_threshold=1.0, verl_rollout_is="token",
                         skyrl_token_tis_ratio_clip_high=1.0, prime_rl_dppo_mask_high=0.0, prime_rl_dppo_mask_low=0.0).row(0, named=True)
    zero = {name: s[name] for name in ("slime:train/tis_clipfrac", "verl:rollout_corr/rollout_is_ratio_fraction_high",
                                       "verl:rollout_corr/rollout_is_ratio_fraction_low", "skyrl:tis_token_clip_high_ratio",
                                       "prime-rl:is_masked/mean", "prime-rl:is_masked_high/mean", "prime-rl:is_masked_low/mean")}
    assert zero == dict.fromkeys(zero, 0.0)
    assert s["bia:masked_tokens"] == 4


def test_a_log_ratio_below_minus_the_safety_bound_is_clipped_there():
    # One token with delta = t - r = -25, past the safety bound of 20 on the low side: verl, slime, SkyRL and miles clip
    # it to -20 first, so rho_c = exp(-20) and the clipped K3 is (exp(-20) - 1) + 20 = 19 + exp(-20), which miles then
    # clamps to its 10; |delta| itself is not clipped: 25.
    tokens = pl.DataFrame({"sequence": ["a"], "position": [0], "rollout_logprob": [-0.5], "trainer_logprob": [-25.5], "mask": [True]})
    table = mismatch_table(tokens)
    s = mismatch_summary(tokens).row(0, named=True)
    assert s["slime:train/train_rollout_logprob_abs_diff"] == pytest.approx(25.0)
    assert s["skyrl:policy/rollout_train_logprobs_abs_diff_max"] == pytest.approx(25.0)
    rho_c = math.exp(-20.0)
    assert s["verl:rollout_corr/rollout_is_mean"] == pytest.approx(rho_c, rel=1e-12), "rho_c is exp(-20), not exp(-25)"
    # verl's token-level weights are rho_c itself, token by token: exp(-20) again, from the per-token pass's sums
    token = mismatch_summary(tokens, verl_rollout_is="token").row(0, named=True)
    assert token["verl:rollout_corr/rollout_is_mean"] == pytest.approx(rho_c, rel=1e-12)
    assert table.height == 1


def test_a_null_mask_is_out_of_the_loss_and_a_reappearing_sequence_is_one_sequence():
    # mask None counts as False (not in the loss); the key "a" comes back after "b" in the next row but one, and
    # is one sequence of two loss-masked tokens (rho = 2 and 1/2), not part of b's run.
    tokens = pl.DataFrame({"sequence": ["a", "b", "a", "b"], "position": [0, 0, 1, 1], "rollout_logprob": [LN(0.25), -1.0, LN(0.8), -3.0],
                           "trainer_logprob": [LN(0.5), -1.0, LN(0.4), -1.0], "mask": [True, True, True, None]})
    table = mismatch_table(tokens).sort("sequence")
    assert table["sequence"].to_list() == ["a", "b"]
    assert table["masked_tokens"].to_list() == [2, 1], "b's last token has a null mask: out of the loss"
    assert table["tokens"].to_list() == [2, 2]
    s = mismatch_summary(tokens).row(0, named=True)
    assert s["bia:masked_tokens"] == 3
    # slime averages |delta| per sequence, then over sequences: a's (ln 2 + ln 2) / 2 and b's 0 give ln 2 / 2 (a run
    # split at b would make three sequences' worth)
    assert s["slime:train/train_rollout_logprob_abs_diff"] == pytest.approx(LN(2.0) / 2)


@settings(max_examples=examples(60), deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=32)), min_size=1, max_size=40),
       kind=st.sampled_from(["float32", "float64", "int64", "int32", "uint8", "bool_"]), data=st.data())
def test_an_arrow_chunk_is_read_as_pyarrow_reads_it(values, kind, data):
    # _chunk_array views a chunk's buffer where it has no null, from the chunk's offset (a slice of a longer array);
    # a boolean comes as its bitmap and the bit of its row 0, which must give pyarrow's booleans bit by bit
    import pyarrow as pa

    if kind.startswith(("int", "uint")):
        values = [None if v is None else int(abs(v)) % 200 for v in values]
    if kind == "bool_":
        values = [None if v is None else v > 0 for v in values]
    array = pa.array(values, type=getattr(pa, kind)())
    start = data.draw(st.integers(0, len(values) - 1))
    chunk = array.slice(start, data.draw(st.integers(0, len(values) - start)))
    got, want = _mismatch_blocks._chunk_array(chunk), chunk.to_numpy(zero_copy_only=False)
    if isinstance(got, tuple):
        assert kind == "bool_" and not chunk.null_count
        packed, offset = got
        got = np.array([packed[(offset + i) >> 3] >> ((offset + i) & 7) & 1 for i in range(len(chunk))], dtype=bool)
    assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=got.dtype.kind == "f")


def test_a_column_of_any_other_type_takes_pyarrows_way():
    # only numbers are viewed in place; anything else (a string key on the general path) is pyarrow's to_numpy
    import pyarrow as pa

    assert _mismatch_blocks._chunk_array(pa.array(["a", "b", "c"]).slice(1)).tolist() == ["b", "c"]
