"""The columnar run tables equal the plain per-stream implementation (``parity_oracle.py``) on random
streams: nulls, ties, cut and empty streams, forks at step 0, tokens known only by text and bytes,
duplicate candidates, probabilities that underflow, rows out of order."""

from __future__ import annotations

import json
import math

import parity_oracle as oracle
import polars as pl
import pytest
from conftest import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from analysis import parity
from analysis.metrics.parity._columnar import build_steps, compare_pairs
from analysis.dumps import Dump
from analysis.dumps._schema import CANDIDATE_SCHEMA, REQUEST_SCHEMA, TOKEN_SCHEMA, conform
from analysis.run import Run, band_table, flip_table, prompt_table, slot_table, to_witness

# Few values, so that equal tokens, equal bits, near-ties and exact ties are common.
LOGPROBS = [None, 0.0, -0.0, -0.1, -0.10000000001, -0.1000001, -0.5, -0.52, -2.0, -800.0]
TOKENS = [(1, None, None), (2, None, None), (3, None, None), (None, "a", b"a"), (None, "a", None), (None, None, b"\xff"), (None, "b", b"b")]


def token_strategy(text_tokens: bool):
    return st.sampled_from(TOKENS if text_tokens else TOKENS[:3])


@st.composite
def steps_of(draw, text_tokens: bool, length: int):
    """A stream's steps: (token, logprob, [(candidate token, logprob), ...])."""
    token = token_strategy(text_tokens)
    return [(draw(token), draw(st.sampled_from(LOGPROBS)),
             draw(st.lists(st.tuples(token, st.sampled_from(LOGPROBS)), max_size=4))) for _ in range(length)]


@st.composite
def variant(draw, base, text_tokens: bool):
    """A copy of ``base`` that may part at any step (0 included), drift in its values, or be cut short."""
    out = list(base)
    if out and draw(st.booleans()):
        at = draw(st.integers(0, len(out) - 1))
        out[at:] = draw(steps_of(text_tokens, len(out) - at))
    for i in draw(st.lists(st.integers(0, max(len(out) - 1, 0)), max_size=3)):
        if i < len(out):
            token, _, cands = out[i]
            out[i] = (token, draw(st.sampled_from(LOGPROBS)), list(reversed(cands)) if draw(st.booleans()) else cands)
    if draw(st.booleans()):
        out = out[: draw(st.integers(0, len(out)))]
    return out


@st.composite
def runs(draw):
    text_tokens = draw(st.booleans())
    flagged = draw(st.booleans())  # frames from a reader carry is_duplicate; frames built by hand may not
    unique_lists = draw(st.booleans())
    tokens, candidates, requests = [], [], []
    record = 0
    for p in range(draw(st.integers(1, 2))):
        base = draw(steps_of(text_tokens, draw(st.integers(0, 6))))
        plan = [("reference", None, s, 0) for s in (0, 1)] + [("band", c, s, r) for r in range(draw(st.integers(1, 2))) for c in (1, 3) for s in range(c)]
        for role, c, slot, repeat in plan:
            record += 1
            stream = draw(variant(base, text_tokens))
            positions = sorted(draw(st.lists(st.integers(0, 40), min_size=len(stream), max_size=len(stream), unique=True)))
            for (token, logprob, cands), position in zip(stream, positions):
                key = {"source": "s", "record": record, "choice_index": 0, "segment": "completion", "position": position}
                tokens.append({**key, "token_id": token[0], "token_text": token[1], "token_bytes": token[2], "logprob": logprob})
                identities = [t[0] if t[0] is not None else t[1:] for t, _ in cands]  # as the reader flags a token seen before in its list
                if unique_lists:  # no token twice in any list: the columnar path then trusts the reader's flags
                    cands = [c for i, c in enumerate(cands) if identities[i] not in identities[:i]]
                    identities = list(dict.fromkeys(identities))
                candidates += [{**key, "list_kind": "top_logprobs", "list_index": i, "cand_token_id": t[0], "cand_token_text": t[1],
                                "cand_token_bytes": t[2], "cand_logprob": v, "is_duplicate": identities[i] in identities[:i] if flagged else None}
                               for i, (t, v) in enumerate(cands)]
            timing = draw(st.sampled_from([(None, None, None, None), (3, 0.5, 1.5, 3), (1, 0.5, 1.5, 3), (4, 0.2, 0.2, 4), (4, 0.1, 2.0, 1)]))
            sent = draw(st.sampled_from([None, 0.0, 0.25]))
            requests.append({"source": "s", "record": record, "choice_index": 0, "prompt_id": f"p{p}", "role": role, "c": c, "slot": slot,
                             "repeat": None if role == "reference" else repeat, "completion_tokens": timing[0], "ttft_s": timing[1],
                             "t_last_content": timing[2], "n_content_chunks": timing[3], "stream_live": draw(st.sampled_from([None, True, False])),
                             "extra": None if sent is None else json.dumps({"sent_at_s": sent})})
    frames = [conform(pl.DataFrame(rows, schema={k: v for k, v in schema.items() if k in (rows[0] if rows else {})}, orient="row"), schema)
              if rows else pl.DataFrame(schema=schema) for rows, schema in ((tokens, TOKEN_SCHEMA), (candidates, CANDIDATE_SCHEMA), (requests, REQUEST_SCHEMA))]
    shuffled = [frame.sample(fraction=1.0, shuffle=True, seed=draw(st.integers(0, 2**16))) for frame in frames[:2]]
    return Run({"ladder": [1, 3], "declared_min": 2, "sampler": {"max_tokens": 4}}, Dump(*shuffled, frames[2]))


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def assert_rows_equal(columnar: list[dict], plain: list[dict], columns) -> None:
    assert len(columnar) == len(plain)
    for got, want in zip(columnar, plain):
        for name in columns:
            assert same(got[name], want[name]), (name, got, want)


SLOT_COLUMNS = ["prompt_id", "c", "repeat", "slot", "diverged", "divergence_at", "bitwise_prefix", "max_abs_delta", "max_ulp",
                "topk_order_changes", "reference_margin", "own_margin", "in_reference_topk", "near_tie", "k3_mean", "k3_max", "kl_topk_mean",
                "kl_topk_max", "length", "ttft_s", "decode_tok_s"]
BAND_COLUMNS = ["prompt_id", "c", "repeat", "m_formed", "n_slots", "divergence_min", "divergence_median", "divergence_max", "diverged_slots",
                "near_tie_slots", "intra_agree_to", "max_constant_run", "unique_completions", "modal_share", "modal_share_low", "modal_share_high",
                "decode_tok_s", "s_per_1000_seq", "release_skew_s", "prefix_cache"]
PROMPT_COLUMNS = ["prompt_id", "tie_density_1e-3", "tie_density_1e-2", "tie_density_1e-1", "div_index", "avg_std_top1_prob", "std_output_length"]


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(run=runs(), epsilon=st.sampled_from([parity.NEAR_TIE_EPSILON, 0.3]))
def test_columnar_tables_equal_the_plain_implementation(run, epsilon):
    plain = oracle.comparisons(run, epsilon)
    slots = slot_table(run, epsilon=epsilon)
    assert_rows_equal(slots.to_dicts(), [{**{k: row[k] for k in ("prompt_id", "c", "repeat", "slot", "ttft_s", "decode_tok_s")}, **vars(c)}
                                         for row, c in plain], SLOT_COLUMNS)
    assert_rows_equal(band_table(run, epsilon=epsilon).to_dicts(), oracle.band_rows(run, epsilon), BAND_COLUMNS)
    assert_rows_equal(prompt_table(run).to_dicts(), oracle.prompt_rows(run), PROMPT_COLUMNS)
    assert_rows_equal(flip_table(run).to_dicts(), oracle.flip_curve(run).to_dicts(), ["margin_low", "margin_high", "steps", "flips", "p_flip"])


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(run=runs())
def test_every_comparison_field_and_the_witness_agree_with_the_plain_implementation(run):
    """``topk_set_changes`` and ``reference_length`` are in no table: check them pair by pair, and the witness built on them."""
    plain = oracle.comparisons(run)
    steps = build_steps([(run.dump.tokens, run.dump.candidates, run.dump.requests)])
    number = {(r["source"], r["record"]): r["req"] for r in steps.requests.iter_rows(named=True)}
    ref_rows = {r["prompt_id"]: r for r in run.dump.requests.filter((pl.col("role") == "reference") & (pl.col("slot") == 0)).iter_rows(named=True)}
    pairs = pl.DataFrame([(i, number[("s", ref_rows[row["prompt_id"]]["record"])], number[("s", row["record"])]) for i, (row, _) in enumerate(plain)],
                         schema={"pair": pl.Int64, "ref": pl.Int64, "other": pl.Int64}, orient="row")
    got = compare_pairs(steps, pairs, epsilon=parity.NEAR_TIE_EPSILON).to_dicts()
    assert_rows_equal(got, [vars(c) for _, c in plain], [f for f in vars(plain[0][1]) if f != "epsilon"] if plain else [])
    for prompt in sorted(ref_rows):
        assert to_witness(run, prompt) == oracle_witness(run, prompt)


def oracle_witness(run: Run, prompt: str) -> dict:
    """The witness as the per-stream code built it: recomputed here from streams for the fields the columnar path fills."""
    witness = to_witness(run, prompt)
    all_streams = oracle.streams(run)
    rows = run.dump.requests.filter(pl.col("prompt_id") == prompt)
    refs = [oracle.stream_of(all_streams, r) for r in rows.filter(pl.col("role") == "reference").sort("slot").iter_rows(named=True)]
    expected = json.loads(json.dumps(witness))
    if len(refs) >= 2 and expected["reference"].get("self_divergence_at") is not None:
        expected["reference"]["self_divergence_at"] = parity.agreement(refs[0].identities, refs[1].identities)
    for band in expected["bands"]:
        if band["divergence_at"] is None:
            continue
        slots = [oracle.stream_of(all_streams, r) for r in rows.filter((pl.col("role") == "band") & (pl.col("c") == band["c"])
                                                                           & (pl.col("repeat") == 0)).sort("slot").iter_rows(named=True)]
        first = parity.compare(refs[0], slots[0])
        band["divergence_at"] = first.agree_to
        band["intra_agree_to"] = min(parity.agreement(slots[0].identities, s.identities) for s in slots)
        band["max_constant_run"] = max(parity.longest_constant_run(s.identities) for s in slots)
    return expected


@example(edges=(0.0, 0.0, 1.0))
@given(edges=st.lists(st.sampled_from([0.0, 1e-3, 0.25, 0.5, math.inf]), min_size=2, max_size=5, unique=True).map(sorted).map(tuple))
@settings(max_examples=examples(30), deadline=None)
def test_flip_bins_follow_the_half_open_edges(edges):
    ref = parity.Stream(("r",), (1, 2, 3), (), (((1, -0.5), (3, -0.5)), ((2, -0.125), (4, -0.625)), ((3, -0.25), (5, -0.5))))
    curve = parity.flip_curve([(ref, parity.Stream(("b",), (1, 2, 9)))], edges)
    # margins at risk (exact in binary): 0.0, 0.5, 0.25 (the flip); each lands in the one bin [low, high) that holds it
    for row in curve.iter_rows(named=True):
        inside = [m for m in (0.0, 0.5, 0.25) if row["margin_low"] <= m < row["margin_high"]]
        assert row["steps"] == len(inside)
        assert row["flips"] == inside.count(0.25)


def test_a_witness_from_the_columnar_path_matches_its_hand_worked_values():
    """ref #1 and ref #2 agree on all 3 steps; the band's slot 0 parts at step 1 where the reference's margin is 0.4."""
    cands = [[(1, -0.1), (2, -0.5)], [(2, -0.2), (3, -0.6)], [(3, -0.1), (4, -0.9)]]
    tokens, candidates, requests = [], [], []
    for record, (role, c, slot, ids) in enumerate([("reference", None, 0, [1, 2, 3]), ("reference", None, 1, [1, 2, 3]), ("band", 1, 0, [1, 3, 3])]):
        requests.append({"source": "s", "record": record, "choice_index": 0, "prompt_id": "p", "role": role, "c": c, "slot": slot,
                         "repeat": None if role == "reference" else 0, "completion_tokens": 3})
        for position, token in enumerate(ids):
            key = {"source": "s", "record": record, "choice_index": 0, "segment": "completion", "position": position}
            tokens.append({**key, "token_id": token, "logprob": -0.1})
            candidates += [{**key, "list_kind": "top_logprobs", "list_index": i, "cand_token_id": t, "cand_logprob": v} for i, (t, v) in enumerate(cands[position])]
    frames = [conform(pl.DataFrame(rows), schema) for rows, schema in ((tokens, TOKEN_SCHEMA), (candidates, CANDIDATE_SCHEMA), (requests, REQUEST_SCHEMA))]
    manifest = {"ladder": [1], "declared_min": 1, "sampler": {"max_tokens": 3}, "m_formed": [{"prompt_id": "p", "c": 1, "widths": [1]}]}
    witness = to_witness(Run(manifest, Dump(*frames)), "p")
    assert witness["reference"]["self_divergence_at"] == 3
    band = witness["bands"][0]
    assert (band["divergence_at"], band["intra_agree_to"], band["max_constant_run"]) == (1, 3, 2)
    assert band["top2_margin_at_divergence"] == pytest.approx(0.4)


@pytest.mark.parametrize("flagged", [True, False])
def test_a_candidate_without_a_value_is_left_out_of_the_kl_by_either_path(flagged):
    """The reference lists token 9 with no value and the other does not list it: the KL is over tokens 1 and 2 alone,
    whether the columnar path trusts the reader's duplicate flags (no token twice here) or finds first entries itself."""
    ref_list = [(1, math.log(0.5)), (2, math.log(0.3)), (9, None)]
    other_list = [(2, math.log(0.4)), (1, math.log(0.4))]
    rows = []
    for record, cands in ((0, ref_list), (1, other_list)):
        key = {"source": "s", "record": record, "choice_index": 0, "segment": "completion", "position": 0}
        rows += [{**key, "list_kind": "top_logprobs", "list_index": i, "cand_token_id": t, "cand_logprob": v,
                  "is_duplicate": False if flagged else None} for i, (t, v) in enumerate(cands)]
    tokens = conform(pl.DataFrame([{"source": "s", "record": r, "choice_index": 0, "segment": "completion", "position": 0, "token_id": 1,
                                    "logprob": math.log(0.5)} for r in (0, 1)]), TOKEN_SCHEMA)
    requests = conform(pl.DataFrame({"source": ["s", "s"], "record": [0, 1], "choice_index": [0, 0]}), REQUEST_SCHEMA)
    steps = build_steps([(tokens, conform(pl.DataFrame(rows), CANDIDATE_SCHEMA), requests)])
    got = compare_pairs(steps, pl.DataFrame({"pair": [0], "ref": [0], "other": [1]}), epsilon=0.05).row(0, named=True)
    want = parity.topk_kl(ref_list, other_list)  # 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4) + 0.2 ln(0.2/0.2)
    assert got["kl_topk_max"] == pytest.approx(want) and want == pytest.approx(0.02527, abs=1e-5)


def hand_run(streams: list[tuple[str, int | None, int, list[int], list[float]]]) -> Run:
    """A run from (role, c, slot, token ids, logprobs) per request, one prompt, no candidates."""
    tokens, requests = [], []
    for record, (role, c, slot, ids, values) in enumerate(streams):
        requests.append({"source": "s", "record": record, "choice_index": 0, "prompt_id": "p", "role": role, "c": c, "slot": slot,
                         "repeat": None if role == "reference" else 0})
        tokens += [{"source": "s", "record": record, "choice_index": 0, "segment": "completion", "position": i, "token_id": t, "logprob": v}
                   for i, (t, v) in enumerate(zip(ids, values))]
    frames = [conform(pl.DataFrame(tokens), TOKEN_SCHEMA), pl.DataFrame(schema=CANDIDATE_SCHEMA), conform(pl.DataFrame(requests), REQUEST_SCHEMA)]
    return Run({"ladder": [3]}, Dump(*frames))


def test_band_forks_and_drift_by_hand():
    """Slots 1 and 2 take token 4 where slot 0 takes 3, at step 2; before it slot 1 drifts by 0.25 at step 1."""
    from analysis.run import band_forks, drift_table

    run = hand_run([("reference", None, 0, [1, 2, 3], [-0.5, -0.5, -0.5]),
                    ("band", 3, 0, [1, 2, 3], [-0.5, -0.5, -0.5]),
                    ("band", 3, 1, [1, 2, 4], [-0.5, -0.75, -0.5]),
                    ("band", 3, 2, [1, 2, 4, 5], [-0.5, -0.5, -0.5, -1.0])])
    assert band_forks(run).select("position", "token_id", "slots").rows() == [(2, 4, 2), (2, 3, 1)]
    assert drift_table(run).rows() == [("p c=3 slot 0", 0, 0.0), ("p c=3 slot 0", 1, 0.0), ("p c=3 slot 0", 2, 0.0),
                                       ("p c=3 slot 1", 0, 0.0), ("p c=3 slot 1", 1, 0.25),
                                       ("p c=3 slot 2", 0, 0.0), ("p c=3 slot 2", 1, 0.0)]


def test_a_pandas_backed_run_gives_the_tables_of_a_polars_one():
    """pandas holds integer columns with gaps as floats; the tables read them back as the schema's integers."""
    from polars.testing import assert_frame_equal

    from analysis.run import read_run

    pandas_run, polars_run = read_run("data/experiment-cpu/default", backend="pandas"), read_run("data/experiment-cpu/default")
    for table in (slot_table, band_table, prompt_table, flip_table):
        assert_frame_equal(table(pandas_run), table(polars_run))
    assert to_witness(pandas_run, "p1") == to_witness(polars_run, "p1")
