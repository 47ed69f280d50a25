"""The trend report: a history's bands over time per series (host, engine, model and the settings that
change results), with regressions flagged.

``bia trend HISTORY -o trend.html`` executes ``notebooks/trend_report.ipynb`` with papermill and
exports it as one offline HTML file, as ``bia report`` does. Its figures and fragments live in
:mod:`analysis.views` (``plot_trend``, ``header_html``, ``regressions_html``...), named here too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

from ..core import claim_output
from ..io import bundled, default_sources
from ..studies import read_history
from ..views.html import entries_html, header_html, regressions_html, series_heading_html, show_figure
from ..views.plots import METRICS, figure_alt, plot_trend, series_keys, series_name
from ._notebook import execute_to_html

__all__ = [
    "DEFAULT_TITLE",
    "METRICS",
    "default_history_sources",
    "entries_html",
    "figure_alt",
    "header_html",
    "plot_trend",
    "regressions_html",
    "render_trend",
    "series_heading_html",
    "series_keys",
    "series_name",
    "show_figure",
]

DEFAULT_TITLE = "Batch-invariance trend"


def default_history_sources() -> list[str]:
    """The embedded history: aprender's lambda witnesses, all of one server commit and dated by its release
    marker (one moment: no trend over time), and the release markers of that commit and the next.

    Examples
    --------
    >>> default_history_sources()
    ['data/aprender-lambda']
    """
    return default_sources()


def render_trend(
    sources: Iterable[str | os.PathLike[str]] | None = None,
    output: str | os.PathLike[str] = "trend.html",
    *,
    title: str = DEFAULT_TITLE,
    force: bool = False,
    timeout_s: int = 600,
    progress: bool | None = None,
) -> Path:
    """Execute the trend notebook over ``sources`` (the embedded history when empty) and export one HTML file.

    ``progress`` shows papermill's bar over the notebook's cells; by default only when stderr is a terminal.

    Parameters
    ----------
    sources : iterable of str or path, optional
        History folders, run directories, witness and marker files or URLs, as :func:`analysis.read_history` takes
        them; by default the history embedded in the package.
    output : str or path, default "trend.html"
        The HTML file to write.
    title : str, default "Batch-invariance trend"
        The page's title.
    force : bool, default False
        Replace an existing ``output``.
    timeout_s : int, default 600
        The longest a notebook cell may run, in seconds.
    progress : bool, optional
        Show papermill's bar; by default only when stderr is a terminal.

    Returns
    -------
    pathlib.Path
        The HTML file written.

    Examples
    --------
    >>> import tempfile
    >>> page = render_trend(output=Path(tempfile.mkdtemp()) / "trend.html")  # doctest: +SKIP
    """
    output = claim_output(output, force=force, what="the trend report")
    parameters = {"history": [os.fspath(s) for s in (sources or [])], "title": title}
    read_history(parameters["history"] or default_history_sources())  # a bad source is named here, not inside a kernel
    show = progress if progress is not None else sys.stderr.isatty()
    return execute_to_html(
        bundled("notebooks/trend_report.ipynb"), parameters, output, what="trend", progress=show, timeout_s=timeout_s
    )
