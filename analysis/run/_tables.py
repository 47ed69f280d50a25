"""The run's tables for the report: per request, band and prompt against m=1, flips, drift, forks, widths, observer and accuracy."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from ..metrics import columnar as _columnar
from ..metrics import parity
from ._arms import legacy_arm, main_arm
from ._layout import RunError, _BandEntries, _chosen_widths, _entry_cache_summary, _entry_evidence, engine_steps
from ._steps import numbered_steps, _BAND_ORDER, _band_pairs

if TYPE_CHECKING:  # the tables take any object shaped like a Run (RunLike); only type hints name the class
    from ._model import Run

_SLOT_SCHEMA = {"prompt_id": pl.String, "arm": pl.String, "c": pl.Int64, "repeat": pl.Int64, "slot": pl.Int64, "source": pl.String, "record": pl.Int64,
                "diverged": pl.Boolean, "divergence_at": pl.Int64, "bitwise_prefix": pl.Int64, "max_abs_delta": pl.Float64,
                "max_ulp": pl.Int64, "topk_order_changes": pl.Int64, "reference_margin": pl.Float64, "own_margin": pl.Float64,
                "in_reference_topk": pl.Boolean, "near_tie": pl.Boolean, "k3_mean": pl.Float64, "k3_max": pl.Float64, "kl_topk_mean": pl.Float64,
                "kl_topk_max": pl.Float64, "length": pl.Int64, "ttft_s": pl.Float64, "decode_tok_s": pl.Float64,
                "decode_rate_origin": pl.String, "reference_length": pl.Int64}


def _slot_comparisons(run: Run, epsilon: float, reference: str | Run) -> pl.DataFrame:
    """Every batched request joined with its comparison against its reference (all of ``Comparison``'s columns)."""
    key = ("slots", epsilon, reference if isinstance(reference, str) else id(reference))
    if key not in run._cache:
        steps, pairs = _band_pairs(run, reference)
        compared = _columnar.compare_pairs(steps, pairs.select("pair", "ref", "other"), epsilon=epsilon)
        run._cache[key] = pairs.drop("length").join(compared, on="pair", how="left", maintain_order="left")
    return run._cache[key]


def slot_table(run: Run, *, epsilon: float = parity.NEAR_TIE_EPSILON, reference: str | Run = "ref1") -> pl.DataFrame:
    """One row per batched request: its comparison with ref #1 of its prompt, and its decode rate.

    Over the steps where the request agrees with the reference, ``k3_*`` is prime-rl's
    ``exp(d) - 1 - d`` of the sampled token's logprobs and ``kl_topk_*`` the KL of the reference's
    top-k (plus the rest) against the request's (see :func:`analysis.parity.topk_kl`). Every
    column is what :func:`analysis.parity.compare` gives, computed for all requests at once.

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

    Examples
    --------
    >>> from analysis import assemble_run
    >>> run = assemble_run([
    ...     {"source": "tests/samples/vllm_chat_nonstream_token_ids__OpenPipe-ART.json", "prompt_id": "p", "role": "reference", "slot": 0},
    ...     {"source": "tests/samples/renderers_generate_response_fixture__renderers-tests-test_client.json",
    ...      "prompt_id": "p", "role": "band", "c": 1, "slot": 0}])
    >>> slot_table(run).select("c", "diverged", "divergence_at", "length").row(0)
    (1, True, 0, 2)
    """
    return _slot_comparisons(run, epsilon, reference).select([pl.col(n).cast(t) for n, t in _SLOT_SCHEMA.items()])


_REFERENCE_SCHEMA = {"prompt_id": pl.String, "diverged": pl.Boolean, "divergence_at": pl.Int64, "bitwise_prefix": pl.Int64,
                     "length": pl.Int64, "reference_length": pl.Int64, "max_ulp": pl.Int64, "max_abs_delta": pl.Float64}


def reference_table(run: Run) -> pl.DataFrame:
    """One row per prompt: its m=1 ref #2 against its ref #1, what the server does alone, run to run.

    ``diverged`` and ``divergence_at`` (the first token they differ at, or a length that differs), ``bitwise_prefix`` (the steps
    whose float32 logprobs are bit-identical; null when none was recorded), ``length`` (ref #2's) and ``reference_length``
    (ref #1's), ``max_ulp`` and ``max_abs_delta`` over the agreeing tokens. Prompts without both references have no row.

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
    >>> reference_table(read_run("data/llamacpp-cpu/cache-prompt")).select("prompt_id", "diverged", "bitwise_prefix", "max_ulp").rows()
    [('p0', False, 0, 26), ('p1', False, 0, 19)]
    """
    if "references" not in run._cache:
        run._cache["references"] = _reference_table(run)
    return run._cache["references"].clone()


def _reference_table(run: Run) -> pl.DataFrame:
    steps, _, first = numbered_steps(run, "ref1")
    second = numbered_steps(run, "ref2")[2]
    pairs = (first.join(second.rename({"ref": "other"}), on="prompt_id", how="inner").sort("prompt_id")
             .with_row_index("pair").with_columns(pl.col("pair").cast(pl.Int64)))
    steps = _columnar.of_requests(steps, pl.concat([pairs["ref"], pairs["other"]]))  # the references' steps, not every band's
    compared = _columnar.compare_pairs(steps, pairs.select("pair", "ref", "other"), epsilon=parity.NEAR_TIE_EPSILON)
    joined = pairs.select("pair", "prompt_id").join(compared, on="pair", how="left", maintain_order="left")
    return joined.select([pl.col(n).cast(t) for n, t in _REFERENCE_SCHEMA.items()])


_BAND = ["prompt_id", "arm", "c", "repeat"]
_BAND_SCHEMA = {"prompt_id": pl.String, "arm": pl.String, "c": pl.Int64, "repeat": pl.Int64, "m_formed": pl.Int64, "widths_seen": pl.String,
                "width_evidence": pl.String,
                "n_slots": pl.Int64, "divergence_min": pl.Int64, "divergence_median": pl.Float64, "divergence_max": pl.Int64,
                "diverged_slots": pl.Int64, "near_tie_slots": pl.Int64, "intra_agree_to": pl.Int64, "max_constant_run": pl.Int64,
                "unique_completions": pl.Int64, "modal_share": pl.Float64, "modal_share_low": pl.Float64, "modal_share_high": pl.Float64,
                "decode_tok_s": pl.Float64, "s_per_1000_seq": pl.Float64, "release_skew_s": pl.Float64, "prefix_cache": pl.String}


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
    slots = (slots.join(_columnar.constant_runs(steps).rename({"req": "other"}), on="other", how="left")
             .join(_columnar.sequences(steps).rename({"req": "other"}), on="other", how="left"))
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
    )
    completions = (slots.group_by([*_BAND, "sequence"]).agg(count=pl.len())
                   .group_by(_BAND).agg(unique_completions=pl.len().cast(pl.Int64), modal_count=pl.col("count").max()))
    bands = bands.join(completions, on=_BAND, how="left", nulls_equal=True, maintain_order="left")
    low, high = _columnar.wilson(pl.col("modal_count"), pl.col("n_slots"))
    bands = bands.with_columns(modal_share=pl.col("modal_count") / pl.col("n_slots"), modal_share_low=low, modal_share_high=high)
    widths = _band_widths_text(run, bands)
    return bands.with_columns(pl.Series("m_formed", [w["m_formed"] for w in widths], dtype=pl.Int64),
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


_EVIDENCE_NOTE = {"metrics": " (running-requests gauge samples)", "streams": " (requests decoding at once, from their streams)"}


def _band_widths_text(run: Run, bands: pl.DataFrame) -> list[dict[str, Any]]:
    """Each band's largest width formed, its widths as text and the evidence behind them, from the manifest (one entry
    per band, not per request). ``width_evidence`` names the evidence the width comes from first, then what the
    other kinds show (``"metrics; streams 16"``); null when nothing shows a width. ``prefix_cache``: its cache metrics as text."""
    out = []
    entries = _BandEntries(run.manifest)
    for prompt, arm, c, repeat in bands.select(_BAND).rows():
        entry = entries.entry(prompt, c, repeat, arm=arm)
        evidence = _entry_evidence(entry)
        widths, origin = _chosen_widths(evidence)
        seen = ", ".join(f"m={w} x{n}" for w, n in sorted(Counter(widths).items(), reverse=True))
        if origin == "engine":  # a bound from a mean, said as such
            generated, steps = cast("tuple[int, int]", engine_steps(entry or {}))  # the engine's evidence: both counters
            seen = f"m>={widths[0]} ({generated} tokens in {steps} engine steps, {generated / steps:.2f} a step)"
        others = [f"{kind} {max(found)}" for kind, found in evidence.items() if kind != origin]
        out.append({"m_formed": max(widths) if widths else None,
                    "widths_seen": (seen + ("" if origin == "engine" else _EVIDENCE_NOTE.get(origin or "", ""))) or None,
                    "width_evidence": "; ".join([origin, *others]) if origin else None, "prefix_cache": _entry_cache_summary(entry)})
    return out


_PROMPT_SCHEMA = {"prompt_id": pl.String, "tie_density_1e-3": pl.Float64, "tie_density_1e-2": pl.Float64, "tie_density_1e-1": pl.Float64,
                  "div_index": pl.Int64, "avg_std_top1_prob": pl.Float64, "std_output_length": pl.Float64,
                  "s7_ratio": pl.Float64, "s7_low": pl.Float64, "s7_high": pl.Float64}


def prompt_table(run: Run, *, reference: str | Run = "ref1") -> pl.DataFrame:
    """One row per prompt: the reference's tie density, Yuan et al.'s Div_Index, Avg_Std@top1_prob and
    the std of output lengths (averaged over prompts, their Avg_Std@Output_Length) across the
    reference and each band's slot 0 (the configurations), and S7's c=4/c=1 decode-rate
    ratio with a bootstrap interval over the bands' repeats (null where rates are missing).

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with: ref #1 or ref #2 of its prompt in this run, or ref #1 of the same
        prompt in another run.

    Returns
    -------
    polars.DataFrame
    """
    steps, requests, refs = numbered_steps(run, reference)
    bands = requests.filter((pl.col("role") == "band") & (pl.col("arm") == main_arm(run.manifest)))  # one layout's configurations
    firsts = (bands.filter(pl.col("slot") == 0).sort("c", "repeat").join(refs, on="prompt_id", maintain_order="left")
              .select("prompt_id", "ref", other="req").with_row_index("pair").with_columns(pl.col("pair").cast(pl.Int64)))
    lengths = steps.requests.select("req", "length")
    configurations = pl.concat([refs.select("prompt_id", req="ref"), firsts.select("prompt_id", req="other")]).join(lengths, on="req", how="left")
    thresholds = {"1e-3": 1e-3, "1e-2": 1e-2, "1e-1": 1e-1}
    margins = steps.steps.join(refs, left_on="req", right_on="ref").group_by("prompt_id").agg(
        (pl.col("margin") < t).sum().truediv(pl.col("margin").count()).alias(f"tie_density_{name}") for name, t in thresholds.items())
    parted = (_columnar.agreements(steps, firsts).join(firsts.select("pair", "prompt_id"), on="pair")
              .group_by("prompt_id").agg(first_part=pl.col("agree_to").min()))
    per_prompt = (configurations.group_by("prompt_id").agg(n=pl.len(), shortest=pl.col("length").min(),
                                                           std_output_length=pl.col("length").cast(pl.Float64).std(ddof=0))
                  .join(refs.join(lengths.rename({"req": "ref", "length": "ref_length"}), on="ref"), on="prompt_id")
                  .join(parted, on="prompt_id", how="left").with_columns(div_index=pl.coalesce("first_part", "ref_length")))
    top1 = (configurations.join(steps.steps.select("req", "idx", p=pl.coalesce("top1", "logprob").exp()), on="req")
            .join(per_prompt.select("prompt_id", "n", limit=pl.min_horizontal(pl.col("div_index") + 1, "shortest")), on="prompt_id")
            .filter(pl.col("idx") < pl.col("limit"))
            .group_by("prompt_id", "idx").agg(pl.col("n").first(), known=pl.col("p").count(), std=pl.col("p").std(ddof=0))
            .filter(pl.col("known") == pl.col("n")).group_by("prompt_id").agg(avg_std_top1_prob=pl.col("std").mean()))
    table = (refs.select("prompt_id").join(margins, on="prompt_id", how="left", maintain_order="left")
             .join(per_prompt, on="prompt_id", how="left", maintain_order="left").join(top1, on="prompt_id", how="left", maintain_order="left")
             .join(_s7(bands), on="prompt_id", how="left", maintain_order="left"))
    # a reference without margins has no tie density: NaN, as parity.tie_density gives
    table = table.with_columns(pl.col(f"tie_density_{name}").fill_null(float("nan")) for name in thresholds)
    return table.select([pl.col(n).cast(t) for n, t in _PROMPT_SCHEMA.items()])


def _s7(bands: pl.DataFrame) -> pl.DataFrame:
    """S7's c=4 / c=1 decode-rate ratio per prompt, with its bootstrap interval over each band's repeats."""
    rates = (bands.filter(pl.col("c").is_in([1, 4])).group_by("prompt_id", "c", "repeat")
             .agg(rate=_columnar.band_rate(pl.col("decode_tok_s"))).sort("prompt_id", "c", "repeat"))
    sides = rates.group_by("prompt_id", maintain_order=True).agg(  # each prompt's c=1 and c=4 rates, in repeat order
        base=pl.col("rate").filter(pl.col("c") == 1), batched=pl.col("rate").filter(pl.col("c") == 4))
    rows = []
    for prompt, base, batched in sides.rows():  # one bootstrap per prompt
        if base and batched and None not in base and None not in batched:
            ratio, low, high = parity.ratio_interval(base, batched)
            rows.append({"prompt_id": prompt, "s7_ratio": ratio, "s7_low": low, "s7_high": high})
    return pl.DataFrame(rows, schema={"prompt_id": pl.String, "s7_ratio": pl.Float64, "s7_low": pl.Float64, "s7_high": pl.Float64}, orient="row")


def flip_table(run: Run, *, reference: str | Run = "ref1", edges: Sequence[float] = parity.FLIP_EDGES) -> pl.DataFrame:
    """:func:`analysis.parity.flip_curve` over every batched request of the run against its reference.

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with: ref #1 or ref #2 of its prompt in this run, or ref #1 of the same
        prompt in another run.
    edges : sequence of float, default analysis.parity.FLIP_EDGES
        The bin edges of the reference's top-1 margin, in nats, ascending.

    Returns
    -------
    polars.DataFrame
        One row per margin bin: the steps at risk in it and how many of them flipped.

    Examples
    --------
    >>> from analysis import Run, read_dumps
    >>> flip_table(Run({"ladder": [1]}, read_dumps([]))).select("steps").to_series().sum()
    0
    """
    slots = _slot_comparisons(run, parity.NEAR_TIE_EPSILON, reference)
    steps = numbered_steps(run, reference)[0]
    at_risk = (slots.select("pair", "ref", "diverged", "divergence_at",
                            last=pl.when(pl.col("diverged")).then("divergence_at").otherwise(pl.min_horizontal("length", "reference_length") - 1))
               .join(steps.steps.select(ref="req", idx="idx", margin="margin"), on="ref")
               .filter((pl.col("idx") <= pl.col("last")) & pl.col("margin").is_not_null())
               .select("margin", flip=pl.col("diverged") & (pl.col("idx") == pl.col("divergence_at"))))
    return _columnar.flip_bins(at_risk, edges)


def drift_table(run: Run, *, reference: str | Run = "ref1") -> pl.DataFrame:
    """Per batched request and step before its fork, ``|delta logprob|`` against the reference (``label``, ``step``, ``abs_delta``).

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with: ref #1 or ref #2 of its prompt in this run, or ref #1 of the same
        prompt in another run.

    Returns
    -------
    polars.DataFrame

    Examples
    --------
    >>> from analysis import read_run
    >>> drift = drift_table(read_run("data/experiment-cpu/default"))
    >>> drift.row(0), drift["abs_delta"].max() > 0  # c=1 matches ref #1 bit for bit; some batched request drifts
    (('p0 c=1 slot 0', 0, 0.0), True)
    """
    slots = _slot_comparisons(run, parity.NEAR_TIE_EPSILON, reference)
    steps = numbered_steps(run, reference)[0]
    side = steps.steps.select("req", "idx", "logprob")
    joined = (slots.select("pair", "ref", "other", "agree_to", label=pl.format("{} c={} slot {}", "prompt_id", "c", "slot"))
              .join(side.rename({"req": "ref", "logprob": "lp_r"}), on="ref")
              .join(side.rename({"req": "other", "logprob": "lp_o"}), on=["other", "idx"])
              .filter((pl.col("idx") < pl.col("agree_to")) & pl.col("lp_r").is_not_null() & pl.col("lp_o").is_not_null()))
    return joined.sort("pair", "idx").select("label", step="idx", abs_delta=(pl.col("lp_r") - pl.col("lp_o")).abs())


def reference_margins(run: Run, *, reference: str | Run = "ref1") -> dict[str, list[float | None]]:
    """Each prompt's reference margin (top-1 minus top-2) at every step, for :func:`analysis.plots.plot_margin_trace`.

    Parameters
    ----------
    run : Run
        The run.
    reference : {"ref1", "ref2"} or Run, default "ref1"
        What each request is compared with: ref #1 or ref #2 of its prompt in this run, or ref #1 of the same
        prompt in another run.

    Returns
    -------
    dict of str to list of float or None
        Prompt id to its margins in nats by step; None where a step has no margin.

    Examples
    --------
    >>> from analysis import read_run
    >>> margins = reference_margins(read_run("data/experiment-cpu/default"))
    >>> {prompt: [round(m, 4) for m in steps[:2]] for prompt, steps in margins.items()}
    {'p0': [2.5141, 0.3024], 'p1': [1.9879, 1.3107]}
    """
    steps, _, refs = numbered_steps(run, reference)
    lists = steps.steps.join(refs, left_on="req", right_on="ref").group_by("prompt_id", maintain_order=True).agg(pl.col("margin").sort_by("idx"))
    margins = dict(zip(lists["prompt_id"].to_list(), lists["margin"].to_list()))
    return {prompt: margins.get(prompt, []) for prompt in refs["prompt_id"].to_list()}


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
    bands = requests.filter(pl.col("role") == "band").sort(_BAND_ORDER).with_row_index("pair").with_columns(pl.col("pair").cast(pl.Int64))
    bands = _with_agreement_to_slot_0(steps, bands, "agree_to").with_columns(
        at=pl.col("agree_to").filter(pl.col("req") != pl.col("first")).min().over(_BAND),
        shortest=pl.col("length").min().over(_BAND))
    bands = bands.with_columns(at=pl.coalesce("at", "shortest"))
    taken = (bands.filter(pl.col("at") < pl.col("shortest")).select(*_BAND, "pair", "at", "req")
             .join(steps.steps.select("req", "idx", "ident", "token_id", "token_text", "token_bytes"), left_on=["req", "at"], right_on=["req", "idx"])
             .group_by([*_BAND, "at", "ident"], maintain_order=True)
             .agg(pl.col("token_id", "token_text", "token_bytes").first(), slots=pl.len().cast(pl.Int64), first_slot=pl.col("pair").min())
             .sort([*_BAND, "slots", "first_slot"], descending=[*[False] * len(_BAND), True, False], nulls_last=False, maintain_order=True))
    keys = bands.group_by(_BAND, maintain_order=True).agg(pl.col("at").first())
    forks = keys.join(taken.drop("ident", "first_slot"), on=[*_BAND, "at"], how="left", nulls_equal=True, maintain_order="left")
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


def observer_table(run: Run) -> pl.DataFrame:
    """The observer-effect check: each band's text with logprobs against its twin fired without them.

    One row per observer request: whether its completion text equals the same slot's text in the
    band that asked for logprobs, and the first character where they part (null when equal).
    Empty when the run was probed without ``observer``.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    polars.DataFrame
        The observer requests' keys with ``text_with_logprobs``, ``text_without_logprobs``, ``texts_equal``
        and ``first_difference``.

    Examples
    --------
    >>> from analysis import Run, read_dumps
    >>> observer_table(Run({"ladder": [1]}, read_dumps([]))).height
    0
    """
    requests = run.dump.requests
    key = ["prompt_id", "arm", "c", "repeat", "slot"]
    scored = requests.filter(pl.col("role") == "band").select(*key, pl.col("completion_text").alias("text_with_logprobs"))
    bare = requests.filter(pl.col("role") == "observer").select(*key, pl.col("completion_text").alias("text_without_logprobs"))
    joined = bare.join(scored, on=key, how="left", nulls_equal=True).sort(key)
    parts = [_first_difference(a, b) for a, b in zip(joined["text_with_logprobs"].to_list(), joined["text_without_logprobs"].to_list())]
    return joined.with_columns(
        pl.Series("texts_equal", [None if p == -2 else p == -1 for p in parts], dtype=pl.Boolean),
        pl.Series("first_difference", [None if p < 0 else p for p in parts], dtype=pl.Int64),
    )


def _first_difference(a: str | None, b: str | None) -> int:
    """-2 when a text is missing, -1 when equal, else the first index where they part."""
    if a is None or b is None:
        return -2
    if a == b:
        return -1
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


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
        prompt, c, repeat, arm = str(entry.get("prompt_id")), entry.get("c"), entry.get("repeat"), entry.get("arm", legacy_arm(run.manifest))
        widths, origin = _chosen_widths(_entry_evidence(entries.entry(prompt, c, repeat, arm=arm)))
        for width, steps in sorted(Counter(widths).items(), reverse=True):
            rows.append({"prompt_id": prompt, "arm": arm, "c": c, "repeat": repeat, "width": width, "steps": steps,
                         "share": steps / len(widths), "origin": origin})
    schema = {"prompt_id": pl.String, "arm": pl.String, "c": pl.Int64, "repeat": pl.Int64, "width": pl.Int64, "steps": pl.Int64,
              "share": pl.Float64, "origin": pl.String}
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)


def accuracy_table(run: Run, *, match: str = "contains") -> tuple[pl.DataFrame, float | None]:
    """Accuracy per configuration against the prompts' answers, and Yuan et al.'s Std@Acc across them.

    A configuration is the m=1 reference (ref #1) or one band's slot 0 at each (c, repeat). A
    prompt counts when the manifest gives it an ``answer`` (``bia probe --prompts FILE.jsonl`` with
    ``{"text": ..., "answer": ...}`` lines); a completion is correct when it contains the answer
    (``match="contains"``) or equals it after trimming (``"exact"``).

    Parameters
    ----------
    run : Run
        The run.
    match : {"contains", "exact"}, default "contains"
        How a completion is scored against its prompt's answer.

    Returns
    -------
    table : polars.DataFrame
        One row per configuration: ``configuration``, ``prompts``, ``correct`` and ``accuracy``.
    std_at_acc : float or None
        Std@Acc across the configurations; None when no prompt has an answer.

    Raises
    ------
    RunError
        Another ``match``.

    Examples
    --------
    >>> from analysis import Run, read_dumps
    >>> table, std = accuracy_table(Run({"prompts": [{"prompt_id": "p0", "text": "1+1="}]}, read_dumps([])))
    >>> table.height, std
    (0, None)
    """
    if match not in ("contains", "exact"):
        raise RunError(f"match must be 'contains' or 'exact', got {match!r}")
    answers = {str(p.get("prompt_id")): str(p["answer"]) for p in run.manifest.get("prompts", []) if p.get("answer") is not None}
    requests = run.dump.requests.filter(pl.col("prompt_id").is_in(list(answers)) & (pl.col("slot") == 0)
                                        & pl.col("role").is_in(["reference", "band"]))
    correct: dict[str, list[bool]] = {}
    for row in requests.sort("c", "repeat", "prompt_id", nulls_last=False).iter_rows(named=True):
        config = "m=1 reference" if row["role"] == "reference" else f"c={row['c']} repeat {row['repeat']}"
        text, answer = row["completion_text"] or "", answers[row["prompt_id"]]
        correct.setdefault(config, []).append(answer in text if match == "contains" else text.strip() == answer.strip())
    rows = [{"configuration": config, "prompts": len(hits), "correct": sum(hits), "accuracy": sum(hits) / len(hits)} for config, hits in correct.items()]
    schema = {"configuration": pl.String, "prompts": pl.Int64, "correct": pl.Int64, "accuracy": pl.Float64}
    table = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    return table, parity.std_at_acc(table["accuracy"].to_list())
