"""The report's sampler-vs-trainer section in words and tables: every RL framework's mismatch metrics per run and the
sequences with the largest K3 (:mod:`analysis.studies._rl_mismatch` computes them)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from html import escape
from typing import cast

from ...studies import TOP_SEQUENCES, largest_k3, mismatch_summaries, mismatch_tokens, stale_pairs
from .tables import table_html


def rl_mismatch_html(pairs: Sequence[str | os.PathLike[str]]) -> str:
    """The section's tables: every framework's metrics per run, and the sequences with the largest K3.

    Parameters
    ----------
    pairs : sequence of paths
        Sampler-trainer pairs files (see :func:`analysis.trainer_pairs`).

    Returns
    -------
    str
        Escaped HTML: a heading, a sentence per run on whether it reached exactly 0, and the two tables.

    Examples
    --------
    >>> html = rl_mismatch_html(["data/experiment-cpu/trainer/fixed-tiles.jsonl"])
    >>> "experiment-cpu/fixed-tiles: every one of the 3968 tokens" in html
    True
    """
    summaries = mismatch_summaries(pairs)
    tokens = mismatch_tokens(pairs)
    said = []
    for (run,), group in tokens.group_by("run", maintain_order=True):
        parted = int((group["delta"] != 0).sum())
        said.append(
            f"{run}: every one of the {group.height} tokens has the sampler's bits, so every metric is at its no-mismatch value"
            if parted == 0
            else f"{run}: {parted} of {group.height} tokens part, "
            f"by up to {cast(float, group['delta'].abs().max()):.3g} nats"
        )
    intro = (
        "<h2>Sampler and trainer</h2><p>Each sampled sequence scored again as an RL trainer scores it: one teacher-forced "
        "forward pass over prompt and completion, batched as a trainer batches, in the run's kernel mode. The metrics are each "
        "framework's own (names as they log them, their averaging and constants); delta is the trainer's logprob minus the "
        "sampler's. A kernel mode whose one-pass forward gives the decode's bits makes every one exactly 0.</p>"
    )
    findings = "<ul>" + "".join(f"<li>{escape(s)}</li>" for s in said) + "</ul>"
    findings += "".join(f'<p class="bia-fail">{escape(s)}</p>' for s in stale_pairs(pairs))
    summary = table_html(
        summaries,
        caption="Every framework's sampler-trainer mismatch metrics, one column per run. With no "
        "mismatch a difference or KL reads 0 and a ratio 1; verl divides its token means by "
        "the token count + 1e-8, so its chi2_token reads a hair below 0 even then.",
        empty="No sampler-trainer pairs.",
    )
    top = table_html(
        largest_k3(pairs),
        caption=f"The {TOP_SEQUENCES} sequences of each run with the largest K3 (token mean); "
        "'first parted at' is the first completion token whose logprob differs in any bit.",
        empty="No sampler-trainer pairs.",
    )
    return intro + findings + summary + top
