"""Runs generated with hypothesis (references that differ, a request alone that differs, a batched request that parts,
missing and unformed bands, dropped logprobs, c=1 only): the verdict follows the rules, worked out here independently,
and every surface gives it (analysis.judge, certificate.json's exit code, the answer table, the card, the probe's line,
Jupyter's Run card and the trend)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import assemble_run, judge, read_history, read_run, write_run
from analysis.probe._summary import result_line
from analysis.studies._certificate import certificate_document
from analysis.studies._judgement_frame import EXIT_CODES
from analysis.views.html import answer_html
from analysis.views.html import run_review
import pytest

pytestmark = pytest.mark.slow

A = [("a", -0.5), ("b", -0.25), ("c", -0.125)]
B = [("a", -0.5), ("b", -0.2500001), ("c", -0.125)]  # A with token 1's float32 logprob 3 ULP away


def _chat(path: Path, tokens, *, logprobs: bool = True) -> str:
    entries = [{"token": t, "bytes": list(t.encode()), "logprob": lp if logprobs else None, "top_logprobs": []} for t, lp in tokens]
    path.write_text(json.dumps({"id": path.stem, "object": "chat.completion", "model": "m", "choices": [{
        "index": 0, "message": {"role": "assistant", "content": "".join(t for t, _ in tokens)}, "finish_reason": "length",
        "logprobs": {"content": entries}}], "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)}}))
    return str(path)


@st.composite
def plans(draw):
    ladder = sorted({1} | draw(st.sets(st.sampled_from([2, 3]), max_size=2)))
    bands = {c: {"present": draw(st.booleans()), "formed": draw(st.booleans()), "parts": draw(st.booleans()), "dropped": draw(st.booleans())}
             for c in ladder if c > 1}
    return {"ladder": ladder, "refs_differ": draw(st.booleans()), "alone_differs": draw(st.booleans()), "bands": bands}


def _expected(plan) -> str:
    """The rules of docs/verdicts.md, applied to the plan by hand."""
    if plan["refs_differ"] or plan["alone_differs"]:
        return "RED"
    present = {c: b for c, b in plan["bands"].items() if b["present"]}
    if any(b["parts"] for b in present.values()):
        return "RED"
    if not plan["bands"] or len(present) < len(plan["bands"]) or any(not b["formed"] or b["dropped"] for b in present.values()):
        return "UNVERIFIED"
    return "AMBER"  # a handful of batched requests never bounds the rate below 1%


def _write(folder: Path, plan) -> Path:
    folder.mkdir()
    mapping = [{"source": _chat(folder / "r0.json", A), "prompt_id": "p", "role": "reference", "slot": 0},
               {"source": _chat(folder / "r1.json", B if plan["refs_differ"] else A), "prompt_id": "p", "role": "reference", "slot": 1},
               {"source": _chat(folder / "c1.json", B if plan["alone_differs"] else A), "prompt_id": "p", "role": "band", "c": 1, "slot": 0}]
    widths = [{"prompt_id": "p", "c": 1, "widths": [1]}]
    for c, band in plan["bands"].items():
        if not band["present"]:
            continue
        for slot in range(c):
            stream = B if band["parts"] and slot == 0 else A
            mapping.append({"source": _chat(folder / f"c{c}s{slot}.json", stream, logprobs=not (band["dropped"] and slot == c - 1)),
                            "prompt_id": "p", "role": "band", "c": c, "slot": slot})
        widths.append({"prompt_id": "p", "c": c, "widths": [c if band["formed"] else 1]})
    manifest = {"ladder": plan["ladder"], "prompts": [{"prompt_id": "p", "text": "x"}], "m_formed": widths}
    return write_run(assemble_run(mapping, manifest), folder / "run")


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans())
def test_generated_runs_get_the_rules_verdict_on_every_surface(plan):
    with tempfile.TemporaryDirectory() as scratch:
        folder = _write(Path(scratch) / "r", plan)
        run = read_run(folder)
        judgement = judge(run)
        verdict = judgement.verdict
        assert verdict == _expected(plan), judgement.frame["reason"][0]
        row = judgement.frame.row(0, named=True)
        if plan["refs_differ"] or plan["alone_differs"]:  # run-to-run first: no batch is ever named as the first to part
            assert row["cause"] == "run-to-run" and row["first_request"]["c"] in (None, 1)
        if verdict != "RED" or not (plan["refs_differ"] or plan["alone_differs"]):
            assert row["requests"] == sum(c for c, b in plan["bands"].items() if b["present"])  # only c > 1 counts
        # a target the handful of requests can meet: GREEN only where the rules leave AMBER
        loose = judge(run, target_rate=0.999).verdict
        assert loose == ("GREEN" if verdict == "AMBER" else verdict)
        document = certificate_document(judgement, target_rate=0.01, confidence=0.95)
        assert document["exit_code"] == EXIT_CODES[verdict]
        assert f'data-verdict="{verdict}"' in answer_html(judgement)
        card = run_review(run, epsilon=0.05, judgement=judgement)
        assert card.verdict == verdict and card.headline.startswith(verdict)
        assert result_line(folder).startswith(verdict)
        assert f'data-verdict="{verdict}"' in run._repr_html_()
        assert read_history(folder).entries["verdict"].to_list() == [verdict]
