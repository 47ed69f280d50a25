"""The run's tables per band: each band's divergence, agreement, completions and rates (:func:`band_table`), the
widths the server formed (:func:`width_table`) and where a band's slots part among themselves (:func:`band_forks`)."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from ..metrics import columnar as _columnar
from ..metrics import parity
from ._arms import legacy_arm
from ._layout import _BandEntries, _chosen_widths, _entry_cache_summary, _entry_evidence, engine_steps
from ._piecewise import piecewise
from ._slot_tables import _slot_comparisons
from ._steps import _BAND_ORDER, numbered_steps

if TYPE_CHECKING:  # the tables take any object shaped like a Run (RunLike); only type hints name the class
    from ._model import Run

_BAND = ["prompt_id", "arm", "c", "repeat"]
_BAND_SCHEMA = {
    "prompt_id": pl.String,
    "arm": pl.String,
    "c": pl.Int64,
    "repeat": pl.Int64,
    "m_formed": pl.Int64,
    "widths_seen": pl.String,
    "width_evidence": pl.String,
    "n_slots": pl.Int64,
    "divergence_min": pl.Int64,
    "divergence_median": pl.Float64,
    "divergence_max": pl.Int64,
    "diverged_slots": pl.Int64,
    "near_tie_slots": pl.Int64,
    "intra_agree_to": pl.Int64,
    "max_constant_run": pl.Int64,
    "unique_completions": pl.Int64,
    "modal_share": pl.Float64,
    "modal_share_low": pl.Float64,
    "modal_share_high": pl.Float64,
    "decode_tok_s": pl.Float64,
    "s_per_1000_seq": pl.Float64,
    "release_skew_s": pl.Float64,
    "prefix_cache": pl.String,
}


@piecewise("bands")
def band_table(run: Run, *, epsilon: float = parity.NEAR_TIE_EPSILON, reference: str | Run = "ref1") -> pl.DataFrame:
    """One row per (prompt, band, repeat): divergence over slots, agreement, completions, decode rate,
    seconds per 1000 sequences (the band's wall time from its first send to its last token, per
    request) and the release skew (first to last send); the last two for probe runs only, which
    record when each request was sent. Each column is :func:`analysis.parity.band_summary`'s, as group-bys.
    Computed once per run, epsilon and reference (the verdict, the cards, the figures and the detail all read it).

    Parameters
    ----------
    run : Run
        The run.
    epsilon : float, default 0.05
        The near-tie epsilon: a fork where the reference's top-1 margin is below it is a near tie
        (``analysis.parity.NEAR_TIE_EPSILON``).
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with: ref #1 or ref #2 of its prompt in this run, or ref #1 of the same
        prompt in another run.

    Returns
    -------
    polars.DataFrame
        A copy: changing it leaves the cached table alone.
    """
    key = ("bands", epsilon, reference if isinstance(reference, str) else id(reference))
    if key not in run._cache:
        run._cache[key] = _band_table(run, epsilon, reference)
    return run._cache[key].clone()  # a cheap copy (its columns are shared): what a caller does to it stays with it


def _band_table(run: Run, epsilon: float, reference: str | Run) -> pl.DataFrame:
    slots = _slot_comparisons(run, epsilon, reference)
    if slots.height == 0:
        return pl.DataFrame(schema=_BAND_SCHEMA)
    steps = numbered_steps(run, reference)[0]
    slots = _with_agreement_to_slot_0(steps, slots, "intra")
    slots = slots.join(_columnar.constant_runs(steps).rename({"req": "other"}), on="other", how="left").join(
        _columnar.sequences(steps).rename({"req": "other"}), on="other", how="left"
    )
    sent = pl.col("extra").str.json_path_match("$.sent_at_s").cast(pl.Float64)
    slots = slots.with_columns(sent=sent, end=sent + pl.col("t_last_content"))
    timed = (pl.col("sent").null_count() == 0) & (pl.col("end").null_count() == 0)
    bands = slots.group_by(_BAND, maintain_order=True).agg(
        n_slots=pl.len().cast(pl.Int64),
        divergence_min=pl.col("agree_to").min(),
        divergence_median=pl.col("agree_to").median(),
        divergence_max=pl.col("agree_to").max(),
        diverged_slots=pl.col("diverged").sum().cast(pl.Int64),
        near_tie_slots=pl.col("near_tie").sum().cast(pl.Int64),
        intra_agree_to=pl.col("intra").min(),
        max_constant_run=pl.col("max_constant_run").max(),
        decode_tok_s=_columnar.band_rate(pl.col("decode_tok_s")),
        s_per_1000_seq=pl.when(timed).then((pl.col("end").max() - pl.col("sent").min()) / pl.len() * 1000),
        release_skew_s=pl.when(timed).then(pl.col("sent").max() - pl.col("sent").min()),
        all_live=pl.col("stream_live").fill_null(False).all(),
    )
    completions = (
        slots.group_by([*_BAND, "sequence"])
        .agg(count=pl.len())
        .group_by(_BAND)
        .agg(unique_completions=pl.len().cast(pl.Int64), modal_count=pl.col("count").max())
    )
    bands = bands.join(completions, on=_BAND, how="left", nulls_equal=True, maintain_order="left")
    low, high = _columnar.wilson(pl.col("modal_count"), pl.col("n_slots"))
    bands = bands.with_columns(
        modal_share=pl.col("modal_count") / pl.col("n_slots"), modal_share_low=low, modal_share_high=high
    )
    widths = _band_widths_text(run, bands)
    return bands.with_columns(
        pl.Series("m_formed", [w["m_formed"] for w in widths], dtype=pl.Int64),
        pl.Series("widths_seen", [w["widths_seen"] for w in widths], dtype=pl.String),
        pl.Series("width_evidence", [w["width_evidence"] for w in widths], dtype=pl.String),
        pl.Series("prefix_cache", [w["prefix_cache"] for w in widths], dtype=pl.String),
    ).select([pl.col(n).cast(t) for n, t in _BAND_SCHEMA.items()])


def _with_agreement_to_slot_0(steps: _columnar.Steps, bands: pl.DataFrame, name: str) -> pl.DataFrame:
    """Band requests (``pair``, ``req``, in slot order) with their band's first request (``first``) and how many
    leading tokens each shares with it (``name``)."""
    bands = bands.with_columns(first=pl.col("req").first().over(_BAND))
    agreed = _columnar.agreements(steps, bands.select("pair", ref="first", other="req")).rename({"agree_to": name})
    return bands.join(agreed, on="pair", how="left", maintain_order="left")


_EVIDENCE_NOTE = {
    "metrics": " (running-requests gauge samples)",
    "streams": " (requests decoding at once, from their streams)",
}


def _band_widths_text(run: Run, bands: pl.DataFrame) -> list[dict[str, Any]]:
    """Each band's largest width formed, its widths as text and the evidence behind them, from the manifest (one entry
    per band, not per request); the streams' co-residency counts only for a band whose every stream was live (``all_live``). ``width_evidence`` names the evidence the width comes from first, then what the
    other kinds show (``"metrics; streams 16"``); null when nothing shows a width. ``prefix_cache``: its cache metrics as text."""
    out = []
    entries = _BandEntries(run.manifest)
    for prompt, arm, c, repeat, live in bands.select(*_BAND, "all_live").rows():
        entry = entries.entry(prompt, c, repeat, arm=arm)
        evidence = _entry_evidence(entry)
        if not live:  # streams that were not live (replayed, or arriving in a burst) decoded nothing together: no width
            evidence.pop("streams", None)
        widths, origin = _chosen_widths(evidence)
        seen = ", ".join(f"m={w} x{n}" for w, n in sorted(Counter(widths).items(), reverse=True))
        if origin == "engine":  # a bound from a mean, said as such
            generated, steps = cast(
                "tuple[int, int]", engine_steps(entry or {})
            )  # the engine's evidence: both counters
            seen = f"m>={widths[0]} ({generated} tokens in {steps} engine steps, {generated / steps:.2f} a step)"
        others = [f"{kind} {max(found)}" for kind, found in evidence.items() if kind != origin]
        out.append(
            {
                "m_formed": max(widths) if widths else None,
                "widths_seen": (seen + ("" if origin == "engine" else _EVIDENCE_NOTE.get(origin or "", ""))) or None,
                "width_evidence": "; ".join([origin, *others]) if origin else None,
                "prefix_cache": _entry_cache_summary(entry),
            }
        )
    return out


@piecewise("forks")
def band_forks(run: Run) -> pl.DataFrame:
    """Where the slots of each band first disagree among themselves (``at``) and which tokens they took there.

    One row per (band, token taken): ``token_id``, ``token_text``, ``token_bytes`` and how many slots
    took it (most first); a band whose slots never part has one row with ``at`` and null tokens.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> from analysis import read_run
    >>> band_forks(read_run("data/experiment-cpu/default")).select("prompt_id", "c", "position", "slots").row(0)  # 64 tokens, no fork
    ('p0', 1, 64, None)
    """
    steps, requests, _ = numbered_steps(run)
    bands = (
        requests.filter(pl.col("role") == "band")
        .sort(_BAND_ORDER)
        .with_row_index("pair")
        .with_columns(pl.col("pair").cast(pl.Int64))
    )
    bands = _with_agreement_to_slot_0(steps, bands, "agree_to").with_columns(
        at=pl.col("agree_to").filter(pl.col("req") != pl.col("first")).min().over(_BAND),
        shortest=pl.col("length").min().over(_BAND),
    )
    bands = bands.with_columns(at=pl.coalesce("at", "shortest"))
    taken = (
        bands.filter(pl.col("at") < pl.col("shortest"))
        .select(*_BAND, "pair", "at", "req")
        .join(
            steps.steps.select("req", "idx", "ident", "token_id", "token_text", "token_bytes"),
            left_on=["req", "at"],
            right_on=["req", "idx"],
        )
        .group_by([*_BAND, "at", "ident"], maintain_order=True)
        .agg(
            pl.col("token_id", "token_text", "token_bytes").first(),
            slots=pl.len().cast(pl.Int64),
            first_slot=pl.col("pair").min(),
        )
        .sort(
            [*_BAND, "slots", "first_slot"],
            descending=[*[False] * len(_BAND), True, False],
            nulls_last=False,
            maintain_order=True,
        )
    )
    keys = bands.group_by(_BAND, maintain_order=True).agg(pl.col("at").first())
    forks = keys.join(
        taken.drop("ident", "first_slot"), on=[*_BAND, "at"], how="left", nulls_equal=True, maintain_order="left"
    )
    return forks.rename({"at": "position"})  # a token position, as in every table


def _send_spans(group: pl.DataFrame) -> list[tuple[float, float]] | None:
    """Each request's (sent, last content chunk) on the run's clock; None without the probe's send times."""
    spans = []
    for extra, last in zip(group["extra"].to_list(), group["t_last_content"].to_list()):
        sent = json.loads(extra).get("sent_at_s") if extra else None
        if sent is None or last is None:
            return None
        spans.append((sent, sent + last))
    return spans or None


def _seconds_per_1000(spans: list[tuple[float, float]] | None) -> float | None:
    """Thinking Machines' seconds per 1000 sequences for one band (its ``_send_spans``): from the first request
    sent to the last content chunk received, per request, times 1000. None without the probe's send times."""
    if spans is None:
        return None
    return (max(end for _, end in spans) - min(start for start, _ in spans)) / len(spans) * 1000


def _release_skew(spans: list[tuple[float, float]] | None) -> float | None:
    """Seconds between the first and the last request of a band leaving the client: a batch can only form
    from requests that arrive together."""
    return None if spans is None else max(start for start, _ in spans) - min(start for start, _ in spans)


def width_table(run: Run) -> pl.DataFrame:
    """The batch widths the server formed, per band: one row per (prompt, band, repeat, width) with how
    often it was seen and its share of the band, from the server log's per-step lines (``origin``
    "log") or, without them, the running-requests gauge's samples ("metrics"), or, without either, the
    band's streams ("streams": how many of its requests were decoding at once, one row).

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    polars.DataFrame
        ``prompt_id``, ``arm``, ``c``, ``repeat``, ``width``, ``steps``, ``share`` and ``origin``.

    Examples
    --------
    >>> manifest = {"m_formed": [{"prompt_id": "p0", "c": 4, "repeat": 0, "widths": [4, 4, 4, 3]}]}
    >>> from analysis import Run, read_dumps
    >>> width_table(Run(manifest, read_dumps([]))).select("c", "width", "steps", "share").rows()
    [(4, 4, 3, 0.75), (4, 3, 1, 0.25)]
    """
    rows = []
    entries = _BandEntries(run.manifest)
    for entry in run.manifest.get("m_formed", []):
        if entry.get("role", "band") != "band":
            continue
        prompt, c, repeat, arm = (
            str(entry.get("prompt_id")),
            entry.get("c"),
            entry.get("repeat"),
            entry.get("arm", legacy_arm(run.manifest)),
        )
        widths, origin = _chosen_widths(_entry_evidence(entries.entry(prompt, c, repeat, arm=arm)))
        for width, steps in sorted(Counter(widths).items(), reverse=True):
            rows.append(
                {
                    "prompt_id": prompt,
                    "arm": arm,
                    "c": c,
                    "repeat": repeat,
                    "width": width,
                    "steps": steps,
                    "share": steps / len(widths),
                    "origin": origin,
                }
            )
    schema = {
        "prompt_id": pl.String,
        "arm": pl.String,
        "c": pl.Int64,
        "repeat": pl.Int64,
        "width": pl.Int64,
        "steps": pl.Int64,
        "share": pl.Float64,
        "origin": pl.String,
    }
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
