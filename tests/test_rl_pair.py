"""The sampler-trainer pair's pieces without a server (analysis.experiment.trainer): reading vLLM's answer, the
trainer's teacher-forced recompute against step-by-step decoding, the export bia reads, and the bundled pair
(data/vllm-hf-pair, made by scripts/rl_pair.py against a real vLLM) scored by mismatch_summary.
tests/test_vllm.py makes a pair against the real server."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis import mismatch_summary, read_dumps
from analysis.experiment.trainer import PairError, rollout_from_answer, write_pair

BUNDLED = Path(__file__).resolve().parent.parent / "data" / "vllm-hf-pair" / "pairs.jsonl"


def _answer(**change):
    answer = {"prompt_token_ids": [72, 105], "choices": [{"token_ids": [33, 10], "finish_reason": "length",
                                                          "logprobs": {"content": [{"logprob": -0.25}, {"logprob": -2.0}]}}]}
    answer["choices"][0].update(change)
    return answer


def test_a_rollout_from_vllms_answer():
    assert rollout_from_answer(_answer(), "p0") == {"prompt_ids": [72, 105], "token_ids": [33, 10], "logprobs": [-0.25, -2.0],
                                                    "finish_reason": "length"}


@pytest.mark.parametrize("answer, message", [
    ({"error": "no"}, "p0: the answer has no choices"),
    ({"choices": [{"token_ids": [1], "logprobs": {"content": [{"logprob": -1.0}]}}]}, "p0: prompt_token_ids is missing or empty"),
    (_answer(token_ids=None), r"p0: choices\[0\].token_ids is missing or empty \(vLLM gives it with return_token_ids"),
    (_answer(logprobs=None), r"p0: choices\[0\].logprobs.content is missing or empty"),
    (_answer(token_ids=[33]), r"p0: choices\[0\].logprobs.content holds 2 entries for 1 token_ids"),
])
def test_an_answer_that_cannot_be_paired_says_which_field(answer, message):
    with pytest.raises(PairError, match=message):
        rollout_from_answer(answer, "p0")


def test_write_pair_refuses_what_does_not_match(tmp_path):
    rollout = rollout_from_answer(_answer(), "p0")
    with pytest.raises(PairError, match="1 trainer recomputes for 2 rollouts"):
        write_pair(tmp_path / "a.jsonl", [rollout, rollout], [[-0.25, -2.0]])
    with pytest.raises(PairError, match="rollout 0: the trainer scored 1 tokens of 2"):
        write_pair(tmp_path / "b.jsonl", [rollout], [[-0.25]])


def test_the_export_is_read_as_prime_rls_and_scored(tmp_path):
    """The spec's worked example (r = [-0.1, -2.0], t = [-0.12, -1.9]) written as a pair and read back."""
    rollout = {"prompt_ids": [1], "token_ids": [5, 6], "logprobs": [-0.1, -2.0], "finish_reason": "length"}
    path = write_pair(tmp_path / "pair.jsonl", [rollout], [[-0.12, -1.9]], sample_ids=["s"])
    line = json.loads(path.read_text())
    assert line["prompt_token_ids"] == [1] and line["loss_mask"] == [True, True] and line["sample_id"] == "s"
    dump = read_dumps(path)
    assert dump.requests["endpoint"].to_list() == ["prime-rl export"]
    summary = mismatch_summary(dump).row(0, named=True)
    assert summary["openrlhf:vllm_kl"] == pytest.approx(-0.04)  # K1 token mean: ((-0.1 + 0.12) + (-2.0 + 1.9)) / 2
    assert summary["verl:rollout_corr/k3_kl"] == pytest.approx(0.0026848, abs=1e-7)
    assert summary["slime:train/train_rollout_logprob_abs_diff"] == pytest.approx(0.06)  # (0.02 + 0.1) / 2


def test_the_trainer_recompute_equals_decoding_step_by_step(tmp_path):
    """The trainer's one pass over prompt + completion, batched with right padding, scores each token as the model's
    own step-by-step decode does, within float32 rounding (the shapes differ, so the sums may round differently)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from analysis.experiment import bundled_model
    from analysis.experiment.engines import write_hf_checkpoint
    from analysis.experiment.model import decode, load_model
    from analysis.experiment.trainer import trainer_logprobs

    torch.manual_seed(0)
    checkpoint = write_hf_checkpoint(bundled_model(), tmp_path / "hf")
    model = load_model(bundled_model())
    prompts = [list(b"If the argument is"), list(b"Return")]  # different lengths: the second is padded in the batch
    rollouts = []
    for prompt in prompts:
        (decoded,) = decode(model, [prompt], mode="default", max_tokens=12, top_k=1)
        rollouts.append({"prompt_ids": prompt, "token_ids": decoded.token_ids, "logprobs": decoded.logprobs})
    for batch_size in (1, 2):
        scored = trainer_logprobs(checkpoint, rollouts, batch_size=batch_size)
        for rollout, mine in zip(rollouts, scored):
            assert len(mine) == 12
            assert np.abs(np.array(mine) - np.array(rollout["logprobs"])).max() < 1e-4


def test_the_bundled_pair_is_scored_in_every_frameworks_terms():
    """data/vllm-hf-pair: each line's numbers, and the summary's metrics from them as the spec writes them."""
    lines = [json.loads(line) for line in BUNDLED.read_text().splitlines()]
    r = np.concatenate([line["inference_logprobs"] for line in lines])
    t = np.concatenate([line["trainer_logprobs"] for line in lines])
    delta = t - r
    summary = mismatch_summary(read_dumps(BUNDLED)).row(0, named=True)
    assert summary["bia:tokens"] == r.size == sum(len(line["token_ids"]) for line in lines)
    assert summary["openrlhf:vllm_kl"] == pytest.approx(-delta.mean(), rel=1e-9, abs=1e-15)
    assert summary["prime-rl:mismatch_kl/all/mean"] == pytest.approx((np.exp(delta) - 1 - delta).mean(), rel=1e-6, abs=1e-15)
    assert summary["skyrl:policy/rollout_train_logprobs_abs_diff_max"] == pytest.approx(np.abs(delta).max(), rel=1e-12)
    assert 0 < np.abs(delta).max() < 1e-4  # two engines, one set of float32 weights: rounding, not a different model
