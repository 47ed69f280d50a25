"""Metamorphic relations of the judgement (issue 40), over small runs generated with hypothesis: a toy ``generate`` probed in
process (1 to 3 prompts, a ladder drawn from {1, 2, 3, 4}, 1 to 4 tokens, 1 or 2 repeats), then one edit of its captures or
manifest. The rules are not worked out here again (tests/test_evidence_rules.py has one worked example per case); these
hold between a run and its edit, whatever the run:

- degrading one piece of evidence (an empty completion, a null, NaN or infinite logprob, a request refused or dropped, a
  band's width evidence lowered or gone, a reference removed) of a run GREEN at a loose target never leaves it GREEN, unless
  the run with that request removed entirely would itself certify (a request sent alone at c=1), and never raises;
- duplicating a capture line, or a request (its response again in another envelope), changes nothing;
- changing one batched token, or one bit of one recorded float64 logprob of a batched request (chosen or alternative), is
  RED naming that request, or UNVERIFIED when ref #1's bits at that step are unknown;
- renaming the prompts or reordering the capture lines changes nothing.

"Nothing" is the verdict and every count of the row (``_evidence.COUNTS``), and ``certificate_document``'s exit code.
"""

from __future__ import annotations

import atexit
import copy
import math
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from _evidence import (
    copy_run,
    counts,
    empty_completion,
    entries,
    flip_bit,
    is_batched,
    is_reference,
    lines,
    manifest,
    probe,
    refuse,
    toy,
    unknown_logprob,
    where,
    write_lines,
    write_manifest,
)
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import judge, read_run
from analysis.studies._certificate import certificate_document
from analysis.studies._judgement_frame import EXIT_CODES

pytestmark = pytest.mark.slow  # about 40 s for the full budget: generated runs, each judged two or three times

LOOSE = 0.999  # one bit-identical batched context bounds the rate at 95% (95% confidence): GREEN at this target
SETTINGS = settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                                       HealthCheck.function_scoped_fixture])

_BASES: dict[tuple, Path] = {}
_SCRATCH = Path(tempfile.mkdtemp(prefix="bia-relations-"))  # the clean runs, probed once per session
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)


@st.composite
def shapes(draw) -> tuple:
    """(prompts, ladder, tokens, repeats) of a small run with at least one batched c."""
    ladder = sorted(draw(st.sets(st.sampled_from([1, 2, 3, 4]), min_size=1).filter(lambda s: max(s) > 1)))
    return draw(st.integers(1, 3)), tuple(ladder), draw(st.integers(1, 4)), draw(st.integers(1, 2))


def _base(shape: tuple) -> Path:
    """The clean run of a shape (probed once per session): every request bit-identical to m=1."""
    if shape not in _BASES:
        prompts, ladder, tokens, repeats = shape
        _BASES[shape] = probe(_SCRATCH / f"base{len(_BASES)}", toy(tokens=tokens), prompts=prompts, ladder=ladder, repeats=repeats)
    return _BASES[shape]


def _judged(run: Path, target_rate: float = LOOSE) -> dict:
    """The run's one row, with the certificate's exit code checked against its verdict."""
    judgement = judge(read_run(run), target_rate=target_rate)
    assert len(judgement) == 1
    row = judgement.frame.row(0, named=True)
    document = certificate_document(judgement, target_rate=target_rate, confidence=0.95)
    assert document["exit_code"] == EXIT_CODES[row["verdict"]]
    return row


def _drop(run: Path, index: int) -> None:
    envelopes = lines(run)
    del envelopes[index]
    write_lines(run, envelopes)


# --- degrading evidence never makes GREEN -------------------------------------------------------------------------

UNKNOWN = {"null": None, "NaN": math.nan, "inf": math.inf, "-inf": -math.inf}
REQUEST_DEGRADATIONS = ("empty", "null", "NaN", "inf", "-inf", "refuse", "drop")


def _degrade_request(run: Path, index: int, how: str, position: int) -> None:
    """One request's evidence degraded: its completion emptied, a logprob unknown, refused (listed under ``refused``) or
    dropped from the captures."""
    if how == "refuse":
        target = where(lines(run)[index])
        refuse(run, lambda e: where(e) == target)
        return
    if how == "drop":
        _drop(run, index)
        return
    envelopes = lines(run)
    envelope = envelopes[index]
    if how == "empty":
        empty_completion(envelope)
    else:
        tokens = entries(envelope)
        unknown_logprob(tokens[position % len(tokens)], UNKNOWN[how])
    write_lines(run, envelopes)


@SETTINGS
@given(shape=shapes(), how=st.sampled_from(REQUEST_DEGRADATIONS), pick=st.integers(0, 10**6), position=st.integers(0, 3))
def test_degrading_one_request_never_makes_green(shape, how, pick, position):
    """A run GREEN at a loose target; one request's evidence degraded (emptied, a logprob null, NaN or infinite, refused,
    dropped). A batched request or a reference degraded: never GREEN. A request sent alone at c=1 degraded: GREEN only if
    the run without that request is GREEN too. Never raises; the certificate's exit code is its verdict's."""
    base = _base(shape)
    assert _judged(base)["verdict"] == "GREEN"  # the relation's premise: the clean run certifies at the loose target
    envelopes = lines(base)
    index = pick % len(envelopes)
    envelope = envelopes[index]
    with tempfile.TemporaryDirectory() as scratch:
        run = copy_run(base, Path(scratch) / "run")
        _degrade_request(run, index, how, position)
        row = _judged(run)
        if is_batched(envelope) or is_reference(envelope):
            assert row["verdict"] != "GREEN", (how, where(envelope), row["reason"])
        elif row["verdict"] == "GREEN":
            without = copy_run(base, Path(scratch) / "without")
            _drop(without, index)
            assert _judged(without)["verdict"] == "GREEN", (how, where(envelope), row["reason"])


@SETTINGS
@given(shape=shapes(), pick=st.integers(0, 10**6), how=st.sampled_from(["lower", "none", "streams lower", "log 1, streams c"]),
       width=st.integers(1, 3))
def test_weakening_one_bands_width_evidence_never_makes_green(shape, pick, how, width):
    """A run GREEN at a loose target; one batched band's width evidence weakened: its log's widths lowered below c, gone
    altogether, replaced by stream overlap below c, or contradicted (the log says m=1 at every step, the streams c). Never
    GREEN, never raises."""
    base = _base(shape)
    assert _judged(base)["verdict"] == "GREEN"
    with tempfile.TemporaryDirectory() as scratch:
        run = copy_run(base, Path(scratch) / "run")
        data = manifest(run)
        bands = [e for e in data["m_formed"] if e["c"] > 1]
        entry = bands[pick % len(bands)]
        lower = 1 + (width - 1) % (entry["c"] - 1)  # 1 .. c-1
        if how == "lower":
            entry["widths"] = [lower] * entry["steps"]
        elif how == "none":
            del entry["widths"]
        elif how == "streams lower":
            del entry["widths"]
            entry["streams"] = {"co_resident": lower, "timed": entry["c"], "of": entry["c"]}
        else:
            entry["widths"] = [1] * entry["steps"]
            entry["streams"] = {"co_resident": entry["c"], "timed": entry["c"], "of": entry["c"]}
        write_manifest(run, data)
        row = _judged(run)
        assert row["verdict"] != "GREEN", (how, entry, row["reason"])


# --- varied runs: a clean run with one edit of any kind ---------------------------------------------------------


EDITS = ("none", "token", "bit", "null", "drop batched", "width", "ref #2 differs")


def _edit(run: Path, how: str, pick: int, position: int, bit: int) -> None:
    """One edit of a clean run, so that the relations below see runs of every verdict."""
    envelopes = lines(run)
    batched = [i for i, e in enumerate(envelopes) if is_batched(e)]
    index = batched[pick % len(batched)]
    tokens = entries(envelopes[index])
    step = tokens[position % len(tokens)]
    if how == "token":
        step["token"] = step["top_logprobs"][0]["token"] = "token_id:999"
    elif how == "bit":
        step["logprob"] = flip_bit(step["logprob"], bit)
    elif how == "null":
        unknown_logprob(step, None)
    elif how == "drop batched":
        del envelopes[index]
    elif how == "ref #2 differs":
        ref2 = next(e for e in envelopes if is_reference(e, 1))
        first = entries(ref2)[0]
        first["logprob"] = flip_bit(first["logprob"], 40)
    elif how == "width":
        data = manifest(run)
        entry = next(e for e in data["m_formed"] if e["c"] > 1)
        entry["widths"] = [1] * entry["steps"]
        write_manifest(run, data)
    write_lines(run, envelopes)


@st.composite
def varied(draw) -> tuple:
    return draw(shapes()), draw(st.sampled_from(EDITS)), draw(st.integers(0, 10**6)), draw(st.integers(0, 3)), draw(st.integers(0, 51))


def _varied_run(folder: Path, spec: tuple) -> Path:
    shape, how, pick, position, bit = spec
    run = copy_run(_base(shape), folder)
    _edit(run, how, pick, position, bit)
    return run


def _duplicated(spec: tuple, pick: int, at: int, envelope_changes: dict) -> None:
    """The relation of a duplicate: one capture line of a varied run written twice (the twin at another place in the file,
    with ``envelope_changes``), the same verdict and counts."""
    with tempfile.TemporaryDirectory() as scratch:
        run = _varied_run(Path(scratch) / "run", spec)
        before = _judged(run, target_rate=0.5)
        envelopes = lines(run)
        twin = copy.deepcopy(envelopes[pick % len(envelopes)]) | envelope_changes
        envelopes.insert(at % (len(envelopes) + 1), twin)
        write_lines(run, envelopes)
        after = _judged(run, target_rate=0.5)
        assert counts(after) == counts(before), (spec, where(twin), before["reason"], after["reason"])


@SETTINGS
@given(spec=varied(), pick=st.integers(0, 10**6), at=st.integers(0, 10**6))
def test_a_duplicate_capture_line_changes_nothing(spec, pick, at):
    """Any run (a clean run with one edit); one of its capture lines written twice, the same bytes, at another place in the
    file: the same verdict and counts."""
    _duplicated(spec, pick, at, {})


@SETTINGS
@given(spec=varied(), pick=st.integers(0, 10**6), at=st.integers(0, 10**6))
def test_a_duplicate_request_changes_nothing(spec, pick, at):
    """Any run (a clean run with one edit); one of its requests captured twice: the same response (the same response id)
    in another envelope (another send time), at another place in the file. A request is counted once: the same verdict and
    counts, and no error."""
    _duplicated(spec, pick, at, {"t_sent": 12.5})


@SETTINGS
@given(shape=shapes(), pick=st.integers(0, 10**6), position=st.integers(0, 3), change=st.sampled_from(["token", "chosen", "alternative"]),
       bit=st.integers(0, 51), ref_unknown=st.booleans())
def test_changing_one_batched_token_or_bit_is_red_naming_that_request(shape, pick, position, change, bit, ref_unknown):
    """A clean run; one batched request changed: a token (another id), or one bit of one recorded float64 logprob at a step
    (the chosen token's or an alternative's). RED, naming that request (prompt, c, repeat, slot) and the step; when ref #1's
    logprob there is unknown (null) and only a bit changed, UNVERIFIED instead."""
    with tempfile.TemporaryDirectory() as scratch:
        run = copy_run(_base(shape), Path(scratch) / "run")
        envelopes = lines(run)
        batched = [e for e in envelopes if is_batched(e)]
        target = batched[pick % len(batched)]
        tokens = entries(target)
        k = position % len(tokens)
        step = tokens[k]
        if change == "token":
            step["token"] = step["top_logprobs"][0]["token"] = "token_id:999"
        elif change == "chosen":
            step["logprob"] = flip_bit(step["logprob"], bit)
        else:
            step["top_logprobs"][1]["logprob"] = flip_bit(step["top_logprobs"][1]["logprob"], bit)
        unknown = ref_unknown and change != "token"
        if unknown:
            ref1 = next(e for e in envelopes if e["prompt_id"] == target["prompt_id"] and is_reference(e, 0))
            ref_step = entries(ref1)[k]
            if change == "chosen":
                unknown_logprob(ref_step, None)
            else:
                ref_step["top_logprobs"][1]["logprob"] = None
        write_lines(run, envelopes)
        row = _judged(run)
        if unknown:
            assert row["verdict"] == "UNVERIFIED", (change, k, row["reason"])
            return
        assert row["verdict"] == "RED", (change, k, bit, row["reason"])
        first = row["first_request"]
        named = (first["prompt_id"], first["c"], first["repeat"], first["slot"])
        assert named == (target["prompt_id"], target["c"], target["repeat"], target["slot"]), row["first"]
        assert (first["parted"], first["position"]) == ("tokens" if change == "token" else "bits", k), row["first"]


# --- names and order --------------------------------------------------------------------------------------------


def _rename(run: Path, names: dict[str, str]) -> None:
    """Every prompt id replaced by its new name, in the captures (prompt_id, unit, response id) and the manifest."""

    def unit(text):
        head, sep, tail = (text or "").partition("/")
        return names.get(head, head) + sep + tail if text else text

    envelopes = lines(run)
    for envelope in envelopes:
        envelope["prompt_id"] = names[envelope["prompt_id"]]
        envelope["unit"] = unit(envelope.get("unit"))
        envelope["response"]["id"] = unit(envelope["response"]["id"])
    write_lines(run, envelopes)
    data = manifest(run)
    for entry in [*data["prompts"], *data["m_formed"], *data.get("refused", [])]:
        entry["prompt_id"] = names[entry["prompt_id"]]
        if "unit" in entry:
            entry["unit"] = unit(entry["unit"])
    write_manifest(run, data)


@SETTINGS
@given(spec=varied(), seed=st.integers(0, 2**32 - 1))
def test_reordering_capture_lines_changes_nothing(spec, seed):
    """Any run (a clean run with one edit); its capture lines shuffled: the same verdict, counts and first request."""
    with tempfile.TemporaryDirectory() as scratch:
        run = _varied_run(Path(scratch) / "run", spec)
        before = _judged(run, target_rate=0.5)
        envelopes = lines(run)
        random.Random(seed).shuffle(envelopes)
        write_lines(run, envelopes)
        after = _judged(run, target_rate=0.5)
        assert counts(after) == counts(before), (spec, before["reason"], after["reason"])
        assert after["first_request"] == before["first_request"]


@SETTINGS
@given(spec=varied(), names=st.lists(st.sampled_from(["p0", "p1", "p2"]) | st.text("abcxyz0129", min_size=1, max_size=5), min_size=3,
                                     max_size=3, unique=True))
def test_renaming_prompts_changes_nothing(spec, names):
    """Any run (a clean run with one edit); its prompts renamed (p0, p1, p2 to names drawn, one another's among them) in
    its captures and manifest: the same verdict and counts."""
    with tempfile.TemporaryDirectory() as scratch:
        run = _varied_run(Path(scratch) / "run", spec)
        before = _judged(run, target_rate=0.5)
        _rename(run, {f"p{k}": name for k, name in enumerate(names)})
        after = _judged(run, target_rate=0.5)
        assert counts(after) == counts(before), (spec, names, before["reason"], after["reason"])
