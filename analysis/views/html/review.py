"""The report's verdict cards: what a reviewer asks of one run or one witness, in the study's
engine-neutral words (no release gate of any one engine).

Is the server batch invariant in bits (float32 logprobs identical to m=1) and in tokens, where
does it first part, does a near-tie explain it, what does batching cost in decode rate, and is
the evidence complete. Every value is formatted for people here; the templates escape it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import polars as pl

from ...core import MISSING, cell, few, kernel_mode_words, share
from ...metrics import bits_unrecorded, per_c_counts

NOT_RECORDED = "the logprob bits are not recorded"  # why a card has no bits to judge, unless it says another reason


@dataclass
class Review:
    """One card: a headline, a small table per batch size c, and one line per question.

    Attributes
    ----------
    kind : str
        ``"run"`` or ``"witness"``.
    name : str
        The run folder or the witness file.
    about : list of (str, str)
        What served it (engine, model, host, ...), formatted.
    headline : str
        The answer in one sentence.
    css : str
        ``pass``, ``warn`` or ``fail``: how the headline is coloured.
    per_c : pl.DataFrame
        One row per c, every cell a string.
    lines : list of (str, str, str or None)
        (question, answer, css): the judgement's cause, next step, cost and evidence, then bits, tokens, near-tie and
        completeness.
    verdict : str
        The judgement's verdict (:func:`analysis.judge`), the worst of the card's arms: the card's ``data-verdict``.
    """

    kind: str
    name: str
    about: list[tuple[str, str]]
    headline: str
    css: str
    per_c: pl.DataFrame
    lines: list[tuple[str, str, str | None]] = field(default_factory=list)
    verdict: str = "UNVERIFIED"


def _judged(rows: list[dict[str, Any]]) -> tuple[str, str, str, list[tuple[str, str, str | None]]]:
    """The card's verdict, headline, colour and judgement lines from its judgement rows (one per arm): the worst arm heads it."""
    from ...studies import VERDICTS
    from .answer import CSS

    if not rows:
        return "UNVERIFIED", "UNVERIFIED: nothing to judge.", "warn", []
    head = max(rows, key=lambda row: VERDICTS.index(row["verdict"]))
    cause = f" ({head['cause']})" if head["cause"] else ""
    headline = f"{head['verdict']}{cause}: {head['reason']}."
    lines: list[tuple[str, str, str | None]] = []
    for row in rows:
        arm = f" ({row['arm']})" if len(rows) > 1 else ""
        if len(rows) > 1:
            lines.append((f"verdict{arm}", f"{row['verdict']}: {row['reason']}.", CSS[row["verdict"]]))
        lines.append((f"next step{arm}", row["next_step"], None))
        lines.append(
            (
                f"decode cost{arm}",
                row["cost"] or "unmeasured: no decode rate timed the same way at c=1 and at a batched c.",
                None,
            )
        )
        lines.append((f"evidence{arm}", row["evidence"], None))
    return head["verdict"], headline, CSS[head["verdict"]], lines


def _per_c_table(counts: pl.DataFrame, no_bits: str = NOT_RECORDED) -> pl.DataFrame:
    """The card's table: one row per c, in words."""
    unknown = "not recorded" if no_bits == NOT_RECORDED else "not judged"
    rows = [
        {
            "c": str(r["c"]),
            "requests": str(r["requests"]),
            "bit-identical to m=1": share(r["bitwise"], r["bits_known"]) if r["bits_known"] else unknown,
            "token-identical": share(r["same"], r["requests"]),
            "first divergence": f"token {r['first']} ({r['first_where']})" if r["parted"] else MISSING,
            "near-tie explains": _explained(r),
        }
        for r in counts.iter_rows(named=True)
    ]
    columns = ["c", "requests", "bit-identical to m=1", "token-identical", "first divergence", "near-tie explains"]
    return pl.DataFrame(rows, schema=dict.fromkeys(columns, pl.String), orient="row")


def _explained(row: dict[str, Any]) -> str:
    """How many of a c's divergences a near-tie explains, in words."""
    if not row["parted"]:
        return MISSING
    if row["no_margin"] == row["parted"]:
        return "no margin recorded"
    return f"{row['near_tie']} of {row['parted']}"


def _bits_line(counts: pl.DataFrame, max_ulp: int | None, no_bits: str = NOT_RECORDED) -> tuple[str, str, str | None]:
    known = int(counts["bits_known"].sum())
    if not known and no_bits == NOT_RECORDED:
        return "bits", "not recorded: only tokens were kept, not their float32 logprobs.", None
    if not known:
        return "bits", f"not judged: {no_bits}.", "warn"
    same = int(counts["bitwise"].sum())
    ulp = f"; the largest logprob distance is {max_ulp:,} ULP" if max_ulp else ""
    return (
        "bits",
        f"{share(same, known)} of the requests bit-identical to m=1{ulp}.",
        "pass" if same == known else "warn",
    )


def _tokens_line(counts: pl.DataFrame) -> tuple[str, str, str | None]:
    requests, same = int(counts["requests"].sum()), int(counts["same"].sum())
    if same == requests:
        return "tokens", f"{share(same, requests)} token-identical: no request parted from m=1.", "pass"
    first = counts.filter(pl.col("parted") > 0).sort("first").row(0, named=True)
    return (
        "tokens",
        (
            f"{share(same, requests)} token-identical; the earliest divergence is at token {first['first']} "
            f"(c={first['c']}, {first['first_where']})."
        ),
        "fail",
    )


def _near_tie_line(counts: pl.DataFrame, epsilon: float) -> tuple[str, str, str | None]:
    parted, explained, unknown = (int(counts[n].sum()) for n in ("parted", "near_tie", "no_margin"))
    if not parted:
        return "near-tie", "nothing to explain: no request parted.", None
    if unknown == parted:
        return "near-tie", f"unknown: no reference margin was recorded at any of the {parted} divergence(s).", "warn"
    words = f"explains {explained} of {parted} divergence(s) (the reference's top-1/top-2 margin below {epsilon:g})"
    words += f"; {unknown} with no margin recorded" if unknown else ""
    return "near-tie", words + ".", "pass" if explained == parted else "fail"


# --- runs ----------------------------------------------------------------------------------------


def run_review(run, *, epsilon: float, reference: Any = "ref1", judgement: Any = None) -> Review:
    """The card of one run: its judgement's verdict and reason as the headline, then what the counts per c show.

    Parameters
    ----------
    run : Run
        The run: its batched requests are compared with ``reference`` per c.
    epsilon : float
        A divergence is explained by a near-tie when the reference's top-1/top-2 margin there is below it.
    reference : str or Run
        "ref1", "ref2", or another run (its ref #1), for the per-c table and lines; the verdict is always against m=1.
    judgement : Judgement, optional
        The judgement holding this run's rows (the report judges every run once); judged here when not given.

    Returns
    -------
    Review

    Examples
    --------
    >>> from analysis.run import read_run
    >>> run_review(read_run("data/experiment-cpu/default"), epsilon=0.05).headline[:60]
    'RED (co-batching): 56 of 56 batched requests part from m=1 ('
    """
    from ...run import slot_table
    from ...studies import judge_runs

    if judgement is None:
        judgement = judge_runs(run)
    verdict, headline, css, judged = _judged(judgement.frame.filter(pl.col("run") == run.label).to_dicts())
    if run.dump.requests.unique(["source", "record"]).height == 1:
        return _lone_review(run, verdict)
    slots = slot_table(run, epsilon=epsilon, reference=reference)
    spans = _reference_spans(run) if isinstance(reference, str) else _NO_SPANS
    counts = per_c_counts(_within_spans(slots, spans))
    no_bits = _bits_not_judged(spans)
    max_ulp = cast("int | None", slots["max_ulp"].max())  # an Int64 column
    lines = [
        *judged,
        _bits_line(counts, max_ulp, no_bits),
        _tokens_line(counts) if counts.height else ("tokens", MISSING, None),
        _near_tie_line(counts, epsilon),
        _run_completeness(run),
    ]
    run_to_run = _run_to_run_line(spans, slots)
    if run_to_run:
        lines.insert(len(judged) + 1, run_to_run)
    return Review("run", run.label, _run_about(run), headline, css, _per_c_table(counts, no_bits), lines, verdict)


_NO_SPANS = pl.DataFrame(
    schema={"prompt_id": pl.String, "token_span": pl.Int64, "bit_span": pl.Int64, "length": pl.Int64}
)


def _reference_spans(run) -> pl.DataFrame:
    """Per prompt, where its two m=1 references part: ``token_span`` (the first token they differ at) and ``bit_span``
    (the first position whose logprob bits differ), each null where they never do: what the server does alone, run to run.
    From :func:`analysis.run.reference_table` (ref #2 against ref #1, every prompt at once)."""
    from ...run import reference_table

    length = pl.min_horizontal("length", "reference_length")
    return (
        reference_table(run)
        .select(
            "prompt_id",
            token_span=pl.when(pl.col("diverged")).then("divergence_at"),
            bit_span=pl.when(pl.col("bitwise_prefix") < length).then("bitwise_prefix"),
            length=length,
        )
        .cast(_NO_SPANS.schema)
    )


def _within_spans(slots: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """The rows :func:`per_c_counts` takes, batching judged only where the prompt's references agree with each other: a request
    that parts at or after its references' own parting is no batching divergence, and where they differ from the first
    logprob on, its bits cannot be judged (null); nor where it has no logprob to compare (:func:`bits_unrecorded`)."""
    joined = slots.join(spans.select("prompt_id", "token_span", "bit_span"), on="prompt_id", how="left")
    bit_end = pl.min_horizontal("length", pl.col("bit_span").fill_null(pl.col("length")))
    same_bits = pl.col("bitwise_prefix") >= bit_end
    bitwise = (
        pl.when(pl.col("bitwise_prefix").is_null() | (pl.col("bit_span") == 0) | (same_bits & bits_unrecorded()))
        .then(None)
        .otherwise(same_bits)
    )
    batching = pl.col("diverged") & (pl.col("token_span").is_null() | (pl.col("divergence_at") < pl.col("token_span")))
    return joined.select(
        c="c",
        bitwise=bitwise,
        diverged=batching,
        divergence_at="divergence_at",
        near_tie="near_tie",
        margin_known=pl.col("reference_margin").is_not_null(),
        where=pl.format("{} slot {}", "prompt_id", "slot"),
    )


def _bits_not_judged(spans: pl.DataFrame) -> str:
    """Why bits cannot be judged when every prompt's references differ from their first logprob on; else the default."""
    if spans.height and (spans["bit_span"] == 0).all():
        return "the two m=1 references differ in their logprob bits from the first token on"
    return NOT_RECORDED


def _run_to_run_line(spans: pl.DataFrame, slots: pl.DataFrame) -> tuple[str, str, str] | None:
    """What the server does alone, run to run, when its two m=1 references part: where, and what the card leaves to it."""
    parted = spans.filter(pl.col("token_span").is_not_null() | pl.col("bit_span").is_not_null()).sort("prompt_id")
    if parted.is_empty():
        return None
    where = []
    for prompt, token_span, bit_span, length in parted.iter_rows():
        part = f"tokens at {token_span}" if token_span is not None else f"logprob bits at token {bit_span}"
        where.append(f"{prompt}: {part} of {length}")
    late = (
        slots.join(parted.select("prompt_id", "token_span"), on="prompt_id")
        .filter(pl.col("diverged") & (pl.col("divergence_at") >= pl.col("token_span")))
        .height
    )
    left = (
        f"; {late} batched request(s) parting at or after that point count as run-to-run, not batching" if late else ""
    )
    return (
        "run-to-run",
        f"the two m=1 references differ from each other ({'; '.join(where)}): the server is not deterministic even alone. "
        f"Batching is judged only where they agree{left}.",
        "warn",
    )


def _lone_review(run, verdict: str) -> Review:
    """The card of a run of one request (a lone dump): what one request shows, and that it allows no batch comparison."""
    request = run.dump.requests.row(0, named=True)
    tokens = run.dump.tokens.filter(pl.col("segment") == "completion")
    scored = int(tokens["logprob"].is_not_null().sum())
    top_k = int(tokens["n_candidates"].max() or 0) if tokens.height else 0
    holds = f"{tokens.height} completion token(s), {scored} with a logprob, " + (
        f"up to {top_k} top-k candidate(s) per step" if top_k else "no top-k candidates"
    )
    lines = [
        ("read", f"one request ({cell(request['source_format'])}, {cell(request['model'])}): {holds}.", None),
        (
            "can judge",
            "that the dump reads and what it holds: each token's logprob and candidates, in the detail below.",
            None,
        ),
        (
            "cannot judge",
            "batch invariance. Bits, tokens, near-ties and decode cost each compare the same prompt sent alone (m=1) "
            "with it sent in a batch of c, and one request has nothing to compare with. Give the batched requests' dumps "
            "too, with prompt_id, role, c and slot in their capture envelopes (or bia assemble --mapping).",
            "warn",
        ),
        _run_completeness(run),
    ]
    return Review(
        "run",
        run.label,
        _run_about(run),
        f"{verdict}: one request, no batch comparison. A single request reads, but batch invariance needs the same prompt "
        "also sent in a batch of c.",
        "warn",
        _per_c_table(pl.DataFrame()),
        lines,
        verdict,
    )


def _run_about(run) -> list[tuple[str, str]]:
    manifest = run.manifest
    identity = manifest.get("identity") or {}
    mode = kernel_mode_words(manifest)  # as asked, with the mode that ran beside it when they differ
    repeats = manifest.get("repeats", 1)
    about = [
        ("engine", cell(identity.get("engine") or manifest.get("producer"))),
        ("model", cell((identity.get("model") or {}).get("path"))),
        ("host", cell(identity.get("host"))),
        ("prompts", str(len(run.prompts))),
        ("ladder", cell(run.ladder or None)),
    ]
    if mode:
        about.insert(1, ("kernel mode", cell(mode)))
    if repeats and repeats != 1:
        about.append(("repeats", cell(repeats)))
    origins = list(
        dict.fromkeys(str(o.get("source")) for o in manifest.get("assembled_from") or [] if isinstance(o, dict))
    )
    if origins:
        about.append(("assembled from", few(origins)))
    return about


def _run_completeness(run) -> tuple[str, str, str | None]:
    manifest = run.manifest
    missing, refused, skipped = len(run.missing()), len(manifest.get("refused") or []), len(run.dump.skipped)
    gaps = [
        f"{missing} request(s) never came back" if missing else "",
        f"{refused} refused" if refused else "",
        f"{skipped} capture record(s) left out" if skipped else "",
        "the run did not finish" if manifest.get("complete", True) is False else "",
    ]
    gaps = [g for g in gaps if g]
    have = f"{len(run.dump.requests)} request(s) read"
    if not gaps:
        return "completeness", f"complete: {have}, none missing, none refused.", "pass"
    return "completeness", f"incomplete: {have}; " + "; ".join(gaps) + ".", "fail"


# --- witnesses -----------------------------------------------------------------------------------


def witness_reviews(ws, *, epsilon: float, judgement: Any = None) -> list[Review]:
    """One card per witness file of a witness set (markers have none).

    A witness keeps tokens, not logprobs: its bits are "not recorded", its near-tie comes from
    the band's recorded margin, its decode cost from slot rates (else band rates).

    Parameters
    ----------
    ws : WitnessSet
        The witnesses.
    epsilon : float
        The near-tie epsilon.
    judgement : Judgement, optional
        The judgement holding each witness's row (:func:`analysis.judge` of the set); judged here when not given.

    Returns
    -------
    list of Review
        In the order the witnesses were read, each headed by its judgement's verdict.
    """
    from ...studies import judge_witnesses
    from ..plots.witness import witness_label

    if judgement is None:
        judgement = judge_witnesses(ws)

    out = []
    for row, slots, bands in ws.each_witness():
        judged = _judged(judgement.frame.filter(pl.col("run") == row["source"]).to_dicts())
        out.append(
            _witness_review(witness_label(row["source"], row["witness_version"]), row, slots, bands, epsilon, judged)
        )
    return out


def _witness_review(
    name: str, witness: dict[str, Any], slots: pl.DataFrame, bands: pl.DataFrame, epsilon: float, judged: tuple
) -> Review:
    margins = bands.select("band_index", margin="top2_margin_at_divergence")
    reference = pl.lit(
        witness["reference_tokens"], pl.Int64
    )  # a literal: fill_null(None) raises for a witness with no reference length
    length = pl.min_horizontal(pl.col("completion_tokens").fill_null(reference), reference)
    span = _witness_span(witness)
    parted = (pl.col("agree_to") < length).fill_null(False)
    batching = parted & (pl.col("agree_to") < span) if span is not None else parted
    rows = slots.join(margins, on="band_index", how="left").select(
        "c",
        bitwise=pl.lit(None, dtype=pl.Boolean),
        diverged=batching,
        divergence_at="agree_to",
        near_tie=((pl.col("margin") >= 0) & (pl.col("margin") < epsilon)).fill_null(False),
        margin_known=pl.col("margin").is_not_null(),
        where=pl.format("slot {}", "i"),
    )
    counts = per_c_counts(rows)
    verdict, headline, css, judgement_lines = judged
    lines = [
        *judgement_lines,
        _bits_line(counts, None),
        _tokens_line(counts) if counts.height else ("tokens", MISSING, None),
        _near_tie_line(counts, epsilon),
        _witness_completeness(witness, slots, bands),
    ]
    if span is not None:
        late = slots.filter(parted & (pl.col("agree_to") >= span)).select("c").to_series().to_list()
        left = (
            f"; {len(late)} request(s) parting at or after it (c={', '.join(str(c) for c in sorted(set(late)))}) count as run-to-run, not batching"
            if late
            else ""
        )
        lines.insert(
            len(judgement_lines) + 1,
            (
                "run-to-run",
                f"the two m=1 references agree only to token {span} of {witness['reference_tokens']}: the server is not "
                f"deterministic even alone. Batching is judged on the tokens before {span}{left}.",
                "warn",
            ),
        )
    differs = _against_aprender(witness, bands, css)
    if differs:
        lines.append(differs)
    about = [
        ("source", witness["source"]),
        ("witness_version", cell(witness["witness_version"])),
        ("host", cell(witness["host"])),
        ("server commit", cell((witness["commit"] or "")[:10] or None)),
        ("model", cell(witness["model_path"])),
    ]
    return Review("witness", name, about, headline, css, _per_c_table(counts), lines, verdict)


def _witness_span(witness: dict[str, Any]) -> int | None:
    """The token the witness's two m=1 references part at, when they part before its reference length; else None."""
    at, tokens = witness["reference_self_divergence_at"], witness["reference_tokens"]
    return at if at is not None and tokens is not None and at < tokens else None


def _against_aprender(witness: dict[str, Any], bands: pl.DataFrame, css: str) -> tuple[str, str, None] | None:
    """One line, when aprender's recorded verdict and this card disagree, saying why: its rules judge other things than m=1."""
    recorded, version = witness["recorded_verdict"], witness["witness_version"]
    if (recorded == "PASS") == (css != "fail") or recorded not in ("PASS", "FAIL"):
        return None
    if recorded == "PASS" and version in (2, 3):
        batched = bands.filter(pl.col("c") > 1)
        agree = batched["intra_agree_to"].min() if "intra_agree_to" in batched.columns else None
        declared = batched["declared_min"].min() if "declared_min" in batched.columns else None
        return (
            "aprender",
            f"records PASS: witness_version {version} passes a batch whose requests agree with each other "
            f"(here to token {cell(agree)}, declared_min {cell(declared)}) without comparing them with m=1; "
            "this card compares every request with m=1.",
            None,
        )
    return (
        "aprender",
        f"records {recorded} by witness_version {version}'s rules (a band passes when it agrees with m=1 to "
        "declared_min); this card asks whether every request matches m=1 over its whole length.",
        None,
    )


def _witness_completeness(
    witness: dict[str, Any], slots: pl.DataFrame, bands: pl.DataFrame
) -> tuple[str, str, str | None]:
    expected = int(bands["c"].sum()) if bands.height else 0
    refused = int(slots["refused"].is_not_null().sum())
    gaps = [
        f"{expected - slots.height} slot(s) absent" if slots.height < expected else "",
        f"{refused} refused" if refused else "",
    ]
    if (
        witness["reference_stable"] is False and _witness_span(witness) is None
    ):  # a parting with no token: the run-to-run line has none to give
        gaps.append("the two m=1 references are recorded as unstable")
    gaps = [g for g in gaps if g]
    have = f"{slots.height} of {expected} slot(s) across {bands.height} band(s)"
    if not gaps:
        return "completeness", f"complete: {have}, none refused.", "pass"
    return "completeness", f"{have}; " + "; ".join(gaps) + ".", "fail" if slots.height < expected or refused else "warn"
