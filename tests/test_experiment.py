"""The torch experiment: batch-invariant bits at every c in the one-by-one, fixed-tiles and row-invariant modes,
default-mode drift detected, reruns identical."""

from __future__ import annotations

import json

import polars as pl
import pytest

torch = pytest.importorskip("torch")

from analysis.core._output import OutputExists  # noqa: E402
from analysis.experiment import ExperimentError, bundled_model, run_experiment  # noqa: E402
from analysis.run import read_run, slot_table, to_witness  # noqa: E402

pytestmark = pytest.mark.slow

SMALL = {"prompts": ["Return a new list"], "ladder": (1, 2, 4), "max_tokens": 8, "top_k": 3}
MODES = ("default", "one-by-one", "fixed-tiles", "row-invariant")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """default, one-by-one, fixed-tiles and row-invariant runs of one experiment."""
    out = tmp_path_factory.mktemp("experiment")
    return tuple(read_run(folder) for folder in run_experiment(out, modes=MODES, **SMALL))


@pytest.mark.parametrize("index", [1, 2, 3], ids=["one-by-one", "fixed-tiles", "row-invariant"])
def test_invariant_modes_are_bitwise_identical_at_every_c(runs, index):
    table = slot_table(runs[index])
    assert table.height == 1 + 2 + 4
    assert table["divergence_at"].null_count() == table.height and (table["length"] == 8).all() and (table["bitwise_prefix"] == 8).all()
    assert table["max_ulp"].to_list() == [0] * 7


def test_default_mode_differences_are_detected_in_the_bits(runs):
    """The check above, with the mode switched off: a batched row's float32 logprobs differ from m=1's."""
    table = slot_table(runs[0])
    alone = table.filter(pl.col("c") == 1)
    batched = table.filter(pl.col("c") > 1)
    assert alone["bitwise_prefix"].to_list() == [8]  # c=1 runs the reference's own shapes
    assert (batched["bitwise_prefix"] < 8).any(), "no bit-level difference: the default mode would not be told apart"
    assert batched["max_ulp"].max() > 0


def test_rerun_gives_identical_bits(runs, tmp_path):
    again = read_run(run_experiment(tmp_path, modes=("default",), **SMALL)[0])
    first = runs[0].dump.tokens.select("record", "position", "token_id", "raw_value")
    assert again.dump.tokens.select("record", "position", "token_id", "raw_value").equals(first)
    assert all(run.manifest["determinism"]["identical"] for run in runs)


def test_manifest_and_witness(runs):
    manifest = runs[0].manifest
    assert manifest["requested"]["kernel_mode"] == "default" and manifest["effective"]["dtype"] == "float32"
    assert [run.manifest["effective"]["kernel_mode"] for run in runs] == list(MODES)
    assert manifest["identity"]["model"]["path"] == bundled_model().name
    assert manifest["environment"]["torch"] == torch.__version__
    w = to_witness(runs[1], "p0")
    assert [b["result"] for b in w["bands"]] == ["PASS", "PASS", "PASS"]
    assert all(b["divergence_at"] == 8 for b in w["bands"])
    rates = runs[1].requests["decode_tok_s"].drop_nulls()
    assert rates.len() == runs[1].requests.height and (rates > 0).all()  # live captures carry arrival times


def test_needle_layout_and_bfloat16(tmp_path):
    """The old name of one-by-one still works (its folder keeps the name asked for); fixed-tiles and row-invariant beside it."""
    folders = run_experiment(tmp_path, modes=("batch-invariant", "fixed-tiles", "row-invariant"), layout="needle", dtype="bfloat16",
                             **{**SMALL, "prompts": ["Return a new list", "The default value is", "Raise"]})
    assert [f.name for f in folders] == ["batch-invariant", "fixed-tiles", "row-invariant"]
    for folder in folders:
        run = read_run(folder)
        table = slot_table(run)
        assert table.height == 3 * 3  # one recorded target per band
        assert (table["bitwise_prefix"] == 8).all()
        assert run.manifest["effective"]["dtype"] == "bfloat16"
        lines = [json.loads(line) for line in (folder / "captures" / "requests.jsonl").read_text().splitlines()]
        assert {line["batch_row"] for line in lines if line.get("c") == 4} <= {0, 1, 2, 3}
    manifest = read_run(folders[0]).manifest
    assert (manifest["requested"]["kernel_mode"], manifest["effective"]["kernel_mode"]) == ("batch-invariant", "one-by-one")


@pytest.mark.parametrize("settings, words", [
    ({"dtype": "float64"}, "--dtype: expected 'float32' or 'bfloat16', got 'float64'"),
    ({"modes": ("fast",)}, "--modes: expected distinct kernel modes"),
    ({"modes": ("one-by-one", "batch-invariant")}, "--modes: expected distinct kernel modes"),  # one mode under two names
    ({"modes": ("row-invariant",), "environ": {"MKL_CBWR": "COMPATIBLE"}},
     "--modes: the row-invariant mode needs MKL's GEMM to sum each row alike whatever the row count, which MKL_CBWR=COMPATIBLE does not"),
    ({"device": "tpu"}, "--device: expected cpu, cuda or cuda:N, got 'tpu'"),
    ({"max_tokens": 0}, "--max-tokens: expected an integer >= 1, got 0"),
    ({"max_tokens": -1}, "--max-tokens: expected an integer >= 1, got -1"),
    ({"top_k": 0}, "--top-k: expected an integer >= 1, got 0"),
    ({"top_k": 100000}, "--top-k 100000: the model has only 256 tokens"),
    ({"max_tokens": 1000}, "the longest prompt (21 tokens) and the completion exceed the model's context of 256"),
    ({"prompts": []}, "--prompts: expected at least one non-empty prompt"),
    ({"ladder": [1, 0]}, "--ladder: expected distinct batch sizes >= 1"),
    ({"ladder": [4, 4]}, "--ladder: expected distinct batch sizes >= 1"),
    ({"model_path": "/nonexistent/m.safetensors"}, "--model /nonexistent/m.safetensors: no such file or folder"),
])
def test_bad_settings_are_refused_before_anything_is_written(tmp_path, monkeypatch, settings, words):
    settings = dict(settings)
    for name, value in settings.pop("environ", {}).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ExperimentError) as caught:
        run_experiment(tmp_path / "out", **settings)
    assert words in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_no_gpu_is_said():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ExperimentError, match="sees no GPU"):
        run_experiment("unused", device="cuda")


def test_an_existing_run_is_not_overwritten_unless_forced(tmp_path):
    kept = tmp_path / "out" / "default" / "manifest.json"
    kept.parent.mkdir(parents=True)
    kept.write_text("yesterday's run")
    with pytest.raises(OutputExists, match="the default run already exists; give force=True to overwrite it"):
        run_experiment(tmp_path / "out", modes=("default",), ladder=(1,), max_tokens=2, top_k=2)
    assert kept.read_text() == "yesterday's run"
    (folder,) = run_experiment(tmp_path / "out", modes=("default",), ladder=(1,), max_tokens=2, top_k=2, force=True)
    assert json.loads(kept.read_text())["producer"] == "bia experiment" and folder == kept.parent


def test_modes_side_by_side(runs):
    from analysis import mode_comparison

    table = mode_comparison(runs)
    by_mode = {(r["kernel_mode"], r["c"]): r for r in table.iter_rows(named=True)}
    assert [by_mode[(mode, 4)]["bit_identical_share"] for mode in MODES[1:]] == [1.0, 1.0, 1.0]
    assert by_mode[("default", 4)]["bit_identical_share"] < 1.0
    assert by_mode[("default", 1)]["bit_identical_share"] == 1.0
    assert all(r["median_decode_tok_s"] > 0 for r in by_mode.values())
    assert {r["rate_vs_default"] for r in by_mode.values() if r["kernel_mode"] == "default"} == {1.0}  # the cost, against default
    one_by_one, default = by_mode[("one-by-one", 4)], by_mode[("default", 4)]
    assert one_by_one["rate_vs_default"] == one_by_one["median_decode_tok_s"] / default["median_decode_tok_s"]
    assert (runs[0].path / "derived" / "tokens.parquet").exists()  # the derived tables are written with the run


@pytest.mark.engine
def test_a_local_hugging_face_model(tmp_path):
    """A small GPT-2 built here and saved locally: the experiment loads it offline and the modes behave."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder = tmp_path / "hf-tiny"
    words = ["the", "a", "value", "is", "return", "list", "if", "argument", "new", "of"]
    vocab = {"[UNK]": 0}
    for word in words:
        vocab[word] = len(vocab)
        vocab["Ġ" + word] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(vocab), n_positions=64, n_embd=128, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    with pytest.raises(ExperimentError, match="fixed-tiles runs bia's own model's layers"):
        run_experiment(tmp_path / "runs", model_path=folder, prompts=["if the argument is"], max_tokens=6, top_k=3)
    with pytest.raises(ExperimentError, match="--modes: fixed-tiles and row-invariant run bia's own model's layers, not a Hugging Face "
                                              "model's .*; leave them out of --modes"):
        run_experiment(tmp_path / "runs", model_path=folder, modes=MODES, prompts=["if the argument is"], max_tokens=6, top_k=3)
    default, invariant = run_experiment(tmp_path / "runs", model_path=folder, modes=("default", "one-by-one"),
                                        prompts=["if the argument is"], ladder=(1, 2, 4), max_tokens=6, top_k=3)
    assert (slot_table(read_run(invariant))["bitwise_prefix"] == 6).all()
    table = slot_table(read_run(default))
    assert table.filter(pl.col("c") == 1)["bitwise_prefix"].to_list() == [6]
    tokens = read_run(invariant).dump.tokens
    assert set(tokens["token_id"].to_list()) <= set(vocab.values())
    assert read_run(invariant).manifest["identity"]["model"]["path"] == "hf-tiny"
