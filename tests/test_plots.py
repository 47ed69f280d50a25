"""Plot functions: Agg backend, assertions on the artists, figures closed after each test (conftest)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import polars as pl
import pytest
from test_run import make_run

import analysis
from analysis import plots, read_witnesses
from analysis.parity import flip_curve, step_margins
from analysis.run import band_table, drift_table, flip_table, read_run, reference_margins, slot_table, width_table
from conftest import LAMBDA, ROOT


def test_witness_plots():
    ws = read_witnesses(LAMBDA)
    ax = plots.plot_divergence(ws.bands)
    assert ax.get_ylabel().startswith("divergence_at") and any("declared_min = 64" in t.get_text() for t in ax.get_legend().get_texts())
    ax = plots.plot_decode_rate(ws.bands)
    assert "No decode rates recorded" in ax.texts[0].get_text()
    ax = plots.plot_env_knobs(ws.witnesses)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["BATCHED_PREFILL"]


def test_run_plots(tmp_path):
    run = read_run(make_run(tmp_path))
    slots, bands = slot_table(run), band_table(run)
    fig, axes = plt.subplots(2, 4)
    ax = plots.plot_divergence(slots, declared_min=3, ax=axes[0, 0])
    assert ax is axes[0, 0]
    marks = {line.get_marker(): list(line.get_ydata()) for line in ax.get_lines() if line.get_marker() in ("o", "^")}
    assert marks == {"o": [2]}  # the c=1 request is not batched: not drawn (issue 44); four requests at one place, one mark
    assert [t.get_text() for t in ax.get_legend().get_texts()][0] == "parted in tokens (4)"  # the legend counts requests
    ax = plots.plot_margin_at_divergence(slots, epsilon=0.05, ax=axes[0, 1])
    parted = slots.filter(pl.col("diverged") & pl.col("reference_margin").is_not_null())
    drawn = sorted(zip(ax.get_lines()[0].get_xdata(), ax.get_lines()[0].get_ydata()))
    assert parted.height == 4 and drawn == sorted(set(parted.select("c", "reference_margin").rows()))  # one mark a place
    ref = next(s for k, s in run.streams().items() if k[1] == 1)
    ax = plots.plot_margin_trace(step_margins(ref), [2], ax=axes[0, 2])
    assert len(ax.get_lines()) == 3  # the trace, epsilon, one divergence line
    deltas = pl.DataFrame({"label": ["s0"] * 2, "step": [0, 1], "abs_delta": [0.0, 1e-7]})
    assert len(plots.plot_delta_before_fork(deltas, ax=axes[0, 3]).get_lines()) == 1
    others = [s for k, s in run.streams().items() if k[1] > 3]
    ax = plots.plot_flip_curve(flip_curve([(ref, o) for o in others]), ax=axes[1, 0])
    assert len(ax.patches) >= 1 and max(p.get_height() for p in ax.patches) == 1.0
    ax = plots.plot_unique_completions(bands, ax=axes[1, 1])
    assert list(ax.get_lines()[0].get_ydata()) == [1, 1]
    ax = plots.plot_fork_tree([("<script>x</script>", 3), (" a", 1)], at=2, ax=axes[1, 2])
    assert any("'<script>x</script>': 3 of 4" == t.get_text() for t in ax.texts)


def test_empty_inputs_say_so():
    empty = pl.DataFrame(schema={"prompt_id": pl.String, "c": pl.Int64, "diverged": pl.Boolean, "divergence_at": pl.Int64, "length": pl.Int64, "reference_length": pl.Int64,
                                 "reference_margin": pl.Float64, "unique_completions": pl.Int64})
    assert "No batched requests" in plots.plot_divergence(empty).texts[0].get_text()
    assert "never part" in plots.plot_fork_tree([], at=0).texts[0].get_text()
    assert "no step with two candidates" in plots.plot_margin_trace([None, None]).texts[0].get_text()


def test_band_widths_and_margin_traces_per_prompt(tmp_path):
    from analysis.run import width_table

    run = read_run(make_run(tmp_path, widths4=(4, 4, 3)))
    widths = width_table(run)
    assert widths.select("c", "width", "steps").rows() == [(1, 1, 2), (4, 4, 2), (4, 3, 1)]
    ax = plots.plot_band_widths(widths)
    (dots,) = ax.collections
    assert [list(p) for p in dots.get_offsets()] == [[1, 1], [4, 4], [4, 3]]
    assert list(dots.get_sizes()) == pytest.approx([20 + 400 * 1.0, 20 + 400 * 2 / 3, 20 + 400 * 1 / 3])  # area follows the share of steps
    assert list(ax.get_lines()[0].get_ydata()) == [1, 4]  # the m = c line
    assert "no batch widths" in plots.plot_band_widths(widths.clear()).texts[0].get_text()
    ax = plots.plot_margin_trace({"p0": [0.5, 0.01, None, 0.2], "p1": [0.3, 0.3]}, {"p0": [1], "p1": []})
    traces = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    assert [t.get_label() for t in traces] == ["p0: reference top-1 minus top-2", "p1: reference top-1 minus top-2"]
    assert list(traces[0].get_xdata()) == [0, 1, 3]  # a step without two candidates is left out
    parted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert len(parted) == 1 and parted[0].get_color() == traces[0].get_color()


# --- issue 22, item 8: series that would hide each other, a run where nothing parted, margins from 0 -----------------


def _drawn(ax) -> list[tuple[str, tuple]]:
    """Each labelled line's legend label and the points it puts on the axes."""
    return [(line.get_label(), tuple(zip(line.get_xdata(), line.get_ydata()))) for line in ax.get_lines() if not line.get_label().startswith("_")]


def _save(ax, name, tmp_path):
    """Saved as a PNG, as the report does, so the layout (legend placement, tight bbox) is exercised too."""
    ax.figure.savefig(tmp_path / f"{name}.png", dpi=60, bbox_inches="tight")


def test_witnesses_with_the_same_points_are_drawn_beside_each_other(tmp_path):
    bands = read_witnesses(LAMBDA).bands  # witness-v3.0-rule.json (v1) and witness@464c168e62.json (v2) part at the same steps
    ax = plots.plot_divergence(bands)
    _save(ax, "divergence", tmp_path)
    lines = {label: points for label, points in _drawn(ax) if "declared_min" not in label}
    assert len(lines) == 3 and len({points for points in lines.values()}) == 3  # no line lies on another
    (twin,) = [label for label in lines if label.startswith("witness@464c168e62.json")]
    assert "= witness-v3.0-rule.json (v1)" in twin
    markers = [tuple(zip(line.get_xdata(), line.get_ydata())) for line in ax.get_lines() if line.get_marker() in ("o", "X", "s")]
    points = [p for group in markers for p in group]
    assert len(points) == len(set(points)) == 12  # every band's result marker where no other covers it
    assert ax.get_legend() is not None and [t.get_text().replace("\n", " ") for t in ax.get_legend().get_texts()][2] == twin  # wrapped to fit


def test_identical_series_are_merged_into_one_named_line(tmp_path):
    deltas = pl.DataFrame({"label": [f"p{k} c={c} slot {s}" for c in (4, 8) for k in range(3) for s in range(2) for _ in range(2)],
                           "c": [c for c in (4, 8) for _ in range(12)], "step": [0, 1] * 12,
                           "abs_delta": [1e-6, 1e-5] * 12})  # c=4 and c=8 drift alike, step for step
    ax = plots.plot_delta_before_fork(deltas)
    _save(ax, "drift", tmp_path)
    assert [label for label, _ in _drawn(ax)] == ["c=4, 8 identical (largest of 6, 6)"]
    ax = plots.plot_margin_trace({"p0": [0.5, 0.01], "p1": [0.5, 0.01], "p2": [0.2, 0.3]}, {"p0": [1], "p1": [], "p2": []})
    traces = [label for label, _ in _drawn(ax) if "reference top-1" in label]
    assert traces == ["p0 = p1 (2 identical series): reference top-1 minus top-2", "p2: reference top-1 minus top-2"]
    rates = pl.DataFrame({"source": ["a.json"] * 2 + ["b.json"] * 2, "witness_version": [3] * 4, "c": [1, 4] * 2,
                          "decode_tok_s": [100.0, 60.0] * 2})
    ax = plots.plot_decode_rate(rates)
    assert [label for label, _ in _drawn(ax)][0] == "a.json (v3) = b.json (v3) (2 identical series)"
    assert len({points for _, points in _drawn(ax)}) == len(_drawn(ax))


def _slots(agree_to, diverged):
    """Requests agreeing with the reference for ``agree_to`` tokens: parting there when ``diverged``, else that long."""
    n = len(agree_to)
    return pl.DataFrame({"prompt_id": ["p0"] * n, "c": [4] * n, "slot": list(range(n)), "diverged": diverged,
                         "divergence_at": [a if d else None for a, d in zip(agree_to, diverged)], "length": agree_to, "reference_length": agree_to})


def test_a_run_where_nothing_parted_says_so_on_a_full_axis(tmp_path):
    ax = plots.plot_divergence(_slots([64] * 4, [False] * 4), declared_min=64)
    _save(ax, "nothing-parted", tmp_path)
    bottom, top = ax.get_ylim()
    assert bottom == 0 and top > 64 * 1.1  # the axis shows where 64 sits, not 63 to 67
    # a frame without the slot table's bits columns: the tokens agree, the bits are not known (issue 44: never greener)
    assert any(t.get_text().startswith("No batched request (c > 1) parts in tokens; 4 of 4") for t in ax.texts)
    assert [label for label, _ in _drawn(ax)] == ["tokens agree, bits unknown (drawn at their length) (4)", "declared_min = 64"]
    ax = plots.plot_divergence(_slots([64, 3], [False, True]), declared_min=64)
    assert not any(t.get_text().startswith(("Nothing parted", "No batched")) for t in ax.texts)
    identical = read_run(ROOT / "data" / "experiment-cpu" / "fixed-tiles")
    ax = plots.plot_divergence(identical)
    assert any(t.get_text().startswith("Nothing parted: all 56 batched requests (c > 1)") for t in ax.texts)
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 64 * 1.1


def test_margin_axes_start_at_zero(tmp_path):
    slots = pl.DataFrame({"c": [4, 8, 8], "diverged": [True, True, True], "reference_margin": [0.0, 0.02, 3.0]})
    ax = plots.plot_margin_at_divergence(slots, epsilon=0.05)
    _save(ax, "margin-at-divergence", tmp_path)
    assert ax.get_yscale() == "symlog" and ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 3.0  # a margin is never negative
    ax = plots.plot_margin_trace({"p0": [0.5, 0.0, 2.0]}, {"p0": [1]})
    _save(ax, "margin-trace", tmp_path)
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 2.0


def test_a_witness_where_nothing_parted_says_so_on_a_full_axis(tmp_path):
    """The witness figure's twin of the run figure's fix (issue 22 item 8): bia's witness of the bundled fixed-tiles run holds
    every band's slot 0 to the reference's full 64 tokens, so divergence_at = 64 = declared_min at c = 1, 4, 8, 16; drawn on a
    y-axis of 60.5 to 67.5, the points sat on the declared_min line and nothing said they never parted."""
    from analysis import write_witness
    from conftest import ROOT

    witness = write_witness(read_run(ROOT / "data" / "experiment-cpu" / "fixed-tiles"), tmp_path / "w.json", prompt_id="p0")
    ws = read_witnesses([str(witness)], progress=False)
    assert ws.bands["divergence_at"].to_list() == [64] * 4 and ws.witnesses["reference_tokens"].to_list() == [64]
    ax = plots.plot_divergence(ws.bands, witnesses=ws.witnesses)
    _save(ax, "witness-nothing-parted", tmp_path)
    bottom, top = ax.get_ylim()
    assert bottom == 0 and top > 64 * 1.1
    assert [t.get_text() for t in ax.texts] == ["Nothing parted: in every band (4), slot 0 agrees\nwith the m=1 reference to its end (64 tokens)."]
    # aprender's witnesses part at token 3 (and c=1 of one at 100): nothing to say, and the axis still starts at 0
    lambda_set = read_witnesses(LAMBDA)
    ax = plots.plot_divergence(lambda_set.bands, witnesses=lambda_set.witnesses)
    assert list(ax.texts) == [] and ax.get_ylim()[0] == 0


# --- issue 32 item 10: a run plot given a Run draws it; anything else is a TypeError that says what to pass ----------------


def _artists(ax) -> tuple:
    """What an Axes shows: its lines' points and labels, its scatter offsets, its bars, its texts and its empty-panel reason."""
    lines = tuple((line.get_label(), tuple(map(float, line.get_xdata())), tuple(map(float, line.get_ydata()))) for line in ax.get_lines())
    dots = tuple(tuple(map(tuple, c.get_offsets().tolist())) for c in ax.collections)
    bars = tuple(round(p.get_height(), 12) for p in ax.patches)
    return lines, dots, bars, tuple(t.get_text() for t in ax.texts), getattr(ax, "bia_empty", None)


def _drift(run):
    return drift_table(run).with_columns(c=pl.col("label").str.extract(r"c=(\d+) slot \d+$", 1).cast(pl.Int64))


RUN_PLOTS = [  # each run plot, and the table it draws when given that table rather than the run
    ("plot_divergence", lambda run: ((slot_table(run),), {"declared_min": run.declared_min})),
    ("plot_decode_rate", lambda run: ((band_table(run),), {})),
    ("plot_margin_at_divergence", lambda run: ((slot_table(run),), {})),
    ("plot_unique_completions", lambda run: ((band_table(run),), {})),
    ("plot_band_widths", lambda run: ((width_table(run),), {})),
    ("plot_flip_curve", lambda run: ((flip_table(run),), {})),
    ("plot_delta_before_fork", lambda run: ((_drift(run),), {})),
    ("plot_margin_trace", lambda run: ((reference_margins(run), {p: g["divergence_at"].drop_nulls().to_list()
                                                                  for (p,), g in slot_table(run).group_by(["prompt_id"])}), {})),
]


@pytest.mark.parametrize(("name", "tables"), RUN_PLOTS, ids=[name for name, _ in RUN_PLOTS])
@pytest.mark.parametrize("folder", ["experiment-cpu/default", "vllm-cpu/prefix-cache"])
def test_a_run_plot_given_a_run_draws_what_its_table_draws(name, tables, folder):
    """A new user passed read_run's Run to plot_run_divergence and got "expected pandas DataFrame or Series, got 'analysis.Run'"."""
    run = read_run(ROOT / "data" / folder)
    plot = getattr(plots, name)
    args, options = tables(run)
    drawn, given = _artists(plot(run)), _artists(plot(*args, **options))
    if name == "plot_decode_rate":  # given the run, its half-of-c=1 line is the judgement's baseline, named as its cost names it
        (run_line, table_line), drawn, given = (drawn[0][-1], given[0][-1]), (drawn[0][:-1], *drawn[1:]), (given[0][:-1], *given[1:])
        assert run_line[1:] == table_line[1:] and run_line[0].startswith("50% of the c=1 baseline (") and "c=1 requests" in run_line[0]
    assert drawn == given


WRONG = [(name, given) for name, _ in RUN_PLOTS for given in ("data/experiment-cpu/default", 3, [1, 2])
         if not (name == "plot_margin_trace" and given == [1, 2])]  # one reference's margins are a list


@pytest.mark.parametrize(("name", "given"), WRONG, ids=[f"{name}-{type(given).__name__}" for name, given in WRONG])
def test_a_run_plot_given_neither_a_run_nor_its_table_says_what_to_pass(name, given):
    with pytest.raises(TypeError, match=rf"^{name} draws a Run,? ") as refused:
        getattr(plots, name)(given)
    if isinstance(given, str):
        assert str(refused.value).endswith(f"read the run first, {name}(analysis.read_run('{given}'))")


# --- issue 32 item 10: every legend lies inside its axes -------------------------------------------------------------------


def _legend_outside(ax) -> tuple[float, ...] | None:
    """How far (in pixels: left, bottom, right, top) the axes' legend reaches past the axes' box, or None when inside."""
    ax.figure.canvas.draw()
    legend, box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    over = (box.x0 - legend.x0, box.y0 - legend.y0, legend.x1 - box.x1, legend.y1 - box.y1)
    return over if max(over) > 0.5 else None


def _every_figure_with_a_legend():
    """Each plot with a legend, as the report draws it (two panels a figure), alone in its own figure, and at its worst."""
    from analysis import plot_trend, read_history
    from analysis.views.plots import METRICS, plot_attribution, plot_first_ops, series_keys
    from analysis.views.plots.attribution import _CAUSES

    ws = read_witnesses(LAMBDA, progress=False)
    yield from ((f"report: {alt}", fig) for fig, alt in plots.witness_figures(ws))
    runs = [read_run(ROOT / "data" / folder) for folder in ("experiment-cpu/default", "llamacpp-cpu/no-cache-prompt", "vllm-cpu/prefix-cache")]
    for run in runs:
        yield from ((f"report: {alt}", fig) for fig, alt in plots.run_figures(run, epsilon=0.05))
        for name, _ in RUN_PLOTS:
            yield f"{name}({run.label})", getattr(plots, name)(run).figure
    yield "plot_divergence alone", plots.plot_divergence(ws.bands, witnesses=ws.witnesses).figure
    yield "plot_first_ops", plot_first_ops(runs[0]).figure
    shares = pl.DataFrame([{"engine": engine, "c": c, "cause": cause, "requests": 1, "share": 1 / len(_CAUSES)}
                           for engine in ("llama.cpp (cache-prompt)", "vLLM (prefix-cache)") for c in (1, 4, 16) for cause in _CAUSES])
    yield "plot_attribution, every cause", plot_attribution(shares).figure
    history = read_history(LAMBDA)
    for metric, *_ in METRICS:
        yield f"plot_trend {metric}", plot_trend(history, series_keys(history)[0], metric).figure
    # at their worst: the most entries a legend holds, each with a long name
    long = [f"data/nightly/witness@{k:010x}-with-a-long-name-from-a-nightly-job.json" for k in range(12)]
    bands = pl.DataFrame({"source": [s for s in long for _ in (1, 4)], "witness_version": [1] * 24, "c": [1, 4] * 12,
                          "divergence_at": [k for k in range(24)], "declared_min": [64] * 24, "result": ["FAIL"] * 24})
    yield "plot_divergence, 12 long names", plots.plot_divergence(bands).figure
    deltas = pl.DataFrame({"label": [f"{name} c=4 slot {k}" for k, name in enumerate(long[:9]) for _ in range(2)],
                           "step": [0, 1] * 9, "abs_delta": [1e-7 * (k + 1) for k in range(9) for _ in range(2)]})
    yield "plot_delta_before_fork, 9 long labels", plots.plot_delta_before_fork(deltas).figure


@pytest.mark.slow
def test_every_legend_lies_inside_its_axes():
    """Issue 32 item 10: plot_divergence put its legend below the axes (bbox_to_anchor (0.5, -0.16)), where a notebook's inline
    figure cut it off; every plot's legend now lies inside the axes' box, its long labels wrapped to the panel."""
    checked, outside = 0, []
    for name, figure in _every_figure_with_a_legend():
        for ax in figure.axes:
            if ax.get_legend() is not None:
                checked += 1
                if (over := _legend_outside(ax)) is not None:
                    outside.append((name, ax.get_title(), over))
        plt.close(figure)
    assert outside == []
    assert checked >= 40


def test_docstring_examples_assign_the_axes_a_plot_returns():
    """Issue 32 item 10: an example that ends in a plot call shows its Axes' repr (<Axes: ...>) as the output a reader copies;
    every example assigns it (ax = plot_...) and shows what the plot drew."""
    import re

    bare = [(str(path.relative_to(ROOT)), line.strip()) for path in sorted((ROOT / "analysis").rglob("*.py"))
            for line in path.read_text().splitlines() if re.match(r"\s*>>> (?!\w+(, \w+)* = )[^#]*\bplot_\w+\(", line)]
    assert bare == []


# --- issue 33: one function per figure, whatever it is given; the twins of old are deprecated aliases ----------------------


@pytest.mark.parametrize(("old", "new"), [("plot_run_divergence", "plot_divergence"), ("plot_run_decode_rate", "plot_decode_rate")])
def test_a_deprecated_twin_warns_naming_its_successor_and_still_plots(old, new):
    import analysis

    run = read_run(ROOT / "data" / "experiment-cpu" / "default")
    for home in (plots, analysis):
        with pytest.warns(DeprecationWarning, match=rf"^{old} is deprecated .*: call {new},"):
            ax = getattr(home, old)(run)
        assert _artists(ax) == _artists(getattr(plots, new)(run))


def test_one_figure_takes_a_run_a_witness_set_a_history_or_their_frames():
    from analysis import read_history

    ws = read_witnesses(LAMBDA, progress=False)
    assert _artists(plots.plot_divergence(ws)) == _artists(plots.plot_divergence(ws.bands, witnesses=ws.witnesses))
    assert _artists(plots.plot_decode_rate(ws)) == _artists(plots.plot_decode_rate(ws.bands))
    assert _artists(plots.plot_env_knobs(ws)) == _artists(plots.plot_env_knobs(ws.witnesses))
    assert _artists(plots.plot_divergence(ws.to_backend("pandas").bands)) == _artists(plots.plot_divergence(ws.bands))
    history = read_history(LAMBDA)
    assert plots.plot_decode_rate(history).bia_empty.startswith("No decode rates recorded in the history's")
    with pytest.raises(TypeError, match="plot_trend"):
        plots.plot_divergence(history)
    # a run's table read with c as its concurrency column draws the same figure as with c
    run = read_run(ROOT / "data" / "vllm-cpu" / "prefix-cache")
    for name, table in (("plot_decode_rate", band_table), ("plot_unique_completions", band_table), ("plot_band_widths", width_table),
                        ("plot_margin_at_divergence", slot_table)):
        plot = getattr(plots, name)
        drawn, given = _artists(plot(table(run).rename({"c": "c"}))), _artists(plot(run))
        if name == "plot_decode_rate":  # the run's baseline line is named after the judgement's baseline (see above)
            drawn, given = (drawn[0][:-1], *drawn[1:]), (given[0][:-1], *given[1:])
        assert drawn == given, name
    assert _artists(plots.plot_divergence(slot_table(run).rename({"c": "c"}), declared_min=run.declared_min)) == _artists(plots.plot_divergence(run))


def test_a_legacy_frame_naming_concurrency_band_c_draws_as_c():
    """Run tables bia wrote before run_version 2 named c band_c: a frame saved then still plots, the same points."""
    slots = analysis.slot_table(analysis.read_run("data/experiment-cpu/default"))
    now, legacy = plt.subplots()[1], plt.subplots()[1]
    analysis.plot_divergence(slots, ax=now)
    analysis.plot_divergence(slots.rename({"c": "band_c"}).to_pandas(), ax=legacy)
    drawn = [[line.get_xydata().tolist() for line in ax.get_lines()] for ax in (now, legacy)]
    assert drawn[0] == drawn[1] and any(points for points in drawn[0])
    plt.close("all")


def test_the_attribution_figure_takes_runs_or_their_shares():
    run = read_run(ROOT / "data" / "experiment-cpu" / "default")  # no control arms: nothing to attribute
    assert plots.plot_attribution(run).bia_empty == plots.plot_attribution([run]).bia_empty
    assert "nothing to attribute" in plots.plot_attribution(plots.attribution_shares_by_engine([run])).bia_empty


# --- a figure as wide as its bars (issue 41, part 4) ------------------------------------------------


def _png_width(figure) -> tuple[int, int]:
    """The PNG the report embeds (figures._png: 100 dpi, tight box), as (width, height) in pixels."""
    import struct

    from analysis.views.html.figures import _png

    png, _ = _png(figure)
    return struct.unpack(">II", png[16:24])


def test_a_one_column_knob_grid_is_not_drawn_page_wide():
    # the bundled witnesses differ in one knob (BATCHED_PREFILL): one column, drawn 943 px wide before; now its 2.6 in
    # (1 in + 1.6 a column) and the witnesses' names beside it
    from analysis.views.plots.panels import witness_figures

    figure, alt = witness_figures(read_witnesses(LAMBDA, progress=False))[-1]
    assert alt == "kernel env knobs that differ between witnesses" and figure.get_figwidth() == pytest.approx(2.6)
    width, _ = _png_width(figure)
    assert width < 600


def test_many_knobs_stay_legible_within_the_bound():
    # twelve knobs: the width stops at 12 in, each column keeps over 70 px, and its long names are slanted, not overlapping
    names = [f"VLLM_KNOB_NUMBER_{k}" for k in range(12)]
    frame = pl.DataFrame({"source": ["a.json", "b.json"], "witness_version": [1, 2], **{f"env_{n}": ["1", None] for n in names}})
    ax = plots.plot_env_knobs(frame)
    assert ax.figure.get_figwidth() == 12.0
    assert ax.get_window_extent().width / len(names) > 70
    assert {t.get_rotation() for t in ax.get_xticklabels()} == {35.0}
    boxes = [t.get_window_extent() for t in ax.get_xticklabels()]
    assert all(a.x1 <= b.x1 and a.x0 < b.x0 for a, b in zip(boxes, boxes[1:]))  # in order, left to right
    assert 900 < _png_width(ax.figure)[0] <= 1300


def test_a_one_bar_attribution_chart_is_narrower_than_a_many_bar_one():
    one = pl.DataFrame({"engine": ["e"], "c": [4], "cause": ["co-batching"], "requests": [3], "share": [1.0]})
    many = pl.DataFrame({"engine": ["e"] * 12, "c": [1, 2, 4, 8, 16, 32] * 2, "cause": ["co-batching"] * 6 + ["cache state"] * 6,
                         "requests": [1] * 12, "share": [0.5] * 12})
    narrow, wide = plots.plot_attribution(one), plots.plot_attribution(many)
    assert narrow.figure.get_figwidth() == 5.5 and wide.figure.get_figwidth() == 7.5  # 4.5 in and 0.5 a bar, at least 5.5
    assert _png_width(narrow.figure)[0] < 700


def test_many_references_are_grey_lines_in_one_collection_with_their_partings_as_dots():
    from matplotlib.collections import LineCollection

    from analysis.views.plots._drawing import _covered, _legend
    from analysis.views.plots.margins import _grey_traces

    traces = {f"q{k:02d}": [(0, 1.0 + k), (1, 0.5 + k), (2, 0.25 + k)] for k in range(12)}
    _, ax = plt.subplots()
    _grey_traces(ax, traces, {"q03": [1], "q07": [2, 2]})
    (lines,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert [segment.tolist() for segment in lines.get_segments()] == [[list(p) for p in t] for t in traces.values()]
    dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert [tuple(zip(d.get_xdata(), d.get_ydata())) for d in dots] == [((1, 3.5), (2, 7.25))]
    assert ax.get_ylim()[1] >= 12.0  # the view takes in every line
    _legend(ax)
    assert "one line per prompt (12)" in " ".join(t.get_text() for t in ax.get_legend().get_texts())
    box = ax.transData.transform([(0.4, 4.7), (0.6, 4.8)])  # on q04's line between its steps, off every vertex
    from matplotlib.transforms import Bbox

    assert _covered(ax, Bbox(box))  # a legend there would hide a line: the collection's segments count
