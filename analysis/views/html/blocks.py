"""The building blocks of every HTML fragment bia shows: one jinja2 environment, a frame as a table, a card's frame, and
the report's :class:`~analysis.report.Section` (what Jupyter displays of a section).

Autoescape is always on, because witness fields and model output are untrusted text; values are written for people by
:mod:`analysis.core` (``cell``) before a template sees them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jinja2

from ...core import as_polars, cell

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("analysis.views.html", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(template: str, **context: Any) -> str:
    """Render ``templates/<template>`` with every interpolated value HTML-escaped.

    Parameters
    ----------
    template : str
        The template's file name under ``analysis/views/html/templates``.
    **context : Any
        The template's variables; an undefined one is an error.

    Returns
    -------
    str
    """
    return _ENV.get_template(template).render(**context)


class Shortened(NamedTuple):
    """A table cell shown cut short, its whole value the cell's tooltip (``title``): a 40-character commit hash as 10."""

    text: str
    full: str


def frame_html(
    frame: Any,
    *,
    caption: str = "",
    empty: str = "nothing to show",
    limit: int | None = None,
    shorten: Mapping[str, int] | None = None,
    nowrap: bool = False,
) -> str:
    """A polars or pandas frame as an escaped HTML table of people-formatted cells, in a box of its own that scrolls
    sideways when the table is wider than the card (a notebook's output area, which has no report stylesheet); with
    ``limit``, the first rows and a count of the rest; ``shorten`` cuts a column's values to so many characters, each
    whole in its tooltip; ``nowrap`` keeps values of up to 24 characters on one line (a card's preview: the table scrolls
    rather than squeezing a date into four lines; the report, whose tables must fit its page, wraps them).

    Parameters
    ----------
    frame : polars.DataFrame or pandas.DataFrame
        The table; each value written by :func:`cell`.
    caption : str, default ""
        The table's caption; none when empty.
    empty : str, default "nothing to show"
        What is shown instead of a table without rows.
    limit : int, optional
        Show at most this many rows, with a line counting the rest; all rows when None.
    shorten : Mapping of str to int, optional
        Column name to the number of characters its values are cut to.
    nowrap : bool, default False
        Keep values of up to 24 characters on one line.

    Returns
    -------
    str
        The HTML fragment, every value escaped.

    Examples
    --------
    >>> import re
    >>> import polars as pl
    >>> html = frame_html(pl.DataFrame({"commit": ["a765c86a5f5437c01bb327848787bbcda15249c7", "<b>"]}), shorten={"commit": 10})
    >>> re.findall(r"<td[^>]*>.*?</td>", html)
    ['<td title="a765c86a5f5437c01bb327848787bbcda15249c7">a765c86a5f</td>', '<td>&lt;b&gt;</td>']
    >>> 'style="max-width:100%;overflow-x:auto"' in html
    True
    """
    frame = as_polars(frame)
    shown = frame if limit is None else frame.head(limit)
    cut = [(shorten or {}).get(name) for name in shown.columns]
    rows = [[_shortened(cell(v), n) for v, n in zip(row, cut)] for row in shown.iter_rows()]
    more = f"the first {shown.height} of {frame.height} rows" if frame.height > shown.height else ""
    return render(
        "table.html.j2", columns=shown.columns, rows=rows, caption=caption, empty=empty, more=more, nowrap=nowrap
    )


SCROLL_BOX = '<div class="bia-scroll" style="max-width:100%;overflow-x:auto">'  # the report's class with its rule inline: the templates' boxes too


def scroll_box(html: str) -> str:
    """A table in a box of its own that scrolls sideways when the table is wider than the card (a notebook loads no report
    stylesheet, so the box carries its rule inline), rather than widening the whole output.

    Parameters
    ----------
    html : str
        The HTML to wrap, trusted as it is (not escaped here).

    Returns
    -------
    str

    Examples
    --------
    >>> scroll_box("<table></table>")
    '<div class="bia-scroll" style="max-width:100%;overflow-x:auto"><table></table></div>'
    """
    return f"{SCROLL_BOX}{html}</div>"


VERDICT_COLOURS = {  # each verdict class's colour: the report's (report.css, light) and one for dark themes
    "pass": ("#1a7f37", "#3fb950"),
    "warn": ("#9a6700", "#d29922"),
    "fail": ("#cf222e", "#ff7b72"),
}
_DARK = ('body[data-jp-theme-light="false"]', "body.vscode-dark", "body.jp-mod-dark")


def _jupyter_style() -> str:
    """The style a card carries into Jupyter, which loads no report stylesheet: the verdict colours (light, and dark where
    JupyterLab or VS Code says its theme is dark), cells aligned left as the report's are (JupyterLab aligns them right),
    and a verdict that never breaks inside its word."""
    rules = []
    for name, (light, dark) in VERDICT_COLOURS.items():
        rules.append(f".bia-jupyter .bia-{name}{{color:{light};font-weight:600}}")
        rules.append(", ".join(f"{theme} .bia-jupyter .bia-{name}" for theme in _DARK) + f"{{color:{dark}}}")
    cells = ", ".join(f"{scope}.bia-jupyter {tag}" for scope in ("", ".jp-RenderedHTMLCommon ") for tag in ("td", "th"))
    rules.append(f"{cells}{{text-align:left;vertical-align:top}}")
    rules.append(".bia-jupyter td[data-verdict-cell]{white-space:nowrap;overflow-wrap:normal}")
    return "<style>" + "\n".join(rules) + "</style>"


JUPYTER_STYLE = _jupyter_style()


def jupyter_card(html: str) -> str:
    """A card as Jupyter shows it: in a box that carries bia's verdict colours and left-aligned cells (``JUPYTER_STYLE``).

    Parameters
    ----------
    html : str
        The card's HTML, trusted as it is (not escaped here).

    Returns
    -------
    str

    Examples
    --------
    >>> html = jupyter_card('<p class="bia-fail">RED</p>')
    >>> html.startswith('<div class="bia-jupyter"><style>') and ".bia-jupyter .bia-fail{color:#cf222e" in html
    True
    """
    return f'<div class="bia-jupyter">{JUPYTER_STYLE}{html}</div>'


def _shortened(text: str, n: int | None) -> str | Shortened:
    return Shortened(text[:n], text) if n is not None and len(text) > n else text


def summary_html(
    kind: str,
    name: str | None,
    facts: list[tuple[str, Any]],
    lines: Sequence[tuple[str, str | None]] = (),
    preview: Any = None,
    preview_rows: int = 5,
    shorten: Mapping[str, int] | None = None,
) -> str:
    """The compact HTML card an object shows in Jupyter (``shorten``: as :func:`frame_html` takes it).

    Parameters
    ----------
    kind : str
        What the object is (the card's heading), e.g. ``Run``.
    name : str or None
        Its name beside the kind; none when None.
    facts : list of (str, Any)
        Label and value pairs of the card's table, each value written by :func:`cell`.
    lines : list of (str, str or None), default ()
        Further lines under the facts, as the summary template shows them.
    preview : polars.DataFrame or pandas.DataFrame, optional
        A frame whose first rows the card shows; none when None.
    preview_rows : int, default 5
        How many of the preview's rows are shown.
    shorten : Mapping of str to int, optional
        Column name to the number of characters its preview values are cut to.

    Returns
    -------
    str
    """
    table = frame_html(preview, limit=preview_rows, shorten=shorten, nowrap=True) if preview is not None else ""
    return render(
        "summary.html.j2",
        kind=kind,
        name=name,
        facts=[(label, cell(value)) for label, value in facts],
        lines=list(lines),
        preview=table,
    )


@dataclasses.dataclass(frozen=True)
class Section:
    """One section of the parity report: Jupyter displays its HTML, as the exported report shows it.

    Parameters
    ----------
    name : str
        Which section (``"answer"``, ``"runs"``, ...).
    html : str
        Its HTML, every value escaped; empty when the section has nothing to show.

    Examples
    --------
    >>> Section("answer", "<h2>The answer</h2>")
    Section('answer', 19 characters of HTML)
    """

    name: str
    html: str

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return f"Section({self.name!r}, {len(self.html)} characters of HTML)"
