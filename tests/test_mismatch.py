"""RL mismatch metrics (analysis.metrics.mismatch._mismatch, _support, _rl): the spec's worked examples, values worked out by hand
per metric, a property test against a plain numpy transcription of each framework's code, and the sampling-mask rules."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import SamplingMaskError, mismatch_summary, mismatch_table, read_dump, read_dumps
from analysis.metrics.mismatch import _mismatch

LN = math.log

# every test on both per-token passes, compiled and numpy (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("per_token_pass")


def frame(rows, advantage=False):
    cols = ["sequence", "position", "rollout_logprob", "trainer_logprob", "mask"] + (["advantage"] if advantage else [])
    return pl.DataFrame([dict(zip(cols, r)) for r in rows], schema={"sequence": pl.String, "position": pl.Int64, "rollout_logprob": pl.Float64,
                                                                  "trainer_logprob": pl.Float64, "mask": pl.Boolean,
                                                                  **({"advantage": pl.Float64} if advantage else {})})


# --- the spec's worked examples ---------------------------------------------------------------------------------------

def test_spec_example_one_sequence():
    step = frame([("s", 0, -0.1, -0.12, True), ("s", 1, -2.0, -1.9, True)])
    s = mismatch_summary(step, verl_rollout_is="token").row(0, named=True)
    want = {
        "verl:rollout_corr/kl": -0.04, "verl:rollout_corr/k3_kl": 0.0026848, "verl:rollout_corr/log_ppl_abs_diff": 0.04,
        "verl:rollout_corr/ppl_ratio": 0.960789, "verl:rollout_corr/chi2_token": 0.0910961, "verl:rollout_corr/chi2_seq": 0.173511,
        "verl:rollout_corr/rollout_is_mean": 1.04268, "verl:rollout_corr/rollout_is_eff_sample_size": 0.996421,
        "verl:training/rollout_probs_diff_max": 0.017917, "verl:training/rollout_probs_diff_mean": 0.0160752,
        "verl:training/rollout_probs_diff_std": 0.00260473, "slime:train/train_rollout_logprob_abs_diff": 0.06,
        "slime:train/tis_abs": 0.0624861, "openrlhf:vllm_kl": -0.04, "prime-rl:mismatch_kl/all/mean": 0.0026848,
        "slime:train/mis_k3_kl": 0.0026848, "slime:train/mis_chi2_seq": 0.173511,
    }
    for name, value in want.items():
        assert s[name] == pytest.approx(value, abs=1.5e-6 * max(1, abs(value)), rel=5e-6), name
    assert mismatch_summary(step)["verl:rollout_corr/rollout_is_mean"].item() == pytest.approx(1.08329, rel=5e-6)  # sequence level


def _logsoftmax(z):
    z = np.asarray(z, dtype=np.float64)
    return z - (z.max() + np.log(np.exp(z - z.max()).sum()))


def test_spec_example_sampling_mask_replay():
    sampler, trainer = _logsoftmax([2, 1, 0.5, -1, -3]), _logsoftmax([2.05, 0.98, 0.5, -1, -3])
    support = [0, 1]  # top-k = 2
    r = sampler[1] - np.log(np.exp(sampler[support]).sum())
    assert r == pytest.approx(-1.313262, abs=1e-6) and sampler[1] == pytest.approx(-1.499280, abs=1e-6)
    step = pl.DataFrame({"sequence": ["s"], "position": [0], "token_id": [1], "rollout_logprob": [r], "trainer_logprob": [trainer[1]],
                         "mask": [True], "support_ids": [support], "support_logprobs": [[float(sampler[i] - np.log(np.exp(sampler[support]).sum())) for i in support]],
                         "trainer_support_logprobs": [[float(trainer[i]) for i in support]]})
    assert mismatch_table(step)["support_tokens"].item() == 1
    replayed = mismatch_summary(step)
    assert replayed["prime-rl:mismatch_kl/all/mean"].item() == pytest.approx(0.00131122, rel=1e-5)
    assert replayed["bia:support_tokens"].item() == 1
    # without the replay the full-vocabulary trainer logprob measures the mask, not the mismatch
    full = mismatch_summary(step.drop("support_ids", "support_logprobs", "trainer_support_logprobs"))
    assert full["prime-rl:mismatch_kl/all/mean"].item() == pytest.approx(0.0250221, rel=1e-5)
    assert trainer[1] == pytest.approx(-1.545628, abs=1e-6)
    assert trainer[1] - np.log(np.exp(trainer[support]).sum()) == pytest.approx(-1.364912, abs=1e-6)


# --- worked by hand, metric by metric ---------------------------------------------------------------------------------
# A: rho = 3 (0.25 -> 0.75) and rho = 1 (0.5 -> 0.5), advantage +1; B: rho = 1/4 (0.8 -> 0.2), advantage -1;
# C: one padding token (no logprobs, not in the loss). Three sequences, three masked tokens.

HAND = frame([("A", 0, LN(0.25), LN(0.75), True, 1.0), ("A", 1, LN(0.5), LN(0.5), True, 1.0), ("B", 0, LN(0.8), LN(0.2), True, -1.0),
              ("C", 0, None, None, False, 1.0)], advantage=True)


def test_hand_worked_values():
    s = mismatch_summary(HAND).row(0, named=True)
    st_ = mismatch_summary(HAND, verl_rollout_is="token").row(0, named=True)
    e = 1e-8  # verl's masked_mean guard
    k3a, k3b = 3 - 1 - LN(3), 0.25 - 1 + LN(4)
    lpd_a, lpd_b = (LN(0.25) + LN(0.5)) / (2 + e) - (LN(0.75) + LN(0.5)) / (2 + e), (LN(0.8) - LN(0.2)) / (1 + e)
    x = np.array([0.5, 0.0, 0.6])
    want = {
        "bia:sequences": 3, "bia:tokens": 4, "bia:masked_tokens": 3, "bia:support_tokens": 0,
        "verl:training/rollout_probs_diff_max": 0.6, "verl:training/rollout_probs_diff_mean": 1.1 / 3,
        "verl:training/rollout_probs_diff_std": math.sqrt(((0.5 - 1.1 / 3) ** 2 + (1.1 / 3) ** 2 + (0.6 - 1.1 / 3) ** 2) / 2),
        "verl:training/rollout_actor_probs_pearson_corr": float(np.corrcoef([0.75, 0.5, 0.2], [0.25, 0.5, 0.8])[0, 1]),
        "verl:rollout_corr/kl": (LN(1 / 3) + LN(4)) / (3 + e), "verl:rollout_corr/k3_kl": (k3a + k3b) / (3 + e),
        "verl:rollout_corr/training_ppl": (math.exp(-(LN(0.75) + LN(0.5)) / (2 + e)) + math.exp(-LN(0.2) / (1 + e)) + 1) / 3,
        "verl:rollout_corr/rollout_ppl": (math.exp(-(LN(0.25) + LN(0.5)) / (2 + e)) + math.exp(-LN(0.8) / (1 + e)) + 1) / 3,
        "verl:rollout_corr/log_ppl_diff": (lpd_a + lpd_b) / 3, "verl:rollout_corr/log_ppl_abs_diff": (abs(lpd_a) + lpd_b) / 3,
        "verl:rollout_corr/log_ppl_diff_max": lpd_b, "verl:rollout_corr/log_ppl_diff_min": lpd_a,
        "verl:rollout_corr/ppl_ratio": (math.exp(lpd_a) + math.exp(lpd_b) + 1) / 3,
        "verl:rollout_corr/chi2_token": (9 + 1 + 1 / 16) / (3 + e) - 1, "verl:rollout_corr/chi2_seq": (9 + 1 / 16 + 1) / 3 - 1,
        # sequence-level IS (verl's default): A's weight 3 -> 2 on its two tokens, B's 1/4; shares over the three sequences
        "verl:rollout_corr/rollout_is_mean": (2 * 2 + 0.25) / (3 + e), "verl:rollout_corr/rollout_is_ratio_fraction_high": 1 / 3,
        "verl:rollout_corr/rollout_is_ratio_fraction_low": 1 / 3,
        "verl:rollout_corr/rollout_is_eff_sample_size": (4.25 / (3 + e) + e) ** 2 * (3 + e) / (2 * 4 + 1 / 16),
        # slime: per sequence over max(n, 1), then over the three rollouts (C adds 0)
        "slime:train/train_rollout_logprob_abs_diff": (LN(3) / 2 + LN(4)) / 3, "slime:train/tis": ((3 + 1) / 2 + 0.25) / 3,
        "slime:train/tis_clipfrac": (1 / 2) / 3, "slime:train/tis_abs": ((2 + 0) / 2 + 0.75) / 3,
        "slime:train/mis_kl": (-LN(3) / 2 + LN(4)) / 3, "slime:train/mis_k3_kl": (k3a / 2 + k3b) / 3,
        "slime:train/mis_log_ppl_abs_diff": (LN(3) / 2 + LN(4)) / 3, "slime:train/mis_ppl_ratio": (1 / math.sqrt(3) + 4) / 3,
        "slime:train/mis_chi2_token": (((9 + 1) / 2 - 1) + (1 / 16 - 1)) / 3, "slime:train/mis_chi2_seq": ((9 - 1) + (1 / 16 - 1)) / 3,
        "miles:train/train_rollout_kl": (k3a / 2 + k3b) / 3,
        "prime-rl:mismatch_kl/all/mean": (k3a + k3b) / 3, "prime-rl:mismatch_kl/all/std": float(np.std([k3a, 0, k3b], ddof=1)),
        "prime-rl:mismatch_kl/all/max": k3a,
        # A's first token rose 0.5 with a positive advantage, B's fell 0.6 with a negative one: both masked
        "prime-rl:is_masked/mean": (1 / 2 + 1 + 0) / 3, "prime-rl:is_masked/max": 1.0,
        "prime-rl:is_masked_high/mean": (1 / 2) / 3, "prime-rl:is_masked_high/max": 0.5,
        "prime-rl:is_masked_low/mean": 1 / 3, "prime-rl:is_masked_low/max": 1.0,
        "prime-rl:masked_mismatch_kl/mean": (k3a + k3b) / 3, "prime-rl:masked_mismatch_kl/max": k3a,
        "prime-rl:unmasked_mismatch_kl/mean": 0.0, "prime-rl:unmasked_mismatch_kl/max": 0.0,
        "openrlhf:vllm_kl": (LN(1 / 3) + LN(4)) / 3,
        "skyrl:policy/rollout_train_logprobs_abs_diff_mean": (LN(3) + LN(4)) / 3,
        "skyrl:policy/rollout_train_logprobs_abs_diff_std": float(np.std([LN(3), 0, LN(4)], ddof=1)),
        "skyrl:policy/rollout_train_logprobs_abs_diff_max": LN(4), "skyrl:policy/rollout_train_logprobs_abs_diff_min": 0.0,
        "skyrl:is_ratio_mean": 4.25 / 3, "skyrl:tis_token_clip_high_ratio": 1 / 3,
    }
    assert set(s) == set(want)
    for name, value in want.items():
        assert s[name] == pytest.approx(value, rel=1e-12, abs=1e-14), name
    assert x.max() == 0.6
    # token-level IS: weights 2 (3 clipped), 1, 1/4
    assert st_["verl:rollout_corr/rollout_is_mean"] == pytest.approx(3.25 / (3 + e), rel=1e-12)
    assert st_["verl:rollout_corr/rollout_is_eff_sample_size"] == pytest.approx((3.25 / (3 + e) + e) ** 2 * (3 + e) / (4 + 1 + 1 / 16), rel=1e-12)
    # the constants are arguments: slime's clip at 4 clips nothing; per-token loss pools the tokens
    assert mismatch_summary(HAND, slime_tis_clip=4.0)["slime:train/tis_clipfrac"].item() == 0.0
    assert mismatch_summary(HAND, slime_per_token_loss=True)["slime:train/tis"].item() == pytest.approx((3 + 1 + 0.25) / (2 + 1 + 1), rel=1e-12)


def test_table_by_hand():
    t = mismatch_table(HAND)
    assert t["sequence"].to_list() == ["A", "B", "C"] and t["masked_tokens"].to_list() == [2, 1, 0]
    assert t["k1"].to_list()[:2] == pytest.approx([-LN(3) / 2, LN(4)]) and t["k1"][2] is None
    assert t["is_masked"].to_list() == [0.5, 1.0, None]
    assert t["chi2_seq"].to_list()[:2] == pytest.approx([8.0, 1 / 16 - 1])


def test_without_masked_tokens_verl_and_skyrl_give_null():
    s = mismatch_summary(frame([("a", 0, -1.0, -1.0, False)])).row(0, named=True)
    assert s["verl:rollout_corr/kl"] is None and s["skyrl:policy/rollout_train_logprobs_abs_diff_mean"] is None
    assert s["slime:train/tis"] == 0.0 and s["skyrl:is_ratio_mean"] == 0.0


def test_a_masked_token_without_a_logprob_is_refused():
    with pytest.raises(ValueError, match="sequence 'a' has a loss-masked token without a finite"):
        mismatch_summary(frame([("a", 0, None, -1.0, True)]))


# --- property: a plain numpy transcription of each framework's code ---------------------------------------------------

def reference(seqs, C=2.0, B=20.0):
    """seqs: list of (r, t, m, a) numpy arrays. Each framework's reduction, written out as its code does it."""
    r, t, m, a = (np.concatenate([s[i] for s in seqs]) for i in range(4))
    mb = m.astype(bool)
    N, e = m.sum(), 1e-8
    d = np.where(mb, t - r, 0.0)
    out = {}
    if N:
        x = np.abs(np.exp(t[mb]) - np.exp(r[mb]))
        out["verl:training/rollout_probs_diff_max"], out["verl:training/rollout_probs_diff_mean"] = x.max(), x.mean()
        out["verl:rollout_corr/kl"] = ((r - t)[mb]).sum() / (N + e)
        out["verl:rollout_corr/k3_kl"] = (np.exp(d) - d - 1)[mb].sum() / (N + e)
        out["verl:rollout_corr/chi2_token"] = (np.exp(np.clip(d, -B, B)) ** 2)[mb].sum() / (N + e) - 1
        w = np.minimum(np.exp(np.clip(d, -B, B)), C)
        out["verl:rollout_corr/rollout_is_ratio_fraction_high@token"] = (np.exp(np.clip(d, -B, B)) > C)[mb].sum() / (N + e)
        out["openrlhf:vllm_kl"] = ((r - t)[mb]).sum() / N
        out["prime-rl:mismatch_kl/all/mean"] = (np.exp(d) - d - 1)[mb].mean()
        out["prime-rl:mismatch_kl/all/max"] = (np.exp(d) - d - 1)[mb].max()
        absd = np.abs(r - t)[mb]
        out["skyrl:policy/rollout_train_logprobs_abs_diff_mean"] = absd.mean()
        out["skyrl:policy/rollout_train_logprobs_abs_diff_max"], out["skyrl:policy/rollout_train_logprobs_abs_diff_min"] = absd.max(), absd.min()
        if N > 1:
            out["verl:training/rollout_probs_diff_std"] = x.std(ddof=1)
            out["prime-rl:mismatch_kl/all/std"] = (np.exp(d) - d - 1)[mb].std(ddof=1)
            out["skyrl:policy/rollout_train_logprobs_abs_diff_std"] = absd.std(ddof=1)
        wm = w[mb].sum() / (N + e)
        out["verl:rollout_corr/rollout_is_eff_sample_size@token"] = 1 / (((w / (wm + e)) ** 2)[mb].sum() / (N + e))
        out["verl:rollout_corr/rollout_is_mean@token"] = wm
    out["skyrl:is_ratio_mean"] = (np.exp(np.clip(d, -B, B)) * m).sum() / max(N, 1)
    out["skyrl:tis_token_clip_high_ratio"] = ((np.exp(np.clip(d, -B, B)) > C) & mb).sum() / max(N, 1)
    per = {k: [] for k in ("ppl_t", "lpd", "chi2s", "abs", "tis", "clip", "tisabs", "k3", "miles", "schi2t", "slpd", "s_is")}
    pm = {k: [] for k in ("is_masked", "is_masked_high", "is_masked_low", "masked_mismatch_kl", "unmasked_mismatch_kl")}
    for rs, ts, ms, ads in seqs:
        mk = ms.astype(bool)
        n = ms.sum()
        ds = np.where(mk, ts - rs, 0.0)
        rz, tz = np.where(mk, rs, 0.0), np.where(mk, ts, 0.0)
        mean_r, mean_t = rz.sum() / (n + e), tz.sum() / (n + e)  # verl masked_mean(axis=-1)
        per["ppl_t"].append(np.exp(-mean_t))
        per["lpd"].append(mean_r - mean_t)
        per["chi2s"].append(np.exp(2 * np.clip(ds.sum(), -B, B)))
        per["s_is"].append(ds.sum())
        n1 = max(n, 1)
        rho = np.exp(ds)
        per["abs"].append(np.abs(ds)[mk].sum() / n1)
        per["tis"].append(rho[mk].sum() / n1)
        per["clip"].append((np.clip(rho, 0.0, 2.0) != rho)[mk].sum() / n1)
        per["tisabs"].append(np.abs(rho - 1)[mk].sum() / n1)
        per["k3"].append((rho - 1 - ds)[mk].sum() / n1)
        dc = np.clip(ds, -20, 20)
        per["miles"].append(np.clip(np.exp(dc) - 1 - dc, -10, 10)[mk].sum() / n1)
        per["schi2t"].append(((np.exp(dc) ** 2)[mk].sum() / n1 - 1) if n else 0.0)
        per["slpd"].append((rz.sum() / n1 - tz.sum() / n1) if n else None)
        dp = np.exp(ts) - np.exp(rs)
        masked = np.where(ads > 0, dp > 0.2, dp < -0.2)
        high, low = (ads > 0) & (dp > 0.2), (ads < 0) & (dp < -0.2)
        k3 = np.exp(ds) - ds - 1
        pm["is_masked"].append(masked[mk].sum() / n1)
        pm["is_masked_high"].append(high[mk].sum() / n1)
        pm["is_masked_low"].append(low[mk].sum() / n1)
        pm["masked_mismatch_kl"].append(k3[mk & masked].sum() / max((mk & masked).sum(), 1))
        pm["unmasked_mismatch_kl"].append(k3[mk & ~masked].sum() / max((mk & ~masked).sum(), 1))
    if N:
        lpd = np.array(per["lpd"])
        out["verl:rollout_corr/training_ppl"] = np.mean(per["ppl_t"])
        out["verl:rollout_corr/log_ppl_abs_diff"], out["verl:rollout_corr/log_ppl_diff_max"] = np.abs(lpd).mean(), lpd.max()
        out["verl:rollout_corr/ppl_ratio"] = np.exp(lpd).mean()
        out["verl:rollout_corr/chi2_seq"] = np.mean(per["chi2s"]) - 1
        sw = np.array([min(np.exp(np.clip(v, -B, B)), C) for v in per["s_is"]])
        ns = np.array([s[2].sum() for s in seqs])
        out["verl:rollout_corr/rollout_is_mean"] = (sw * ns).sum() / (N + e)
        out["verl:rollout_corr/rollout_is_ratio_fraction_high"] = np.mean([v > LN(C) for v in per["s_is"]])  # over sequences
    for key, name in (("abs", "train_rollout_logprob_abs_diff"), ("tis", "tis"), ("clip", "tis_clipfrac"), ("tisabs", "tis_abs"),
                      ("k3", "mis_k3_kl"), ("schi2t", "mis_chi2_token")):
        out[f"slime:train/{name}"] = np.mean(per[key])
    out["slime:train/mis_log_ppl_abs_diff"] = np.mean([abs(v) if v is not None else 0.0 for v in per["slpd"]])
    out["miles:train/train_rollout_kl"] = np.mean(per["miles"])
    for name, values in pm.items():
        out[f"prime-rl:{name}/mean"], out[f"prime-rl:{name}/max"] = np.mean(values), np.max(values)
    return out


logprob = st.floats(-6.0, 0.0, allow_nan=False)
token = st.tuples(logprob, st.floats(-2.5, 2.5), st.booleans(), st.sampled_from([-1.0, 0.0, 0.5]))
batch = st.lists(st.lists(token, min_size=0, max_size=6), min_size=1, max_size=5)


@pytest.mark.slow
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch)
def test_summary_matches_a_numpy_transcription(seqs):
    rows, arrays = [], []
    for i, toks in enumerate(seqs):
        r = np.array([tk[0] for tk in toks], dtype=np.float64)
        t = np.minimum(r + np.array([tk[1] for tk in toks], dtype=np.float64), 0.0)
        m = np.array([tk[2] for tk in toks], dtype=np.float64)
        a = np.array([tk[3] for tk in toks], dtype=np.float64)
        arrays.append((r, t, m, a))
        rows += [(f"s{i}", j, float(r[j]), float(t[j]), bool(m[j]), float(a[j])) for j in range(len(toks))]
    if not rows:
        return
    step = frame(rows, advantage=True)
    seqs_present = [arr for arr in arrays if len(arr[0])]
    want = reference(seqs_present)
    got = mismatch_summary(step, chunk_size=3).row(0, named=True)  # tiny batches: sequences cut across them
    got_token = mismatch_summary(step, verl_rollout_is="token").row(0, named=True)
    for name, value in want.items():
        if name.endswith("@token"):
            assert got_token[name[:-6]] == pytest.approx(value, rel=1e-9, abs=1e-12), name
        else:
            assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


# --- sampling masks: the renderers' rules, named ----------------------------------------------------------------------

def _support_step(ids, logprobs=None, token_id=1, trainer=None):
    trainer = trainer if trainer is not None else [-0.5] * len(ids)
    data = {"sequence": ["s"], "position": [3], "token_id": [token_id], "rollout_logprob": [-0.3], "trainer_logprob": [-0.4],
            "mask": [True], "support_ids": [ids], "trainer_support_logprobs": [trainer]}
    schema = {"support_ids": pl.List(pl.Int64), "trainer_support_logprobs": pl.List(pl.Float64)}
    if logprobs is not None:
        data["support_logprobs"], schema["support_logprobs"] = [logprobs], pl.List(pl.Float64)
    return pl.DataFrame(data, schema_overrides=schema)


@pytest.mark.parametrize("step, rule", [
    (_support_step([]), "empty_row"),
    (_support_step([1, 1]), "repeated_id"),
    (_support_step([0, 2]), "sampled_id_missing"),
    (_support_step([0, 1], [LN(0.5), LN(0.4)]), "probabilities_do_not_sum_to_1"),
    (_support_step([0, 1], [LN(0.5)]), "logprobs_not_parallel"),
    (_support_step([0, 1], trainer=[-0.5]), "trainer_support_missing"),
])
def test_support_rules_are_named_errors(step, rule):
    with pytest.raises(SamplingMaskError) as caught:
        mismatch_summary(step)
    assert caught.value.rule == rule and caught.value.sequence == "s" and caught.value.position == 3


def test_a_support_within_tolerance_is_accepted_and_replay_can_be_declined():
    step = _support_step([0, 1], [LN(0.5) + 4e-5, LN(0.5)], trainer=[LN(0.3), LN(0.1)])
    s = mismatch_summary(step)
    assert s["bia:support_tokens"].item() == 1
    assert mismatch_table(step)["k1"].item() == pytest.approx(-0.3 - (-0.4 - LN(0.4)))
    assert mismatch_table(step, replay=False)["k1"].item() == pytest.approx(-0.3 + 0.4)  # the trainer's value taken as already replayed


# --- inputs: Parquet (streamed, pieces), Ray, dumps -------------------------------------------------------------------

def test_parquet_pieces_equal_the_frame(tmp_path):
    path = tmp_path / "step.parquet"
    HAND.write_parquet(path)
    whole = mismatch_summary(HAND)
    pieces = mismatch_summary(path, piece_rows=1, chunk_size=1)  # every token its own piece: sequences cut and merged
    for name in whole.columns:
        assert pieces[name].item() == pytest.approx(whole[name].item(), rel=1e-12, abs=1e-15), name
    assert mismatch_summary(str(tmp_path / "*.parquet")).equals(mismatch_summary([path]))


@pytest.mark.slow  # a local Ray instance takes seconds to start
def test_ray_engine_gives_equal_results(tmp_path):
    ray = pytest.importorskip("ray")
    path = tmp_path / "step.parquet"
    HAND.write_parquet(path)
    # the test owns its local Ray instance, as tests/test_study.py does: one left running makes a later ray.init fail
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert mismatch_summary(path, engine="ray", piece_rows=2).equals(mismatch_summary(path, piece_rows=2))
        with pytest.raises(ValueError, match="engine='ray' reads Parquet files"):
            mismatch_summary(HAND, engine="ray")
    finally:
        ray.shutdown()


def test_primerl_export_dump(tmp_path):
    lines = [
        {"schema_version": 1, "sample_id": "s0", "token_ids": [5, 6, 7], "inference_logprobs": [-0.1, -2.0, -0.3],
         "trainer_logprobs": [-0.12, -1.9, -0.3], "loss_mask": [1, 1, 0]},
        {"schema_version": 1, "sample_id": "s1", "token_ids": [8], "inference_logprobs": [-0.5], "trainer_logprobs": [-0.5], "loss_mask": [1]},
    ]
    path = tmp_path / "export.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    s = mismatch_summary(read_dump(path))
    assert s["bia:sequences"].item() == 2 and s["bia:masked_tokens"].item() == 3
    assert s["openrlhf:vllm_kl"].item() == pytest.approx((0.02 - 0.1 + 0) / 3)
    assert s["slime:train/train_rollout_logprob_abs_diff"].item() == pytest.approx((0.12 / 2 + 0) / 2)


def test_two_dumps_joined_on_record_and_position(tmp_path):
    def export(name, values):
        p = tmp_path / name
        p.write_text(json.dumps({"schema_version": 1, "token_ids": [5, 6], "inference_logprobs": values, "loss_mask": [1, 1]}) + "\n")
        return read_dump(p)

    s = mismatch_summary((export("rollout.jsonl", [-0.1, -2.0]), export("trainer.jsonl", [-0.12, -1.9])))
    assert s["verl:rollout_corr/k3_kl"].item() == pytest.approx(0.0026848, rel=1e-5)
    with pytest.raises(ValueError, match="score different tokens"):
        other = tmp_path / "other.jsonl"
        other.write_text(json.dumps({"schema_version": 1, "token_ids": [5, 9], "inference_logprobs": [-0.1, -0.2]}) + "\n")
        mismatch_summary((export("rollout2.jsonl", [-0.1, -2.0]), read_dumps([other])))


def test_constants_are_checked():
    with pytest.raises(ValueError, match="verl_rollout_is"):
        mismatch_summary(HAND, verl_rollout_is="batch")
    with pytest.raises(TypeError):
        mismatch_summary(HAND, no_such_constant=1.0)
    assert _mismatch.Constants().verl_rollout_is == "sequence"
