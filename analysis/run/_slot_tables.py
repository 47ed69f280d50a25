"""The run's per-request tables against m=1: every batched request against its reference (:func:`slot_table`) and
each prompt's ref #2 against its ref #1 (:func:`reference_table`). The band and prompt tables are built over these
comparisons."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ..metrics import columnar as _columnar
from ..metrics import parity
from ._piecewise import piecewise
from ._steps import _band_pairs, numbered_steps, with_evidence

if TYPE_CHECKING:  # the tables take any object shaped like a Run (RunLike); only type hints name the class
    from ._model import Run

# the evidence the verdict counts, in the slot and reference tables alike: evidence_pairs' columns and with_evidence's
_EVIDENCE = {
    "has_reference": pl.Boolean,
    **{name: dtype for name, dtype in _columnar.EVIDENCE_SCHEMA.items() if name != "pair"},
    "text_same": pl.Boolean,
}

_SLOT_SCHEMA = {
    "prompt_id": pl.String,
    "arm": pl.String,
    "c": pl.Int64,
    "repeat": pl.Int64,
    "slot": pl.Int64,
    "source": pl.String,
    "record": pl.Int64,
    "diverged": pl.Boolean,
    "divergence_at": pl.Int64,
    "bitwise_prefix": pl.Int64,
    "max_abs_delta": pl.Float64,
    "max_ulp": pl.Int64,
    "topk_order_changes": pl.Int64,
    "reference_margin": pl.Float64,
    "own_margin": pl.Float64,
    "in_reference_topk": pl.Boolean,
    "near_tie": pl.Boolean,
    "k3_mean": pl.Float64,
    "k3_max": pl.Float64,
    "kl_topk_mean": pl.Float64,
    "kl_topk_max": pl.Float64,
    "length": pl.Int64,
    "ttft_s": pl.Float64,
    "decode_tok_s": pl.Float64,
    "decode_rate_origin": pl.String,
    "reference_length": pl.Int64,
    **_EVIDENCE,
    "finish_reason": pl.String,
    "prompt_tokens": pl.Int64,
    "stream_live": pl.Boolean,
    "context": pl.String,
}

SLOT_COLUMNS = tuple(_SLOT_SCHEMA)  # what a reader may ask slot_table(run, columns=...) for


def _slot_comparisons(run: Run, epsilon: float, reference: str | Run) -> pl.DataFrame:
    """Every batched request joined with its comparison against its reference (all of ``Comparison``'s columns)."""
    key = ("slots", epsilon, reference if isinstance(reference, str) else id(reference))
    if key not in run._cache:
        steps, pairs = _band_pairs(run, reference)
        judged = pairs.filter(pl.col("ref").is_not_null()).select("pair", "ref", "other")
        compared = _columnar.compare_pairs(steps, judged, epsilon=epsilon)
        joined = pairs.join(compared, on="pair", how="left", maintain_order="left", suffix="_compared")
        joined = joined.with_columns(length=pl.coalesce("length_compared", "length"), context=batch_context()).drop(
            "length_compared"
        )
        run._cache[key] = with_evidence(steps, joined)
    return run._cache[key]


def batch_context() -> pl.Expr:
    """A batched request's batch context, the unit the bound counts (``docs/verdicts.md``): its arm, c, prompt, the row it
    sat in (the envelope's ``row``, else its slot) and the prompts it was batched with (the envelope's ``batch``, one id per
    row). A run that did not record its companions has one context per (arm, c, prompt, slot): its repeats of a band are
    the same experiment, not new ones."""
    envelope = pl.col("extra").str.json_path_match
    return pl.concat_str(
        pl.col("arm").fill_null(""),
        pl.col("c").cast(pl.String).fill_null(""),
        pl.col("prompt_id").fill_null(""),
        pl.coalesce(envelope("$.row"), pl.col("slot").cast(pl.String)).fill_null(""),
        envelope("$.batch").fill_null(""),
        separator="\x1f",
    )


@piecewise("slots")
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


_REFERENCE_SCHEMA = {
    "prompt_id": pl.String,
    "diverged": pl.Boolean,
    "divergence_at": pl.Int64,
    "bitwise_prefix": pl.Int64,
    "length": pl.Int64,
    "reference_length": pl.Int64,
    "max_ulp": pl.Int64,
    "max_abs_delta": pl.Float64,
    **_EVIDENCE,
}


@piecewise("refs")
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
    second = numbered_steps(run, "ref2")[2].select("prompt_id", other="ref", completion_text="reference_text")
    pairs = (
        first.join(second, on="prompt_id", how="inner")
        .sort("prompt_id")
        .with_row_index("pair")
        .with_columns(pl.col("pair").cast(pl.Int64))
    )
    steps = _columnar.of_requests(
        steps, pl.concat([pairs["ref"], pairs["other"]])
    )  # the references' steps, not every band's
    compared = _columnar.compare_pairs(steps, pairs.select("pair", "ref", "other"), epsilon=parity.NEAR_TIE_EPSILON)
    joined = pairs.join(compared, on="pair", how="left", maintain_order="left")
    return with_evidence(steps, joined).select([pl.col(n).cast(t) for n, t in _REFERENCE_SCHEMA.items()])
