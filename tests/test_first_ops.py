"""The first op that differs (issue 24, item 4): taps on every op, a hand-made drift named exactly, the
bundled model's own drift checked against the run's bitwise prefix, invariant modes with no first op,
the table's errors, and the report's section."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest

torch = pytest.importorskip("torch")

from analysis import RunError, first_op_table, read_run, slot_table  # noqa: E402
from analysis.experiment import run_experiment  # noqa: E402
from analysis.experiment.model import ModelConfig, Taps, TinyLM, band_first_ops, decode, reference_taps, tapped_ops  # noqa: E402
from analysis.experiment.model._first_ops import _Comparison, _Reference  # noqa: E402
from analysis.views.html import first_op_html  # noqa: E402
from analysis.plots import plot_first_ops  # noqa: E402

pytestmark = pytest.mark.slow

SMALL = {"prompts": ["Return a new list", "If x"], "ladder": (1, 4), "max_tokens": 8, "top_k": 3}
STEPS = 6


@pytest.fixture(scope="module")
def model():
    """A small random TinyLM: three layers, so that layer 1 has a layer before and after it."""
    torch.manual_seed(0)
    return TinyLM(ModelConfig(d_model=32, n_heads=2, n_layers=3, context=64)).eval()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An experiment in its three modes, each replayed with taps (bia experiment's default)."""
    out = tmp_path_factory.mktemp("first-ops")
    return {run.manifest["effective"]["kernel_mode"]: run for run in map(read_run, run_experiment(out, **SMALL))}


def _one_ulp_up(module, args, output):
    """Layer 1's MLP output, every element moved to the next float32 up: the smallest drift there is."""
    return torch.nextafter(output, torch.full_like(output, float("inf")))


def test_a_hand_made_drift_in_layer_1s_mlp_is_named_exactly(model):
    """The band's decode alone is perturbed, 1 ULP at layer 1's MLP output; the reference is not. The
    band is c=1, so without the perturbation every op is bit-identical to m=1 (the same shapes run
    the same kernels): whatever differs starts where the ULP was added, and nowhere before it."""
    prompt = model.encode("the cat")
    reference = reference_taps(model, prompt, mode="default", max_tokens=STEPS, top_k=3)
    _, clean, tapped = band_first_ops(model, reference, [prompt], [0], mode="default", max_tokens=STEPS, top_k=3)
    assert tapped and len(clean["step"]) == 0  # the control: no drift without the perturbation
    handle = model.blocks[1].proj.register_forward_hook(_one_ulp_up)
    try:
        outs, found, tapped = band_first_ops(model, reference, [prompt], [0], mode="default", max_tokens=STEPS, top_k=3)
    finally:
        handle.remove()
    alone = reference[0][0]
    # the steps that differ, counted here from the outputs themselves: a logprob or top-k value moved
    moved = [s for s in range(STEPS) if outs[0].logprobs[s] != alone.logprobs[s] or outs[0].top_logprobs[s] != alone.top_logprobs[s]
             or outs[0].token_ids[s] != alone.token_ids[s]]
    assert tapped and moved and found["step"].tolist() == moved
    ops = tapped_ops(3)
    assert {ops[i] for i in found["op_index"].tolist()} == {(1, "mlp_down")}


def test_the_comparison_aligns_left_padding_and_compares_bits():
    """Worked by hand: the reference is one row of two positions; the batch has two rows of three
    (the first position padding). Row 0's last two entries equal the reference's; row 1 differs at
    one element, by the sign of a zero (-0.0 == 0.0 as floats, not as bits)."""
    reference = _Reference()
    reference(0, 0, torch.tensor([[[1.0, 0.0], [2.0, 3.0]]]))
    comparison = _Comparison(reference, batch=2, rows=[0, 1], n_ops=1)
    batched = torch.tensor([[[9.0, 9.0], [1.0, 0.0], [2.0, 3.0]],
                            [[9.0, 9.0], [1.0, -0.0], [2.0, 3.0]]])
    comparison(0, 0, batched)
    assert comparison.paired and comparison.differs[0].tolist() == [[False, True]]
    comparison(1, 0, batched)  # a call the reference never made: the rows cannot be paired
    assert not comparison.paired


def test_taps_fire_once_per_op_in_forward_order_and_leave_nothing_behind(model):
    seen = []
    with Taps(model, lambda call, op, value: seen.append((call, op))) as taps:
        decode(model, [model.encode("ab"), model.encode("abc")], mode="default", max_tokens=2, top_k=2)
    n = len(tapped_ops(3))
    assert taps.rows == [2, 2] and sorted(seen) == [(call, op) for call in range(2) for op in range(n)]
    assert all(block.tap is None for block in model.blocks)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_the_default_modes_drift_starts_where_its_bits_part(runs):
    """Each request's first differing step is the run's own bitwise prefix (slot_table, computed from
    the captures by other code), for exactly the requests whose bits part; every op is a tapped one."""
    table = first_op_table(runs["default"])
    bits = slot_table(runs["default"]).filter(pl.col("bitwise_prefix") < pl.col("length")).select("prompt_id", "c", "slot",
                                                                                                    step="bitwise_prefix")
    assert bits.height > 0, "the bundled model's default mode drifts at c=4 on CPU; without drift this test checks nothing"
    onsets = table.filter(pl.col("onset")).select("prompt_id", "c", "slot", "step")
    assert onsets.sort(onsets.columns).equals(bits.sort(bits.columns))
    assert table["op"].null_count() == 0 and (table["c"] > 1).all()
    assert set(zip(table["layer"], table["op"])) <= {*tapped_ops(3), (None, "logprobs")}


def test_a_padded_needle_is_compared_on_its_own_positions(tmp_path):
    """The needle layout left-pads the shorter prompt; the onsets still match the bitwise prefix."""
    run = read_run(run_experiment(tmp_path, **{**SMALL, "ladder": (2, 4)}, layout="needle", modes=("default",))[0])
    bits = slot_table(run).filter(pl.col("bitwise_prefix") < pl.col("length")).select("prompt_id", "c", "slot", step="bitwise_prefix")
    onsets = first_op_table(run).filter(pl.col("onset")).select("prompt_id", "c", "slot", "step")
    assert onsets.sort(onsets.columns).equals(bits.sort(bits.columns))


@pytest.mark.parametrize("mode", ["one-by-one", "fixed-tiles"])
def test_invariant_modes_record_no_first_op(runs, mode):
    assert first_op_table(runs[mode]).height == 0
    record = json.loads((runs[mode].path / "first_ops.json").read_text())
    assert record["kernel_mode"] == mode and record["tapped"] is False  # their kernels never run the batch through TinyLM.forward
    assert "no first op" in first_op_html(runs[mode])


def test_a_replay_that_does_not_give_the_captured_bits_is_refused(runs, tmp_path):
    from analysis.experiment import ExperimentError, write_first_ops

    run = shutil.copytree(runs["default"].path, tmp_path / "run")
    lines = (run / "captures" / "requests.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    sse = first["sse"]  # ref #1 of p0: its first token's logprob rewritten
    start = sse.index('"logprob": ') + len('"logprob": ')
    end = sse.index(",", start)
    first["sse"] = sse[:start] + "-0.123" + sse[end:]
    (run / "captures" / "requests.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(ExperimentError, match=r"the replay of request p0-ref1 differs from its capture at token 0"):
        write_first_ops(run)


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.update(first_ops_version=3), "field first_ops_version: expected 1 or 2, got 3"),
    (lambda r: r["steps"]["step"].__setitem__(0, 1.5), "steps record 0: field step: expected int, got 1.5"),
    (lambda r: r["steps"]["op"].__setitem__(0, "nope"), "steps record 0: field op: layer 0 op 'nope' is not one of the file's ops"),
    (lambda r: r["steps"].pop("slot"), "field steps: expected the columns"),
    (lambda r: r["ops"].__setitem__(0, {"layer": "0", "op": "x"}), "ops record 0: expected"),
])
def test_a_malformed_record_is_named_by_file_record_and_field(runs, tmp_path, edit, message):
    run = shutil.copytree(runs["default"].path, tmp_path / "run")
    record = json.loads((run / "first_ops.json").read_text())
    edit(record)
    (run / "first_ops.json").write_text(json.dumps(record))
    with pytest.raises(RunError, match="first_ops.json: " + message.replace("(", r"\(").replace(")", r"\)")):
        first_op_table(read_run(run))


def test_a_run_without_taps_says_so(tmp_path, runs):
    run = shutil.copytree(runs["default"].path, tmp_path / "run")
    (run / "first_ops.json").unlink()
    with pytest.raises(RunError, match="first_ops.json: no first-op record"):
        first_op_table(read_run(run))
    assert first_op_html(read_run(run)) == ""


def test_the_figure_and_section_name_the_ops_that_start_the_drift(runs):
    table = first_op_table(runs["default"])
    ax = plot_first_ops(runs["default"])
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == "embedding" and labels[-1] == "logprobs" and len(labels) == len(tapped_ops(3)) + 1
    requests, steps = ax.containers  # the shares of requests whose drift starts at each op, and of all differing steps
    onsets = table.filter(pl.col("onset"))
    assert {i: round(b.get_width() * onsets.height) for i, b in enumerate(requests) if b.get_width()} == dict(
        onsets.group_by("op_index").len().rows())
    assert {i: round(b.get_width() * table.height) for i, b in enumerate(steps) if b.get_width()} == dict(
        table.group_by("op_index").len().rows())
    page = first_op_html(runs["default"])
    assert "Where drift starts" in page and "data:image/png;base64," in page and 'alt="' in page
    first = table.filter(pl.col("onset")).row(0, named=True)
    assert f"L{first['layer']} {first['op']}" in page


def test_op_names_from_the_file_are_escaped_in_the_section(runs, tmp_path):
    run = shutil.copytree(runs["default"].path, tmp_path / "run")
    record = json.loads((run / "first_ops.json").read_text())
    evil = "<img src=x onerror=alert(1)>"
    record["ops"] = [{**op, "op": evil} if op == {"layer": 0, "op": "qkv"} else op for op in record["ops"]]
    record["steps"]["op"] = [evil if op == "qkv" else op for op in record["steps"]["op"]]
    (run / "first_ops.json").write_text(json.dumps(record))
    page = first_op_html(read_run(run))
    assert evil not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
