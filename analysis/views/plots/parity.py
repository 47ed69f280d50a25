"""The parity figures of where streams part: where batched requests part from m=1 (a run's requests or a witness's
bands), how many answers one prompt got, and the fork itself. The margins there are in
:mod:`analysis.views.plots.margins`, the drift before the fork in :mod:`analysis.views.plots.drift`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import polars as pl

from ...run import Run, band_table, slot_table
from ...studies import BATCHED_ARMS, STATE_COLUMNS, History, Judgement, judge, part_counts, request_states
from ...witness import WitnessSet
from ._drawing import (
    _axes,
    _empty,
    _fill,
    _label_points,
    _legend,
    _set_c_axis,
    as_frame,
    drawn,
)
from .witness import witness_label

_RESULT_MARKERS = {"PASS": "o", "FAIL": "X", "UNMEASURABLE": "s"}


def plot_divergence(
    parity: Any, *, witnesses: Any = None, declared_min: int | None = None, judgement: Any = None, ax=None
):
    """Where batched requests part from the m=1 reference, against c, on an axis from 0; when nothing parted the plot says so.

    Given a run (or its :func:`analysis.slot_table`): each batched request (c > 1) where it parts from ref #1, in its tokens
    (o) or only in its logprob bits (D), or at its length when it never parts, one series per state whatever the number of
    prompts, the earliest partings named. Requests of one state at the same c and position are one mark (the legend counts
    the requests), so that a figure of half a million requests draws hundreds of marks, not half a million on top of each
    other. The title and the sentence on the plot restate :func:`analysis.judge`'s row of
    the run: its verdict, and how many batched requests part in tokens and in bits.

    Given a witness set (or its bands): divergence_at per witness, its marker the band's recorded result (o PASS, X FAIL,
    s UNMEASURABLE), declared_min marked. A point that one drawn before it would hide (the same c and divergence_at) is nudged
    right of it and its line dashed; a witness whose every point repeats an earlier one's says whose in the legend. Given the
    ``witnesses`` frame (a WitnessSet brings its own), a band whose divergence_at reaches its reference's length never parted.

    Parameters
    ----------
    parity : Run, WitnessSet or DataFrame
        A run, a witness set, or the frame of one (polars or pandas): a frame with ``diverged`` is drawn as a run's requests,
        any other as witness bands. The concurrency column is ``c``.
    witnesses : DataFrame, optional
        The witnesses of the bands, for their reference lengths.
    declared_min : int, optional
        A run's line at this many tokens; given a run, the run's own ``declared_min`` when not given.
    judgement : Judgement, optional
        The run's judgement, whose row the figure restates; given a run, ``analysis.judge(run)`` when not given. A frame
        drawn without one states its own requests' counts, decided as the judgement decides them.
    ax : matplotlib Axes, optional
        Where to draw; a new figure otherwise.

    Returns
    -------
    matplotlib Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_divergence(analysis.read_run("data/experiment-cpu/default"))  # assigned: a cell ends without the Axes' repr
    >>> [t.get_text() for t in ax.get_legend().get_texts()]  # in bits they part, in tokens none does
    ['tokens agree, bits part (56)', 'declared_min = 64']
    >>> ax.get_title()
    'Where batched requests part from m=1:\\nRED (co-batching)'
    >>> ax = plot_divergence(analysis.read_witnesses("data/aprender-lambda", progress=False))
    >>> len(ax.get_lines()) >= 3
    True
    """
    ax = _axes(ax)
    if isinstance(parity, History):
        raise TypeError(
            "plot_divergence draws a Run, a WitnessSet or their frames; a History's earliest divergence over time is "
            "plot_trend(history, key, 'earliest_divergence')"
        )
    if isinstance(parity, WitnessSet) and witnesses is None:
        witnesses = parity.to_backend("polars").witnesses
    rows = None
    if isinstance(parity, Run):
        declared_min = parity.declared_min if declared_min is None else declared_min
        judgement = judge(parity) if judgement is None else judgement
    if judgement is not None:
        rows = _rows(judgement, parity)
    frame = drawn(
        parity,
        "plot_divergence",
        run=slot_table,
        witnesses=_bands,
        frame="analysis.slot_table(run) or WitnessSet.bands",
        lazy=True,
    )
    if "diverged" in frame.collect_schema().names():  # a run's requests; witness bands have no per-request column
        return _requests_parting(frame, declared_min, ax, rows)
    return _witnesses_parting(frame.lazy().collect(), witnesses, ax)


def _rows(judgement: Any, parity: Any) -> list[dict]:
    """The judgement's rows of this run (a Judgement of several runs, or one row as a dict, alike)."""
    if isinstance(judgement, dict):
        return [judgement]
    frame = judgement.frame if isinstance(judgement, Judgement) else cast(pl.DataFrame, as_frame(judgement))
    if isinstance(parity, Run) and frame["run"].n_unique() > 1:
        frame = frame.filter(pl.col("run") == parity.label)
    return frame.to_dicts()


def _bands(ws: WitnessSet) -> pl.DataFrame:
    return ws.to_backend("polars").bands


_STATE_MARKS = {  # each batched request's state (analysis.judge's), how it is drawn and named in the legend
    "tokens": ("o", "tab:red", "parted in tokens"),
    "bits": ("D", "tab:orange", "tokens agree, bits part"),
    "bits unknown": ("s", "tab:gray", "tokens agree, bits unknown (drawn at their length)"),
    "identical": ("^", "tab:blue", "identical to m=1, bit for bit (drawn at their length)"),
}


def _requests_parting(slots: pl.DataFrame | pl.LazyFrame, declared_min: int | None, ax, rows: list[dict] | None = None):
    """A run's figure: each batched request (c > 1) where it parts from ref #1 in tokens (o) or only in its logprob bits
    (D), or at its length when it never parts; the counts and the verdict are ``rows``' (``analysis.judge``'s) when given.
    What is drawn is read as aggregates (a mark per state, c and position; each prompt's earliest parting), a morsel at a
    time from a scan: the figure holds its marks and not its requests."""
    c = "c"
    batched = _batched(slots, rows)
    # where each request parts, or its length (the shorter of it and the reference's) when it never does
    agreed = pl.coalesce("position", pl.min_horizontal("reference_length", "length"), "divergence_at")
    marks = batched.group_by("state", c, agreed=agreed).agg(requests=pl.len()).collect(engine="streaming")
    if marks.is_empty():
        return _empty(ax, "No batched requests (c > 1) in the run.")
    counts = _counts(batched, rows)
    for state, (marker, colour, words) in _STATE_MARKS.items():
        drawn_ = marks.filter(pl.col("state") == state).sort(c, "agreed", nulls_last=True)
        if drawn_.height:
            # one opaque mark a place: nothing of its own state is drawn over it, so it needs no transparency to show
            label = f"{words} ({drawn_['requests'].sum()})"
            ax.plot(drawn_[c], drawn_["agreed"], marker, color=colour, markersize=7, label=label)
    order = ["agreed", c, "order"]  # the earliest, then the lowest c, then the table's order
    earliest = (
        batched.filter(pl.col("state").is_in(["tokens", "bits"]))
        .select("prompt_id", "slot", c, agreed=agreed)
        .with_row_index("order")
        .group_by("prompt_id")
        .agg(pl.col(c, "agreed", "slot", "order").sort_by(order).first())
        .sort(order)
        .collect(engine="streaming")
    )
    _label_points(
        ax, [(c, at, f"{p} slot {s}") for p, c, at, s in earliest.select("prompt_id", c, "agreed", "slot").rows()]
    )
    if declared_min is not None:
        ax.axhline(declared_min, color="black", linestyle="--", linewidth=1, label=f"declared_min = {declared_min}")
    _set_c_axis(ax, marks[c].unique().to_list())
    top = max(cast("int | None", marks["agreed"].max()) or 0, declared_min or 0, 1)  # an integer column
    ax.set_ylim(0, top * 1.6)  # room above the points for the sentence
    ax.text(0.5, 0.97, _fill(ax, parting_words(counts, rows)), ha="center", va="top", transform=ax.transAxes)
    ax.set_ylabel("tokens agreeing with m=1\n(0-based position of the part)")
    ax.set_title(_verdict_title(rows))
    _legend(ax, loc="lower right")
    return ax


# What the run's figure reads of each request: its place, and what request_states decides its state from.
DRAWN_COLUMNS = (
    "prompt_id",
    "arm",
    "c",
    "repeat",
    "slot",
    "diverged",
    "divergence_at",
    *STATE_COLUMNS,
)


def _batched(slots: pl.DataFrame | pl.LazyFrame, rows: list[dict] | None) -> pl.LazyFrame:
    """The batched requests (c > 1, of the judged arms) with the state ``analysis.judge`` gives each, as a query; a frame
    without the slot table's evidence columns counts a request that did not part in tokens as bits unknown (never
    greener)."""
    arms = sorted({r["arm"] for r in rows}) if rows else list(BATCHED_ARMS)
    names = slots.collect_schema().names()
    chosen = slots.lazy().select(name for name in names if name in DRAWN_COLUMNS)  # not a copy of every column
    if "arm" in names:
        chosen = chosen.filter(pl.col("arm").is_in(arms))
    chosen = chosen.filter(pl.col("c") > 1)
    if {"has_reference", "parted_at", "bits_differ_at", "bits_known"} <= set(names):
        return request_states(chosen)
    tokens = pl.col("diverged").fill_null(False)
    return chosen.with_columns(
        state=pl.when(tokens).then(pl.lit("tokens")).otherwise(pl.lit("bits unknown")),
        tokens_parted=tokens,
        bits_parted=pl.lit(False),
        bits_unknown=~tokens,
        position=pl.when(tokens).then("divergence_at"),
    )


def _counts(batched: pl.LazyFrame, rows: list[dict] | None) -> dict[str, int]:
    """The judgement rows' counts (summed over the run's arms), else those of the states drawn."""
    if not rows:
        return part_counts(batched)
    keys = ("requests", "divergent", "tokens_parted", "bits_only", "bits_unknown", "alone", "alone_parted")
    return {k: sum(int(r[k] or 0) for r in rows) for k in keys}


def parting_words(counts: dict[str, int], rows: list[dict] | None = None) -> str:
    """The sentence a divergence figure says of a run's batched requests: the counts of its judgement row, tokens and bits
    both named (a run whose tokens agree and whose bits part says so, in those words).

    Parameters
    ----------
    counts : dict of str to int
        ``requests``, ``divergent``, ``tokens_parted``, ``bits_only`` and ``bits_unknown`` (:func:`analysis.judge`'s row, or
        ``analysis.studies.part_counts``), with ``alone`` and ``alone_parted`` when known.
    rows : list of dict, optional
        The judgement rows, for the cause when the server differs from itself alone.

    Returns
    -------
    str

    Examples
    --------
    >>> print(parting_words({"requests": 56, "divergent": 56, "tokens_parted": 0, "bits_only": 56, "bits_unknown": 0}))
    Tokens agree in all 56 batched requests (c > 1),
    but bits part: 56 of 56 differ from m=1 in their logprob bits.
    """
    n, tokens, bits, unknown = (counts[k] for k in ("requests", "tokens_parted", "bits_only", "bits_unknown"))
    if tokens:
        lines = [
            f"{tokens + bits} of {n} batched requests (c > 1) part from m=1:",
            f"{tokens} in tokens, {bits} only in bits.",
        ]
    elif bits:
        lines = [
            f"Tokens agree in all {n} batched requests (c > 1),",
            f"but bits part: {bits} of {n} differ from m=1 in their logprob bits.",
        ]
    elif unknown:
        lines = [
            f"No batched request (c > 1) parts in tokens; {unknown} of {n}",
            "have bits unknown: not shown identical.",
        ]
    else:
        lines = [f"Nothing parted: all {n} batched requests (c > 1)", "match m=1 bit for bit, to their end."]
    if counts.get("alone_parted"):
        cause = next((r["cause"] for r in rows or [] if r.get("cause")), "run-to-run")
        lines.append(
            f"Alone, {counts['alone_parted']} of {counts['alone']} part too ({cause}): batching is not judged."
        )
    return "\n".join(lines)


def _verdict_title(rows: list[dict] | None) -> str:
    """The figure's title: what it draws, and the verdict of the rows it restates."""
    title = "Where batched requests part from m=1"
    if not rows:
        return title
    words = []
    for r in rows:
        cause = f" ({r['cause']})" if r.get("cause") else ""
        arm = f" [{r['arm']}]" if len(rows) > 1 else ""
        words.append(f"{r['verdict']}{cause}{arm}")
    return f"{title}:\n{'; '.join(words)}"


def _witnesses_parting(bands: pl.DataFrame, witnesses: Any, ax):
    """A witness set's figure: divergence_at against c, one line per witness, each band's result as its marker."""
    c = "c"
    measured = bands.filter(pl.col("divergence_at").is_not_null())
    if measured.is_empty():
        return _empty(ax, "No band recorded a divergence_at.")
    series: dict[tuple, str] = {}  # each witness's points, for the legend of one that repeats them
    drawn: dict[tuple, int] = {}  # how many witnesses drew each (c, divergence_at) so far
    for (source, version), group in measured.sort(c).group_by(["source", "witness_version"], maintain_order=True):
        label, points = witness_label(source, version), tuple(group.select(c, "divergence_at").rows())
        nudges = [
            2 ** (0.08 * drawn.get(point, 0)) for point in points
        ]  # on the log2 c axis: beside the point it would hide
        for point in points:
            drawn[point] = drawn.get(point, 0) + 1
        if points in series:
            label += f" (= {series[points]}, nudged right)"
        series.setdefault(points, witness_label(source, version))
        group = group.with_columns(x=pl.col(c) * pl.Series(nudges))
        line = ax.plot(group["x"], group["divergence_at"], "--" if max(nudges) > 1 else "-", alpha=0.7, label=label)[0]
        for result, marker in _RESULT_MARKERS.items():
            part = group.filter(pl.col("result") == result)
            if part.height:
                ax.plot(
                    part["x"], part["divergence_at"], marker, color=line.get_color(), markersize=8, linestyle="none"
                )
    declared_mins = sorted(set(measured["declared_min"].drop_nulls().to_list()))
    for declared in declared_mins:
        ax.axhline(declared, color="black", linestyle="--", linewidth=1, label=f"declared_min = {declared}")
    _set_c_axis(ax, measured[c].to_list())
    # from 0, so that where the bands sit shows against the whole stream (not 60.5 to 67.5 around declared_min = 64)
    ax.set_ylim(0, max([*measured["divergence_at"].to_list(), *declared_mins, 1]) * 1.25)
    lengths = _never_parted_lengths(measured, witnesses)
    if lengths:
        ax.text(
            0.5,
            0.4,
            f"Nothing parted: in every band ({measured.height}), slot 0 agrees\nwith the m=1 reference to its end "
            f"({', '.join(map(str, lengths))} tokens).",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    ax.set_ylabel("divergence_at (tokens agreeing with m=1)")
    ax.set_title("Where each batch size parts from the m=1 reference")
    _legend(ax)
    return ax


def _never_parted_lengths(measured: pl.DataFrame, witnesses: Any) -> list[int]:
    """The reference lengths when every measured band's divergence_at reaches its witness's (none parted), else []."""
    if witnesses is None:
        return []
    tokens = cast(pl.DataFrame, as_frame(witnesses)).select("source", "reference_tokens").unique("source")  # a frame
    joined = measured.join(tokens, on="source", how="left")
    if joined["reference_tokens"].null_count() or (joined["divergence_at"] < joined["reference_tokens"]).any():
        return []
    return sorted(set(joined["reference_tokens"].to_list()))


def plot_unique_completions(bands: Any, *, ax=None):
    """Unique completions per band against c: every band a dot, the most in any band per c a line, the bands
    with the most named.

    ``bands``: a run, or its :func:`analysis.band_table`.

    Parameters
    ----------
    bands : Run or DataFrame
        See above.
    ax : matplotlib.axes.Axes, optional
        The axes to draw on; by default a new figure's.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import analysis
    >>> ax = plot_unique_completions(analysis.read_run("data/experiment-cpu/default"))
    >>> [int(n) for n in ax.get_lines()[1].get_ydata()]  # the most in one band, per c
    [1, 1, 1, 1]
    """
    ax = _axes(ax)
    bands = drawn(bands, "plot_unique_completions", run=band_table)
    if bands.is_empty():
        return _empty(ax, "No bands in the run.")
    c = "c"
    bands = bands.sort(c)
    ax.plot(bands[c], bands["unique_completions"], "o", alpha=0.5, color="tab:blue", label=f"one band ({bands.height})")
    most = bands.group_by(c, maintain_order=True).agg(pl.col("unique_completions").max())
    ax.plot(most[c], most["unique_completions"], "-", color="black", linewidth=1, label="the most in one band")
    spread = bands.filter(pl.col("unique_completions") > 1).sort("unique_completions", descending=True)
    _label_points(ax, [(x, n, str(p)) for p, x, n in spread.select("prompt_id", c, "unique_completions").rows()])
    _set_c_axis(ax, bands[c].to_list())
    ax.set_ylim(bottom=0)
    ax.set_ylabel("unique completions in the band")
    ax.set_title("How many different answers one prompt got")
    _legend(ax)
    return ax


def plot_fork_tree(branches: Sequence[tuple[str, int]], *, at: int, ax=None):
    """The fork: each token taken at position ``at`` and how many streams took it (as text).

    Parameters
    ----------
    branches : sequence of tuple of (str, int)
        Each token taken and how many streams took it, as :func:`analysis.parity.fork_table` gives them.
    at : int
        The position of the fork.
    ax : matplotlib.axes.Axes, optional
        The axes to draw on; by default a new figure's.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> ax = plot_fork_tree([(" yes", 3), (" no", 1)], at=7)
    >>> [t.get_text() for t in ax.texts]
    ['step 7', "' yes': 3 of 4", "' no': 1 of 4"]
    """
    ax = _axes(ax)
    if not branches:
        return _empty(ax, "The streams never part.")
    total = sum(n for _, n in branches)
    ax.text(0.02, 0.5, f"step {at}", va="center", fontsize="large")
    for k, (token, n) in enumerate(branches):
        y = 1 - (k + 1) / (len(branches) + 1)
        ax.annotate(
            f"{token!r}: {n} of {total}", xy=(0.2, 0.5), xytext=(0.35, y), va="center", arrowprops={"arrowstyle": "<-"}
        )
    ax.set_axis_off()
    ax.set_title("The fork")
    return ax
