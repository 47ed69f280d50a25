"""Issue 40, "a verdict is never greener than its evidence": one worked example per case the issue reports, each built as
its reporter built it (a toy ``generate`` probed in process by ``analysis.probe_callable``, then its captures and manifest
edited), each test's docstring stating the rule and the verdict it expects.

The evidence a request contributes is compared, bits unknown, missing, refused or duplicate; only compared and identical
evidence can make GREEN, only a recorded difference makes RED, everything else leaves the verdict UNVERIFIED. Several runs
here are judged at a loose target (``target_rate=0.5`` or ``0.999``) so that a handful of requests would be GREEN if their
evidence counted: a verdict that is not GREEN there is not GREEN for want of requests.
"""

from __future__ import annotations

import copy
import json
import math

import polars as pl
import pytest
from _cli import bia
from _evidence import (
    as_stream,
    copy_run,
    entries,
    is_batched,
    is_reference,
    lines,
    manifest,
    probe,
    refuse,
    row,
    toy,
    unknown_logprob,
    write_lines,
    write_manifest,
)
from conftest import V2_WITNESS, write_json

from analysis import assemble_run, judge, read_run, read_witnesses
from analysis.run import plan
from analysis.testing import assert_batch_invariant

LOOSE = 0.6  # 0 of 8 batched requests in 4 distinct contexts (2 prompts x 2 slots) bound the rate at 52.7% (95%): GREEN here when complete


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Two prompts at c = 1, 2, twice: 8 batched requests, every one bit-identical to m=1 (GREEN at the loose target)."""
    return probe(tmp_path_factory.mktemp("base") / "run", prompts=2, ladder=(1, 2), repeats=2)


def _copy(base, tmp_path):
    return copy_run(base, tmp_path / "run")


def test_the_base_run_is_green_at_the_loose_target(base):
    """The run every edit below starts from certifies at the loose target, so whatever keeps an edited copy from GREEN is
    the edit."""
    r = row(base, target_rate=LOOSE)
    assert (r["verdict"], r["requests"], r["divergent"], r["bits_unknown"]) == ("GREEN", 8, 0, 0)


# --- no compared token: evidence missing, never a match ---------------------------------------------------------


def test_every_completion_empty_is_unverified(tmp_path):
    """Rule: a request with no compared token (an empty completion) is evidence missing, never a match. Every completion
    empty, references included [UNVERIFIED], at the loose target and at the default one."""
    run = probe(tmp_path / "run", toy(empty=lambda prompt: True), prompts=2, ladder=(1, 2), repeats=2)
    assert all(not entries(e) for e in lines(run))
    for target in (LOOSE, 0.999, 0.01):
        r = row(run, target_rate=target)
        assert r["verdict"] == "UNVERIFIED", (target, r["reason"])


def test_nine_of_ten_prompts_ending_at_once_is_unverified(tmp_path):
    """Rule: a request with no compared token is evidence missing. 9 of 10 prompts answer with an immediate end of stream
    (references, alone and batched alike); only one prompt's 2 batched requests are compared [UNVERIFIED]."""
    run = probe(tmp_path / "run", toy(empty=lambda prompt: prompt != "Hello"), prompts=10, ladder=(1, 2))
    assert sum(1 for e in lines(run) if is_batched(e) and entries(e)) == 2
    r = row(run, target_rate=LOOSE)
    assert r["verdict"] == "UNVERIFIED", r["reason"]


@pytest.mark.slow  # bia certify, a process
def test_a_response_whose_usage_says_8_tokens_while_its_logprobs_hold_0_is_no_traceback(base, tmp_path):
    """Rule: a run a server left inconsistent is judged or refused in one line, never a traceback. One batched response
    whose usage says 8 completion tokens while its logprobs hold none [UNVERIFIED, exit 7; or one line and exit 4]."""
    run = _copy(base, tmp_path)
    envelopes = lines(run)
    hit = next(e for e in envelopes if is_batched(e))
    hit["response"]["choices"][0]["logprobs"]["content"] = []
    hit["response"]["usage"]["completion_tokens"] = 8
    write_lines(run, envelopes)
    done = bia("certify", run, "-o", tmp_path / "certificate.json")
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode in (7, 4), (done.returncode, done.stdout[-500:], done.stderr[-500:])
    if done.returncode == 4:
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    else:
        assert json.loads((tmp_path / "certificate.json").read_text())["verdict"] == "UNVERIFIED"


def test_assert_batch_invariant_fails_on_a_generate_that_returns_empty_outputs(tmp_path):
    """Rule: nothing compared is no evidence of invariance. ``assert_batch_invariant`` handed a ``generate`` that returns
    empty outputs [AssertionError, UNVERIFIED: it fails even with AMBER allowed]."""
    with pytest.raises(AssertionError, match="UNVERIFIED"):
        assert_batch_invariant(toy(empty=lambda prompt: True), prompts=["Hello", "World"], ladder=[1, 2], output=tmp_path / "run",
                               allow_amber=True)


# --- bits unknown: neither GREEN nor "bits differ" ------------------------------------------------------------------


def test_a_logprob_recorded_only_at_token_0_is_unverified(base, tmp_path):
    """Rule: a token whose logprob is null on either side is bits unknown, and cannot make GREEN. Every request records a
    logprob at token 0 only (tokens 1 and 2 carry none, nor any alternative) [UNVERIFIED]."""
    run = _copy(base, tmp_path)
    envelopes = lines(run)
    for envelope in envelopes:
        for entry in entries(envelope)[1:]:
            entry["logprob"], entry["top_logprobs"] = None, []
    write_lines(run, envelopes)
    r = row(run, target_rate=LOOSE)
    assert r["verdict"] == "UNVERIFIED", r["reason"]


@pytest.mark.parametrize("value", [math.nan, -math.inf, None], ids=["NaN", "-inf", "null"])
def test_a_logprob_nan_or_infinite_on_both_sides_is_unverified(base, tmp_path, value):
    """Rule: a logprob that is NaN, infinite or null is bits unknown, even when both sides carry the same: NaN never
    equals NaN, and -inf carries no bits of the distribution. Token 1 of every request NaN, -inf or null [UNVERIFIED]."""
    run = _copy(base, tmp_path)
    envelopes = lines(run)
    for envelope in envelopes:
        unknown_logprob(entries(envelope)[1], value)
    write_lines(run, envelopes)
    r = row(run, target_rate=LOOSE)
    assert r["verdict"] == "UNVERIFIED", r["reason"]


@pytest.mark.parametrize("value", [None, math.nan, math.inf, -math.inf], ids=["null", "NaN", "inf", "-inf"])
@pytest.mark.parametrize("side", ["batched", "ref #1"])
def test_a_logprob_unknown_on_one_side_only_is_unverified_not_red(base, tmp_path, value, side):
    """Rule: RED needs a recorded difference. Token 1's logprob null, NaN or infinite on one side only (one batched request,
    or ref #1 of a prompt) is bits unknown, not bits that differ [UNVERIFIED, not RED]."""
    run = _copy(base, tmp_path)
    envelopes = lines(run)
    hit = next(e for e in envelopes if (is_batched(e) if side == "batched" else is_reference(e, 0)))
    unknown_logprob(entries(hit)[1], value)
    write_lines(run, envelopes)
    r = row(run, target_rate=LOOSE)
    assert r["verdict"] == "UNVERIFIED", r["reason"]


def test_no_logprob_recorded_and_a_different_answer_is_red(base, tmp_path):
    """Rule: a request with no logprob at all (``"logprobs": null``) still has its message text compared. Every response
    without logprobs, the batched answers "Lyon ..." where the references and the requests alone said "Paris ..." [RED,
    naming a batched request]."""
    run = _copy(base, tmp_path)
    envelopes = lines(run)
    for envelope in envelopes:
        choice = envelope["response"]["choices"][0]
        choice["logprobs"] = None
        choice["message"]["content"] = ("Lyon" if is_batched(envelope) else "Paris") + " is the capital of France."
    write_lines(run, envelopes)
    r = row(run, target_rate=LOOSE)
    assert r["verdict"] == "RED", r["reason"]
    assert r["first_request"]["c"] == 2 and r["first_request"]["parted"] == "tokens"


def test_token_ids_missing_on_one_side_are_compared_by_text(base, tmp_path):
    """Rule: when token ids are missing on one side, the token text is compared. The references and the requests alone
    carry each token's id and text (llama.cpp's ``id``), the batched requests the same text without ids, the same logprobs
    [not RED]."""
    run = _copy(base, tmp_path)
    envelopes = lines(run)
    for envelope in envelopes:
        for entry in entries(envelope):
            ident = int(entry["token"].removeprefix("token_id:"))
            text = f"w{ident} "
            for top in entry["top_logprobs"]:
                top_ident = int(top["token"].removeprefix("token_id:"))
                top.update(token=f"w{top_ident} ", bytes=list(f"w{top_ident} ".encode()))
                if not is_batched(envelope):
                    top["id"] = top_ident
            entry.update(token=text, bytes=list(text.encode()))
            if not is_batched(envelope):
                entry["id"] = ident
    write_lines(run, envelopes)
    r = row(run, target_rate=LOOSE)
    assert r["verdict"] != "RED", r["reason"]


# --- compared at the precision recorded, every recorded logprob ----------------------------------------------------


@pytest.mark.parametrize("moved", ["chosen", "alternative"])
def test_float64_logprobs_moved_by_1e_9_are_red(tmp_path, moved):
    """Rule: logprobs are compared at the precision recorded (float64 stays float64), and every recorded logprob of a step
    is compared, top-k alternatives too. Each batched request's chosen logprobs, or its second alternative's, moved by 1e-9
    (the same float32) [RED, bits; and assert_batch_invariant fails]."""
    generate = toy(shift=1e-9) if moved == "chosen" else toy(alternative_shift=1e-9)
    run = probe(tmp_path / "run", generate, prompts=2, ladder=(1, 2))
    batched = next(e for e in lines(run) if is_batched(e))
    value = entries(batched)[0]["logprob"] if moved == "chosen" else entries(batched)[0]["top_logprobs"][1]["logprob"]
    assert value != float(pl.Series([value], dtype=pl.Float32)[0])  # float64 recorded, not a float32 value
    r = row(run)
    assert r["verdict"] == "RED", r["reason"]
    assert r["first_request"]["parted"] == "bits" and r["first_request"]["c"] == 2
    with pytest.raises(AssertionError, match="RED"):
        assert_batch_invariant(generate, prompts=["Hello", "World"], ladder=[1, 2], output=tmp_path / "asserted")


def test_an_alternatives_bits_moving_is_red(tmp_path):
    """Rule: every recorded logprob of a step is compared, top-k alternatives too. The batched requests' chosen logprobs
    bit-identical, their second alternative's moved by 2**-20 (2 float32 ULP at -4) [RED]."""
    run = probe(tmp_path / "run", toy(alternative_shift=2**-20), prompts=2, ladder=(1, 2))
    r = row(run, target_rate=LOOSE)
    assert r["verdict"] == "RED", r["reason"]
    assert r["first_request"]["parted"] == "bits" and r["first_request"]["position"] == 0


# --- refused, failed and missing requests ---------------------------------------------------------------------------


def test_128_of_192_batched_requests_refused_is_unverified_and_says_refused(tmp_path):
    """Rule: a batched request that was refused makes its band incomplete, and the reason names it. Two prompts at
    c = 1, 8, 16, four times (192 batched requests); the server refused slots 4 and up of every band (128 requests, listed
    under the manifest's ``refused`` as ``bia probe`` lists them); the 64 that came back are bit-identical
    [UNVERIFIED, the reason says "refused"]."""
    run = probe(tmp_path / "run", prompts=2, ladder=(1, 8, 16), repeats=4)
    assert sum(map(is_batched, lines(run))) == 192
    assert refuse(run, lambda e: is_batched(e) and e["slot"] >= 4) == 128
    assert read_run(run).missing() == []  # every request of the plan is accounted for: kept or refused
    r = row(run, target_rate=LOOSE)
    assert r["verdict"] == "UNVERIFIED", r["reason"]
    assert "refused" in r["reason"]


def _without_ref1_of_p1(base, tmp_path, how: str):
    """A copy of the base run whose prompt p1 lost its ref #1: taken out of the captures (``missing``), or refused (and
    listed under the manifest's ``refused``)."""
    run = _copy(base, tmp_path)
    chosen = lambda e: e["prompt_id"] == "p1" and is_reference(e, 0)  # noqa: E731
    if how == "refused":
        assert refuse(run, chosen) == 1
    else:
        write_lines(run, [e for e in lines(run) if not chosen(e)])
    return run


@pytest.mark.parametrize("how", ["missing", "refused"])
def test_a_run_whose_ref1_is_missing_for_one_prompt_is_unverified_naming_it(base, tmp_path, how):
    """Rule: a reference that is missing or refused makes its prompt unjudged: UNVERIFIED naming the prompt, never a
    traceback. Ref #1 of prompt p1 taken out of the captures (and, refused, listed under ``refused``) [UNVERIFIED naming
    p1]."""
    r = row(_without_ref1_of_p1(base, tmp_path, how), target_rate=LOOSE)
    assert r["verdict"] == "UNVERIFIED", r["reason"]
    assert "p1" in r["reason"]


@pytest.mark.slow  # a report notebook and a certificate, each a process
@pytest.mark.parametrize("how", ["missing", "refused"])
def test_bia_certify_exits_7_and_bia_report_succeeds_on_a_run_missing_a_ref1(base, tmp_path, how):
    """Rule: a prompt without its ref #1 is unjudged, never a traceback, on every surface. The run above [``bia certify RUN``
    exits 7, no traceback; ``bia report RUN -o x.html`` succeeds]."""
    run = _without_ref1_of_p1(base, tmp_path, how)
    done = bia("certify", run, "-o", tmp_path / "certificate.json")
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 7, (done.stdout[-500:], done.stderr[-500:])
    report = bia("report", run, "-o", tmp_path / "x.html")
    assert report.returncode == 0, report.stderr[-2000:]
    assert (tmp_path / "x.html").exists()


# --- width evidence: the strongest present decides ------------------------------------------------------------------


def test_a_log_of_m1_at_every_step_against_streams_of_c_is_unverified(base, tmp_path):
    """Rule: a band counts as formed only if the strongest evidence present says so, and evidence that contradicts itself
    gives UNVERIFIED. The server's own batch log says m=1 at every decode step of every band, its streams' overlap says c
    [UNVERIFIED]."""
    run = _copy(base, tmp_path)
    data = manifest(run)
    for entry in data["m_formed"]:
        entry["widths"] = [1] * entry["steps"]
        entry["streams"] = {"co_resident": entry["c"], "timed": entry["c"], "of": entry["c"]}
    write_manifest(run, data)
    r = row(run, target_rate=LOOSE)
    assert r["verdict"] == "UNVERIFIED", r["reason"]


@pytest.mark.parametrize("mode, times", [("replay", [0.5, 0.5, 0.5]), (None, [2.0, 2.0, 2.0])], ids=["replayed", "burst"])
def test_overlapping_streams_that_were_not_live_are_no_evidence_of_formation(base, tmp_path, mode, times):
    """Rule: stream overlap from streams that were not live (replayed, released in one burst) is no evidence of formation.
    A server that replays cached answers: every request an SSE stream declared ``replay`` (or, undeclared, its chunks read at
    one instant), the only width evidence of each band its streams' overlap, c [not GREEN]."""
    run = _copy(base, tmp_path)
    write_lines(run, [as_stream(e, mode, times) for e in lines(run)])
    data = manifest(run)
    for entry in data["m_formed"]:
        del entry["widths"]
        entry["streams"] = {"co_resident": entry["c"], "timed": entry["c"], "of": entry["c"]}
    write_manifest(run, data)
    requests = read_run(run).requests
    assert requests["stream_live"].to_list() == [False] * requests.height  # as the liveness rule reads them
    r = row(run, target_rate=LOOSE)
    assert r["verdict"] != "GREEN", r["reason"]


# --- a request is counted once ------------------------------------------------------------------------------------


def test_slots_copied_beyond_c_are_counted_once(base, tmp_path):
    """Rule: a request is counted once (duplicate response ids are read once) and a slot beyond its band's c is refused.
    Each batched line of a c=2 band copied five times as slots 2, 4, ..., 11 (the same response id): 8 batched requests,
    AMBER at a 10% target, would be 48 and GREEN [counted once: the verdict and counts of the run without them]."""
    run = _copy(base, tmp_path)
    envelopes = lines(run)
    extra = [dict(copy.deepcopy(e), slot=e["slot"] + 2 * k) for e in envelopes if is_batched(e) for k in range(1, 6)]
    write_lines(run, envelopes + extra)
    before, after = row(base, target_rate=0.1), row(run, target_rate=0.1)
    assert before["verdict"] == "AMBER"
    assert (after["verdict"], after["requests"], after["divergent"]) == (before["verdict"], before["requests"], before["divergent"]), after["reason"]


def test_23_repeats_of_one_context_are_amber(tmp_path):
    """Rule: the bound counts distinct batch contexts (prompt, c, slot, companions, arm), repeats of one context once. One
    prompt, one c (2), one slot recorded (the needle layout), 23 repeats, every one bit-identical: 23 requests would bound
    the rate at 12.2%, one context bounds it at 95% [AMBER at a 20% target; ``contexts`` 1, ``requests`` 23]."""
    tokens = [("a", -0.5), ("b", -0.25), ("c", -0.125)]

    def chat(name):
        entries_ = [{"token": t, "bytes": list(t.encode()), "logprob": lp, "top_logprobs": []} for t, lp in tokens]
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"id": name, "object": "chat.completion", "model": "m", "choices": [{
            "index": 0, "message": {"role": "assistant", "content": "abc"}, "finish_reason": "length",
            "logprobs": {"content": entries_}}], "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}}))
        return str(path)

    mapping = [{"source": chat(f"r{k}"), "prompt_id": "p", "role": "reference", "slot": k} for k in (0, 1)]
    widths = []
    for repeat in range(23):
        for c in (1, 2):
            mapping.append({"source": chat(f"c{c}r{repeat}"), "prompt_id": "p", "role": "band", "c": c, "slot": 0, "repeat": repeat})
            widths.append({"prompt_id": "p", "c": c, "repeat": repeat, "widths": [c, c, c]})
    data = {"ladder": [1, 2], "repeats": 23, "requested": {"layout": "needle"}, "prompts": [{"prompt_id": "p", "text": "x"}],
            "fillers": ["y"], "m_formed": widths}
    run = assemble_run(mapping, data)
    assert run.missing() == []
    r = judge(run, target_rate=0.2).frame.row(0, named=True)
    assert (r["verdict"], r["requests"], r.get("contexts")) == ("AMBER", 23, 1), r["reason"]


# --- alone first ----------------------------------------------------------------------------------------------------


def _with_arm(run, arm: str) -> None:
    """The run (a copies run of prompts p0 and p1 at c = 1, 2, twice) probed with arms copies and ``arm`` (repeat: three requests
    alone at c=1; serial: c=2's requests sent one after another), every request of ``arm`` ref #1's answer with token 1's
    logprob 1 float32 ULP away."""
    envelopes, data = lines(run), manifest(run)
    data["arms"] = ["copies", arm]
    for envelope in envelopes:
        if envelope["role"] == "band":
            envelope["arm"] = "copies"
    for entry in data["m_formed"]:
        entry["arm"] = "copies"
    for unit in plan(data):
        if unit.arm != arm:
            continue
        ref1 = next(e for e in envelopes if e["prompt_id"] == unit.prompt_id and is_reference(e, 0))
        for slot in unit.slots:
            placement = {"role": "band", "c": unit.c, "slot": slot, "repeat": unit.repeat, "arm": arm, "unit": unit.key}
            envelope = copy.deepcopy(ref1) | placement
            envelope["response"]["id"] = f"{unit.key}/s{slot}"
            first = entries(envelope)[1]
            first["logprob"] = first["top_logprobs"][0]["logprob"] = first["logprob"] - 2**-25  # -0.25: 1 float32 ULP
            envelopes.append(envelope)
        data["m_formed"].append({"unit": unit.key, "prompt_id": unit.prompt_id, "role": "band", "c": unit.c, "repeat": unit.repeat,
                                 "arm": arm, "widths": [1, 1, 1]})
    write_lines(run, envelopes)
    write_manifest(run, data)


@pytest.mark.parametrize("arm", ["repeat", "serial"])
def test_every_request_of_a_control_arm_sent_alone_parting_from_ref1_is_red_run_to_run(base, tmp_path, arm):
    """Rule: a request sent alone in any arm (repeat, serial, c=1) that parts from ref #1 is RED with cause run-to-run,
    before batching is judged. Every request of the repeat arm (c=1) or of the serial arm (c=2, one after another) parts
    from ref #1 in its bits; the copies arm's batched requests are bit-identical [RED, run-to-run, naming a request of that
    arm]."""
    run = _copy(base, tmp_path)
    _with_arm(run, arm)
    assert read_run(run).missing() == []
    judgement = judge(read_run(run), target_rate=0.999)
    assert judgement.verdict == "RED", judgement.frame.select("arm", "verdict", "reason").rows()
    for r in judgement.to_dicts():
        assert (r["verdict"], r["cause"]) == ("RED", "run-to-run"), r["reason"]
        assert arm in r["first_request"]["role"], r["first_request"]


# --- witnesses ------------------------------------------------------------------------------------------------------


def test_a_witness_slot_that_ends_while_its_reference_goes_on_has_parted_there(tmp_path):
    """Rule: a witness slot that ends while its reference goes on has parted at that token. The bundled v2 witness with its
    references agreeing and every slot agreeing to its own length, one c=4 slot ending (stop) at token 100 of the
    reference's 128 [RED, co-batching, that slot at token 100]."""
    data = json.loads(V2_WITNESS.read_text())
    data["reference"]["self_divergence_at"] = None
    for band in data["bands"]:
        band["divergence_at"] = None
        for slot in band["slots"]:
            slot["agree_to"] = slot["completion_tokens"] = data["reference"]["tokens"]
    band = next(b for b in data["bands"] if b["c"] == 4)
    band["slots"][2].update(completion_tokens=100, agree_to=100, finish_reason="stop")
    judgement = judge(read_witnesses(write_json(tmp_path / "w.json", data), progress=False))
    r = judgement.frame.row(0, named=True)
    assert (r["verdict"], r["cause"]) == ("RED", "co-batching"), r["reason"]
    assert (r["first_request"]["c"], r["first_request"]["slot"], r["first_request"]["position"]) == (4, 2, 100)


# --- what the certificate covers ------------------------------------------------------------------------------------


@pytest.mark.slow  # bia certify, a process
def test_the_certificate_says_what_its_verdict_covers(tmp_path):
    """Rule: ``certificate.json`` carries a ``domain`` object describing what the verdict covers: the ladder, the widths
    measured, the prompts, the contexts, the prompt and completion lengths (min and max), the sampling, the precision
    compared ("float32" or "float64") and the arms. Two prompts at c = 1, 2, 3 with float64 logprobs."""
    run = probe(tmp_path / "run", toy(logprob=lambda k: -0.1 * (k + 1)), prompts=2, ladder=(1, 2, 3))
    done = bia("certify", run, "-o", tmp_path / "certificate.json", "--target-rate", "0.999")
    assert done.returncode == 0, (done.stdout[-500:], done.stderr[-1000:])
    document = json.loads((tmp_path / "certificate.json").read_text())
    domains = [document["domain"]] if "domain" in document else [arm["domain"] for arm in document["arms"]]
    assert domains
    for domain in domains:
        assert isinstance(domain, dict), domain
        keys = set(domain)
        assert {"ladder", "prompts", "contexts", "sampling", "precision", "arms"} <= keys, keys
        assert any("width" in k for k in keys), keys
        for side in ("prompt", "completion"):
            for end in ("min", "max"):
                assert any(k.startswith(side) and k.endswith(end) for k in keys), (side, end, keys)
        assert list(domain["ladder"]) == [1, 2, 3]
        assert domain["prompts"] == 2
        assert domain["contexts"] == 2 * (2 + 3)  # (prompt, c, slot): each slot of each batched c of each prompt
        assert domain["precision"] == "float64"
        completion = [v for k, v in domain.items() if k.startswith("completion") and k.endswith(("min", "max"))]
        assert completion == [3, 3], domain
