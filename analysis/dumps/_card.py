"""A dump's card in Jupyter: sizes, sources and formats, what was left out, counts that differ for a known reason, the first requests."""

from __future__ import annotations

import json

from ..core import as_polars, few, summary_html


def dump_summary(dump) -> str:
    """A dump's card: sizes, sources and formats, what was left out, counts that differ for a known reason, the first requests.

    Parameters
    ----------
    dump : Dump
        The dump (either backend).

    Returns
    -------
    str
        HTML.
    """
    sources = list(dump.formats)
    formats = sorted({f for found in dump.formats.values() for f in found})
    requests = as_polars(dump.requests)
    notes = count_notes(requests)
    facts = [
        ("requests", len(dump.requests)),
        ("scored tokens", len(dump.tokens)),
        ("candidates", len(dump.candidates)),
        ("sources", few(sources)),
        ("formats", few(formats)),
        ("records left out", len(dump.skipped)),
        ("backend", dump.backend),
    ]
    if notes:
        facts.append(("usage counts tokens never sent", len(notes)))
    lines = [(str(e), "fail") for e in dump.skipped[:5]] + [(note, None) for note in notes[:5]]
    columns = [
        c
        for c in (
            "request_id",
            "source_format",
            "model",
            "prompt_id",
            "role",
            "c",
            "slot",
            "completion_tokens",
            "finish_reason",
        )
        if c in requests.columns
    ]
    return summary_html("bia dump", None, facts, lines, requests.select(columns))


def count_notes(requests) -> list[str]:
    """One line per request whose usage counts tokens its logprob entries never carried, for a recorded reason
    (``extra.usage_minus_entries``: the Responses API's end-of-message token).

    Parameters
    ----------
    requests : polars.DataFrame
        A dump's requests table (``source``, ``record``, ``completion_tokens``, ``n_completion_scored``, and
        ``extra`` when any request has one).

    Returns
    -------
    list of str

    Examples
    --------
    >>> import polars as pl
    >>> extra = '{"usage_minus_entries": 1, "usage_minus_entries_reason": "the end token"}'
    >>> count_notes(pl.DataFrame({"source": ["a.sse"], "record": [0], "completion_tokens": [3], "n_completion_scored": [2], "extra": [extra]}))
    ['a.sse record 0: usage counts 3 tokens, 2 logprob entries (1 more: the end token)']
    """
    if "extra" not in requests.columns:
        return []
    notes = []
    for row in requests.filter(
        requests["extra"].str.contains('"usage_minus_entries"', literal=True).fill_null(False)
    ).iter_rows(named=True):
        extra = json.loads(row["extra"])
        notes.append(
            f"{row['source']} record {row['record']}: usage counts {row['completion_tokens']} tokens, {row['n_completion_scored']} logprob "
            f"entries ({extra['usage_minus_entries']} more: {extra.get('usage_minus_entries_reason', 'reason not recorded')})"
        )
    return notes
