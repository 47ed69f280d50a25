"""Reading witnesses and markers: values checked by hand against the real lambda files."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import polars as pl
import pytest
from conftest import CONTROL, LAMBDA, V2_WITNESS, write_json

import analysis
from analysis import WitnessError, derive_band_result, read_witness, read_witnesses

V1_WITNESS = LAMBDA / "witness-v3.0-rule.json"
V1_VARIANT = LAMBDA / "witness-variant-batched-prefill-0.json"


def test_v2_witness_row_by_hand():
    ws = read_witness(V2_WITNESS)
    row = ws.witnesses.row(0, named=True)
    assert row["source"] == str(V2_WITNESS)
    assert (row["witness_version"], row["probe"], row["host"]) == (2, "perf041", "lambda")
    assert row["commit"] == "a765c86a5f5437c01bb327848787bbcda15249c7"
    assert row["model_path"] == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert row["model_dir"] == "APR_MODELS (default $HOME/models)"
    assert (row["temperature"], row["seed"], row["ignore_eos"], row["max_tokens"], row["top_logprobs"]) == (0.0, 0, True, 128, None)
    assert row["declared_min"] == 64
    assert row["env_CUDA_BATCH_WINDOW_MS"] == "200"
    assert row["env_BATCHED_PREFILL"] is None
    assert (row["reference_stable"], row["reference_tokens"], row["reference_self_divergence_at"]) == (True, 128, 100)
    assert (row["recorded_exit"], row["recorded_verdict"], row["derived_verdict"], row["verdict_agrees"]) == (0, "PASS", "PASS", True)
    assert row["notes"] == [] and row["extra"] is None and row["n_bands"] == 4


def test_v2_bands_and_slots_by_hand():
    ws = read_witness(V2_WITNESS)
    bands = ws.bands
    assert bands["c"].to_list() == [1, 4, 8, 16]
    assert bands["m_formed"].to_list() == [1, 4, 8, 16]
    assert bands["divergence_at"].to_list() == [100, 3, 3, 3]
    assert bands["result"].to_list() == ["PASS"] * 4
    assert bands["derived_result"].to_list() == ["PASS"] * 4
    assert bands["intra_agree_to"].to_list() == [128] * 4
    assert bands["n_slots"].to_list() == [1, 4, 8, 16]
    assert set(bands["witness_version"]) == {2} and set(bands["source"]) == {str(V2_WITNESS)}
    slots = ws.slots
    assert slots.height == 29
    assert slots.group_by("c").agg(pl.col("agree_to").min()).sort("c")["agree_to"].to_list() == [100, 3, 3, 3]
    assert slots.filter(c=16)["i"].to_list() == list(range(16))
    assert slots["refused"].null_count() == 29
    assert ws.discrepancies.is_empty()


def test_same_measurement_is_fail_in_v1_and_pass_in_v2():
    v1 = read_witness(V1_WITNESS)
    assert v1.bands["result"].to_list() == ["PASS", "FAIL", "FAIL", "FAIL"]
    assert v1.bands["derived_result"].to_list() == ["PASS", "FAIL", "FAIL", "FAIL"]
    assert v1.witnesses["derived_verdict"].to_list() == ["FAIL"]
    band = v1.bands.row(1, named=True) | {"intra_agree_to": 128, "max_constant_run": 1, "max_constant_run_declared": 16}
    slots = v1.slots.filter(c=4).to_dicts()
    assert derive_band_result(1, band, slots) == ("FAIL", None)
    assert derive_band_result(2, band, slots) == ("PASS", None)


def test_folder_reads_witnesses_and_markers_in_order():
    ws = read_witnesses(LAMBDA)
    assert [s.rsplit("/", 1)[-1] for s in ws.sources] == [
        "marker@7e1b6e213b.json", "marker@abb48c5cfa.json", "witness-v3.0-rule.json", "witness-variant-batched-prefill-0.json", "witness@464c168e62.json"
    ]
    assert ws.witnesses.height == 3 and ws.bands.height == 12 and ws.markers.height == 2
    assert ws.discrepancies.is_empty()
    variant = ws.witnesses.filter(pl.col("source").str.ends_with("batched-prefill-0.json")).row(0, named=True)
    assert variant["env_BATCHED_PREFILL"] == "0" and variant["reference_self_divergence_at"] == 128
    marker = ws.markers.row(0, named=True)
    assert marker == {
        "source": str(LAMBDA / "marker@7e1b6e213b.json"),
        "cc": "89",
        "commit": "c554a7731de46ad56622ab5d835e63b6116a524d",
        "exit": 0,
        "host": "lambda",
        "max_m": 16,
        "sha256": "61a78292b94f3053e93026c6c5114fb127b90a5dd8e78643bf9de144a6a95fea",
        "started_utc": datetime(2026, 9, 9, 18, 15, 37, tzinfo=timezone.utc),
        "status": "PASS",
        "status_agrees": True,
        "extra": None,
    }


def test_polars_and_pandas_hold_equal_content():
    as_polars = read_witnesses(LAMBDA)
    as_pandas = read_witnesses(LAMBDA, backend="pandas")
    for name in ("witnesses", "bands", "slots", "markers", "discrepancies"):
        left, right = getattr(as_polars, name), getattr(as_pandas, name)
        assert type(right).__module__.startswith("pandas")
        assert list(right.columns) == left.columns
        assert len(right) == left.height
        back = pl.from_pandas(right)
        for column in left.columns:
            expected = left[column].to_list()
            got = back[column].to_list()
            if left.schema[column] == pl.List(pl.String):
                got = [list(v) if v is not None else None for v in got]
            assert got == expected, (name, column)
    assert as_pandas.bands["result"].tolist() == as_polars.bands["result"].to_list()


def test_tampered_results_are_reported_not_hidden(tmp_path):
    data = json.loads(V2_WITNESS.read_text())
    data["bands"][1]["result"] = "FAIL"  # c=4 says FAIL although its fields say PASS
    data["bands"][2]["slots"][5]["intra_agree_to"] = 10  # c=8's aggregate now disagrees with a slot
    path = write_json(tmp_path / "w.json", data)
    ws = read_witness(path)
    assert ws.bands["result_agrees"].to_list() == [True, False, True, True]
    rows = ws.discrepancies.select("record", "field", "recorded", "derived").rows()
    assert rows == [
        ("$.bands[1] (c=4)", "result", "FAIL", "PASS"),
        ("$.bands[2] (c=8)", "intra_agree_to", "128", "10"),
        ("$", "exit", "PASS", "FAIL"),
    ]
    assert ws.witnesses["verdict_agrees"].to_list() == [False]


def test_v2_rules_unmeasurable_and_frozen(tmp_path):
    data = json.loads(V2_WITNESS.read_text())
    data["bands"][1]["slots"][0]["refused"] = "short"
    data["bands"][2]["m_formed"] = 1
    data["bands"][3]["max_constant_run"] = 16
    ws = read_witness(write_json(tmp_path / "w.json", data))
    assert ws.bands["derived_result"].to_list() == ["PASS", "UNMEASURABLE", "UNMEASURABLE", "FAIL"]
    assert ws.bands["result_agrees"].to_list() == [True, False, False, False]


def v3_witness(**changes):
    bands = []
    for band in CONTROL["bands"]:
        c = band["c"]
        slots = [{"i": i, "completion_tokens": 128, "finish_reason": "length", "refused": None, "decode_tok_s": band["decode_tok_s"] + i} for i in range(c)]
        rates = sorted(s["decode_tok_s"] for s in slots)
        median = (rates[(c - 1) // 2] + rates[c // 2]) / 2
        bands.append(band | {"intra_agree_to": 128, "max_constant_run": 1, "max_constant_run_declared": 16, "reason": None, "slots": slots, "decode_tok_s": median})
    witness = {k: v for k, v in CONTROL.items() if k != "bands"} | {
        "witness_version": 3,
        "probe": "perf041-rs",
        "declared_min": 64,
        "sampler": {"temperature": 0.0, "seed": 0, "ignore_eos": True, "max_tokens": 128, "top_logprobs": 2},
        "env": {k: None for k in analysis.witness._schema.ENV_KEYS},
        "reference": {"stable": True, "tokens": 128, "self_divergence_at": 128},
        "bands": bands,
        "result": "PASS",
    }
    witness.update(changes)
    return witness


def test_v3_witness(tmp_path):
    ws = read_witness(write_json(tmp_path / "w3.json", v3_witness()))
    row = ws.witnesses.row(0, named=True)
    assert (row["witness_version"], row["max_tokens"], row["top_logprobs"], row["recorded_verdict"], row["derived_verdict"]) == (3, 128, 2, "PASS", "PASS")
    # c=4 slots decode at 30, 31, 32, 33 tok/s: the median is 31.5
    assert ws.bands["decode_tok_s"].to_list() == [40.0, 31.5, 28.5, 27.5]
    assert ws.slots.filter(c=4)["decode_tok_s"].to_list() == [30.0, 31.0, 32.0, 33.0]
    assert ws.discrepancies.is_empty()
    assert ws.shape_checks()[str(tmp_path / "w3.json")].status == "ADMISSIBLE"


def test_v3_band_aggregate_and_slot_count_rules(tmp_path):
    data = v3_witness()
    data["bands"][1]["decode_tok_s"] = 30.0  # not the median of its slots
    data["bands"][2]["slots"].pop()  # fired 8, 7 came back
    ws = read_witness(write_json(tmp_path / "w3.json", data))
    assert ws.bands["derived_result"].to_list() == ["PASS", "PASS", "UNMEASURABLE", "PASS"]
    assert ws.discrepancies.select("record", "field", "recorded", "derived").rows() == [
        ("$.bands[1] (c=4)", "decode_tok_s", "30.0", "31.5"),
        ("$.bands[2] (c=8)", "result", "PASS", "UNMEASURABLE"),
        ("$.bands[2] (c=8)", "decode_tok_s", "28.5", "28.0"),
    ]


def test_unknown_fields_are_kept(tmp_path):
    data = json.loads(V2_WITNESS.read_text())
    data["gpu"] = {"name": "RTX 4090"}
    data["model"]["quant"] = "q4_k_m"
    data["env"]["NEW_KNOB"] = "1"
    data["bands"][0]["slots"][0]["ttft_ms"] = 12.5
    ws = read_witness(write_json(tmp_path / "w.json", data))
    assert json.loads(ws.witnesses["extra"][0]) == {"gpu": {"name": "RTX 4090"}, "model": {"quant": "q4_k_m"}}
    assert ws.witnesses["env_NEW_KNOB"].to_list() == ["1"]
    assert json.loads(ws.slots["extra"][0]) == {"ttft_ms": 12.5}


@pytest.mark.parametrize(
    ("mutate", "record", "field", "problem"),
    [
        (lambda d: d["bands"][1]["slots"][2].update(agree_to="3"), "$.bands[1] (c=4).slots[2]", "agree_to", 'expected an integer, got str "3"'),
        (lambda d: d["bands"][2].pop("c"), "$.bands[2]", "c", "required field is missing"),
        (lambda d: d["bands"][0].update(m_formed=True), "$.bands[0] (c=1)", "m_formed", "expected an integer, got bool true"),
        (lambda d: d["bands"][3].update(slots={"i": 0}), "$.bands[3] (c=16)", "slots", "expected a list"),
        (lambda d: d.update(witness_version=7), "$", "witness_version", "expected 1, 2 or 3, got 7"),
        (lambda d: d["reference"].update(stable="yes"), "$.reference", "stable", "expected true or false"),
        (lambda d: d.update(notes=[1]), "$", "notes", "expected a list of strings"),
        (lambda d: d.update(bands=None), "$", "bands", "expected a list, got null"),
        (lambda d: d["sampler"].update(seed=-1), "$.sampler", "seed", "expected a non-negative integer"),
        (lambda d: d["bands"][1]["slots"].append(7), "$.bands[1] (c=4).slots[4]", None, "expected a JSON object, got int 7"),
    ],
)
def test_malformed_witness_names_file_record_and_field(tmp_path, mutate, record, field, problem):
    data = json.loads(V2_WITNESS.read_text())
    mutate(data)
    path = write_json(tmp_path / "bad.json", data)
    with pytest.raises(WitnessError) as info:
        read_witness(path)
    error = info.value
    assert (error.source, error.record, error.field) == (str(path), record, field)
    assert problem in str(error) and str(path) in str(error)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty file"),
        ("{", "not valid JSON"),
        ('{"witness_version": 2, "witness_version": 2, "bands": []}', "key appears more than once"),
        ('{"host": "x"}', "neither a witness"),
        ("[1, 2]", "neither a witness"),
        ('{"witness_version": 2, "bands": [], "declared_min": NaN}', "NaN is not a JSON number"),
    ],
)
def test_unreadable_documents(tmp_path, text, problem):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(WitnessError, match=problem) as info:
        read_witness(path)
    assert str(path) in str(info.value)


def test_sources_glob_missing_and_empty_folder(tmp_path):
    assert len(read_witnesses(str(LAMBDA / "marker@*.json")).markers) == 2
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_witnesses([V2_WITNESS, tmp_path / "absent.json"])
    with pytest.raises(FileNotFoundError, match="holds no"):
        read_witnesses(tmp_path)
    with pytest.raises(FileNotFoundError, match="matches no file"):
        read_witnesses(str(tmp_path / "*.json"))
    with pytest.raises(ValueError, match="backend"):
        read_witnesses(LAMBDA, backend="arrow")


def test_no_progress_bar_when_not_a_terminal(capsys):
    read_witnesses(LAMBDA)
    assert capsys.readouterr().err == ""
    read_witnesses(LAMBDA, progress=True)
    assert "reading witnesses" in capsys.readouterr().err
