"""Plot functions: Agg backend, assertions on the artists, figures closed after each test (conftest)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import polars as pl
import pytest
from test_run import make_run

from analysis import plots, read_witnesses
from analysis.parity import flip_curve, step_margins
from analysis.run import band_table, read_run, slot_table
from conftest import LAMBDA


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
    ax = plots.plot_run_divergence(slots, declared_min=3, ax=axes[0, 0])
    assert ax is axes[0, 0]
    marks = {line.get_marker(): list(line.get_ydata()) for line in ax.get_lines() if line.get_marker() in ("o", "^")}
    assert marks == {"o": [2, 2, 2, 2], "^": [4]}
    ax = plots.plot_margin_at_divergence(slots, epsilon=0.05, ax=axes[0, 1])
    assert list(ax.get_lines()[0].get_ydata()) == slots["reference_margin"].drop_nulls().to_list()
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
    empty = pl.DataFrame(schema={"prompt_id": pl.String, "band_c": pl.Int64, "diverged": pl.Boolean, "agree_to": pl.Int64,
                                 "reference_margin": pl.Float64, "unique_completions": pl.Int64})
    assert "No batched requests" in plots.plot_run_divergence(empty).texts[0].get_text()
    assert "never part" in plots.plot_fork_tree([], at=0).texts[0].get_text()
    assert "no step with two candidates" in plots.plot_margin_trace([None, None]).texts[0].get_text()


def test_band_widths_and_margin_traces_per_prompt(tmp_path):
    from analysis.run import width_table

    run = read_run(make_run(tmp_path, widths4=(4, 4, 3)))
    widths = width_table(run)
    assert widths.select("band_c", "width", "steps").rows() == [(1, 1, 2), (4, 4, 2), (4, 3, 1)]
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


def _slots(agree_to, diverged):
    n = len(agree_to)
    return pl.DataFrame({"prompt_id": ["p0"] * n, "band_c": [4] * n, "slot": list(range(n)), "agree_to": agree_to, "diverged": diverged})


def test_a_run_where_nothing_parted_says_so_on_a_full_axis(tmp_path):
    ax = plots.plot_run_divergence(_slots([64] * 4, [False] * 4), declared_min=64)
    _save(ax, "nothing-parted", tmp_path)
    bottom, top = ax.get_ylim()
    assert bottom == 0 and top > 64 * 1.1  # the axis shows where 64 sits, not 63 to 67
    assert any(t.get_text().startswith("Nothing parted: all 4 batched requests") for t in ax.texts)
    assert [label for label, _ in _drawn(ax)] == ["never parted (4; drawn at their length)", "declared_min = 64"]
    ax = plots.plot_run_divergence(_slots([64, 3], [False, True]), declared_min=64)
    assert not any(t.get_text().startswith("Nothing parted") for t in ax.texts)


def test_margin_axes_start_at_zero(tmp_path):
    slots = pl.DataFrame({"band_c": [4, 8, 8], "diverged": [True, True, True], "reference_margin": [0.0, 0.02, 3.0]})
    ax = plots.plot_margin_at_divergence(slots, epsilon=0.05)
    _save(ax, "margin-at-divergence", tmp_path)
    assert ax.get_yscale() == "symlog" and ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 3.0  # a margin is never negative
    ax = plots.plot_margin_trace({"p0": [0.5, 0.0, 2.0]}, {"p0": [1]})
    _save(ax, "margin-trace", tmp_path)
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 2.0
