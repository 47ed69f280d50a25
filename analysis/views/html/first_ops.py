"""The report's first-op section: for an experiment run replayed with taps, the op where each
batched request's drift from m=1 starts, by layer and op (:func:`analysis.first_op_table`)."""

from __future__ import annotations

import polars as pl

from ...run import first_op_table, first_ops_record, has_first_ops
from ..plots.first_ops import kernel_mode, op_counts, plot_first_ops
from .blocks import render
from .figures import png_base64
from .tables import table_html


def first_op_html(run) -> str:
    """Where drift starts in one experiment run: a sentence, the figure and the ops that start it;
    empty for a run without ``first_ops.json`` (a probe's, or an experiment's written before taps).

    Parameters
    ----------
    run : Run
        Any run.

    Returns
    -------
    str
        Escaped HTML, the figure as an inline PNG.

    Examples
    --------
    >>> from analysis import read_run
    >>> first_op_html(read_run("data/llamacpp-cpu/cache-prompt"))
    ''
    >>> "no first op" in first_op_html(read_run("data/experiment-cpu/fixed-tiles"))
    True
    """
    if not has_first_ops(run):
        return ""
    record, table = first_ops_record(run), first_op_table(run)
    mode = kernel_mode(run, record)
    png, alt, rows = "", "", ""
    if table.is_empty():
        words = (
            f"In kernel mode {mode}, no batched decode step of this run differs from m=1 bit for bit: no first op, "
            "as a batch-invariant mode should be."
        )
    elif not record["tapped"] or table["op_index"].is_null().any():
        words = (
            f"{table.height} batched decode steps differ from m=1, but kernel mode {mode} runs kernels without taps: "
            "the op where they start is not known."
        )
    else:
        words, alt = (
            _words(table, mode),
            f"{run.label}: the first op that differs from m=1, by layer and op, in kernel mode {mode}",
        )
        png, rows = png_base64(plot_first_ops(run)), _table(record["ops"], table)
    return render("first_ops.html.j2", path=run.label, words=words, png=png, alt=alt, table=rows)


def _words(table: pl.DataFrame, mode: str) -> str:
    """The section's sentence: how many requests' drift starts where."""
    onsets = table.filter(pl.col("onset"))
    starts = onsets.group_by("op_index", "layer", "op").agg(n=pl.len()).sort("n", "op_index", descending=[True, False])
    where = ", ".join(
        f"{_place(layer, op)} for {n} request{'s' if n != 1 else ''}" for _, layer, op, n in starts.rows()
    )
    return (
        f"In kernel mode {mode}, {onsets.height} batched requests part from m=1 bit for bit. Replayed with taps on every op, "
        f"the first op whose output differs at each request's first differing step is {where}. Later steps also carry what "
        f"earlier ones changed ({table.height} differing steps in all)."
    )


def _place(layer: int | None, op: str) -> str:
    return f"layer {layer}'s {op}" if layer is not None else op


def _table(ops, table: pl.DataFrame) -> str:
    counts = op_counts(ops, table).filter(pl.col("steps") > 0)
    frame = counts.select(
        op="label", **{"requests whose drift starts there": "requests", "differing steps it starts": "steps"}
    )
    return table_html(frame, caption="The ops that start a difference, in forward order.")
