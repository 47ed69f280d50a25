"""The report's detail: each run's provenance and per-prompt tables, each witness set's bands and
markers, every long table cut to its worst rows with a count of the rest.

The report shows these inside collapsed ``<details>``; every value goes through
:func:`analysis.core._cells.cell` (rounded, ``—`` for missing, yes/no), and the templates escape it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from ...core import MISSING, as_polars, canonical_setting, cell, duration, pairs, render

WORST_ROWS = 20  # a long table shows this many of its worst rows and counts the rest
FEW = 5  # per-prompt sentences (negative controls, forks) listed before the rest are counted


def table_html(frame: Any, *, caption: str = "", empty: str = "nothing to show", more: str = "") -> str:
    """Any frame as an escaped HTML table of people-formatted cells, in its own horizontal scroll box.

    Parameters
    ----------
    frame : DataFrame
        Polars or pandas.
    caption : str, default ""
        The table's caption.
    empty : str, default "nothing to show"
        What is shown instead of a table without rows.
    more : str, default ""
        A note after the table (the rows left out, say).

    Returns
    -------
    str
        HTML.
    """
    frame = as_polars(frame)
    rows = [[cell(v) for v in row] for row in frame.iter_rows()]
    return render("table.html.j2", columns=frame.columns, rows=rows, caption=caption, empty=empty, more=more)


def worst_html(
    frame: pl.DataFrame,
    *,
    by: Sequence[str],
    descending: Sequence[bool],
    caption: str,
    what: str,
    n: int = WORST_ROWS,
    empty: str = "nothing to show",
) -> str:
    """The ``n`` worst rows of ``frame`` by ``by``, with a line counting the rest.

    Parameters
    ----------
    frame : pl.DataFrame
        The whole table.
    by, descending : sequence
        The sort that puts the worst rows first (nulls last).
    caption, what : str
        The table's caption, and what its rows are ("requests") for the count of the rest.
    n : int
        How many rows to show.
    empty : str
        What to say when the table has no row.

    Examples
    --------
    >>> frame = pl.DataFrame({"request": list("abc"), "agrees to": [5, 1, 3]})
    >>> page = worst_html(frame, by=["agrees to"], descending=[False], caption="Requests", what="requests", n=2)
    >>> page.index("<td>b</td>") < page.index("<td>c</td>"), "1 more of the 3 requests" in page, "<td>a</td>" in page
    (True, True, False)
    """
    shown = frame.sort(by, descending=list(descending), nulls_last=True, maintain_order=True).head(n)
    rest = frame.height - shown.height
    more = (
        f"{rest} more of the {frame.height} {what} not shown (the first {shown.height} are the worst)." if rest else ""
    )
    return table_html(shown, caption=caption, empty=empty, more=more)


# --- one run -------------------------------------------------------------------------------------


def _token_labels(run) -> dict[Any, str]:
    """A readable label for each token identity: its text when the dump had one, else ``id N``."""
    labelled = (
        run.dump.tokens.select("token_id", "token_text", "token_bytes")  # each id's first row with a text or bytes
        .filter(
            pl.col("token_id").is_not_null()
            & (pl.col("token_text").is_not_null() | pl.col("token_bytes").is_not_null())
        )
        .unique("token_id", keep="first", maintain_order=True)
    )
    return {
        token_id: text if text is not None else data.decode("utf-8", errors="replace")
        for token_id, text, data in labelled.rows()
    }


def _label(identity: Any, labels: Mapping[Any, str]) -> str:
    if isinstance(identity, tuple):
        text, data = identity
        return text if text is not None else (data or b"").decode("utf-8", errors="replace")
    return labels.get(identity, f"id {identity}")


def negative_control(run, prompt_id: str) -> dict[str, Any]:
    """Plant a divergence in a copy of ref #1 (a token it never produced, at its middle step) and check that it is found.

    Parameters
    ----------
    run : Run
        The run.
    prompt_id : str
        The prompt whose ref #1 is copied.

    Returns
    -------
    dict
    """
    from ...metrics import parity

    refs = run.dump.requests.filter((pl.col("role") == "reference") & (pl.col("prompt_id") == prompt_id)).sort("slot")
    row = refs.row(0, named=True)
    one = (
        pl.col("source").eq_missing(row["source"])
        & pl.col("record").eq_missing(row["record"])
        & pl.col("choice_index").eq_missing(row["choice_index"])
    )
    return _planted(
        next(iter(parity.streams(run.dump.tokens.filter(one)).values()), parity.Stream(("none",), ())), prompt_id
    )


def _planted(reference, prompt_id: str) -> dict[str, Any]:
    """:func:`negative_control` of a prompt's ref #1 stream."""
    from ...metrics import parity

    at = len(reference) // 2
    planted = list(reference.identities)
    if planted:
        planted[at] = ("<planted>", b"\x00planted")
    found = parity.compare(reference, parity.Stream(("control",), tuple(planted)))
    return {
        "prompt_id": prompt_id,
        "planted_at": at,
        "found_at": found.divergence_at,
        "detected": bool(planted) and found.divergence_at == at,
    }


def _controls(run, prompts: list[str]) -> dict[str, Any]:
    """The negative control of every prompt with a reference: the missed ones first, then a few found, and the count.
    Each prompt's first reference (lowest slot) as :func:`negative_control` takes it, their streams built in one pass."""
    from ...metrics import parity

    key = ["source", "record", "choice_index"]
    firsts = (
        run.dump.requests.filter(pl.col("role") == "reference")
        .sort("prompt_id", "slot", maintain_order=True)
        .unique("prompt_id", keep="first", maintain_order=True)
        .select("prompt_id", *key)
    )
    tokens = run.dump.tokens.join(firsts.select(key), on=key, how="semi", nulls_equal=True)
    streams = parity.streams(tokens)
    first_of = {prompt: (source, record, choice) for prompt, source, record, choice in firsts.iter_rows()}
    controls = [_planted(streams.get(first_of[p], parity.Stream(("none",), ())), p) for p in prompts if p in first_of]
    missed = [c for c in controls if not c["detected"]]
    shown = (missed + [c for c in controls if c["detected"]])[: max(FEW, len(missed))]
    return {"shown": shown, "total": len(controls), "detected": len(controls) - len(missed)}


def _forks(run) -> dict[str, Any]:
    """Where the slots of each band part among themselves: the earliest forks, and how many bands never part."""
    from ...run import band_forks

    labels, parted = _token_labels(run), []
    forks = band_forks(run)
    for (prompt, c, repeat, at), group in forks.filter(pl.col("slots").is_not_null()).group_by(
        ["prompt_id", "c", "repeat", "position"], maintain_order=True
    ):
        branches = [
            (_label(token_id if token_id is not None else (text, data), labels), n)
            for token_id, text, data, n in group.select("token_id", "token_text", "token_bytes", "slots").rows()
        ]
        parted.append({"prompt_id": prompt, "c": c, "repeat": repeat, "at": at, "branches": branches})
    parted.sort(key=lambda f: (f["at"], f["c"]))
    bands = forks.select("prompt_id", "c", "repeat").unique().height
    return {"shown": parted[:WORST_ROWS], "parted": len(parted), "bands": bands}


def _settings(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    requested, effective = manifest.get("requested", {}) or {}, manifest.get("effective", {}) or {}
    # a setting differs only when both sides name it: the probe's own choices (layout, ...) have no server-side twin;
    # a requested alias the server took under its canonical name (batch-invariant: one-by-one) was honoured, not refused
    rows = []
    for k in sorted(set(requested) | set(effective)):
        both = k in requested and k in effective and requested[k] != effective[k]
        alias = both and canonical_setting(k, requested[k]) == effective[k]
        rows.append(
            {
                "name": k,
                "requested": cell(requested.get(k)),
                "effective": cell(effective.get(k)),
                "differs": both and not alias,
                "alias": alias,
            }
        )
    return rows


def _identity(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What served the run and how it was asked, as (label, text) rows."""
    identity = manifest.get("identity", {}) or {}
    rows = [
        ("engine", identity.get("engine")),
        ("engine chosen", (manifest.get("engine") or {}).get("said")),
        ("host", identity.get("host")),
        ("server commit", identity.get("commit")),
        ("model", (identity.get("model") or {}).get("path")),
        ("model sha256", ((identity.get("model") or {}).get("sha256") or "")[:16] or None),
    ]
    return [(label, cell(value)) for label, value in rows if value is not None or label in ("engine", "host", "model")]


def run_html(run) -> str:
    """A run's provenance, settings, what it lacks, its negative control and the forks inside its bands.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    str
        HTML.
    """
    manifest = run.manifest
    prompts = sorted({p for p in run.dump.requests["prompt_id"].to_list() if p is not None})
    return render(
        "run.html.j2",
        run=run,
        identity=_identity(manifest),
        ladder=cell(run.ladder),
        declared_min=cell(run.declared_min),
        sampler=pairs(manifest.get("sampler")),
        environment=pairs(manifest.get("environment")),
        settings=_settings(manifest),
        controls=_controls(run, prompts),
        forks=_forks(run),
        missing=run.missing(),
        refused=_refused(manifest),
        complete=manifest.get("complete", True),
        skipped=run.dump.skipped,
    )


def _refused(manifest: Mapping[str, Any]) -> list[dict[str, str]]:
    return [
        {
            "what": " ".join(
                p
                for p in (
                    cell(r.get("prompt_id")),
                    cell(r.get("role")),
                    f"c={r['c']}" if r.get("c") else "",
                    f"slot {cell(r.get('slot'))}",
                )
                if p
            ),
            "reason": cell(r.get("reason")),
        }
        for r in manifest.get("refused") or []
    ]


def run_admission(run, policy) -> list[dict[str, Any]]:
    """aprender's V3 verdict of each prompt's witness, prompts with the same verdict and reasons grouped.

    Parameters
    ----------
    run : Run
        The run.
    policy : V3Policy
        The policy the witnesses are judged by.

    Returns
    -------
    list of dict
    """
    from ...run import RunError, to_witness
    from ...verdicts import ShapeVerdict, shape_check_data

    groups: dict[tuple, dict[str, Any]] = {}
    for prompt in sorted({p for p in run.dump.requests["prompt_id"].to_list() if p is not None}):
        source = f"{run.label} prompt {prompt}"
        try:
            witness = to_witness(run, prompt)
        except (
            RunError
        ) as exc:  # no witness to judge (a run assembled from dumps records no max_tokens): red, saying why
            verdict, result = ShapeVerdict("RED", (f"RED: no witness: {exc}",), source, policy), "UNMEASURABLE"
        else:
            verdict, result = shape_check_data(witness, source=source, policy=policy), witness["result"]
        key = (verdict.status, verdict.reasons, result)
        group = groups.setdefault(key, {"verdict": verdict, "result": result, "prompts": []})
        group["prompts"].append(prompt)
    return list(groups.values())


def run_tables_html(run, *, epsilon: float, reference: Any = "ref1") -> str:
    """The run's prompts, bands (per c, then the worst bands) and requests (the worst), then the observer
    and accuracy checks when the run has them.

    Parameters
    ----------
    run : Run
        The run.
    epsilon : float
        The near-tie epsilon.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with.

    Returns
    -------
    str
        HTML.
    """
    from ...run import accuracy_table, observer_table

    against = reference if isinstance(reference, str) else f"ref #1 of {reference.label}"
    return (
        _prompts_html(run, reference)
        + _bands_html(run, epsilon, reference, against)
        + _requests_html(run, epsilon, reference, against)
        + _observer_html(observer_table(run))
        + _accuracy_html(*accuracy_table(run))
    )


def _prompts_html(run, reference: Any) -> str:
    from ...run import prompt_table

    prompts = prompt_table(run, reference=reference).select(
        prompt="prompt_id",
        **{
            "Div_Index (first divergence across configurations)": "div_index",
            "ties < 1e-3": "tie_density_1e-3",
            "ties < 1e-2": "tie_density_1e-2",
            "ties < 1e-1": "tie_density_1e-1",
            "Avg_Std@top1_prob": "avg_std_top1_prob",
            "std of output length": "std_output_length",
        },
        **{"S7 c=4/c=1 rate": "s7_ratio"},
        **{"S7 interval": _interval("s7_low", "s7_high")},
    )
    return worst_html(
        prompts,
        by=["Div_Index (first divergence across configurations)", "ties < 1e-2"],
        descending=[False, True],
        what="prompts",
        caption="Prompts: the reference's tie density (share of steps whose top-1/top-2 margin is below each bound), "
        "Div_Index and Avg_Std@top1_prob across configurations, and S7's c=4/c=1 decode-rate ratio with "
        "a bootstrap interval; the prompts that part earliest first.",
    )


def _interval(low: str, high: str) -> pl.Expr:
    """``low–high`` rounded, or missing."""
    return (
        pl.when(pl.col(low).is_not_null() & pl.col(high).is_not_null())
        .then(pl.format("{}–{}", pl.col(low).round(3), pl.col(high).round(3)))
        .otherwise(pl.lit(MISSING))
    )


def _bands_html(run, epsilon: float, reference: Any, against: str) -> str:
    from ...run import band_table

    bands = band_table(run, epsilon=epsilon, reference=reference)
    arms = ["arm"] if run.manifest.get("arms") is not None else []  # a run with control arms: each arm's bands apart
    per_c = (
        bands.group_by(*arms, "c")
        .agg(
            bands=pl.len(),
            requests=pl.col("n_slots").sum(),
            widths_formed=pl.col("widths_seen").drop_nulls().unique().sort().str.join("; "),
            parted=pl.col("diverged_slots").sum(),
            near_tie=pl.col("near_tie_slots").sum(),
            earliest=pl.col("divergence_min").min(),
            most_completions=pl.col("unique_completions").max(),
            rate=pl.col("decode_tok_s").median(),
            per_1000=pl.col("s_per_1000_seq").median(),
        )
        .sort(*arms, "c")
        .select(
            *arms,
            c="c",
            bands="bands",
            **{
                "batch widths formed": "widths_formed",
                "requests": "requests",
                "parted from m=1": "parted",
                "at a near-tie": "near_tie",
                "earliest divergence": "earliest",
                "most unique completions": "most_completions",
                "median decode tok/s": "rate",
                "median time per 1000 seq": "per_1000",
            },
        )
    )
    worst_columns: dict[str, str | pl.Expr] = {
        "m formed": "m_formed",
        "widths formed": "widths_seen",
        "width evidence": "width_evidence",
        "earliest divergence": "divergence_min",
        "parted": pl.format("{} of {}", "diverged_slots", "n_slots"),
        "near-tie": "near_tie_slots",
        "slots agree to": "intra_agree_to",
        "unique completions": "unique_completions",
        "modal share": "modal_share",
        "decode tok/s": "decode_tok_s",
        "time per 1000 seq": "s_per_1000_seq",
        "prefix cache": "prefix_cache",
    }
    worst = bands.select(*arms, prompt="prompt_id", c="c", repeat="repeat", **worst_columns)
    if worst["prefix cache"].null_count() == worst.height:
        worst = worst.drop("prefix cache")
    per_c, worst = _as_durations(per_c, "median time per 1000 seq"), _as_durations(worst, "time per 1000 seq")
    return table_html(
        per_c,
        caption=f"Bands per c: divergence from {against} over every prompt and repeat, the batch widths the server "
        "formed, completions and the median decode rate.",
        empty="No bands in the run.",
    ) + worst_html(
        worst,
        by=["earliest divergence", "slots agree to", "unique completions"],
        descending=[False, False, True],
        what="bands",
        caption="Bands that part earliest: one row per prompt, c and repeat.",
        empty="No bands in the run.",
    )


def _as_durations(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """The frame with a column of seconds written as every duration bia shows (:func:`analysis.core._cells.duration`)."""
    return frame.with_columns(pl.Series(column, [duration(s) for s in frame[column]], dtype=pl.String))


def _requests_html(run, epsilon: float, reference: Any, against: str) -> str:
    from ...run import slot_table

    arms = ["arm"] if run.manifest.get("arms") is not None else []  # a run with control arms names each request's arm
    slots = slot_table(run, epsilon=epsilon, reference=reference).select(
        *arms,
        prompt="prompt_id",
        c="c",
        repeat="repeat",
        slot="slot",
        **{
            "divergence at": "divergence_at",
            "bit-identical prefix": "bitwise_prefix",
            "max ULP": "max_ulp",
            "reference margin": "reference_margin",
            "own margin": "own_margin",
            "near-tie": "near_tie",
            "KL top-k max": "kl_topk_max",
            "length": "length",
            "decode tok/s": "decode_tok_s",
        },
    )
    return worst_html(
        slots,
        by=["divergence at", "bit-identical prefix", "max ULP"],
        descending=[False, False, True],
        what="requests",
        caption=f"Requests: each batched request against {against} (positions 0-based); those that part earliest, then those "
        "whose bits part earliest, first.",
        empty="No batched requests in the run.",
    )


def _accuracy_html(table: pl.DataFrame, std: float | None) -> str:
    """Accuracy per configuration and Std@Acc, when the run's prompts carry answers."""
    if table.is_empty():
        return ""
    return table_html(
        table,
        caption=f"Accuracy against the prompts' answers per configuration (ref #1, and slot 0 of each band); "
        f"Std@Acc across them = {std:.4g}.",
    )


def _observer_html(observed: pl.DataFrame) -> str:
    """The observer-effect check, when the run fired each band a second time without logprobs."""
    if observed.is_empty():
        return ""
    changed = observed.filter(pl.col("texts_equal").not_())
    summary = (
        f"{changed.height} of {observed.height} request(s) fired without logprobs gave a different text: asking for logprobs changed the output."
        if changed.height
        else f"All {observed.height} request(s) fired without logprobs gave the same text as with them."
    )
    return worst_html(
        observed,
        by=["texts_equal"],
        descending=[False],
        what="requests",
        caption=f"Observer effect: each band fired again without logprobs, texts compared slot by slot. {summary}",
    )


# --- witnesses -----------------------------------------------------------------------------------


def witness_bands_html(ws) -> str:
    """The bands of every witness: shape served, agreement with m=1, rate, recorded and derived result.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.

    Returns
    -------
    str
        HTML.
    """
    from ..plots.witness import witness_label

    bands = ws.to_backend("polars").bands
    labels = [witness_label(s, v) for s, v in bands.select("source", "witness_version").iter_rows()]
    bands = bands.with_columns(pl.Series("witness", labels, dtype=pl.String)).select(
        "witness",
        "c",
        **{
            "m formed": "m_formed",
            "slots": "n_slots",
            "divergence at": "divergence_at",
            "declared min": "declared_min",
            "margin at divergence": "top2_margin_at_divergence",
            "agree among slots to": "intra_agree_to",
            "longest constant run": "max_constant_run",
            "decode tok/s": "decode_tok_s",
            "result": "result",
            "derived result": "derived_result",
        },
    )
    return worst_html(
        bands,
        by=["witness", "c"],
        descending=[False, False],
        what="bands",
        n=4 * WORST_ROWS,
        caption="Witness bands: the batch width the server formed, where the band parted from the m=1 reference, the "
        "reference's top-2 margin there, the per-request decode rate, and the band result as recorded and as re-derived.",
        empty="No bands: no witness measured any.",
    )


def markers_html(ws) -> str:
    """Release markers, if any were read.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.

    Returns
    -------
    str
        HTML.
    """
    markers = ws.to_backend("polars").markers
    if markers.is_empty():
        return table_html(markers, empty="No release markers among the sources.")
    shown = markers.select(
        "source",
        "status",
        "exit",
        "host",
        commit=pl.col("commit").str.slice(0, 10),
        started="started_utc",
        **{"max m": "max_m", "sha256": pl.col("sha256").str.slice(0, 16), "status agrees": "status_agrees"},
    )
    return table_html(shown, caption="Release markers.")
