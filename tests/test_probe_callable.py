"""probe_callable (issue 34 item 1): an in-process engine probed as bia probe probes a server, on toy engines whose answer is
worked out by hand and on bia's own torch model, whose default kernels part bits in a batch and whose fixed tiles do not."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest

from analysis import CallableError, OutputExists, judge, probe_callable, read_run, slot_table

pytestmark = pytest.mark.slow


def _shifted(prompts):
    """A toy engine: two tokens per prompt; in a batch the second logprob moves by 2**-20 (32 float32 ULPs at -0.25)."""
    return [{"token_ids": [len(p), 7], "logprobs": [-0.5, -0.25 - (len(prompts) > 1) * 2 ** -20],
             "top_logprobs": [[(len(p), -0.5), (3, -1.5)], [(7, -0.25), (9, -2.0)]]} for p in prompts]


def test_a_toy_engine_whose_bits_move_in_a_batch_is_red_at_the_token_and_ulps_worked_out_by_hand(tmp_path):
    run = probe_callable(_shifted, ["Hello", "Hi"], tmp_path / "run", ladder=[1, 2, 4])
    row = judge(run).to_dicts()[0]
    assert (row["verdict"], row["cause"]) == ("RED", "co-batching")
    assert row["requests"] == 2 * (2 + 4) and row["divergent"] == row["requests"] and row["tokens_parted"] == 0  # every batched row
    assert row["first"] == "p0 c=2 repeat 0 slot 0: its logprob bits differ from ref #1 from token 1 (up to 32 ULP)"
    assert (row["alone"], row["alone_parted"], row["bands_unformed"], row["missing"]) == (2 * 2, 0, 0, 0)  # ref #2 and c=1: no shift
    assert row["evidence"].startswith("12 batched requests, 4 of 4 bands seen formed")  # the width is known exactly
    table = slot_table(run)
    assert table.height == 2 * (1 + 2 + 4) and table["decode_rate_origin"].unique().to_list() == ["server: timings, request"]
    assert run.dump.candidates.filter(pl.col("list_index") == 1)["cand_token_id"].unique().sort().to_list() == [3, 9]  # runners-up kept


def test_an_engine_that_ignores_its_batch_has_no_divergence(tmp_path):
    def steady(prompts):
        return [{"token_ids": [ord(ch) for ch in p], "logprobs": [-0.125] * len(p)} for p in prompts]

    row = judge(probe_callable(steady, ["abc"], tmp_path / "run", ladder=[1, 8], repeats=2)).to_dicts()[0]
    # 16 batched requests, but the second repeat of the c=8 band is the same 8 contexts (prompt, c, slot, companions): 8 trials
    assert (row["verdict"], row["divergent"], row["requests"], row["contexts"], row["bands"]) == ("AMBER", 0, 16, 8, 2)
    # more contexts come from more prompts, 8 a prompt at this ladder: ceil(299 / 8) = 38 prompts
    assert row["next_step"] == "291 more distinct batch contexts: probe_callable(generate, 38 prompts, OUTPUT) into a new run"


def test_the_needle_layout_records_the_target_row_only(tmp_path):
    seen = []

    def record(prompts):
        seen.append(list(prompts))
        return [{"token_ids": [len(p)], "logprobs": [-1.0]} for p in prompts]

    run = probe_callable(record, ["aa", "bbb"], tmp_path / "run", ladder=[4], layout="needle", seed=3)
    bands = [batch for batch in seen if len(batch) == 4]
    assert [batch.count("aa") for batch in bands] == [1, 3]  # p0: its prompt among 3 of the other; p1: the reverse
    captured = [json.loads(line) for line in (run.path / "captures" / "requests.jsonl").read_text().splitlines()]
    targets = [(line["prompt_id"], line["batch_row"]) for line in captured if line["role"] == "band"]
    assert [bands[k][row] for k, (_, row) in enumerate(targets)] == ["aa", "bbb"]  # each band's recorded row is its prompt's


def test_bias_own_model_parts_bits_in_its_default_kernels_and_not_on_fixed_tiles(tmp_path):
    """The real thing in process: bia's torch model, batched by the caller, as a user's generate would batch."""
    from analysis.experiment import bundled_model
    from analysis.experiment.model import decode, load_model
    import torch

    model = load_model(bundled_model(), torch.float32, "cpu")

    def engine(mode):
        def generate(prompts):
            outs = decode(model, [model.encode(p) for p in prompts], mode=mode, max_tokens=12, top_k=3)
            return [{"token_ids": o.token_ids, "logprobs": o.logprobs, "top_logprobs": [list(zip(i, v)) for i, v in zip(o.top_ids, o.top_logprobs)]}
                    for o in outs]
        return generate

    rows = {mode: judge(probe_callable(engine(mode), ["If the argument is"], tmp_path / mode, ladder=[1, 4], engine=f"tiny {mode}")).to_dicts()[0]
            for mode in ("default", "fixed-tiles")}
    assert rows["default"]["verdict"] == "RED" and rows["default"]["tokens_parted"] == 0 and rows["default"]["max_ulp"] > 0
    assert rows["fixed-tiles"]["verdict"] == "AMBER" and rows["fixed-tiles"]["divergent"] == 0
    assert rows["default"]["engine"] == "tiny default"


@pytest.mark.parametrize("result, message", [
    (lambda ps: {"token_ids": [1]}, "generate, call p0 ref #1: expected a list of 1 results (one per prompt), got 'dict'"),
    (lambda ps: [{"logprobs": [-1.0]} for _ in ps], "row 0: field token_ids: expected a list of integers, got None"),
    (lambda ps: [{"token_ids": [1, 2], "logprobs": [-1.0]} for _ in ps], "row 0: field logprobs: expected one finite logprob <= 0 per token (2)"),
    (lambda ps: [{"token_ids": [1], "logprobs": [0.5]} for _ in ps], "field logprobs: expected one finite logprob <= 0"),
    (lambda ps: [{"token_ids": [True], "logprobs": [-1.0]} for _ in ps], "field token_ids: expected a list of integers, got [True]"),
    (lambda ps: [{"token_ids": [1], "logprobs": [-1.0], "top_logprobs": [[(1, "x")]]} for _ in ps], "field top_logprobs: expected per token"),
    (lambda ps: ["text"] * len(ps), "row 0: expected a mapping with token_ids and logprobs, got str"),
])
def test_what_generate_returns_is_checked_and_named_by_call_row_and_field(tmp_path, result, message):
    with pytest.raises(CallableError, match=re.escape(message)):
        probe_callable(result, ["x"], tmp_path / "run", ladder=[1, 2])
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_wrong_count_in_a_batch_names_the_band(tmp_path):
    with pytest.raises(CallableError, match=r"generate, call p0 c=2 repeat 0: expected a list of 2 results \(one per prompt\), got 1 items"):
        probe_callable(lambda ps: [{"token_ids": [1], "logprobs": [-1.0]}], ["x"], tmp_path / "run", ladder=[1, 2])


@pytest.mark.parametrize("settings, message", [
    ({"prompts": []}, "prompts: expected a non-empty list of non-empty strings"),
    ({"prompts": "Hello"}, "prompts: expected a non-empty list"),
    ({"ladder": [0, 2]}, r"ladder: expected distinct batch sizes >= 1, got \[0, 2\]"),
    ({"ladder": [2, 2]}, "ladder: expected distinct batch sizes"),
    ({"layout": "mixed"}, "layout: expected one of copies, needle, got 'mixed'"),
    ({"layout": "needle"}, "layout: needle puts the prompt among other prompts; give at least two"),
    ({"repeats": 0}, "repeats: expected an integer >= 1, got 0"),
])
def test_settings_are_checked_before_any_call(tmp_path, settings, message):
    calls = []
    arguments = {"prompts": ["x"], **settings}
    with pytest.raises(CallableError, match=message):
        probe_callable(lambda ps: calls.append(ps) or [], arguments.pop("prompts"), tmp_path / "run", **arguments)
    assert calls == []


def test_an_engine_that_fails_leaves_nothing_and_an_existing_run_is_kept(tmp_path):
    def broken(prompts):
        if len(prompts) > 1:
            raise RuntimeError("CUDA out of memory")
        return [{"token_ids": [1], "logprobs": [-1.0]}]

    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        probe_callable(broken, ["x"], tmp_path / "run", ladder=[1, 2])
    assert list(tmp_path.iterdir()) == []
    probe_callable(_shifted, ["x"], tmp_path / "run", ladder=[1])
    with pytest.raises(OutputExists):
        probe_callable(_shifted, ["x"], tmp_path / "run", ladder=[1])
    assert read_run(tmp_path / "run").manifest["producer"] == "bia probe_callable"
    probe_callable(_shifted, ["x"], tmp_path / "run", ladder=[1, 2], force=True)
    assert read_run(tmp_path / "run").ladder == [1, 2]
