"""The report's verdict card of a run: what a reviewer asks of one run, in the study's engine-neutral words (no release
gate of any one engine).

Is the server batch invariant in bits (float32 logprobs identical to m=1) and in tokens, where
does it first part, does a near-tie explain it, what does batching cost in decode rate, and is
the evidence complete; and, when its two m=1 references part, what it does alone, run to run. The card and the lines
it shares with a witness's are :mod:`analysis.views.html.verdict_card`; a witness's card is
:mod:`analysis.views.html.witness_review`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import polars as pl

from ...core import MISSING, cell, few, kernel_mode_words
from ...metrics import COUNTED_COLUMNS, bits_unrecorded, per_c_counts
from .verdict_card import NOT_RECORDED, Review, _bits_line, _judged, _near_tie_line, _per_c_table, _tokens_line


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
    if _one_line(run.request_columns("source", "record")):
        return _lone_review(run, verdict)
    # scanned: each count reads its columns a morsel at a time, not every batched request's held at once
    slots = slot_table(run, epsilon=epsilon, reference=reference, columns=COUNTED_COLUMNS, lazy=True)
    spans = _reference_spans(run) if isinstance(reference, str) else _NO_SPANS
    counts = per_c_counts(_within_spans(slots, spans))
    no_bits = _bits_not_judged(spans)
    max_ulp = cast("int | None", slots.select(pl.col("max_ulp").max()).collect().item())  # an Int64 column
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
    review = Review("run", run.label, _run_about(run), headline, css, _per_c_table(counts, no_bits), lines, verdict)
    return _with_repro(review, run)


def _with_repro(review: Review, run) -> Review:
    """A repro already written beside the run: its repro line says where, and links its REPORT.md."""
    from ...studies import repro_folder

    written = Path(repro_folder(str(run.path))) / "REPORT.md" if run.path is not None else None
    if written is None or not written.is_file():
        return review
    review.lines = [
        (q, f"written beside the run: {written} (repro.py beside it)", css) if q.startswith("repro") else (q, a, css)
        for q, a, css in review.lines
    ]
    review.repro_href = written.resolve().as_uri()
    return review


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


def _one_line(requests: pl.DataFrame) -> bool:
    """Whether every request is one capture line's (a record of choices): each row's source and record the first row's,
    compared without hashing every request.

    Examples
    --------
    >>> _one_line(pl.DataFrame({"source": ["a", "a"], "record": [3, 3]})), _one_line(pl.DataFrame({"source": ["a", "b"], "record": [3, 3]}))
    (True, False)
    >>> _one_line(pl.DataFrame({"source": [], "record": []}, schema={"source": pl.String, "record": pl.Int64}))
    False
    """
    same = [pl.col(name).eq_missing(pl.col(name).first()).all() for name in ("source", "record")]
    return requests.height > 0 and all(requests.select(same).row(0))


def _within_spans(slots: pl.DataFrame | pl.LazyFrame, spans: pl.DataFrame) -> pl.LazyFrame:
    """The rows :func:`per_c_counts` takes, batching judged only where the prompt's references agree with each other: a request
    that parts at or after its references' own parting is no batching divergence, and where they differ from the first
    logprob on, its bits cannot be judged (null); nor where it has no logprob to compare (:func:`bits_unrecorded`)."""
    # lazily: the join carries only the columns selected below, not a copy of the whole slot table; in the slot table's
    # order, which names the first request among those that part at the same token
    joined = slots.lazy().join(
        spans.lazy().select("prompt_id", "token_span", "bit_span"), on="prompt_id", how="left", maintain_order="left"
    )
    bit_end = pl.min_horizontal("length", pl.col("bit_span").fill_null(pl.col("length")))
    same_bits = pl.col("bitwise_prefix") >= bit_end
    bitwise = (
        pl.when(pl.col("bitwise_prefix").is_null() | (pl.col("bit_span") == 0) | (same_bits & bits_unrecorded()))
        .then(None)
        .otherwise(same_bits)
    )
    batching = pl.col("diverged") & (pl.col("token_span").is_null() | (pl.col("divergence_at") < pl.col("token_span")))
    return joined.select(  # where each parts, as per_c_counts writes it for the first of each c alone
        c="c",
        bitwise=bitwise,
        diverged=batching,
        divergence_at="divergence_at",
        near_tie="near_tie",
        margin_known=pl.col("reference_margin").is_not_null(),
        where_prompt="prompt_id",
        where_slot="slot",
    )


def _bits_not_judged(spans: pl.DataFrame) -> str:
    """Why bits cannot be judged when every prompt's references differ from their first logprob on; else the default."""
    if spans.height and (spans["bit_span"] == 0).all():
        return "the two m=1 references differ in their logprob bits from the first token on"
    return NOT_RECORDED


def _run_to_run_line(spans: pl.DataFrame, slots: pl.DataFrame | pl.LazyFrame) -> tuple[str, str, str] | None:
    """What the server does alone, run to run, when its two m=1 references part: where, and what the card leaves to it."""
    parted = spans.filter(pl.col("token_span").is_not_null() | pl.col("bit_span").is_not_null()).sort("prompt_id")
    if parted.is_empty():
        return None
    where = []
    for prompt, token_span, bit_span, length in parted.iter_rows():
        part = f"tokens at {token_span}" if token_span is not None else f"logprob bits at token {bit_span}"
        where.append(f"{prompt}: {part} of {length}")
    late = (
        slots.lazy()
        .join(parted.lazy().select("prompt_id", "token_span"), on="prompt_id")
        .filter(pl.col("diverged") & (pl.col("divergence_at") >= pl.col("token_span")))
        .select(pl.len())
        .collect()
        .item()
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
    tokens = run.tokens.filter(pl.col("segment") == "completion")  # one request: collected even when streamed
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
    have = f"{run.request_columns('record').height} request(s) read"
    if not gaps:
        return "completeness", f"complete: {have}, none missing, none refused.", "pass"
    return "completeness", f"incomplete: {have}; " + "; ".join(gaps) + ".", "fail"
