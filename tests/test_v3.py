"""aprender's V3 check: a case table written from aprender's shape-check rules (docs/v3.md states them).

Each row changes one thing in the spec's control witness and states the exit code and the
exact reasons, in order. Boundaries sit next to each rule.
"""

from __future__ import annotations

import json

import pytest
from _cli import bia
from conftest import V2_WITNESS, write_json

from analysis import V3Policy, shape_check, shape_check_data, shape_check_text
from analysis.verdicts import PolicyError

C1, C4, C8, C16 = 0, 1, 2, 3


def band(index, **changes):
    def mutate(w):
        for key, value in changes.items():
            if value is _DROP:
                w["bands"][index].pop(key, None)
            else:
                w["bands"][index][key] = value

    return mutate


def top(**changes):
    def mutate(w):
        for key, value in changes.items():
            if value is _DROP:
                w.pop(key, None)
            else:
                w[key] = value

    return mutate


def model(**changes):
    def mutate(w):
        for key, value in changes.items():
            if value is _DROP:
                w["model"].pop(key, None)
            else:
                w["model"][key] = value

    return mutate


def drop_band(index):
    return lambda w: w["bands"].pop(index)


def insert_band(index, source_index, **changes):
    def mutate(w):
        copy = dict(w["bands"][source_index], **changes)
        w["bands"].insert(index, copy)

    return mutate


def seq(*mutations):
    def mutate(w):
        for m in mutations:
            m(w)

    return mutate


_DROP = object()
D = "c=4: diverges from m=1 at 3 < 64"

CASES = [
    ("control", lambda w: None, 0, []),
    # S1 model
    ("wrong model", model(path="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"), 5, ['model "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" is not the blessed Qwen3.5-4B']),
    ("prefix is case-insensitive", model(path="QWEN3.5-4B-instruct.gguf"), 0, []),
    ("prefix, not substring", model(path="my-qwen3.5-4b.gguf"), 5, ['model "my-qwen3.5-4b.gguf" is not the blessed Qwen3.5-4B']),
    ("path quoted as Rust Debug", model(path='q"\\\n.gguf'), 5, ['model "q\\"\\\\\\n.gguf" is not the blessed Qwen3.5-4B']),
    ("model missing", top(model=_DROP), 5, ['model "" is not the blessed Qwen3.5-4B', "model sha256 missing"]),
    ("model null", top(model=None), 5, ['model "" is not the blessed Qwen3.5-4B', "model sha256 missing"]),
    ("model path missing", model(path=_DROP), 5, ['model "" is not the blessed Qwen3.5-4B']),
    ("model sha256 missing", model(sha256=_DROP), 5, ["model sha256 missing"]),
    ("model sha256 blank", model(sha256=" \t\n"), 5, ["model sha256 missing"]),
    # S4 identity, in field order
    ("no binary_sha256", top(binary_sha256=_DROP), 5, ["identity field binary_sha256 missing"]),
    ("null commit", top(commit=None), 5, ["identity field commit missing"]),
    ("blank host", top(host="   "), 5, ["identity field host missing"]),
    ("empty prompt_sha256", top(prompt_sha256=""), 5, ["identity field prompt_sha256 missing"]),
    ("U+001C is not blank in Rust", top(host="\x1c"), 0, []),
    (
        "all identity fields missing, in order",
        top(binary_sha256=_DROP, commit=_DROP, host=_DROP, prompt_sha256=_DROP),
        5,
        [f"identity field {k} missing" for k in ("binary_sha256", "commit", "host", "prompt_sha256")],
    ),
    # S2 bands
    ("no c=1", drop_band(C1), 5, ["band c=1 not measured"]),
    ("no c=4 (S7 not read)", drop_band(C4), 5, ["band c=4 not measured"]),
    ("no c=8", drop_band(C8), 5, ["band c=8 not measured"]),
    ("no c=16", drop_band(C16), 5, ["band c=16 not measured"]),
    (
        "c=8 twice: every copy is checked",
        insert_band(2, C8, result="FAIL"),
        5,
        ["band c=8 recorded 2 times; a witness has one band per c", "c=8: perf041 result FAIL"],
    ),
    (
        "c=1 twice: S7 is not read",
        insert_band(0, C1, decode_tok_s=1.0),
        5,
        ["band c=1 recorded 2 times; a witness has one band per c"],
    ),
    ("a failed band outside V3 is ignored", insert_band(4, C1, c=2, result="FAIL", m_formed=0), 0, []),
    # S6 result
    ("c=8 FAIL", band(C8, result="FAIL"), 5, ["c=8: perf041 result FAIL"]),
    ("c=1 result missing", band(C1, result=_DROP), 5, ["c=1: perf041 result not recorded"]),
    ("lowercase pass is not PASS", band(C4, result="pass"), 5, ["c=4: perf041 result pass"]),
    (
        "UNMEASURABLE without divergence_at reports only its result",
        band(C8, result="UNMEASURABLE", divergence_at=None),
        5,
        ["c=8: perf041 result UNMEASURABLE"],
    ),
    # S3 shape
    ("c=16 m_formed 14", band(C16, m_formed=14), 5, ["c=16: m_formed 14 != c (shape not served)"]),
    ("c=4 m_formed null", band(C4, m_formed=None), 5, ["c=4: m_formed not recorded (shape not shown)"]),
    ("c=4 m_formed missing", band(C4, m_formed=_DROP), 5, ["c=4: m_formed not recorded (shape not shown)"]),
    ("m_formed 0", band(C1, m_formed=0), 5, ["c=1: m_formed 0 != c (shape not served)"]),
    # floor
    ("declared_min 63 is below the floor", band(C8, declared_min=63), 5, ["c=8: declared_min 63 is below the floor of 64 (witness.min_agree_tokens)"]),
    ("declared_min 64 is the floor", band(C8, declared_min=64, divergence_at=64), 0, []),
    (
        "floor and S5 both speak",
        band(C4, declared_min=10, divergence_at=3),
        5,
        [
            "c=4: declared_min 10 is below the floor of 64 (witness.min_agree_tokens)",
            "c=4: diverges from m=1 at 3 < 10 with no near-tie margin recorded",
        ],
    ),
    # S5 agreement with m=1
    ("no declared_min", band(C4, declared_min=_DROP), 5, ["c=4: declared_min not recorded, so agreement with m=1 cannot be checked"]),
    (
        "no declared_min on a FAIL band: both reasons",
        band(C4, declared_min=None, result="FAIL"),
        5,
        ["c=4: perf041 result FAIL", "c=4: declared_min not recorded, so agreement with m=1 cannot be checked"],
    ),
    (
        "no divergence_at on a PASS band",
        band(C16, divergence_at=None),
        5,
        ["c=16: divergence_at not recorded on a PASS band, so agreement with m=1 is unmeasured"],
    ),
    ("no divergence_at on a FAIL band", band(C16, divergence_at=None, result="FAIL"), 5, ["c=16: perf041 result FAIL"]),
    ("divergence_at == declared_min passes", band(C4, divergence_at=64), 0, []),
    ("divergence_at one below", band(C4, divergence_at=63), 5, ["c=4: diverges from m=1 at 63 < 64 with no near-tie margin recorded"]),
    ("divergence_at 0", band(C4, divergence_at=0), 5, ["c=4: diverges from m=1 at 0 < 64 with no near-tie margin recorded"]),
    ("spec: divergence 3, margin 0.01", band(C4, divergence_at=3, top2_margin_at_divergence=0.01), 0, []),
    ("spec: divergence 3, no margin", band(C4, divergence_at=3), 5, [f"{D} with no near-tie margin recorded"]),
    ("margin 0 (exact tie) explains", band(C4, divergence_at=3, top2_margin_at_divergence=0), 0, []),
    ("margin just below epsilon", band(C4, divergence_at=3, top2_margin_at_divergence=0.04999999), 0, []),
    (
        "margin == epsilon does not (half-open)",
        band(C4, divergence_at=3, top2_margin_at_divergence=0.05),
        5,
        [f"{D}; the recorded top-2 margin 0.05 is not a near-tie (needs 0 <= margin < 0.05)"],
    ),
    (
        "negative margin does not",
        band(C4, divergence_at=3, top2_margin_at_divergence=-0.01),
        5,
        [f"{D}; the recorded top-2 margin -0.01 is not a near-tie (needs 0 <= margin < 0.05)"],
    ),
    (
        "whole margin prints without .0",
        band(C4, divergence_at=3, top2_margin_at_divergence=2.0),
        5,
        [f"{D}; the recorded top-2 margin 2 is not a near-tie (needs 0 <= margin < 0.05)"],
    ),
    (
        "tiny margin prints without exponent",
        band(C4, divergence_at=3, top2_margin_at_divergence=-1e-7),
        5,
        [f"{D}; the recorded top-2 margin -0.0000001 is not a near-tie (needs 0 <= margin < 0.05)"],
    ),
    ("margin ignored when agreement holds", band(C4, divergence_at=100, top2_margin_at_divergence=3.5), 0, []),
    # the near-tie cap
    ("one near-tie batched band is fine", band(C16, divergence_at=3, top2_margin_at_divergence=0.01), 0, []),
    (
        "two near-tie batched bands exceed the cap",
        seq(band(C4, divergence_at=3, top2_margin_at_divergence=0.01), band(C8, divergence_at=5, top2_margin_at_divergence=0.0)),
        5,
        ["near-tie cap: 2 batched bands (c=4, c=8) are admitted only by a near-tie margin; at most 1 of c=4, 8, 16 may be"],
    ),
    (
        "three near-tie batched bands",
        seq(*(band(i, divergence_at=3, top2_margin_at_divergence=0.01) for i in (C4, C8, C16))),
        5,
        ["near-tie cap: 3 batched bands (c=4, c=8, c=16) are admitted only by a near-tie margin; at most 1 of c=4, 8, 16 may be"],
    ),
    (
        "c=1 is not batched",
        seq(band(C1, divergence_at=3, top2_margin_at_divergence=0.01), band(C4, divergence_at=3, top2_margin_at_divergence=0.01)),
        0,
        [],
    ),
    (
        "a margin on an agreeing band is not counted",
        seq(band(C4, divergence_at=64, top2_margin_at_divergence=0.01), band(C8, divergence_at=3, top2_margin_at_divergence=0.01)),
        0,
        [],
    ),
    (
        "the cap counts FAIL bands and every copy",
        seq(
            band(C8, divergence_at=3, top2_margin_at_divergence=0.01, result="FAIL"),
            insert_band(3, C8, divergence_at=3, top2_margin_at_divergence=0.01, result="PASS"),
        ),
        5,
        [
            "band c=8 recorded 2 times; a witness has one band per c",
            "c=8: perf041 result FAIL",
            "near-tie cap: 2 batched bands (c=8, c=8) are admitted only by a near-tie margin; at most 1 of c=4, 8, 16 may be",
        ],
    ),
    # S7 decode
    (
        "spec: c=4 at 19.6 tok/s is 49%",
        band(C4, decode_tok_s=19.6),
        5,
        ["S7 (FALSIFY-CB-004): per-request decode at c=4 is 19.6 tok/s, 49.0% of c=1's 40 tok/s; needs at least 50%"],
    ),
    ("exactly 50% passes", band(C4, decode_tok_s=20), 0, []),
    ("c=8 and c=16 rates are never read", seq(band(C8, decode_tok_s=0.001), band(C16, decode_tok_s=None)), 0, []),
    ("no rate at c=4", band(C4, decode_tok_s=_DROP), 5, ["S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at c=4"]),
    ("null rate at c=1", band(C1, decode_tok_s=None), 5, ["S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at c=1"]),
    (
        "zero and negative rates are not rates",
        seq(band(C1, decode_tok_s=0), band(C4, decode_tok_s=-3.0)),
        5,
        ["S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at c=1 and c=4"],
    ),
    (
        "integer rates print as integers",
        seq(band(C1, decode_tok_s=100), band(C4, decode_tok_s=33)),
        5,
        ["S7 (FALSIFY-CB-004): per-request decode at c=4 is 33 tok/s, 33.0% of c=1's 100 tok/s; needs at least 50%"],
    ),
    (
        "percent is rounded to one decimal",
        seq(band(C1, decode_tok_s=3), band(C4, decode_tok_s=1)),
        5,
        ["S7 (FALSIFY-CB-004): per-request decode at c=4 is 1 tok/s, 33.3% of c=1's 3 tok/s; needs at least 50%"],
    ),
    # everything at once: order is model, identity, per band in 1, 4, 8, 16, cap, S7
    (
        "emission order",
        seq(
            model(path="x.gguf", sha256=""),
            top(host=None),
            band(C16, m_formed=2, result="FAIL", declared_min=8, divergence_at=3, top2_margin_at_divergence=0.2),
            band(C4, m_formed=None, divergence_at=1, top2_margin_at_divergence=0.0),
            band(C8, divergence_at=1, top2_margin_at_divergence=0.01),
            band(C4, decode_tok_s=1.5),
        ),
        5,
        [
            'model "x.gguf" is not the blessed Qwen3.5-4B',
            "model sha256 missing",
            "identity field host missing",
            "c=4: m_formed not recorded (shape not shown)",
            "c=16: perf041 result FAIL",
            "c=16: m_formed 2 != c (shape not served)",
            "c=16: declared_min 8 is below the floor of 64 (witness.min_agree_tokens)",
            "c=16: diverges from m=1 at 3 < 8; the recorded top-2 margin 0.2 is not a near-tie (needs 0 <= margin < 0.05)",
            "near-tie cap: 2 batched bands (c=4, c=8) are admitted only by a near-tie margin; at most 1 of c=4, 8, 16 may be",
            "S7 (FALSIFY-CB-004): per-request decode at c=4 is 1.5 tok/s, 3.8% of c=1's 40 tok/s; needs at least 50%",
        ],
    ),
    ("unknown fields are ignored", seq(top(extra={"x": [1]}), band(C1, slots=[{"odd": True}])), 0, []),
]


@pytest.mark.parametrize(("name", "mutate", "code", "reasons"), CASES, ids=[c[0] for c in CASES])
def test_case_table(control, name, mutate, code, reasons):
    mutate(control)
    verdict = shape_check_text(json.dumps(control), source="w.json")
    assert verdict.exit_code == code, verdict
    assert list(verdict.reasons) == reasons
    assert verdict.status == {0: "ADMISSIBLE", 5: "NOT ADMISSIBLE"}[code]


TYPE_ERRORS = [
    ("m_formed true", band(C1, m_formed=True)),
    ("c as a string", band(C4, c="4")),
    ("c as a float", band(C4, c=4.0)),
    ("c null", band(C4, c=None)),
    ("c missing", band(C4, c=_DROP)),
    ("negative c", band(C4, c=-4)),
    ("c beyond u32", band(C4, c=2**32 + 4)),
    ("divergence_at float", band(C4, divergence_at=3.5)),
    ("declared_min string", band(C4, declared_min="64")),
    ("margin false", band(C4, divergence_at=3, top2_margin_at_divergence=False)),
    ("margin a string", band(C4, divergence_at=3, top2_margin_at_divergence="0.01")),
    ("decode_tok_s a string", band(C4, decode_tok_s="30")),
    ("result a number", band(C4, result=1)),
    ("host a number", top(host=7)),
    ("model a string", top(model="Qwen3.5-4B.gguf")),
    ("model path a list", model(path=["a"])),
    ("bands an object", top(bands={"c": 1})),
    ("bands a number", top(bands=4)),
    ("a band that is a list", lambda w: w["bands"].append([1, 4])),
]


@pytest.mark.parametrize(("name", "mutate"), TYPE_ERRORS, ids=[t[0] for t in TYPE_ERRORS])
def test_mistyped_witness_is_red_never_not_admissible(control, name, mutate):
    mutate(control)
    verdict = shape_check_text(json.dumps(control))
    assert verdict.status == "RED"
    assert verdict.exit_code == 4
    assert len(verdict.reasons) == 1 and verdict.reasons[0].startswith("RED: unreadable witness: ")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "RED: empty witness"),
        (" \n\t\r ", "RED: empty witness"),
        ("{}", "RED: the witness measured no bands"),
        ('{"bands": null}', "RED: the witness measured no bands"),
        ('{"bands": []}', "RED: the witness measured no bands"),
        ('{"host": "h", "bands": []}', "RED: the witness measured no bands"),
    ],
)
def test_red_texts(text, reason):
    verdict = shape_check_text(text)
    assert (verdict.status, verdict.reasons, verdict.exit_code) == ("RED", (reason,), 4)
    assert verdict.stdout_lines() == []
    assert str(verdict) == reason


@pytest.mark.parametrize(
    "text",
    ["{", "[]", "3", "null", '"witness"', '{"bands": 4}', '{"bands": [{"c": NaN}]}', '{"bands": [{"c": 1, "decode_tok_s": 1e999}]}',
     '{"bands": [{"c": 1}], "bands": [{"c": 4}]}', '{"bands": [{"c": 1, "c": 4}]}', '\ufeff{"bands": [{"c": 1}]}'],
)
def test_unreadable_texts(text):
    verdict = shape_check_text(text)
    assert verdict.status == "RED" and verdict.exit_code == 4
    assert verdict.reasons[0].startswith("RED: unreadable witness: ")


def test_mistyped_field_beats_no_bands():
    # serde reads the whole witness before looking at the bands
    assert shape_check_text('{"host": 3}').reasons[0].startswith("RED: unreadable witness: ")


def test_duplicate_unknown_key_is_ignored(control):
    text = json.dumps(control)[:-1] + ', "x": 1, "x": 2}'
    assert shape_check_text(text).status == "ADMISSIBLE"


def test_real_v2_witness_gives_the_five_reasons():
    verdict = shape_check(V2_WITNESS)
    assert verdict.exit_code == 5
    assert list(verdict.reasons) == [
        'model "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" is not the blessed Qwen3.5-4B',
        "c=4: diverges from m=1 at 3 < 64 with no near-tie margin recorded",
        "c=8: diverges from m=1 at 3 < 64 with no near-tie margin recorded",
        "c=16: diverges from m=1 at 3 < 64 with no near-tie margin recorded",
        "S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at c=1 and c=4",
    ]


def test_shape_check_missing_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        shape_check(tmp_path / "absent.json")
    with pytest.raises(IsADirectoryError):
        shape_check(tmp_path)


def test_non_utf8_file_is_red(tmp_path):
    path = tmp_path / "w.json"
    path.write_bytes(b'{"host": "\xff"}')
    verdict = shape_check(path)
    assert verdict.status == "RED" and verdict.reasons[0].startswith(f"RED: cannot read witness {path}: ")


# --- the verdict object -------------------------------------------------------------------


def test_verdict_prints_as_the_cli_does_and_renders_escaped_html(control):
    control["model"]["path"] = "<script>alert(1)</script>.gguf"
    verdict = shape_check_data(control, source="w.json")
    assert str(verdict).splitlines() == [
        "V3 shape check w.json: NOT ADMISSIBLE",
        '  - model "<script>alert(1)</script>.gguf" is not the blessed Qwen3.5-4B',
    ]
    html = verdict._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "NOT ADMISSIBLE" in html
    frame = verdict.to_frame()
    assert frame["reason"].to_list() == list(verdict.reasons)
    assert verdict.to_frame("pandas")["reason"].tolist() == list(verdict.reasons)


# --- the policy is data -------------------------------------------------------------------


def test_default_policy_is_aprenders():
    p = V3Policy()
    assert (p.model_prefix, p.model_label, p.bands, p.near_tie_epsilon, p.near_tie_cap, p.declared_min_floor, p.s7_ratio) == (
        "qwen3.5-4b", "Qwen3.5-4B", (1, 4, 8, 16), 0.05, 1, 64, 0.5
    )


def test_own_model_and_bands(control):
    control["model"]["path"] = "Llama-3.1-8B.Q8_0.gguf"
    control["bands"] = [b for b in control["bands"] if b["c"] in (1, 4)] + [dict(control["bands"][1], c=2, m_formed=2)]
    policy = V3Policy(model_prefix="llama-3.1-8b", bands=(1, 2, 4))
    assert shape_check_data(control, policy=policy).status == "ADMISSIBLE"
    assert shape_check_data(control).reasons[0] == 'model "Llama-3.1-8B.Q8_0.gguf" is not the blessed Qwen3.5-4B'


def test_policy_constants_change_the_texts(control):
    control["bands"][C4].update(divergence_at=3, top2_margin_at_divergence=0.05, decode_tok_s=20)
    policy = V3Policy(near_tie_epsilon=0.1, s7_ratio=0.75, declared_min_floor=100)
    reasons = shape_check_data(control, policy=policy).reasons
    assert list(reasons) == [
        *(f"c={c}: declared_min 64 is below the floor of 100 (witness.min_agree_tokens)" for c in (1, 4, 8, 16)),
        "S7 (FALSIFY-CB-004): per-request decode at c=4 is 20 tok/s, 50.0% of c=1's 40 tok/s; needs at least 75%",
    ]


def test_policy_file_toml_and_json(tmp_path):
    toml = tmp_path / "p.toml"
    toml.write_text('model_prefix = "mistral"\nnear_tie_cap = 2\n')
    assert V3Policy.from_file(toml).near_tie_cap == 2
    js = write_json(tmp_path / "p.json", {"bands": [1, 2]})
    assert V3Policy.from_file(js, near_tie_cap=0).bands == (1, 2)
    bad = write_json(tmp_path / "bad.json", {"epsilon": 1})
    with pytest.raises(PolicyError, match="unknown policy fields \\['epsilon'\\]"):
        V3Policy.from_file(bad)
    with pytest.raises(PolicyError):
        V3Policy(bands=(1, 1))
    with pytest.raises(PolicyError):
        V3Policy(near_tie_epsilon=float("nan"))


# --- the command line ----------------------------------------------------------------------


@pytest.mark.slow
def test_cli_real_witness_exits_5_with_exact_stdout():
    run = bia("shape-check", "data/aprender-lambda/witness@464c168e62.json", cwd=V2_WITNESS.parents[2])
    assert run.returncode == 5
    assert run.stdout == (
        "V3 shape check data/aprender-lambda/witness@464c168e62.json: NOT ADMISSIBLE\n"
        '  - model "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" is not the blessed Qwen3.5-4B\n'
        "  - c=4: diverges from m=1 at 3 < 64 with no near-tie margin recorded\n"
        "  - c=8: diverges from m=1 at 3 < 64 with no near-tie margin recorded\n"
        "  - c=16: diverges from m=1 at 3 < 64 with no near-tie margin recorded\n"
        "  - S7 (FALSIFY-CB-004) is unmeasured: no positive per-request decode_tok_s at c=1 and c=4\n"
    )
    assert run.stderr == ""


@pytest.mark.slow
def test_cli_spec_examples(tmp_path, control):
    ok = write_json(tmp_path / "control.json", control)
    run = bia("shape-check", str(ok))
    assert (run.returncode, run.stdout) == (0, f"V3 shape check {ok}: ADMISSIBLE\n")

    control["bands"][C4]["decode_tok_s"] = 19.6
    slow = write_json(tmp_path / "slow.json", control)
    run = bia("shape-check", str(slow))
    assert run.returncode == 5
    assert run.stdout.splitlines()[1] == (
        "  - S7 (FALSIFY-CB-004): per-request decode at c=4 is 19.6 tok/s, 49.0% of c=1's 40 tok/s; needs at least 50%"
    )

    empty_object = tmp_path / "empty.json"
    empty_object.write_text("{}")
    run = bia("shape-check", str(empty_object))
    assert (run.returncode, run.stdout, run.stderr) == (4, "", "RED: the witness measured no bands\n")

    run = bia("shape-check", str(tmp_path))
    assert run.returncode == 3 and run.stdout == ""
    run = bia("shape-check", str(tmp_path / "absent.json"))
    assert run.returncode == 3 and "absent.json" in run.stderr


@pytest.mark.slow
def test_cli_policy_options(tmp_path, control):
    control["model"]["path"] = "llama-3.1-8b.gguf"
    path = write_json(tmp_path / "w.json", control)
    assert bia("shape-check", str(path)).returncode == 5
    assert bia("shape-check", str(path), "--model-prefix", "llama-3.1-8b").returncode == 0
    policy = tmp_path / "policy.toml"
    policy.write_text('model_prefix = "llama-3.1-8b"\nbands = [1, 4, 8, 16, 32]\n')
    run = bia("shape-check", str(path), "--policy", str(policy))
    assert (run.returncode, run.stdout.splitlines()[1:]) == (5, ["  - band c=32 not measured"])
    run = bia("shape-check", str(path), "--bands", "1,x")
    assert run.returncode == 2 and "--bands" in run.stderr
