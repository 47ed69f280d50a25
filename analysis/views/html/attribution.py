"""The report's "why streams part" section: per engine and c, how much of the drift each cause accounts for.

Only runs probed with control arms (``bia probe --arms``) are attributed; a report without such a run
has no section. The figure is embedded as a base64 PNG, so the page stays self-contained.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from html import escape
from io import BytesIO
from typing import Any

import polars as pl

from ..studies._attribution import LADDER, UNEXPLAINED, attribution_shares, attribution_table
from ..studies._modes import _engine_label
from ..views._details import table_html, worst_html

_CAUSES = [name for name, _, _ in LADDER] + [UNEXPLAINED]
_COLOURS = dict(zip(_CAUSES, ["#8c8c8c", "#d62728", "#9467bd", "#ff7f0e", "#1f77b4", "#2ca02c", "#000000"]))


def attribution_shares_by_engine(runs: Iterable[Any]) -> pl.DataFrame:
    """Per run with arms (named by its engine and folder), per c and cause: the requests that part from m=1 and their share.

    Examples
    --------
    >>> from analysis import read_run
    >>> attribution_shares_by_engine([read_run("data/experiment-cpu/default")]).height  # a run without arms is not attributed
    0
    """
    frames = [attribution_shares(attribution_table(run)).select(pl.lit(_engine_label(run)).alias("engine"), pl.all())
              for run in runs if run.manifest.get("arms") is not None]
    schema = {"engine": pl.String, "band_c": pl.Int64, "cause": pl.String, "requests": pl.Int64, "share": pl.Float64}
    return pl.concat([f.cast(schema) for f in frames]) if frames else pl.DataFrame(schema=schema)  # type: ignore[arg-type]


def plot_attribution(shares: pl.DataFrame, *, ax=None):
    """One bar per engine and c, split by the share of its drifting requests each cause accounts for.

    ``shares``: rows of :func:`attribution_shares_by_engine` (engine, band_c, cause, share).
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * max(1, shares.select("engine", "band_c").n_unique())))
    bars = shares.select("engine", "band_c").unique(maintain_order=True).sort("engine", "band_c")
    labels = [f"{engine}  c={c}" for engine, c in bars.rows()]
    left = [0.0] * len(labels)
    for cause in _CAUSES:
        part = bars.join(shares.filter(cause=cause), on=["engine", "band_c"], how="left", maintain_order="left")["share"].fill_null(0.0).to_list()
        if any(part):
            ax.barh(labels, part, left=left, color=_COLOURS[cause], label=cause)
            left = [a + b for a, b in zip(left, part)]
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of the requests that part from m=1")
    ax.set_title("Why streams part: the first control arm that reproduces each divergence")
    ax.legend(loc="lower right", fontsize="small")
    return ax


def _png(ax) -> str:
    import matplotlib.pyplot as plt

    buffer = BytesIO()
    ax.figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(ax.figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def attribution_html(runs: Iterable[Any]) -> str:
    """The section: its heading and words, the figure, the shares per engine and c, and each run's requests
    that part with their cause and evidence (worst first). Empty when no run was probed with arms.

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
        f"{e} c={c}: {cause} {share:.0%}" for e, c, cause, share in shares.select("engine", "band_c", "cause", "share").rows())
    parts = ["<h2>Why streams part</h2><p>Each request that parts from m=1 (in bits or tokens) is put on the first control, in the "
             "order run-to-run, cache state, prefill path, shared prefix, co-batching with copies, mixing with other prompts, whose "
             "own requests part from m=1 no later; what no control reproduces is unexplained.</p>"]
    if shares.height:
        parts.append(f'<img alt="{escape(alt)}" src="data:image/png;base64,{_png(plot_attribution(shares))}">')
    parts.append(table_html(shares, caption="Drift per engine, c and cause.", empty="No request parts from m=1 in any arm."))
    for run in runs:
        table = attribution_table(run).select("prompt_id", "arm", "band_c", "repeat", "slot", "kind", "bitwise_prefix", "cause",
                                              "evidence_arm", "evidence_band_c", "evidence_slot", "evidence_part")
        parts.append(worst_html(table, by=["bitwise_prefix"], descending=[False], what="requests",
                                caption=f"{_engine_label(run)}: each request that parts, its cause and the control that reproduces it.",
                                empty="No request parts from m=1."))
    return "".join(parts)
