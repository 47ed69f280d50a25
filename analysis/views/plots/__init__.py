"""One plot per function: ``ax=`` in (a new figure when None), the Axes out, never ``show()``.

Each figure takes a :class:`~analysis.Run`, a :class:`~analysis.WitnessSet` or a frame alike (a
:class:`~analysis.History` where it makes sense): a run's tables name concurrency ``c``, witnesses
and histories ``c``, and every plot reads whichever its frame has. A module per family: ``parity``
(where streams part, unique completions, forks), ``margins`` (near-ties, flips), ``drift`` (before the fork),
``rates`` (decode rate, batch widths), ``witness`` (env knobs, legend names), ``attribution``, ``first_ops``,
``trend``, ``mismatch`` (sampler and trainer), and ``panels`` (the report's two-panel figures). ``analysis.plots``
names them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from ._drawing import LEGEND_LIMIT, NOTEBOOK_WIDTH, panel_grid
from .attribution import attribution_shares_by_engine, plot_attribution
from .drift import drift_drawn, plot_delta_before_fork
from .first_ops import plot_first_ops
from .margins import plot_flip_curve, plot_margin_at_divergence, plot_margin_trace
from .mismatch import rl_mismatch_figures
from .panels import run_curves, run_figures, witness_figures
from .parity import plot_divergence, plot_fork_tree, plot_unique_completions
from .rates import plot_band_widths, plot_decode_rate
from .trend import METRICS, figure_alt, plot_trend, series_keys, series_name
from .witness import differing_env_knobs, plot_env_knobs, witness_label

__all__ = [
    "LEGEND_LIMIT",
    "METRICS",
    "NOTEBOOK_WIDTH",
    "attribution_shares_by_engine",
    "differing_env_knobs",
    "drift_drawn",
    "figure_alt",
    "panel_grid",
    "plot_attribution",
    "plot_band_widths",
    "plot_decode_rate",
    "plot_delta_before_fork",
    "plot_divergence",
    "plot_env_knobs",
    "plot_first_ops",
    "plot_flip_curve",
    "plot_fork_tree",
    "plot_margin_at_divergence",
    "plot_margin_trace",
    "plot_run_decode_rate",
    "plot_run_divergence",
    "plot_trend",
    "plot_unique_completions",
    "rl_mismatch_figures",
    "run_curves",
    "run_figures",
    "series_keys",
    "series_name",
    "witness_figures",
    "witness_label",
]


def _deprecated(old: str, new: Callable) -> Callable:
    """``old``, kept for one release: it warns (DeprecationWarning, naming ``new``), then draws as ``new`` does."""

    def alias(*args, **options):
        warnings.warn(
            f"{old} is deprecated and goes in the next release: call {new.__name__}, which draws a Run, a WitnessSet "
            "or their frames alike",
            DeprecationWarning,
            stacklevel=2,
        )
        return new(*args, **options)

    alias.__name__ = alias.__qualname__ = old
    alias.__doc__ = (
        f"Deprecated: call :func:`{new.__name__}`, which takes a run, a witness set or their frames alike."
        f"\n\nParameters\n----------\n*args, **options\n    What :func:`{new.__name__}` takes.\n"
    )
    return alias


plot_run_divergence = _deprecated("plot_run_divergence", plot_divergence)
plot_run_decode_rate = _deprecated("plot_run_decode_rate", plot_decode_rate)
