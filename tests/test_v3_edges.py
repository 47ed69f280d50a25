"""Edges of aprender's V3 check that mutation testing showed no test pinned (issue 16): the u32 limit,
ShapeVerdict's properties, the frame of a verdict with no reasons, and policy errors in full."""

from __future__ import annotations

import copy

import polars as pl
import pytest
from conftest import CONTROL

from analysis import PolicyError, V3Policy, shape_check_data


def test_the_u32_limit_at_its_edge():
    at_limit = copy.deepcopy(CONTROL)
    at_limit["bands"][1]["m_formed"] = 4294967295  # the largest u32: read, then judged
    verdict = shape_check_data(at_limit)
    assert (verdict.status, verdict.reasons) == ("NOT ADMISSIBLE", ("c=4: m_formed 4294967295 != c (shape not served)",))
    past = copy.deepcopy(CONTROL)
    past["bands"][1]["m_formed"] = 4294967296  # one past it: unreadable, as serde refuses it
    verdict = shape_check_data(past)
    assert verdict.status == "RED" and verdict.exit_code == 4 and not verdict.admissible
    assert verdict.reasons == ("RED: unreadable witness: bands[1].m_formed: invalid value: integer `4294967296`, "
                               "expected a non-negative integer of at most 4294967295 (u32)",)


def test_an_admissible_verdict_and_its_empty_frame():
    verdict = shape_check_data(CONTROL, source="control.json")
    assert (verdict.status, verdict.admissible, verdict.exit_code, verdict.reasons) == ("ADMISSIBLE", True, 0, ())
    assert verdict.source == "control.json" and verdict.policy == V3Policy()
    frame = verdict.to_frame()
    assert frame.height == 0 and frame.schema == pl.Schema({"source": pl.String, "status": pl.String, "order": pl.Int64, "reason": pl.String})
    assert str(verdict) == "V3 shape check control.json: ADMISSIBLE"


@pytest.mark.parametrize("fields, words", [
    ({"near_tie_epsilon": -0.1}, "options: near_tie_epsilon must be a finite number >= 0, got -0.1"),
    ({"s7_ratio": True}, "options: s7_ratio must be a finite number >= 0, got True"),
    ({"near_tie_cap": "1"}, "options: near_tie_cap must hold non-negative integers, got '1'"),
    ({"bands": [1, 4, 4]}, "options: bands must be distinct batch sizes, got (1, 4, 4)"),
    ({"bands": [[1]]}, "options: bands must hold non-negative integers, got [1]"),
    ({"bands": "1,4"}, "options: bands must be a list of batch sizes, got '1,4'"),
    ({"model_prefix": 7}, "options: model_prefix must be a string, got 7"),
    ({"colour": "red"}, "options: unknown policy fields ['colour']; known: ['bands', 'declared_min_floor', 'model_label', "
                        "'model_prefix', 'near_tie_cap', 'near_tie_epsilon', 's7_base_c', 's7_batched_c', 's7_ratio']"),
])
def test_every_policy_error_in_full(fields, words):
    with pytest.raises(PolicyError) as caught:
        V3Policy.from_mapping(fields, source="options")
    assert str(caught.value) == words


def _with_band(c: int, /, **fields) -> dict:
    """CONTROL with the fields of its band c=c changed; a field given as ... is deleted."""
    witness = copy.deepcopy(CONTROL)
    band = next(b for b in witness["bands"] if b["c"] == c)
    band.update(fields)
    for key in [k for k, v in fields.items() if v is ...]:
        del band[key]
    return witness


@pytest.mark.parametrize("key", ["declared_min", "divergence_at"])
def test_a_margin_without_a_divergence_or_floor_is_no_near_tie_admission(key):
    # c=4 and c=8 both admitted by a near-tie would break the cap of 1; with c=8's declared_min or
    # divergence_at missing, only c=4 counts and the cap holds, and c=8 gets its own reason instead.
    witness = _with_band(4, divergence_at=10, top2_margin_at_divergence=0.01)
    witness["bands"][2].update(divergence_at=10, top2_margin_at_divergence=0.01)
    del witness["bands"][2][key]
    reasons = shape_check_data(witness).reasons
    expected = {
        "declared_min": "c=8: declared_min not recorded, so agreement with m=1 cannot be checked",
        "divergence_at": "c=8: divergence_at not recorded on a PASS band, so agreement with m=1 is unmeasured",
    }
    assert reasons == (expected[key],)


def test_the_near_tie_cap_counts_batched_bands_only_and_names_them():
    witness = copy.deepcopy(CONTROL)
    for band in witness["bands"]:  # every band diverges at 10 < 64 with a margin of 0.01 < 0.05
        band.update(divergence_at=10, top2_margin_at_divergence=0.01)
    assert shape_check_data(witness).reasons == (
        "near-tie cap: 3 batched bands (c=4, c=8, c=16) are admitted only by a near-tie margin; at most 1 of c=4, 8, 16 may be",)
    assert shape_check_data(witness, policy=V3Policy(near_tie_cap=3)).reasons == ()
    assert shape_check_data(witness, policy=V3Policy(near_tie_cap=2)).status == "NOT ADMISSIBLE"


@pytest.mark.parametrize("margin, admitted", [(0.0, True), (0.049, True), (0.05, False), (-0.001, False)])
def test_a_near_tie_is_zero_up_to_but_not_including_epsilon(margin, admitted):
    verdict = shape_check_data(_with_band(4, divergence_at=63, top2_margin_at_divergence=margin))
    if admitted:
        assert verdict.reasons == ()
    else:
        assert verdict.reasons == (f"c=4: diverges from m=1 at 63 < 64; the recorded top-2 margin {margin} is not a near-tie "
                                   "(needs 0 <= margin < 0.05)",)


def test_divergence_at_the_declared_minimum_agrees():
    assert shape_check_data(_with_band(4, divergence_at=64)).reasons == ()
    assert shape_check_data(_with_band(4, divergence_at=63)).reasons == (
        "c=4: diverges from m=1 at 63 < 64 with no near-tie margin recorded",)
    # a band that did not PASS and recorded no divergence is judged by its result alone
    assert shape_check_data(_with_band(4, divergence_at=None, result="FAIL")).reasons == ("c=4: perf041 result FAIL",)


@pytest.mark.parametrize("text, field", [
    ('"model": 1, "model":', "witness: duplicate field `model`"),
    ('"path": "x", "path":', "model: duplicate field `path`"),
    ('"decode_tok_s": 1, "decode_tok_s":', "bands[0]: duplicate field `decode_tok_s`"),
    ('"host": "x", "host":', "witness: duplicate field `host`"),
])
def test_a_repeated_key_is_unreadable(text, field):
    import json

    from analysis import shape_check_text

    original = json.dumps(CONTROL)
    verdict = shape_check_text(original.replace(text.split(",")[-1].strip(), text, 1), source="w.json")
    assert (verdict.status, verdict.reasons, verdict.source) == ("RED", (f"RED: unreadable witness: {field}",), "w.json")
    assert verdict.stdout_lines() == [] and str(verdict) == f"RED: unreadable witness: {field}"


@pytest.mark.parametrize("value, words", [
    (True, "boolean `true`"), (False, "boolean `false`"), (3, "integer `3`"), (1.5, "floating point `1.5`"),
    ([], "a sequence"), ({}, "a map"),
])
def test_type_words_in_unreadable_reasons(value, words):
    verdict = shape_check_data(_with_band(8, result=value))
    assert verdict.reasons == (f"RED: unreadable witness: bands[2].result: invalid type: {words}, expected a string",)


@pytest.mark.parametrize("change, reason", [
    ({"c": ...}, "bands[1]: missing field `c`"),
    ({"c": None}, "bands[1].c: invalid type: null, expected a non-negative integer"),
    ({"c": "4"}, 'bands[1].c: invalid type: string "4", expected a non-negative integer'),
    ({"m_formed": -1}, "bands[1].m_formed: invalid value: integer `-1`, expected a non-negative integer of at most 4294967295 (u32)"),
    ({"divergence_at": 1.0}, "bands[1].divergence_at: invalid type: floating point `1`, expected a non-negative integer"),
    ({"declared_min": True}, "bands[1].declared_min: invalid type: boolean `true`, expected a non-negative integer"),
    ({"top2_margin_at_divergence": "0.1"}, 'bands[1].top2_margin_at_divergence: invalid type: string "0.1", expected a number'),
    ({"decode_tok_s": False}, "bands[1].decode_tok_s: invalid type: boolean `false`, expected a number"),
    ({"decode_tok_s": 10**400}, f"bands[1].decode_tok_s: invalid value: integer `{10**400}`, expected a number within an f64's range"),
])
def test_field_paths_in_unreadable_reasons(change, reason):
    assert shape_check_data(_with_band(4, **change)).reasons == (f"RED: unreadable witness: {reason}",)


@pytest.mark.parametrize("change, reason", [
    ({"model": "x.gguf"}, "model: invalid type: string \"x.gguf\", expected an object"),
    ({"model": {"path": 5}}, "model.path: invalid type: integer `5`, expected a string"),
    ({"model": {"path": "qwen3.5-4b.gguf", "sha256": 5}}, "model.sha256: invalid type: integer `5`, expected a string"),
    ({"host": ["lambda"]}, "witness.host: invalid type: a sequence, expected a string"),
    ({"bands": {"c": 1}}, "bands: invalid type: a map, expected a sequence"),
    ({"bands": [1]}, "bands[0]: invalid type: integer `1`, expected an object"),
])
def test_top_level_paths_in_unreadable_reasons(change, reason):
    witness = copy.deepcopy(CONTROL)
    witness.update(change)
    assert shape_check_data(witness).reasons == (f"RED: unreadable witness: {reason}",)
    assert shape_check_data([CONTROL]).reasons == ("RED: unreadable witness: witness: invalid type: a sequence, expected an object",)


def test_no_model_and_blank_identity_each_give_their_reason():
    witness = copy.deepcopy(CONTROL)
    witness["model"] = None
    witness["host"] = " \t"
    witness["commit"] = None
    assert shape_check_data(witness).reasons == (
        'model "" is not the blessed Qwen3.5-4B', "model sha256 missing",
        "identity field commit missing", "identity field host missing")
    witness = copy.deepcopy(CONTROL)
    witness["model"]["sha256"] = ""
    assert shape_check_data(witness).reasons == ("model sha256 missing",)


def test_the_model_prefix_ignores_ascii_case_only():
    def reasons(path, prefix):
        witness = copy.deepcopy(CONTROL)
        witness["model"]["path"] = path
        return shape_check_data(witness, policy=V3Policy(model_prefix=prefix)).reasons

    assert reasons("QWEN3.5-4B-Q4.gguf", "qwen3.5-4b") == ()
    assert reasons("Modèle-7B.gguf", "modèle") == ()
    # Rust's to_ascii_lowercase leaves È as it is, so it does not match è
    assert reasons("MODÈLE-7B.gguf", "modèle") == ('model "MODÈLE-7B.gguf" is not the blessed modèle',)
    assert reasons("x-qwen3.5-4b.gguf", "qwen3.5-4b") == ('model "x-qwen3.5-4b.gguf" is not the blessed Qwen3.5-4B',)
    assert V3Policy(model_prefix="llama", model_label="Llama 3").model_label == "Llama 3"


def test_a_band_measured_twice_or_missing():
    witness = copy.deepcopy(CONTROL)
    witness["bands"].append(copy.deepcopy(witness["bands"][1]))
    del witness["bands"][3]
    assert shape_check_data(witness).reasons == (
        "band c=4 recorded 2 times; a witness has one band per c", "band c=16 not measured")
    witness["bands"] = []
    assert shape_check_data(witness).reasons == ("RED: the witness measured no bands",)


@pytest.mark.parametrize("base, batched, reason", [
    (40.0, 20.0, None),  # exactly half: S7 holds
    # 100 * 19.9 / 40 is 49.74999... in binary, so Rust's {:.1} writes 49.7
    (40.0, 19.9, "S7 (FALSIFY-CB-004): per-request decode at c=4 is 19.9 tok/s, 49.7% of c=1's 40 tok/s; needs at least 50%"),
    (0.0, 20.0, "S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at c=1"),
    (40.0, None, "S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at c=4"),
    (-1.0, 0.0, "S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at c=1 and c=4"),
])
def test_s7_boundaries(base, batched, reason):
    witness = copy.deepcopy(CONTROL)
    witness["bands"][0]["decode_tok_s"] = base
    witness["bands"][1]["decode_tok_s"] = batched
    assert shape_check_data(witness).reasons == (() if reason is None else (reason,))


def test_s7_compares_the_policys_bands_and_ratio():
    witness = copy.deepcopy(CONTROL)  # rates 40, 30, 25, 20 at c = 1, 4, 8, 16
    assert shape_check_data(witness, policy=V3Policy(s7_batched_c=16, s7_ratio=0.6)).reasons == (
        "S7 (FALSIFY-CB-004): per-request decode at c=16 is 20 tok/s, 50.0% of c=1's 40 tok/s; needs at least 60%",)
    assert shape_check_data(witness, policy=V3Policy(s7_base_c=4, s7_batched_c=16, s7_ratio=0.6)).reasons == ()
    assert shape_check_data(witness, policy=V3Policy(s7_base_c=2)).reasons == ()  # no such band: S7 is not judged


def test_band_rules_in_order_with_their_texts():
    witness = _with_band(4, result=None, m_formed=None, declared_min=10)
    assert shape_check_data(witness).reasons == (
        "c=4: perf041 result not recorded", "c=4: m_formed not recorded (shape not shown)",
        "c=4: declared_min 10 is below the floor of 64 (witness.min_agree_tokens)")
    assert shape_check_data(_with_band(4, declared_min=64)).reasons == ()
    # at the floor is enough, and the floor is the policy's
    assert shape_check_data(_with_band(4, declared_min=10), policy=V3Policy(declared_min_floor=10)).reasons == ()


def test_policy_bands_and_batched_bands():
    policy = V3Policy(bands=[0, 1, 2])
    assert policy.bands == (0, 1, 2) and policy.batched_bands == (2,)
    assert V3Policy.from_mapping({"bands": [1, 2]}).bands == (1, 2)
    assert V3Policy(near_tie_epsilon=1).near_tie_epsilon == 1.0 and isinstance(V3Policy(s7_ratio=1).s7_ratio, float)


@pytest.mark.parametrize("name, text, words", [
    ("p.toml", "bands = [1, 4", "p.toml: not a valid policy file: Unclosed array (at end of document)"),  # tomllib's words
    ("p.json", '{"bands": [1, 4]', "p.json: not a valid policy file: not valid JSON at line 1 column 17 (Expecting ',' delimiter at the end of the text: cut short?)"),
    ("p.json", "[1, 4]", "p.json: a policy file holds one table of fields"),
    ("p.json", '{"s7_ratio": 0.5, "s7_ratio": 0.6}', "p.json: s7_ratio is given more than once"),
    ("p.toml", "a = " + "[" * 5000 + "]" * 5000, "p.toml: not a valid policy file: nested too deep"),
    ("p.toml", 's7_ratio = "half"', "p.toml: s7_ratio must be a finite number >= 0, got 'half'"),
])
def test_policy_file_errors_in_full(tmp_path, name, text, words):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PolicyError) as caught:
        V3Policy.from_file(path)
    assert str(caught.value) == f"{tmp_path}/{words}"


def test_policy_file_not_utf8_and_overrides(tmp_path):
    path = tmp_path / "p.toml"
    path.write_bytes(b's7_ratio = 0.5\n# \xff\n')
    with pytest.raises(PolicyError) as caught:
        V3Policy.from_file(path)
    assert str(caught.value) == f"{path}: not a valid policy file: not UTF-8 text (byte 17)"
    path.write_text('s7_ratio = 0.25\nbands = [1, 2]\n', encoding="utf-8")
    policy = V3Policy.from_file(path, s7_ratio=0.75, bands=None)
    assert (policy.s7_ratio, policy.bands) == (0.75, (1, 2))


def test_red_verdicts_keep_their_source_and_policy(tmp_path):
    from analysis import shape_check, shape_check_text

    own = V3Policy(model_prefix="llama")
    for text, reason in (("  \n", "RED: empty witness"),
                         ("{", "RED: unreadable witness: Expecting property name enclosed in double quotes at line 1 column 2")):
        verdict = shape_check_text(text, source="w.json", policy=own)
        assert (verdict.reasons, verdict.source, verdict.policy) == ((reason,), "w.json", own)
        assert shape_check_text(text).policy == V3Policy()
    path = tmp_path / "w.json"
    path.write_bytes(b"\xff{}")
    verdict = shape_check(path, policy=own)
    assert (verdict.status, verdict.source, verdict.policy) == ("RED", str(path), own)
    assert verdict.reasons == (f"RED: cannot read witness {path}: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",)
    assert shape_check(path).policy == V3Policy()


def test_every_verdict_of_shape_check_data_keeps_its_source_and_policy():
    own = V3Policy(near_tie_cap=2)
    for data, status in (([], "RED"), ({"bands": []}, "RED"), ({"bands": None}, "RED"), (CONTROL, "ADMISSIBLE"),
                         ({**CONTROL, "host": None}, "NOT ADMISSIBLE")):
        verdict = shape_check_data(data, source="w.json", policy=own)
        assert (verdict.status, verdict.source, verdict.policy) == (status, "w.json", own)


def test_a_mapping_without_a_source_is_called_policy():
    with pytest.raises(PolicyError) as caught:
        V3Policy.from_mapping({"s7_ratio": -1})
    assert str(caught.value) == "policy: s7_ratio must be a finite number >= 0, got -1"


def test_a_zero_epsilon_or_ratio_is_a_policy():
    assert (V3Policy(near_tie_epsilon=0).near_tie_epsilon, V3Policy(s7_ratio=0).s7_ratio) == (0.0, 0.0)
