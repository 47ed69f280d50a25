"""The trainer's recompute (analysis.experiment.trainer): prefill == decode bit for bit in the modes that claim it,
at every position of sequences of mixed lengths, in float32 and bfloat16; the default mode's drift found by the same
check; "KL exactly 0" on every framework's metric in the bundled pairs of the invariant run, and not in the default's."""

from __future__ import annotations

import json

import polars as pl
import pytest
from _cli import bia

torch = pytest.importorskip("torch")

import analysis  # noqa: E402
from analysis.cli import app  # noqa: E402
from analysis.core._modes import INVARIANT_MODES, PREFILL_DECODE_MODES  # noqa: E402
from analysis.core._output import OutputExists  # noqa: E402
from analysis.experiment import ExperimentError, bundled_model  # noqa: E402
from analysis.experiment.model import decode, load_model  # noqa: E402
from analysis.experiment.trainer import recompute_logprobs, write_trainer_pairs  # noqa: E402
from conftest import ROOT  # noqa: E402

pytestmark = pytest.mark.slow

# 5 to 99 bytes: with 24 tokens each, the sequences span one to four attention splits of 32 keys
PROMPTS = [
    "Raise",
    "If the argument is",
    "Return a new list of the values in the order given",
    "This function returns the number of items in the sequence; if the argument is not a sequence, raise",
]
TOKENS = 24
TRAINER = ROOT / "data" / "experiment-cpu" / "trainer"
# The bundled fixed-tiles run's first prompt decoded alone, as its reference was: its float32 logprobs, as JSON.
_DECODE_P0 = """
import json, torch
from analysis.experiment import DEFAULT_PROMPTS, bundled_model
from analysis.experiment.model import decode, load_model
model = load_model(bundled_model(), torch.float32)
print(json.dumps(decode(model, [model.encode(DEFAULT_PROMPTS[0])], mode="fixed-tiles", max_tokens=64, top_k=5)[0].logprobs))
"""


def _parted(model, mode: str, batch_size: int = 3) -> list[tuple[int, int]]:
    """(sequence, position) of every completion token whose recomputed logprob differs in any bit from its decode step's.

    The sampler decodes the four prompts as one batch; the trainer rescores them three to a forward pass, so
    a pass mixes lengths and the batches differ from the sampler's."""
    encoded = [model.encode(p) for p in PROMPTS]
    sampled = decode(model, encoded, mode=mode, max_tokens=TOKENS, top_k=1)
    again = recompute_logprobs(model, [(p, s.token_ids) for p, s in zip(encoded, sampled)], mode=mode, batch_size=batch_size)
    assert [len(r) for r in again] == [TOKENS] * len(PROMPTS)
    return [(i, k) for i, (s, r) in enumerate(zip(sampled, again)) for k, (a, b) in enumerate(zip(s.logprobs, r)) if a != b]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def model(request):
    return load_model(bundled_model(), getattr(torch, request.param))


@pytest.fixture(scope="module")
def float32_model():
    return load_model(bundled_model(), torch.float32)


@pytest.mark.parametrize("mode", PREFILL_DECODE_MODES)
def test_prefill_gives_the_decode_bits_at_every_position(model, mode):
    assert _parted(model, mode) == []


def test_the_modes_claiming_prefill_equals_decode_are_invariant_modes():
    assert set(PREFILL_DECODE_MODES) <= set(INVARIANT_MODES)


@pytest.mark.parametrize("mode", [m for m in INVARIANT_MODES if m not in PREFILL_DECODE_MODES])
def test_an_invariant_mode_without_the_claim_does_part(float32_model, mode):
    """Batch invariance alone does not give prefill == decode: one-by-one's lone row still runs a prompt's matmuls
    over its whole length. A mode that starts to pass here belongs in PREFILL_DECODE_MODES."""
    assert len(_parted(float32_model, mode)) > 0


def test_the_same_check_finds_the_default_modes_drift(float32_model):
    """The control: in float32 the default mode's one pass parts from its decode (on this CPU about 2 tokens in 3,
    by about 1e-6). In bfloat16 this CPU's default mode happens to give equal bits (its bfloat16 matmuls round
    a float32 sum, which hides a last-bit difference), so the bfloat16 control would prove nothing here."""
    parted = _parted(float32_model, "default")
    assert len(parted) > len(PROMPTS) * TOKENS // 4


def test_batch_size_changes_no_bit_in_fixed_tiles(float32_model):
    encoded = [float32_model.encode(p) for p in PROMPTS]
    pairs = [(p, p[::-1][:10]) for p in encoded]  # any ids: teacher forcing scores whatever it is given
    one = recompute_logprobs(float32_model, pairs, mode="fixed-tiles", batch_size=1)
    assert recompute_logprobs(float32_model, pairs, mode="fixed-tiles", batch_size=4) == one


def test_a_recompute_by_hand(float32_model):
    """The first completion token's logprob is the prompt's last position's log-softmax at that token (default mode, alone)."""
    prompt, token = float32_model.encode("If the"), 32
    with torch.no_grad():
        logits, _ = float32_model(torch.tensor([prompt]), torch.arange(len(prompt))[None], torch.ones(1, len(prompt), dtype=torch.bool))
    by_hand = float(logits[0, -1].float().log_softmax(-1)[token])
    assert recompute_logprobs(float32_model, [(prompt, [token])], mode="default") == [[by_hand]]


@pytest.mark.parametrize(("sequences", "batch_size", "words"), [
    ([([], [1])], 8, "sequence 0: the prompt is empty"),
    ([([1], [2]), ([1], [2] * 300)], 8, "sequence 1: 301 tokens exceed the model's context of 256"),
    ([([1, 999], [2])], 8, "sequence 0: a token id outside the model's vocabulary of 256"),
    ([([1], [2])], 0, "batch_size: expected an integer >= 1, got 0"),
])
def test_what_cannot_be_scored_is_refused(float32_model, sequences, batch_size, words):
    with pytest.raises(ValueError, match=words):
        recompute_logprobs(float32_model, sequences, mode="default", batch_size=batch_size)


# --- the bundled pairs: KL exactly 0 in the invariant mode, not in the default ----------------------------------


def _summary(name: str) -> pl.DataFrame:
    return analysis.mismatch_summary(analysis.read_dump(TRAINER / f"{name}.jsonl"))


def _no_mismatch(name: str) -> pl.DataFrame:
    """The same tokens with the trainer's logprob set to the sampler's: every metric at its value for no mismatch at all."""
    tokens = analysis.read_dump(TRAINER / f"{name}.jsonl").tokens
    frame = tokens.select(pl.col("record").alias("sequence"), "position", pl.col("logprob").alias("rollout_logprob"),
                          pl.col("logprob").alias("trainer_logprob"), pl.lit(True).alias("mask"))
    return analysis.mismatch_summary(frame)


@pytest.mark.parametrize("name", PREFILL_DECODE_MODES)
def test_bundled_pairs_of_the_prefill_decode_modes_give_exactly_zero_on_every_metric(name):
    summary, identical = _summary(name), _no_mismatch(name)
    # 2 prompts x (2 references + 1 + 4 + 8 + 16 batched requests), 64 tokens each
    assert summary["bia:sequences"].item() == 62 and summary["bia:masked_tokens"].item() == 62 * 64
    assert summary.drop("bia:sequences").rows() == identical.drop("bia:sequences").rows()
    for name in ("verl:rollout_corr/k3_kl", "verl:rollout_corr/kl", "slime:train/train_rollout_logprob_abs_diff", "openrlhf:vllm_kl",
                 "prime-rl:mismatch_kl/all/max", "miles:train/train_rollout_kl", "skyrl:policy/rollout_train_logprobs_abs_diff_max"):
        assert summary[name].item() == 0.0, name


@pytest.mark.parametrize("name", ["default", "batch-invariant"])
def test_bundled_pairs_of_the_other_modes_are_not_zero(name):
    """default parts by batching and by prefill vs decode; batch-invariant (one-by-one) by prefill vs decode alone."""
    summary = _summary(name)
    lines = [json.loads(line) for line in (TRAINER / f"{name}.jsonl").read_text().splitlines()]
    deltas = [t - r for line in lines for r, t in zip(line["inference_logprobs"], line["trainer_logprobs"])]
    # K1 by hand: verl's rollout_corr/kl and OpenRLHF's vllm_kl are the token mean of r - t over every (masked) token
    assert summary["openrlhf:vllm_kl"].item() == pytest.approx(-sum(deltas) / len(deltas), rel=1e-9, abs=1e-18)
    assert summary["slime:train/train_rollout_logprob_abs_diff"].item() > 0
    assert 0 < summary["verl:rollout_corr/k3_kl"].item() < 1e-10  # K3 ~ delta^2 / 2 with |delta| ~ 1e-6
    assert summary["skyrl:policy/rollout_train_logprobs_abs_diff_max"].item() == max(abs(d) for d in deltas)


def test_the_bundled_pairs_are_what_their_command_writes(tmp_path):
    """The fixed-tiles pairs rewritten from the bundled run by data/README.md's command give the same bytes. In a child
    process with MKL_CBWR=AVX2 (conftest's, and the one the bundled runs were decoded with): MKL's code paths sum in
    different orders, and a recompute compares with the sampler's bits only on the same path. (The other modes' bits
    may depend on the thread count, so they are not compared.)"""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MKL_CBWR": "AVX2", "OMP_NUM_THREADS": "1"}
    # First: does this CPU decode the bundled run's own bits? Another CPU's MKL may sum in another order, and then
    # nothing made here can match bits made there.
    again = subprocess.run([sys.executable, "-c", _DECODE_P0], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    bundled = json.loads((TRAINER / "fixed-tiles.jsonl").read_text().splitlines()[0])
    if json.loads(again.stdout) != bundled["inference_logprobs"]:
        pytest.skip("this CPU decodes the bundled fixed-tiles run's first prompt to other bits than the machine that wrote it")
    done = bia("experiment", "-o", str(tmp_path), "--trainer", "--recompute", str(ROOT / "data" / "experiment-cpu" / "fixed-tiles"),
               env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    written = tmp_path / "trainer" / "fixed-tiles.jsonl"
    assert written.read_bytes() == (TRAINER / "fixed-tiles.jsonl").read_bytes()
    first = json.loads(written.read_text().splitlines()[0])
    assert first["sample_id"] == "p0-ref1" and first["kernel_mode"] == "fixed-tiles" and first["loss_mask"] == [1] * 64


def test_the_weights_must_be_the_runs(tmp_path):
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"not the weights")
    with pytest.raises(ExperimentError, match="other.safetensors: its sha256 differs from the weights"):
        write_trainer_pairs(ROOT / "data" / "experiment-cpu" / "default", tmp_path / "pairs.jsonl", model_path=other)
    (tmp_path / "pairs.jsonl").write_text("")
    with pytest.raises(OutputExists):
        write_trainer_pairs(ROOT / "data" / "experiment-cpu" / "default", tmp_path / "pairs.jsonl")


def test_bia_experiment_trainer(tmp_path):
    from typer.testing import CliRunner

    runner = CliRunner()
    out = tmp_path / "exp"
    result = runner.invoke(app, ["experiment", "-o", str(out), "--modes", "fixed-tiles", "--ladder", "1,2", "--max-tokens", "4",
                                 "--top-k", "2", "--trainer", "--trainer-batch", "3"])
    assert result.exit_code == 0, result.output
    assert f"wrote {out / 'trainer' / 'fixed-tiles.jsonl'}" in result.output
    summary = analysis.mismatch_summary(analysis.read_dump(out / "trainer" / "fixed-tiles.jsonl"))
    assert summary["bia:sequences"].item() == 2 * (2 + 1 + 2) and summary["verl:rollout_corr/k3_kl"].item() == 0.0
    again = runner.invoke(app, ["experiment", "-o", str(out), "--recompute", str(out / "fixed-tiles")])
    assert again.exit_code == 2 and "--recompute: give --trainer too" in again.output
