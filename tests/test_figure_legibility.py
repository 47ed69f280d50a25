"""Issue 44 item 3: every figure bia draws is legible at the width JupyterLab gives it.

JupyterLab 4 at 1400 x 1000 with its file browser open gives an output 968 px (measured by the Chromium test of the
tutorials, tests/test_notebooks_in_jupyterlab.py) and shrinks a wider PNG to fit. The inline backend draws at 100 dpi, so
text of ``s`` points is shown at ``s * 100 / 72 * min(1, 968 / width_px)`` px. The report's two-panel figures were 12
inches wide with legends in x-small: axis labels came out at 6-7 px and legends at about 5 px; a legend sat on the drift.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
from conftest import LAMBDA, ROOT

import analysis
from analysis import plots
from analysis.run import read_run

OUTPUT_PX = 968  # JupyterLab 4.6's output area at 1400 px wide, file browser open
DPI = 100  # the inline backend's figure.dpi
SMALLEST_PX = 9


def rendered_sizes(fig) -> list[tuple[float, str]]:
    """Each visible text's size in px as JupyterLab shows the figure's PNG (saved with a tight box, as the inline backend does)."""
    fig.set_dpi(DPI)
    renderer = fig.canvas.get_renderer()
    width = fig.get_tightbbox(renderer).width * DPI  # inches to px: the PNG's own width
    shrink = min(1.0, OUTPUT_PX / width)
    texts = [t for t in fig.findobj(match=lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text"))
             if t.get_visible() and t.get_text().strip() and t.get_figure() is fig
             and all(a.get_visible() for a in _ancestors(t))]
    return [(t.get_fontsize() * DPI / 72 * shrink, t.get_text()) for t in texts]


def _ancestors(artist):
    axes = getattr(artist, "axes", None)
    return [axes] if axes is not None else []


def _run_figures(path: str):
    run = read_run(ROOT / "data" / path)
    yield from ((alt, fig) for fig, alt in plots.run_figures(run, epsilon=0.05))
    for name in ("plot_divergence", "plot_decode_rate", "plot_margin_at_divergence", "plot_delta_before_fork",
                 "plot_flip_curve", "plot_unique_completions", "plot_band_widths"):
        yield name, getattr(plots, name)(run).figure


def _other_figures(kind: str):
    if kind == "witnesses":
        yield from ((alt, fig) for fig, alt in plots.witness_figures(analysis.read_witnesses(LAMBDA, progress=False)))
    elif kind == "mismatch":
        pairs = [ROOT / "data" / "experiment-cpu" / "trainer" / "default.jsonl"]
        yield from ((alt, fig) for fig, alt in plots.rl_mismatch_figures(pairs))
    else:
        history = analysis.read_history(LAMBDA)
        yield "trend", plots.plot_trend(history, analysis.trend.series_keys(history)[0], "bit_identical_share").figure


SOURCES = ["experiment-cpu/default", "llamacpp-cpu/cache-prompt", "vllm-cpu/prefix-cache", "witnesses", "mismatch", "trend"]


def _figures(source: str):
    return list(_run_figures(source) if "/" in source else _other_figures(source))


@pytest.mark.parametrize("source", SOURCES)
def test_no_text_is_under_9_px_at_notebook_width(source):
    small = [(name[:30], round(px, 1), text[:40]) for name, fig in _figures(source) for px, text in rendered_sizes(fig)
             if px < SMALLEST_PX]
    assert small == []


@pytest.mark.parametrize("source", SOURCES)
def test_no_legend_sits_on_the_data(source):
    from analysis.views.plots._drawing import _covered

    covered = []
    for name, fig in _figures(source):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        covered += [(name[:30], ax.get_title()) for ax in fig.axes if ax.get_legend() is not None
                    and _covered(ax, ax.get_legend().get_window_extent(renderer))]
    assert covered == []


def test_a_wide_figure_of_three_panels_wraps_rather_than_shrinks():
    fig, axes = plots.panel_grid(3)
    assert len(axes) == 3 and fig.get_size_inches()[0] * DPI <= OUTPUT_PX
    assert len({round(ax.get_position().y0, 2) for ax in axes}) == 2  # two rows: two panels, then one


def teardown_module():
    plt.close("all")
