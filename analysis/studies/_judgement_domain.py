"""What a verdict covers (its ``domain``): the ladder and widths measured, the distinct prompts and batch contexts, the
batched requests' lengths, the sampling and the precision, worked out once and worded once for every surface."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl


def sampling_words(manifest: Mapping[str, Any]) -> str:
    """How the run sampled, as its manifest records it: ``greedy`` at temperature 0 (or none recorded, as bia's probes
    always ask), else the temperature.

    Parameters
    ----------
    manifest : Mapping of str to Any
        The run's manifest (its ``sampler``).

    Returns
    -------
    str

    Examples
    --------
    >>> sampling_words({"sampler": {"temperature": 0.0}}), sampling_words({"sampler": {"temperature": 0.7}})
    ('greedy (temperature 0)', 'temperature 0.7')
    """
    temperature = (manifest.get("sampler") or {}).get("temperature")
    return "greedy (temperature 0)" if not temperature else f"temperature {temperature:g}"


def domain(
    row: Mapping[str, Any], batched: pl.DataFrame | pl.LazyFrame, bands: pl.DataFrame, ladder: list[int], **run: Any
) -> dict:
    """What a verdict covers: the ladder and the widths measured, the distinct prompts and batch contexts, the batched
    requests' prompt and completion lengths, and the run's ``sampling``, ``precision`` and ``arms`` (given in ``run``).

    Parameters
    ----------
    row : Mapping of str to Any
        The arm's judgement row (its ``prompts``, ``contexts`` and ``requests``).
    batched : polars.DataFrame or polars.LazyFrame
        Its batched requests (``length``, and ``prompt_tokens`` when known).
    bands : polars.DataFrame
        Its bands (``c``, ``widest_seen``).
    ladder : list of int
        The run's ladder.
    **run : Any
        ``sampling``, ``precision`` and ``arms``.

    Returns
    -------
    dict
        The fields of the judgement's ``domain`` column.
    """
    widths = bands.filter(pl.col("c") > 1)["widest_seen"].drop_nulls().unique().sort().to_list()
    rows = batched.lazy()
    prompt_tokens = pl.col("prompt_tokens") if "prompt_tokens" in rows.collect_schema() else pl.lit(None, pl.Int64)
    lengths = rows.select(
        prompt_tokens_min=prompt_tokens.min(),
        prompt_tokens_max=prompt_tokens.max(),
        completion_tokens_min=pl.col("length").min(),
        completion_tokens_max=pl.col("length").max(),
    ).collect(engine="streaming")
    return {
        "ladder": sorted(int(c) for c in ladder),
        "widths": widths,
        "prompts": row["prompts"],
        "contexts": row["contexts"],
        "requests": row["requests"],
        **lengths.row(0, named=True),
        **run,
    }


def domain_words(domain: Mapping[str, Any]) -> str:
    """A domain in one line, as ``bia certify`` ends with it.

    Parameters
    ----------
    domain : Mapping of str to Any
        A judgement row's ``domain`` (or a certificate's).

    Returns
    -------
    str

    Examples
    --------
    >>> domain_words({"ladder": [1, 4], "widths": [4], "prompts": 2, "contexts": 8, "requests": 8, "prompt_tokens_min": 5,
    ...               "prompt_tokens_max": 9, "completion_tokens_min": 16, "completion_tokens_max": 16,
    ...               "sampling": "greedy (temperature 0)", "precision": "float32", "arms": ["copies"]})
    'covers: ladder 1,4 (widths measured 4), 2 prompts in 8 distinct batch contexts (8 batched requests), prompts of 5-9 tokens, completions of 16 tokens, greedy (temperature 0), logprobs compared as float32, arms copies'
    """

    def span(low: Any, high: Any) -> str:
        return "?" if low is None else f"{low}" if low == high else f"{low}-{high}"

    widths = ",".join(map(str, domain["widths"])) or "none"
    prompts = f"{domain['prompts']} prompt{'s' if domain['prompts'] != 1 else ''}"
    return (
        f"covers: ladder {','.join(map(str, domain['ladder']))} (widths measured {widths}), {prompts} in "
        f"{domain['contexts']} distinct batch contexts ({domain['requests']} batched requests), prompts of "
        f"{span(domain['prompt_tokens_min'], domain['prompt_tokens_max'])} tokens, completions of "
        f"{span(domain['completion_tokens_min'], domain['completion_tokens_max'])} tokens, {domain['sampling']}, logprobs "
        f"compared as {domain['precision']}, arms {', '.join(domain['arms'])}"
    )
