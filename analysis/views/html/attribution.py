"""The report's "why streams part" section: per engine and c, how much of the drift each cause accounts for.

Only runs probed with control arms (``bia probe --arms``) are attributed; a report without such a run
has no section. The figure is embedded as a base64 PNG, so the page stays self-contained.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from typing import Any

from ...studies import attribution_table, engine_label
from ..plots.attribution import attribution_shares_by_engine, plot_attribution
from .figures import png_base64
from .tables import table_html, worst_html


def attribution_html(runs: Iterable[Any]) -> str:
    """The section: its heading and words, the figure, the shares per engine and c, and each run's requests
    that part with their cause and evidence (worst first). Empty when no run was probed with arms.

    Parameters
    ----------
    runs : iterable of Run
        The runs; those without arms are left out.

    Returns
    -------
    str
        HTML.

    Examples
    --------
    >>> from analysis import read_run
    >>> attribution_html([read_run("data/experiment-cpu/default")])
    ''
    """
    runs = [run for run in runs if run.manifest.get("arms") is not None]
    if not runs:
        return ""
    shares = attribution_shares_by_engine(runs)
    alt = "per engine and c, the share of drifting requests each cause accounts for: " + "; ".join(
        f"{e} c={c}: {cause} {share:.0%}"
        for e, c, cause, share in shares.select("engine", "c", "cause", "share").rows()
    )
    parts = [
        "<h2>Why streams part</h2><p>Each request that parts from m=1 (in bits or tokens) is put on the first control, in the "
        "order run-to-run, cache state, prefill path, shared prefix, co-batching with copies, mixing with other prompts, whose "
        "own requests part from m=1 no later; what no control reproduces is unexplained.</p>"
    ]
    if shares.height:
        parts.append(f'<img alt="{escape(alt)}" src="data:image/png;base64,{png_base64(plot_attribution(shares))}">')
    parts.append(
        table_html(shares, caption="Drift per engine, c and cause.", empty="No request parts from m=1 in any arm.")
    )
    for run in runs:
        table = attribution_table(run).select(
            "prompt_id",
            "arm",
            "c",
            "repeat",
            "slot",
            "kind",
            "bitwise_prefix",
            "cause",
            "evidence_arm",
            "evidence_c",
            "evidence_slot",
            "evidence_part",
        )
        parts.append(
            worst_html(
                table,
                by=["bitwise_prefix"],
                descending=[False],
                what="requests",
                caption=f"{engine_label(run)}: each request that parts, its cause and the control that reproduces it.",
                empty="No request parts from m=1.",
            )
        )
    return "".join(parts)
