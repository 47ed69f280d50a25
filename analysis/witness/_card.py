"""A witness set's card in Jupyter: counts, each witness's recorded and re-derived verdict, the first bands."""

from __future__ import annotations

from ..core import cell, summary_html


def witness_summary(ws) -> str:
    """A witness set's card: counts, each witness's recorded and re-derived verdict, the first bands.

    Parameters
    ----------
    ws : WitnessSet
        The witnesses, in either backend.

    Returns
    -------
    str
        The card's HTML.
    """
    polars_set = ws.to_backend("polars")
    facts = [
        ("witnesses", polars_set.witnesses.height),
        ("bands", polars_set.bands.height),
        ("slots", polars_set.slots.height),
        ("release markers", polars_set.markers.height),
        ("discrepancies", polars_set.discrepancies.height),
    ]
    lines = []
    for source, recorded, derived in polars_set.witnesses.select(
        "source", "recorded_verdict", "derived_verdict"
    ).iter_rows():
        agree = recorded == derived
        lines.append((f"{source}: recorded {cell(recorded)}, re-derived {cell(derived)}", None if agree else "fail"))
    bands = polars_set.bands.select(
        [
            c
            for c in ("source", "c", "m_formed", "divergence_at", "decode_tok_s", "result", "derived_result")
            if c in polars_set.bands.columns
        ]
    )
    return summary_html("bia witnesses", None, facts, lines, bands)
