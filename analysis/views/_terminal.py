"""Terminal tables (rich) for ``bia witness``."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..core import format_number
from ..verdicts import ShapeVerdict
from .plots.witness import witness_label

_STYLE = {
    "PASS": "green",
    "FAIL": "red",
    "UNMEASURABLE": "yellow",
    "ADMISSIBLE": "green",
    "NOT ADMISSIBLE": "red",
    "RED": "yellow",
}


def _styled(text: str | None) -> str:
    if text is None:
        return "-"
    style = _STYLE.get(text)
    return f"[{style}]{escape(text)}[/]" if style else escape(text)


def _num(value) -> str:
    return "-" if value is None else format_number(value)


def _result(recorded: str | None, derived: str | None) -> str:
    text = _styled(recorded)
    if derived is not None and derived != recorded:
        text += f" [bold red](derived {escape(derived)})[/]"
    return text


def witness_table(ws, verdicts: Mapping[str, ShapeVerdict]) -> Table:
    """One row per band, grouped by witness; the V3 verdict on each witness's first row.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.
    verdicts : mapping of str to ShapeVerdict
        Each witness's V3 verdict, by source.

    Returns
    -------
    rich.table.Table
    """
    table = Table(title="perf041 witnesses", show_lines=False)
    for name in (
        "witness",
        "host",
        "server commit",
        "version",
        "c",
        "m_formed",
        "divergence_at",
        "margin",
        "decode tok/s",
        "result",
        "V3 verdict",
    ):
        table.add_column(
            name, justify="right" if name in ("c", "m_formed", "divergence_at", "margin", "decode tok/s") else "left"
        )
    frames = ws.to_backend("polars")
    for witness in frames.witnesses.iter_rows(named=True):
        verdict = verdicts[witness["source"]]
        v3 = _styled(verdict.status) + (f" ({len(verdict.reasons)})" if verdict.status == "NOT ADMISSIBLE" else "")
        bands = frames.bands.filter(source=witness["source"]).iter_rows(named=True)
        first = True
        for band in bands:
            table.add_row(
                escape(witness_label(witness["source"], None)) if first else "",
                escape(witness["host"] or "-") if first else "",
                escape((witness["commit"] or "-")[:10]) if first else "",
                str(witness["witness_version"]) if first else "",
                str(band["c"]),
                _num(band["m_formed"]),
                _num(band["divergence_at"]),
                _num(band["top2_margin_at_divergence"]),
                _num(band["decode_tok_s"]),
                _result(band["result"], band["derived_result"]),
                v3 if first else "",
                end_section=False,
            )
            first = False
        if first:  # a witness without bands still gets its row
            table.add_row(
                escape(witness_label(witness["source"], None)),
                escape(witness["host"] or "-"),
                escape((witness["commit"] or "-")[:10]),
                str(witness["witness_version"]),
                *["-"] * 6,
                v3,
            )
        table.add_section()
    return table


def marker_table(ws) -> Table:
    """One row per release marker.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.

    Returns
    -------
    rich.table.Table
    """
    table = Table(title="release markers")
    for name in ("source", "host", "commit", "cc", "max_m", "started (UTC)", "status"):
        table.add_column(name)
    for m in ws.to_backend("polars").markers.iter_rows(named=True):
        started = m["started_utc"].strftime("%Y-%m-%d %H:%M:%S") if m["started_utc"] else "-"
        table.add_row(
            escape(m["source"]),
            escape(m["host"] or "-"),
            escape((m["commit"] or "-")[:10]),
            escape(m["cc"] or "-"),
            _num(m["max_m"]),
            started,
            _styled(m["status"]),
        )
    return table


def print_witness_tables(
    ws, verdicts: Mapping[str, ShapeVerdict], *, show_reasons: bool = False, console: Console | None = None
) -> None:
    """Print the witness table, the marker table, and optionally every reason and discrepancy.

    Parameters
    ----------
    ws : WitnessSet
        The witness set.
    verdicts : mapping of str to ShapeVerdict
        Each witness's V3 verdict, by source.
    show_reasons : bool, default False
        Also print every verdict's reasons.
    console : rich.console.Console, optional
        Where to print; by default a new console, at least 160 columns wide when not a terminal.
    """
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
            console = Console(width=max(console.width, 160))
    frames = ws.to_backend("polars")
    if frames.witnesses.height:
        console.print(witness_table(ws, verdicts))
    if frames.markers.height:
        console.print(marker_table(ws))
    if frames.discrepancies.height:
        console.print(
            f"[bold red]{frames.discrepancies.height} recorded value(s) disagree with their version's rules[/]"
        )
        for d in frames.discrepancies.iter_rows(named=True):
            line = (
                f"  {escape(d['source'])}: {escape(d['record'])}.{escape(d['field'])}: "
                f"recorded {escape(d['recorded'])}, derived {escape(d['derived'])} ({escape(d['rule'])})"
            )
            console.print(line, soft_wrap=True)
    if show_reasons:
        for source, verdict in verdicts.items():
            console.print(f"V3 {escape(source)}: {_styled(verdict.status)}", soft_wrap=True)
            for reason in verdict.reasons:
                console.print(f"  - {escape(reason)}", soft_wrap=True)
