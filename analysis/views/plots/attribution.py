"""The attribution figure: per engine and c, how much of the drift each cause accounts for (runs probed with control arms)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import polars as pl

from ...run import Run
from ...studies import LADDER, UNEXPLAINED, attribution_shares, attribution_table, engine_label
from ._drawing import _empty, as_frame, drawn, width_for

_CAUSES = [name for name, _, _ in LADDER] + [UNEXPLAINED]
_COLOURS = dict(zip(_CAUSES, ["#8c8c8c", "#d62728", "#9467bd", "#ff7f0e", "#1f77b4", "#2ca02c", "#000000"]))


def attribution_shares_by_engine(runs: Iterable[Any]) -> pl.DataFrame:
    """Per run with arms (named by its engine and folder), per c and cause: the requests that part from m=1 and their share.

    Parameters
    ----------
    runs : iterable of Run
        The runs.

    Returns
    -------
    polars.DataFrame
        ``engine``, ``c``, ``cause``, ``requests``, ``share``.

    Examples
    --------
    >>> from analysis import read_run
    >>> attribution_shares_by_engine([read_run("data/experiment-cpu/default")]).height  # a run without arms is not attributed
    0
    """
    frames = [
        attribution_shares(attribution_table(run)).select(pl.lit(engine_label(run)).alias("engine"), pl.all())
        for run in runs
        if run.manifest.get("arms") is not None
    ]
    schema = {"engine": pl.String, "c": pl.Int64, "cause": pl.String, "requests": pl.Int64, "share": pl.Float64}
    return pl.concat([f.cast(schema) for f in frames]) if frames else pl.DataFrame(schema=schema)  # type: ignore[arg-type]


def plot_attribution(shares: Any, *, ax=None):
    """One bar per engine and c, split by the share of its drifting requests each cause accounts for.

    ``shares``: a run probed with control arms (``bia probe --arms``), several such runs, or the rows of
    :func:`attribution_shares_by_engine` (engine, c, cause, share). A run without arms is not attributed.

    Parameters
    ----------
    shares : Run, iterable of Run, or DataFrame
        See above.
    ax : matplotlib.axes.Axes, optional
        The axes to draw on; by default a new figure's.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> from analysis import read_run
    >>> ax = plot_attribution(read_run("data/experiment-cpu/default"))
    >>> ax.bia_empty
    'No run was probed with control arms (bia probe --arms): nothing to attribute.'
    """
    import matplotlib.pyplot as plt

    if isinstance(shares, Run) or (
        as_frame(shares) is None and isinstance(shares, Iterable) and not isinstance(shares, (str, bytes))
    ):
        shares = attribution_shares_by_engine([shares] if isinstance(shares, Run) else shares)
    shares = drawn(
        shares,
        "plot_attribution",
        run=lambda run: attribution_shares_by_engine([run]),
        frame="attribution_shares_by_engine(runs)",
    )
    c = "c"
    if ax is None:
        bars = max(1, shares.select("engine", c).n_unique())  # as wide as its bars need, never the page for one
        _, ax = plt.subplots(figsize=(width_for(bars, each=0.5, frame=4.5, least=5.5, most=9.0), 1.2 + 0.45 * bars))
    if shares.is_empty():
        return _empty(ax, "No run was probed with control arms (bia probe --arms): nothing to attribute.")
    bars = shares.select("engine", c).unique(maintain_order=True).sort("engine", c)
    labels = [f"{engine}  c={n}" for engine, n in bars.rows()]
    left = [0.0] * len(labels)
    for cause in _CAUSES:
        part = (
            bars.join(shares.filter(cause=cause), on=["engine", c], how="left", maintain_order="left")["share"]
            .fill_null(0.0)
            .to_list()
        )
        if any(part):
            ax.barh(labels, part, left=left, color=_COLOURS[cause], label=cause)
            left = [a + b for a, b in zip(left, part)]
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of the requests that part from m=1")
    ax.set_title("Why streams part: the first control arm that reproduces each divergence", wrap=True)
    ax.legend(loc="lower right", fontsize="small")
    return ax
