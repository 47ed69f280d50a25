"""Runs: a directory of captures read back, judged per band, and written as an aprender witness."""

from __future__ import annotations

import json

import polars as pl
import pytest
from _cli import bia
from conftest import ROOT, write_json

from analysis import V3Policy, read_witness, shape_check
from analysis.run import RunError, assemble_run, read_run, slot_table, to_witness, write_run, write_witness

REF = [(10, -0.1, [(10, -0.1), (11, -2.0)]), (20, -0.2, [(20, -0.2), (21, -3.0)]), (30, -0.70, [(30, -0.70), (31, -0.72)]), (40, -0.3, [(40, -0.3), (41, -1.3)])]
FORK = [REF[0], REF[1], (31, -0.69, [(31, -0.69), (30, -0.71)]), (40, -0.3, [(40, -0.3), (41, -1.3)])]


def response(tokens, n=None):
    content = [{"token": f"token_id:{t}", "logprob": lp, "top_logprobs": [{"token": f"token_id:{i}", "logprob": v} for i, v in top]} for t, lp, top in tokens]
    return {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": ""}, "finish_reason": "length", "logprobs": {"content": content}}],
            "usage": {"completion_tokens": len(tokens) if n is None else n}}


def make_run(tmp_path, band4=FORK, widths4=(4, 4, 3)):
    folder = tmp_path / "run"
    (folder / "captures").mkdir(parents=True)
    manifest = {
        "run_version": 2,
        "identity": {"host": "box", "commit": "c" * 40, "binary_sha256": "b" * 64, "model": {"path": "tiny-model.gguf", "sha256": "m" * 64}},
        "sampler": {"temperature": 0.0, "seed": 0, "ignore_eos": True, "max_tokens": 4, "top_logprobs": 2},
        "ladder": [1, 4], "declared_min": 3, "max_constant_run": 16,
        "environment": {"KNOB": None},
        "prompts": [{"prompt_id": "p0", "text": "Write an essay on compilers."}],
        "m_formed": [{"prompt_id": "p0", "c": 1, "widths": [1, 1]}, {"prompt_id": "p0", "c": 4, "widths": list(widths4)}],
    }
    write_json(folder / "manifest.json", manifest)
    lines = [{"response": response(REF), "prompt_id": "p0", "role": "reference", "slot": i} for i in range(2)]
    lines.append({"response": response(REF), "prompt_id": "p0", "role": "band", "c": 1, "slot": 0})
    lines += [{"response": response(band4), "prompt_id": "p0", "role": "band", "c": 4, "slot": i} for i in range(4)]
    (folder / "captures" / "p0.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return folder


def test_a_legacy_run_naming_concurrency_band_c_reads_as_c(tmp_path):
    """run_version 1 named c band_c in its manifest and capture envelopes: such a run reads as the same run, and a run
    written again says run_version 2 and c."""
    new = read_run(make_run(tmp_path / "new"))
    folder = make_run(tmp_path / "old")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["run_version"] = 1
    manifest["m_formed"] = [{("band_c" if k == "c" else k): v for k, v in entry.items()} for entry in manifest["m_formed"]]
    write_json(folder / "manifest.json", manifest)
    lines = [json.loads(line) for line in (folder / "captures" / "p0.jsonl").read_text().splitlines()]
    lines = [{("band_c" if k == "c" else k): v for k, v in line.items()} for line in lines]
    (folder / "captures" / "p0.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    old = read_run(folder)
    assert "band_c" in (folder / "captures" / "p0.jsonl").read_text() and "band_c" not in old.dump.requests.columns
    assert old.dump.requests["c"].to_list() == new.dump.requests["c"].to_list() == [None, None, 1, 4, 4, 4, 4]
    assert old.manifest["m_formed"] == new.manifest["m_formed"]
    assert slot_table(old).equals(slot_table(new).with_columns(source=slot_table(old)["source"]))
    again = write_run(old, tmp_path / "again")
    assert json.loads((again / "manifest.json").read_text())["run_version"] == 2
    assert '"c": 4' in (again / "captures" / "requests.jsonl").read_text() and "band_c" not in (again / "captures" / "requests.jsonl").read_text()


def test_witness_from_a_run_by_hand(tmp_path):
    run = read_run(make_run(tmp_path))
    w = to_witness(run)
    assert w["reference"] == {"stable": True, "tokens": 4, "self_divergence_at": 4}
    c1, c4 = w["bands"]
    assert (c1["c"], c1["m_formed"], c1["result"], c1["divergence_at"], c1["intra_agree_to"]) == (1, 1, "PASS", 4, 4)
    assert "top2_margin_at_divergence" not in c1  # they never part: no margin is recorded
    assert (c4["c"], c4["m_formed"], c4["result"], c4["divergence_at"], c4["intra_agree_to"]) == (4, 4, "PASS", 2, 4)
    assert c4["top2_margin_at_divergence"] == pytest.approx(0.02)  # ref #1's margin where slot 0 parts
    assert [s["refused"] for s in c4["slots"]] == [None] * 4
    assert c4["decode_tok_s"] is None  # non-streamed captures carry no arrival times: no rate is invented
    assert w["result"] == "PASS"
    assert w["prompt_sha256"] == "3e31578371f85f23c8fa13b7b287e65bad7e0c09584bc79d3064feab3d1ab7e5"  # the lambda witnesses' prompt


def test_witness_round_trip_through_shape_check_and_the_reader(tmp_path):
    folder = make_run(tmp_path)
    path = write_witness(read_run(folder))
    verdict = shape_check(path, policy=V3Policy(model_prefix="tiny-model", bands=(1, 4), declared_min_floor=3))
    assert verdict.reasons == ("S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at c=1 and c=4",)
    run = bia("shape-check", str(path), "--model-prefix", "tiny-model", "--bands", "1,4", "--floor", "3")  # bia's 300 s limit; it had none
    assert run.returncode == 5 and run.stdout.splitlines()[1:] == [f"  - {verdict.reasons[0]}"]
    ws = read_witness(path)
    assert ws.bands["derived_result"].to_list() == ws.bands["result"].to_list() == ["PASS", "PASS"]
    assert ws.discrepancies.is_empty()


def test_negative_control_a_planted_divergence_is_flagged(tmp_path):
    planted = [REF[0], (99, -0.05, [(99, -0.05), (20, -3.0)]), REF[2], REF[3]]  # parts at token 1 where ref #1 is sure (margin 2.8)
    path = write_witness(read_run(make_run(tmp_path, band4=planted)))
    reasons = shape_check(path, policy=V3Policy(model_prefix="tiny-model", bands=(1, 4), declared_min_floor=3)).reasons
    assert "c=4: diverges from m=1 at 1 < 3; the recorded top-2 margin 2.8 is not a near-tie (needs 0 <= margin < 0.05)" in reasons


def test_unserved_shape_and_refusals(tmp_path):
    w = to_witness(read_run(make_run(tmp_path, widths4=(1, 1))))
    assert w["bands"][1]["result"] == "UNMEASURABLE" and "no batch with m>1 formed" in w["bands"][1]["reason"]
    assert w["result"] == "UNMEASURABLE"
    folder = make_run(tmp_path / "short", band4=FORK[:3])
    w = to_witness(read_run(folder))
    assert w["bands"][1]["slots"][0]["refused"] == "completion_tokens=3 != n_predict=4 (PP-28)"


def test_unstable_reference_runs_no_band(tmp_path):
    folder = make_run(tmp_path)
    lines = (folder / "captures" / "p0.jsonl").read_text().splitlines()
    second = json.loads(lines[1])
    second["response"] = response(FORK)
    lines[1] = json.dumps(second)
    (folder / "captures" / "p0.jsonl").write_text("\n".join(lines) + "\n")
    w = to_witness(read_run(folder))
    assert w["reference"]["stable"] is False and w["reference"]["self_divergence_at"] == 2
    assert w["reference"]["reason"].startswith("the two m=1 references diverge at token 2 < declared_min 3")
    assert w["bands"] == [] and w["result"] == "UNMEASURABLE"


def test_assemble_from_loose_dumps(tmp_path):
    mapping = []
    for name, tokens, role, c, slot in (("r0", REF, "reference", None, 0), ("r1", REF, "reference", None, 1), ("b0", REF, "band", 1, 0)):
        write_json(tmp_path / f"{name}.json", response(tokens))
        mapping.append({"source": str(tmp_path / f"{name}.json"), "prompt_id": "p0", "role": role, "c": c, "slot": slot})
    run = assemble_run(mapping, {"ladder": [1], "declared_min": 3, "sampler": {"max_tokens": 4}, "m_formed": [{"c": 1, "widths": [1]}]})
    w = to_witness(run)
    assert w["reference"]["stable"] and w["bands"][0]["result"] == "PASS"
    with pytest.raises(RunError, match="role"):
        assemble_run([{"source": mapping[0]["source"]}])


def test_run_errors(tmp_path, monkeypatch):
    with pytest.raises(RunError, match="no manifest.json"):
        read_run(tmp_path)
    # issue 32 item 11: a notebook in notebooks/ reading "data/..." was told "no manifest.json"; the folder is not there
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunError) as missing:
        read_run("data/experiment-cpu/default")
    assert str(missing.value) == (f"data/experiment-cpu/default: no such folder (looked for in {tmp_path}); the bundled runs are "
                                  "analysis.default_runs(), whatever the working folder")
    monkeypatch.undo()
    write_json(tmp_path / "manifest.json", {"run_version": 9})
    with pytest.raises(RunError, match="run_version 9"):
        read_run(tmp_path)


def test_slot_and_band_tables(tmp_path):
    from analysis.run import band_table, slot_table

    run = read_run(make_run(tmp_path))
    slots = slot_table(run)
    assert slots.select("c", "slot", "divergence_at", "length", "diverged", "near_tie").rows() == [
        (1, 0, None, 4, False, False), (4, 0, 2, 4, True, True), (4, 1, 2, 4, True, True), (4, 2, 2, 4, True, True), (4, 3, 2, 4, True, True)]
    assert slots["reference_margin"].to_list()[1:] == pytest.approx([0.02] * 4)
    assert slots["bitwise_prefix"].to_list() == [4, 2, 2, 2, 2]
    bands = band_table(run)
    assert bands.select("c", "divergence_min", "divergence_max", "intra_agree_to", "unique_completions", "near_tie_slots").rows() == [
        (1, 4, 4, 4, 1, 0), (4, 2, 2, 4, 1, 4)]


def test_reference_choice_and_prompt_table(tmp_path):
    from analysis.run import prompt_table, references, slot_table

    folder = make_run(tmp_path)
    lines = (folder / "captures" / "p0.jsonl").read_text().splitlines()
    second = json.loads(lines[1])
    second["response"] = response(FORK)  # ref #2 took the fork the batch took
    lines[1] = json.dumps(second)
    (folder / "captures" / "p0.jsonl").write_text("\n".join(lines) + "\n")
    run = read_run(folder)
    assert references(run, "ref2")["p0"].identities == (10, 20, 31, 40)
    assert slot_table(run, reference="ref1")["divergence_at"].to_list() == [None, 2, 2, 2, 2]
    assert slot_table(run, reference="ref2")["divergence_at"].to_list() == [2, None, None, None, None]
    other = read_run(make_run(tmp_path / "other"))
    assert slot_table(run, reference=other)["divergence_at"].to_list() == [None, 2, 2, 2, 2]
    with pytest.raises(RunError, match="reference must be"):
        slot_table(run, reference="ref3")
    table = prompt_table(run)
    row = table.row(0, named=True)
    # ref #1 margins per step: 1.9, 2.8, 0.02, 1.0 -> one of four below 0.1, none below 0.01
    assert (row["tie_density_1e-3"], row["tie_density_1e-2"], row["tie_density_1e-1"]) == (0.0, 0.0, 0.25)
    assert row["div_index"] == 2  # ref #1 and the c=4 slot 0 part at step 2
    assert row["std_output_length"] == 0.0  # every configuration generated 4 tokens
    assert row["s7_ratio"] is None  # non-streamed captures: no rates, no ratio


def test_widths_in_the_band_table_and_what_an_interrupted_run_misses(tmp_path):
    from analysis.run import band_table

    folder = make_run(tmp_path, widths4=(4, 4, 3))
    run = read_run(folder)
    bands = band_table(run)
    assert bands.select("c", "m_formed", "widths_seen").rows() == [(1, 1, "m=1 x2"), (4, 4, "m=4 x2, m=3 x1")]
    assert run.missing() == []
    lines = (folder / "captures" / "p0.jsonl").read_text().splitlines()
    (folder / "captures" / "p0.jsonl").write_text("\n".join(lines[:-2]) + "\n")  # the probe died before the last two slots came back
    assert read_run(folder).missing() == [{"prompt_id": "p0", "role": "band", "c": 4, "slot": s, "repeat": 0, "arm": "copies", "state": "not sent"}
                                           for s in (2, 3)]


def test_seconds_per_1000_sequences_by_hand():
    from analysis.run._band_tables import _release_skew, _seconds_per_1000, _send_spans

    band = pl.DataFrame({"extra": ['{"sent_at_s": 0.0}', '{"sent_at_s": 0.1}'], "t_last_content": [1.0, 0.5]})
    assert _send_spans(band) == [(0.0, 1.0), (0.1, pytest.approx(0.6))]
    assert _seconds_per_1000(_send_spans(band)) == pytest.approx(500.0)  # first send 0.0, last token 1.0: 1 s for 2 requests
    unsent = _send_spans(band.with_columns(pl.lit(None, pl.String).alias("extra")))  # no send times: not a probe run
    assert unsent is None and _seconds_per_1000(unsent) is None and _release_skew(unsent) is None
    assert _release_skew(_send_spans(band)) == pytest.approx(0.1)


def test_an_assembled_run_takes_its_plan_from_the_mapping():
    # Issue 22: assemble_run with only a c=4 band said "ladder [1, 4, 8, 16] ... complete". The mapping's plan is one
    # prompt with a c=4 band: its ladder is [4], and the two m=1 references and slots 1-3 it lacks make it incomplete.
    sample = str(ROOT / "tests" / "samples" / "vllm_chat_nonstream_token_ids__OpenPipe-ART.json")
    run = assemble_run([{"source": sample, "prompt_id": "p0", "role": "band", "c": 4, "slot": 0}])
    assert run.ladder == [4]
    assert [(m["role"], m["slot"]) for m in run.missing()] == [("reference", 0), ("reference", 1), ("band", 1), ("band", 2), ("band", 3)]
    assert run.manifest["complete"] is False
    assert repr(run).endswith("ladder [4], 1 requests, incomplete)")
    given = assemble_run([{"source": sample, "prompt_id": "p0", "role": "band", "c": 4, "slot": 0}], {"ladder": [1, 4], "complete": True})
    assert given.ladder == [1, 4] and given.manifest["complete"] is True  # what the caller's manifest says is kept


def test_what_a_run_misses_is_the_same_a_prompt_at_a_time_and_streamed(tmp_path, monkeypatch):
    # Run.missing joins the plan a group of prompts at a time (issue 42): the groups' rows, in order, are the whole join's
    import shutil

    from analysis.run import _model

    folder = tmp_path / "run"
    shutil.copytree(ROOT / "data" / "experiment-cpu" / "default", folder, ignore=shutil.ignore_patterns("derived"))
    capture = folder / "captures" / "requests.jsonl"
    lines = capture.read_text().splitlines()
    capture.write_text("\n".join(line for i, line in enumerate(lines) if i not in (0, 5, 40, 61)) + "\n")  # both prompts lack some
    whole = read_run(folder).missing()
    assert len(whole) == 4 and {m["prompt_id"] for m in whole} == {"p0", "p1"}
    monkeypatch.setattr(_model, "_MISSING_ROWS", 1)  # one prompt a group
    assert read_run(folder).missing() == whole
    assert read_run(folder, stream=True).missing() == whole
