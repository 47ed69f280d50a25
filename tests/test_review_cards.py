"""The verdict cards keep run-to-run change apart from batching (issue 22, item 2), with values worked out by hand.

Each card's headline is its judgement (analysis.judge, issue 31): a server whose two m=1 references part from each other
is RED for run-to-run drift before batching is judged. Below the headline, the card says where the references part,
counts batching only before it, and, where it disagrees with aprender's recorded verdict, says why in one line.
"""

from __future__ import annotations

import json

import polars as pl
from conftest import ROOT, V2_WITNESS

from analysis import read_run, read_witnesses
from analysis.metrics import per_c_counts
from analysis.views.html.review import _within_spans, run_review
from analysis.views.html.witness_review import witness_reviews


def _card(path) -> dict:
    review = witness_reviews(read_witnesses(path), epsilon=0.05)[0]
    return {"headline": review.headline, "css": review.css, **{q: a for q, a, _ in review.lines}}


def test_the_v2_witness_card_puts_c1_on_run_to_run_and_says_why_aprender_passes():
    # References agree to token 100 of 128; the c=1 request parts at 100 (run-to-run), every c >= 4 request at token 3.
    card = _card(V2_WITNESS)
    assert card["headline"] == ("RED (run-to-run): not reproducible alone (run to run): the two m=1 references part at token 100 of 128 "
                                "(28 batched requests part earlier than that, the first at c=4 token 3); batching is not judged until "
                                "the server repeats itself alone.")
    assert card["run-to-run"] == ("the two m=1 references agree only to token 100 of 128: the server is not deterministic even alone. "
                                  "Batching is judged on the tokens before 100; 1 request(s) parting at or after it (c=1) count as "
                                  "run-to-run, not batching.")
    assert card["aprender"] == ("recorded PASS; bia's rule: RED, run-to-run: witness_version 2 passes a batch whose requests agree with "
                                "each other (here to token 128, declared_min 64) without comparing them with m=1, where bia compares "
                                "every request with m=1")
    assert card["completeness"] == "complete: 29 of 29 slot(s) across 4 band(s), none refused."


def test_a_witness_whose_only_parting_is_run_to_run_is_token_identical(tmp_path):
    # The same witness with every batched request agreeing with m=1 to the end: only c=1 parts, at token 100, where the
    # references themselves part. Before the change its card said "tokens part from m=1 already at c=1, alone".
    witness = json.loads(V2_WITNESS.read_text())
    for band in witness["bands"]:
        if band["c"] > 1:
            band["divergence_at"] = 128
            for slot in band["slots"]:
                slot["agree_to"] = 128
    path = tmp_path / "witness.json"
    path.write_text(json.dumps(witness))
    card = _card(path)
    assert card["headline"] == ("RED (run-to-run): not reproducible alone (run to run): the two m=1 references part at token 100 of 128; "
                                "batching is not judged until the server repeats itself alone.")
    assert card["css"] == "fail"
    assert card["tokens"] == "100% (29 of 29) token-identical: no request parted from m=1."  # counted only before the references part
    assert "1 request(s) parting at or after it (c=1)" in card["run-to-run"]
    assert card["aprender"].startswith("recorded PASS; bia's rule: RED, run-to-run")  # aprender's rules pass it; the card says why not


def test_a_witness_whose_references_agree_has_no_run_to_run_line():
    card = _card(ROOT / "data" / "aprender-lambda" / "witness-variant-batched-prefill-0.json")  # references agree to 128 of 128
    assert "run-to-run" not in card and "aprender" not in card  # v1 records FAIL, and the card is RED
    assert card["headline"] == ("RED (co-batching): 28 of 28 batched requests part from m=1 in tokens; the first is c=4 slot 0: its tokens "
                                "part at token 3.")


def test_requests_are_judged_only_where_their_references_agree():
    # p0's references part in tokens at 10 and in bits at 5 (of 20 tokens); p1's agree; p2's differ in bits from token 0.
    spans = pl.DataFrame({"prompt_id": ["p0", "p1", "p2"], "token_span": [10, None, None], "bit_span": [5, None, 0], "length": [20, 20, 20]},
                         schema={"prompt_id": pl.String, "token_span": pl.Int64, "bit_span": pl.Int64, "length": pl.Int64})
    slots = pl.DataFrame({
        "prompt_id": ["p0", "p0", "p0", "p0", "p1", "p1", "p2"],
        "c": [4] * 7, "slot": [0, 1, 2, 3, 0, 1, 0],
        "diverged": [True, True, False, False, True, False, False],
        "divergence_at": [12, 7, None, None, 12, None, None],
        "bitwise_prefix": [5, 5, 5, 4, 3, 20, 20],
        "length": [20] * 7, "max_ulp": [0] * 7,
        "near_tie": [False] * 7, "reference_margin": [0.5] * 7,
    }, schema_overrides={"divergence_at": pl.Int64})
    rows = _within_spans(slots, spans).collect()
    assert rows["diverged"].to_list() == [False, True, False, False, True, False, False]  # 12 >= p0's 10: run-to-run; p1 has no span
    assert rows["bitwise"].to_list() == [True, True, True, False, False, True, None]  # p0 judged on its first 5 bits; p2 not at all


def test_equal_tokens_without_logprobs_have_unknown_bits_and_parted_tokens_known_ones():
    spans = pl.DataFrame(schema={"prompt_id": pl.String, "token_span": pl.Int64, "bit_span": pl.Int64, "length": pl.Int64})
    slots = pl.DataFrame({"prompt_id": ["p0", "p0"], "c": [8, 8], "slot": [0, 1], "diverged": [False, True], "divergence_at": [None, 2],
                          "bitwise_prefix": [6, 2], "length": [6, 6], "max_ulp": [None, None], "near_tie": [False] * 2,
                          "reference_margin": [None] * 2},
                         schema_overrides={"divergence_at": pl.Int64, "max_ulp": pl.Int64, "reference_margin": pl.Float64})
    assert _within_spans(slots, spans).collect()["bitwise"].to_list() == [None, False]


def test_the_cache_prompt_run_says_its_bits_cannot_be_judged():
    # With llama.cpp's prompt cache on, ref #2 finds ref #1's prompt cached and differs from it in the first logprob's bits.
    review = run_review(read_run(ROOT / "data" / "llamacpp-cpu" / "cache-prompt"), epsilon=0.05)
    lines = {q: a for q, a, _ in review.lines}
    assert review.headline.startswith("RED (prompt cache): not reproducible alone (its prompt cache): 4 of 4 requests sent alone part "
                                      "from ref #1 of their prompt, the first p0 ref #2, sent alone")
    assert review.css == "fail" and review.verdict == "RED"
    assert lines["bits"] == "not judged: the two m=1 references differ in their logprob bits from the first token on."
    assert lines["run-to-run"] == ("the two m=1 references differ from each other (p0: logprob bits at token 0 of 64; p1: logprob bits at "
                                   "token 0 of 64): the server is not deterministic even alone. Batching is judged only where they agree.")
    assert set(review.per_c["bit-identical to m=1"]) == {"not judged"}


def test_a_run_whose_references_agree_is_judged_as_before():
    review = run_review(read_run(ROOT / "data" / "llamacpp-cpu" / "no-cache-prompt"), epsilon=0.05)
    assert review.headline.startswith("RED (co-batching): 56 of 56 batched requests part from m=1 (0 in tokens, 56 only in bits); the first "
                                      "is p0 c=4 repeat 0 slot 0")
    assert "run-to-run" not in {q for q, _, _ in review.lines}


def test_the_gate_section_says_why_a_recorded_pass_is_not_bias_verdict():
    # aprender's gate lists each witness's recorded verdict: the v2 witness records PASS and bia judges it RED (run-to-run), so
    # the recorded verdict is said with bia's and why, coloured as bia's RED, never the green of a PASS; v1 agrees and stays short
    import re

    from analysis.views.html import admission_html, judge_report
    from analysis.verdicts import V3Policy

    ws = read_witnesses(ROOT / "data" / "aprender-lambda", progress=False)
    policy = V3Policy()
    page = admission_html(ws, ws.shape_checks(policy), [], policy, judge_report(ws, []))
    recorded = dict(re.findall(r"<h3><code>[^<]*?([\w@.-]+\.json)</code></h3>.*?Recorded run verdict: (<span.*?</span>)", page, flags=re.S))
    assert recorded["witness@464c168e62.json"] == (
        '<span class="bia-fail">recorded PASS; bia&#39;s rule: RED, run-to-run: witness_version 2 passes a batch whose requests '
        "agree with each other (here to token 128, declared_min 64) without comparing them with m=1, where bia compares every "
        "request with m=1</span>")
    assert recorded["witness-v3.0-rule.json"] == '<span class="bia-fail">FAIL</span>'  # recorded FAIL, judged RED: they agree
    derived = re.search(r"witness@464c168e62\.json.*?re-derived with the version 2 rules: (<span[^>]*>)", page, flags=re.S)
    assert derived.group(1) == '<span class="bia-fail">'  # aprender's own rules re-derive PASS: not green beside bia's RED either
    assert "bia-pass" not in page.split("witness@464c168e62.json")[1].split("V3 shape check")[0]


def test_the_cards_counts_keep_the_slot_tables_order_at_scale():
    """The per-c counts join the references' spans lazily (a copy of the slot table at 516,000 requests otherwise); the
    join keeps the slot table's order, which names the first of the requests that part at the same token. polars'
    streaming join, unordered, scrambled 300,000 rows every time, and the 64-prompt report named another request."""
    n = 300_000
    slots = pl.DataFrame({
        "prompt_id": [f"p{i % 97}" for i in range(n)], "c": [8] * n, "slot": list(range(n)), "diverged": [True] * n,
        "divergence_at": [3] * n, "bitwise_prefix": [0] * n, "length": [8] * n, "near_tie": [False] * n,
        "reference_margin": [0.5] * n, "max_ulp": [1] * n,
    })
    spans = pl.DataFrame({"prompt_id": [f"p{i}" for i in range(97)], "token_span": [None] * 97, "bit_span": [None] * 97},
                         schema={"prompt_id": pl.String, "token_span": pl.Int64, "bit_span": pl.Int64})
    rows = _within_spans(slots.lazy(), spans).collect(engine="streaming")
    assert rows.select("where_prompt", "where_slot").equals(slots.select(where_prompt="prompt_id", where_slot="slot"))
    counts = per_c_counts(_within_spans(slots.lazy(), spans))  # every request parts at 3: the first is the table's first
    assert counts["first_where"].to_list() == ["p0 slot 0"]
    ties = _within_spans(slots.lazy().reverse(), spans)  # the first in the rows' order among the earliest, not a sort's
    assert per_c_counts(ties)["first_where"].to_list() == [f"p{(n - 1) % 97} slot {n - 1}"]
