"""The first-op figure: for an experiment run replayed with taps, the op where each batched request's drift from m=1
starts, by layer and op (:func:`analysis.first_op_table`)."""

from __future__ import annotations

from typing import Any

import polars as pl

from ...core import kernel_mode_words
from ...run import first_op_table, first_ops_record


def _label(layer: int | None, op: str) -> str:
    """An op as the figure names it: ``L1 mlp_down``, or the op alone outside the layers.

    Examples
    --------
    >>> _label(1, "mlp_down"), _label(None, "logits")
    ('L1 mlp_down', 'logits')
    """
    return op if layer is None else f"L{layer} {op}"


def plot_first_ops(run, *, ax=None):
    """Per op in forward order, the requests whose drift from m=1 starts there (dark) and the
    differing steps whose first differing op it is (light), for one experiment run.

    Parameters
    ----------
    run : Run
        An experiment run with its ``first_ops.json``.
    ax : matplotlib Axes, optional
        Where to draw; a new figure otherwise.

    Returns
    -------
    matplotlib Axes
        One bar pair per tapped op, the embedding at the top and ``logprobs`` at the bottom; when no
        step differs, an empty panel saying so (``ax.bia_empty``).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> from analysis import read_run
    >>> ax = plot_first_ops(read_run("data/experiment-cpu/default"))
    >>> [t.get_text() for t in ax.get_yticklabels()][:3]
    ['embedding', 'L0 ln1', 'L0 qkv']
    """
    import matplotlib.pyplot as plt

    record, table = first_ops_record(run), first_op_table(run)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 1 + 0.22 * len(record["ops"])))
    if table.filter(pl.col("op_index").is_not_null()).is_empty():
        message = (
            "no batched step differs from m=1 bit for bit"
            if table.is_empty()
            else "this kernel mode's ops have no taps"
        )
        ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        ax.bia_empty = message
        return ax
    counts = op_counts(record["ops"], table)
    requests, steps = table["onset"].sum(), table.height
    y = list(range(counts.height))
    # shares, so that the requests' few onsets and the many steps after them read on one axis
    ax.barh(
        [i - 0.2 for i in y],
        counts["requests"] / requests,
        height=0.4,
        color="#08519c",
        label=f"share of the {requests} drifting requests whose drift starts there",
    )
    ax.barh(
        [i + 0.2 for i in y],
        counts["steps"] / steps,
        height=0.4,
        color="#9ecae1",
        label=f"share of the {steps} differing steps whose first differing op it is",
    )
    for i, (n, k) in enumerate(counts.select("requests", "steps").rows()):
        if n or k:
            ax.annotate(
                f"{n} requests, {k} steps",
                (max(n / requests, k / steps), i),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize="small",
            )
    ax.set_yticks(y, counts["label"].to_list())
    ax.set_ylim(counts.height - 0.5, -0.5)  # forward order reads down
    ax.set_xlim(0, 1.35)
    ax.set_xlabel("share")
    ax.set_title(f"kernel mode {kernel_mode(run, record)}: the first op whose output differs from m=1")
    ax.legend(loc="lower right", fontsize="small")
    return ax


def op_counts(ops: list[tuple[int | None, str]], table: pl.DataFrame) -> pl.DataFrame:
    """Every op in forward order with its label, the requests whose first differing step it starts, and the steps it starts.

    Parameters
    ----------
    ops : list of tuple of (int or None, str)
        Every tapped op as (layer, op), in forward order.
    table : polars.DataFrame
        The differing steps: ``op_index`` and ``onset`` (the request's first differing step).

    Returns
    -------
    polars.DataFrame
        ``op_index``, ``label``, ``steps``, ``requests``.
    """
    order = pl.DataFrame(
        {"op_index": list(range(len(ops))), "label": [_label(layer, op) for layer, op in ops]},
        schema={"op_index": pl.Int64, "label": pl.String},
    )
    found = table.group_by("op_index").agg(steps=pl.len().cast(pl.Int64), requests=pl.col("onset").sum().cast(pl.Int64))
    return (
        order.join(found, on="op_index", how="left")
        .with_columns(pl.col("steps", "requests").fill_null(0))
        .sort("op_index")
    )


def kernel_mode(run, record: dict[str, Any]) -> str:
    """The run's kernel mode as asked, with the mode that ran when they differ (its manifest's; else what first_ops.json names).

    Parameters
    ----------
    run : Run
        The run.
    record : dict
        Its ``first_ops.json``, parsed.

    Returns
    -------
    str
    """
    return kernel_mode_words(run.manifest) or record["kernel_mode"] or "unknown"
