"""transformers as an in-process engine (issue 34 item 1): its own batched generate, left-padded and continuous, probed on the
bundled model written as a GPT-2 checkpoint, through bia experiment --hf as a user runs it."""

from __future__ import annotations

import polars as pl
import pytest
from _cli import bia

pytest.importorskip("transformers")

from analysis import judge, probe_callable, read_run  # noqa: E402
from analysis.experiment import bundled_model  # noqa: E402
from analysis.experiment.engines import load_checkpoint, padded_generate, write_hf_checkpoint  # noqa: E402

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_hf_checkpoint(bundled_model(), tmp_path_factory.mktemp("hf") / "tiny")


def test_bia_experiment_hf_writes_a_run_per_way_transformers_batches_and_each_parts_bits_in_a_batch(checkpoint, tmp_path):
    done = bia("experiment", "--hf", str(checkpoint), "-o", str(tmp_path), "--ladder", "1,4", "--max-tokens", "12", "--top-k", "3",
               timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"wrote {tmp_path / 'padded'}", f"wrote {tmp_path / 'continuous'}"]
    for way in ("padded", "continuous"):
        run = read_run(tmp_path / way)
        row = judge(run).to_dicts()[0]
        assert row["engine"].startswith("transformers ") and row["engine"].endswith(f"({way} batching)")
        # alone it repeats itself; in a batch of 4 copies (no padding at all) the batched GEMMs sum in another order
        assert (row["verdict"], row["cause"], row["alone_parted"], row["tokens_parted"]) == ("RED", "co-batching", 0, 0)
        assert row["next_step"].startswith("batch-invariant kernels: one prompt per generate call")
        assert run.manifest["identity"]["model"] == {"path": "tiny"} and row["bands_unformed"] == 0


def test_padding_a_prompt_among_longer_ones_is_probed_in_the_needle_layout(checkpoint, tmp_path):
    generate = padded_generate(*load_checkpoint(checkpoint), max_new_tokens=8, top_k=2)
    run = probe_callable(generate, ["Hi", "If the argument is longer"], tmp_path / "run", ladder=[1, 2], layout="needle")
    row = judge(run).to_dicts()[0]
    assert row["requests"] == 2 and row["alone_parted"] == 0 and row["verdict"] in ("RED", "AMBER")
    lengths = read_run(tmp_path / "run").requests.filter(pl.col("role") == "band")["completion_tokens"].to_list()
    assert lengths == [8] * 4  # c=1 and c=2 for each prompt, all 8 tokens: the end-of-sequence token never stops one early


@pytest.mark.parametrize("target, code, words", [
    ("missing", 2, "--hf {path}: no such folder"),  # a file an option reads is a bad option (docs/cli.md)
    ("empty", 2, "--hf {path}: not a Hugging Face checkpoint folder (no config.json), nor bia's model (.safetensors)"),
])
def test_a_checkpoint_that_is_not_one_is_said_in_one_line(tmp_path, target, code, words):
    path = tmp_path / target
    if target == "empty":
        path.mkdir()
    done = bia("experiment", "--hf", str(path), "-o", str(tmp_path / "out"), timeout=120)
    assert done.returncode == code and done.stderr == f"error: {words.format(path=path)}\n"
