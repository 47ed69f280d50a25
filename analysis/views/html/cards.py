"""The cards Jupyter shows for bia's objects: a run, a witness set, a dump, a history and a V3 verdict.

The objects live on lower floors and define no card: the package face binds each of these as the object's
``_repr_html_``, so that every card is drawn here and a run's card can open with the judgement, which is computed above it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from ...core import as_polars, cell, few, kernel_mode_words
from ...metrics import COUNTED_COLUMNS, run_counts
from ...run import Run, run_arms, slot_table
from ...studies import SERIES, judge_runs, judge_witnesses
from .answer import CSS, answer_html
from .blocks import jupyter_card, render, scroll_box, summary_html


def run_card(run: Any) -> str:
    """A :class:`~analysis.Run`'s card in Jupyter: its verdict first (the answer table's row of :func:`analysis.judge`), then
    what served it, its plan, what it lacks, and per c how much of it matched m=1.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    str
        HTML.

    Examples
    --------
    >>> from analysis import read_run
    >>> html = run_card(read_run("data/experiment-cpu/default"))
    >>> html.index('data-verdict="RED"') < html.index("bia run")
    True
    """
    # six columns: wider than a narrow notebook
    return jupyter_card(scroll_box(answer_html(judge_runs(run), table_id=None, full=True)) + _facts(run))


def _facts(run: Run) -> str:
    """A run's card: what served it, its plan, what it lacks, and per c how much of it matched m=1."""
    manifest = run.manifest
    identity = manifest.get("identity") or {}
    facts = [
        ("engine", identity.get("engine") or manifest.get("producer")),
        ("model", (identity.get("model") or {}).get("path")),
        ("prompts", few(run.prompts)),
        ("ladder", run.ladder),
        ("requests", run.request_columns("record").height),
        ("complete", manifest.get("complete", True)),
        ("missing", len(run.missing())),
        ("refused", len(manifest.get("refused") or [])),
        ("capture records left out", len(run.dump.skipped)),
    ]
    mode = kernel_mode_words(manifest)
    if mode:  # as the verdict card says it: as asked, and the mode that ran when it differs, after what served it
        facts.insert(1, ("kernel mode", mode))
    if manifest.get("arms") is not None:
        facts.insert(3, ("arms", ", ".join(manifest["arms"])))
    lines = []
    armed = manifest.get("arms") is not None
    slots = slot_table(run, columns=[*COUNTED_COLUMNS, *(["arm"] if armed else [])])
    # a run with control arms is counted arm by arm: a warm cache's c=1 is not the copies' c=1
    for arm in run_arms(manifest) if armed else [None]:
        counts = run_counts(slots if arm is None else slots.filter(pl.col("arm") == arm))
        for c, requests, bitwise, known, same, earliest in counts.select(
            "c", "requests", "bitwise", "bits_known", "same", "first"
        ).iter_rows():
            words = f"{arm + ' ' if arm else ''}c={c}: " + _bits_words(requests, bitwise, known, same)
            words += f"; the earliest parts at token {earliest}" if earliest is not None else ""
            lines.append((words, "pass" if bitwise == requests else "fail" if same < requests else None))
    return summary_html("bia run", run.label, facts, lines)


def _bits_words(requests: int, bitwise: int, known: int, same: int) -> str:
    """How many of a c's requests matched ref #1 in bits and in tokens, and how many have bits no one can know (tokens that
    all match ref #1's with no logprobs to compare: a request that parts in tokens is known not to be bit-identical).

    Examples
    --------
    >>> _bits_words(4, 3, 4, 4)
    '3 of 4 requests bit-identical to ref #1, 4 token-identical'
    >>> _bits_words(4, 0, 1, 3)
    '0 of 4 requests bit-identical to ref #1, 3 with bits unknown (no logprobs), 3 token-identical'
    """
    unknown = f", {requests - known} with bits unknown (no logprobs)" if known < requests else ""
    return f"{bitwise} of {requests} requests bit-identical to ref #1{unknown}, {same} token-identical"


def witness_card(ws: Any) -> str:
    """A :class:`~analysis.WitnessSet`'s card in Jupyter: bia's verdict first (the answer table's rows of
    :func:`analysis.judge`), then counts, each witness's verdict beside what the file records and what its own rules
    re-derive, the first bands.

    Parameters
    ----------
    ws : WitnessSet
        The witnesses, in either backend.

    Returns
    -------
    str
        HTML.

    Examples
    --------
    >>> from analysis import read_witnesses
    >>> html = witness_card(read_witnesses("data/aprender-lambda"))
    >>> html.index('data-verdict="RED"') < html.index("bia witnesses") < html.index("as recorded in the file PASS")
    True
    """
    polars_set = ws.to_backend("polars")
    facts = [
        ("witnesses", polars_set.witnesses.height),
        ("bands", polars_set.bands.height),
        ("slots", polars_set.slots.height),
        ("release markers", polars_set.markers.height),
        ("discrepancies", polars_set.discrepancies.height),
    ]
    judgement = judge_witnesses(polars_set)
    verdicts = {Path(row["run"]).name: row for row in judgement}
    lines = []
    for source, recorded, derived in polars_set.witnesses.select(
        "source", "recorded_verdict", "derived_verdict"
    ).iter_rows():
        row = verdicts.get(Path(source).name)
        said = f"bia {row['verdict']}" + (f" ({row['cause']})" if row["cause"] else "") if row else "bia: not judged"
        lines.append(
            (
                f"{source}: {said}; as recorded in the file {cell(recorded)}, re-derived by its rules {cell(derived)}",
                CSS[row["verdict"]] if row else None,
            )
        )
    columns = ("source", "c", "m_formed", "divergence_at", "decode_tok_s", "result", "derived_result")
    bands = polars_set.bands.select([c for c in columns if c in polars_set.bands.columns])
    answer = scroll_box(answer_html(judgement, table_id=None, full=True))
    return jupyter_card(answer + summary_html("bia witnesses", None, facts, lines, bands))


_DUMP_PREVIEW = (
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


def dump_card(dump: Any) -> str:
    """A :class:`~analysis.Dump`'s card in Jupyter: sizes, sources and formats, what was left out, counts that differ for a
    known reason, the first requests.

    Parameters
    ----------
    dump : Dump
        The dump (either backend).

    Returns
    -------
    str
        HTML.

    Examples
    --------
    >>> from analysis import read_run
    >>> html = dump_card(read_run("data/experiment-cpu/default").dump)
    >>> "bia dump" in html and "records left out" in html
    True
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
    return summary_html(
        "bia dump", None, facts, lines, requests.select([c for c in _DUMP_PREVIEW if c in requests.columns])
    )


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


def history_card(history: Any) -> str:
    """A :class:`~analysis.History`'s card in Jupyter: its size and span, each regression its rules find, the first entries.

    Parameters
    ----------
    history : History
        The history.

    Returns
    -------
    str
        HTML.

    Examples
    --------
    >>> from analysis import read_history
    >>> html = history_card(read_history("data/aprender-lambda"))
    >>> "bia history" in html and "series (host, engine, model, settings)" in html
    True
    """
    entries = history.entries
    span = entries["time"].drop_nulls()
    facts = [
        ("entries", entries.height),
        ("series (host, engine, model, settings)", entries.select(SERIES).unique().height),
        ("from", span.min() if span.len() else None),
        ("to", span.max() if span.len() else None),  # as every time is shown
        ("markers", history.markers.height),
    ]
    lines = [
        (f"{r['rule']}: {r['host']} {r['engine']} c={r['c']}, first bad {cell(r['first_bad_time'])}", "fail")
        for r in history.regressions().iter_rows(named=True)
    ]
    # a commit's 40 hex digits are most of a row: 10 are enough to tell commits apart, the rest in each cell's tooltip
    preview = entries.select("time", "kind", *SERIES, "commit", "verdict")
    return jupyter_card(summary_html("bia history", None, facts, lines, preview, shorten={"commit": 10}))


def shape_verdict_card(verdict: Any) -> str:
    """A V3 :class:`~analysis.ShapeVerdict`'s card in Jupyter: the status, the source and each reason.

    Parameters
    ----------
    verdict : ShapeVerdict
        The verdict.

    Returns
    -------
    str
        HTML.

    Examples
    --------
    >>> from analysis import shape_check
    >>> html = shape_verdict_card(shape_check("data/aprender-lambda/witness@464c168e62.json"))
    >>> "NOT ADMISSIBLE" in html
    True
    """
    return jupyter_card(render("verdict.html.j2", verdict=verdict))


def study_card(study: Any) -> str:
    """A :class:`~analysis.Study`'s card in Jupyter: where the dataset lies, how much it holds, and each run's engine and
    model (counted from the Parquet files' metadata: no token is read).

    Parameters
    ----------
    study : Study
        The dataset, opened by :func:`~analysis.scan_study`.

    Returns
    -------
    str
        HTML.

    Examples
    --------
    >>> import tempfile
    >>> from analysis import scan_study, write_dataset
    >>> html = study_card(scan_study(write_dataset("data/experiment-cpu/default", tempfile.mkdtemp())))
    >>> "bia study" in html and ">default</td>" in html
    True
    """
    facts = [
        ("runs", study.runs.height),
        ("partitions (run, prompt)", len(study.partitions())),
        ("requests", study.requests.select(pl.len()).collect().item()),
        ("scored tokens", study.tokens.select(pl.len()).collect().item()),
        ("path", study.path),
    ]
    identities = [json.loads(text).get("identity") or {} for text in study.runs["manifest"]]
    runs = study.runs.select(
        "run",
        pl.Series("engine", [i.get("engine") for i in identities], dtype=pl.String),
        pl.Series("model", [(i.get("model") or {}).get("path") for i in identities], dtype=pl.String),
        "path",
    )
    return summary_html("bia study", None, facts, [], runs, preview_rows=10)
