"""The reports' headers: one title block for the parity report and the trend report alike, and the headings of a run, a
file or a series."""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from ...core import MISSING, __version__, cell
from ...io import default_sources
from ...studies import History
from ..plots.trend import series_keys
from .blocks import render


def header_html(
    title: str,
    ws: Any = None,
    runs: Iterable[Any] = (),
    *,
    history: History | None = None,
    sources: Sequence[str] = (),
    default: bool = False,
    admission: bool = False,
) -> str:
    """A report's title block: the parity report's (when and by what it was made, and what it read) given the witness set
    ``ws`` and the ``runs``; the trend report's (its sources, entries, series, span and regressions) given ``history``.

    Parameters
    ----------
    title : str
        The report's title (escaped).
    ws : WitnessSet, optional
        The parity report's witnesses (none is fine).
    runs : iterable of Run
        The parity report's runs.
    history : History, optional
        The trend report's history: the header is then the trend report's.
    sources : sequence of str
        The trend report's sources as given; none says the embedded history was read.
    default : bool
        The parity report read the embedded default.
    admission : bool
        The parity report has aprender's V3 gate.

    Examples
    --------
    >>> import analysis
    >>> "1 run" in header_html("t", analysis.read_witnesses([], progress=False), [analysis.read_run("data/experiment-cpu/default")])
    True
    >>> "(none given: the embedded history)" in header_html("t", history=analysis.read_history("data/aprender-lambda"))
    True
    """
    if isinstance(runs, History):  # the trend report's header_html(title, sources, history) of old
        warnings.warn(
            "header_html(title, sources, history) is deprecated: call header_html(title, history=history, sources=sources)",
            DeprecationWarning,
            stacklevel=2,
        )
        history, sources, ws, runs = runs, ws or (), None, ()
    if history is not None:
        return _trend(title, list(sources), history)
    runs = list(runs)
    polars_set = ws.to_backend("polars")
    counts = [
        (len(runs), "run"),
        (polars_set.witnesses.height, "witness"),
        (polars_set.markers.height, "release marker"),
    ]
    read = (
        ", ".join(
            f"{n} {what}{'es' if what == 'witness' and n != 1 else 's' if n != 1 else ''}" for n, what in counts if n
        )
        or "nothing"
    )
    read += " (the embedded default)" if default else ""
    return render(
        "header.html.j2",
        title=title,
        generated=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        version=__version__,
        read=read,
        admission=admission,
    )


def _trend(title: str, sources: list[str], history: History) -> str:
    """The trend report's title, sources and span."""
    span = history.entries["time"].drop_nulls()
    return render(
        "trend_header.html.j2",
        title=title,
        sources=sources or default_sources(),
        given=bool(sources),
        entries=history.entries.height,
        series=len(series_keys(history)),
        markers=history.markers.height,
        start=cell(span.min()) if span.len() else MISSING,
        end=cell(span.max()) if span.len() else MISSING,
        one_moment=span.len() > 1 and span.min() == span.max(),
        regressions=history.regressions().height,
    )


def heading_html(words: str, name: str, level: int = 3) -> str:
    """A heading naming a run or a file: ``words`` then ``name`` as code, both escaped.

    Parameters
    ----------
    words : str
        The words before the name.
    name : str
        The run's or file's name.
    level : int, default 3
        The heading's level (``<h3>``).

    Returns
    -------
    str
        HTML.

    Examples
    --------
    >>> heading_html("Run", "runs/<b>")
    '<h3>Run <code>runs/&lt;b&gt;</code></h3>'
    """
    return f"<h{level}>{escape(words)} <code>{escape(name)}</code></h{level}>"


def series_heading_html(key: tuple) -> str:
    """A series' heading (host / engine / model) and its settings, escaped: these values come from the files read.

    Parameters
    ----------
    key : tuple
        The series' (host, engine, model, settings); a missing part shows as a dash.

    Returns
    -------
    str
        HTML.

    Examples
    --------
    >>> print(series_heading_html(("lambda", "<b>apr</b>", None, "FP8_DECODE=1")))
    <h2>lambda / &lt;b&gt;apr&lt;/b&gt; / —</h2>
    <p>settings: <code>FP8_DECODE=1</code></p>
    """
    settings = key[3] if len(key) > 3 and key[3] else None
    shown = f"<code>{escape(settings)}</code>" if settings else "none recorded"
    return f"<h2>{escape(' / '.join(cell(k) for k in key[:3]))}</h2>\n<p>settings: {shown}</p>"
