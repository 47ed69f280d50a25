"""The sampler-vs-trainer figures: the distribution of ``|delta|`` (trainer minus rollout logprob), along the sequence, and
against the sampler's top-1/top-2 margin."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, cast

import polars as pl

from ...studies import mismatch_tokens
from ._drawing import SMALLEST_FONT, _clear_of_data, as_frame, panel_grid


def rl_mismatch_figures(pairs: Sequence[str | os.PathLike[str]] | pl.DataFrame) -> list[tuple[Any, str]]:
    """The section's figures (:func:`analysis.report.mismatch` shows them): the distribution of ``|delta|`` (log scale)
    and ``|delta|`` against position; ``|delta|`` against the sampler's top-1/top-2 margin.

    ``pairs``: sampler-trainer pairs files, or their tokens (:func:`analysis.mismatch_tokens`, polars or pandas).

    Parameters
    ----------
    pairs : sequence of str or path, or DataFrame
        See above.

    Returns
    -------
    list of tuple of (matplotlib.figure.Figure, str)
        Each figure with its alt text.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> figures = rl_mismatch_figures(["data/experiment-cpu/trainer/default.jsonl"])
    >>> [len(fig.axes) for fig, _ in figures]
    [2, 1]
    >>> plt.close("all")
    """
    import matplotlib.pyplot as plt

    tokens = as_frame(pairs)
    if tokens is None:  # not a frame: the pairs files
        tokens = mismatch_tokens(cast("Sequence[str | os.PathLike[str]]", pairs))
    tokens = tokens.with_columns(size=pl.col("delta").abs())
    runs = tokens["run"].unique(maintain_order=True).to_list()
    tokens = tokens.with_columns(color=pl.col("run").replace_strict(runs, [f"C{i % 10}" for i in range(len(runs))]))
    fig, axes = panel_grid(2)
    _distribution(tokens, axes[0])
    _by_position(tokens, axes[1])
    out = [
        (
            fig,
            "the distribution of |trainer - rollout logprob| per run on a log scale, and its mean against the token's position",
        )
    ]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    _by_margin(tokens, ax)
    return [*out, (fig, "|trainer - rollout logprob| against the sampler's top-1 minus top-2 logprob margin, per run")]


def _zeros(group: pl.DataFrame) -> str:
    """A run's legend label, saying how many tokens sit at exactly 0 (which a log scale cannot show)."""
    run, zeros = group["run"][0], int((group["size"] == 0).sum())
    return f"{run} ({zeros} of {group.height} at exactly 0)" if zeros else run


def _each_run(tokens: pl.DataFrame):
    """Each run's tokens, its colour (the same in every panel) and its legend label."""
    for (_,), group in tokens.group_by("run", maintain_order=True):
        yield group, group["color"][0], _zeros(group)


def _distribution(tokens: pl.DataFrame, ax) -> None:
    import numpy as np

    nonzero = tokens.filter(pl.col("size") > 0)["size"]
    if nonzero.is_empty():
        ax.bia_empty = "No token's logprob differs between sampler and trainer: no distribution of |delta| to draw."
        return
    low, high = cast(float, nonzero.min()), cast(float, nonzero.max())  # a Float64 series, not empty
    bins = np.logspace(np.log10(low) - 0.1, np.log10(high) + 0.1, 30)
    for group, color, label in _each_run(tokens):
        ax.hist(
            group.filter(pl.col("size") > 0)["size"].to_numpy(), bins=bins, histtype="step", color=color, label=label
        )
    ax.set(xscale="log", xlabel="|trainer - rollout logprob| (nats)", ylabel="tokens", title="Per-token mismatch")
    _clear_of_data(ax, ax.legend(fontsize=SMALLEST_FONT))


def _by_position(tokens: pl.DataFrame, ax) -> None:
    if tokens.filter(pl.col("size") > 0).is_empty():
        ax.bia_empty = "No token's logprob differs between sampler and trainer at any position."
        return
    for group, color, label in _each_run(tokens):
        means = group.group_by("position").agg(pl.col("size").mean()).sort("position").filter(pl.col("size") > 0)
        ax.plot(means["position"].to_numpy(), means["size"].to_numpy(), marker=".", color=color, label=label)
    ax.set(
        yscale="log",
        xlabel="completion token",
        ylabel="mean |trainer - rollout logprob|",
        title="Mismatch along the sequence",
    )
    _clear_of_data(ax, ax.legend(fontsize=SMALLEST_FONT))


def _by_margin(tokens: pl.DataFrame, ax) -> None:
    shown = tokens.filter((pl.col("size") > 0) & (pl.col("margin") > 0))
    if shown.is_empty():
        ax.bia_empty = "No token parts with a known sampler margin (the runs beside the pairs give the margins)."
        return
    for group, color, label in _each_run(tokens):
        group = group.filter((pl.col("size") > 0) & (pl.col("margin") > 0))
        ax.scatter(group["margin"].to_numpy(), group["size"].to_numpy(), s=6, alpha=0.6, color=color, label=label)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="sampler's top-1 minus top-2 logprob",
        ylabel="|trainer - rollout logprob|",
        title="Mismatch against the sampler's margin",
    )
    _clear_of_data(ax, ax.legend(fontsize=SMALLEST_FONT))
