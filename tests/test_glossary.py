"""docs/glossary.md documents every column of every public table, and nothing a table no longer has.

Each public table is built from the bundled data and its columns are held against the glossary section of the same
name (a ``### heading``; the section's table lists one backticked column per row, in the first cell).
"""

from __future__ import annotations

import fnmatch
import re

import polars as pl
import pytest
from conftest import ROOT

import analysis
from analysis.io._bundled import default_rl_pairs
from analysis.run import reference_table

pytestmark = pytest.mark.slow

GLOSSARY = ROOT / "docs" / "glossary.md"

# Sections that list only the columns they add to others' (study frames are run tables or dump frames plus keys).
INHERITS = {
    "study_tables": ("slot_table", "band_table", "prompt_table"),
    "Study: tokens, candidates, requests": ("Dump and Run: tokens", "Dump and Run: candidates", "Dump and Run: requests"),
}


def documented() -> dict[str, list[str]]:
    """Each ``### section`` of the glossary and the backticked names in the first cell of its table's rows."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            current = line[4:].strip()
            sections[current] = []
        elif line.startswith("## "):
            current = None
        elif current is not None and (row := re.match(r"^\|\s*`([^`]+)`\s*\|", line)):
            sections[current].append(row.group(1))
    return sections


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, list[pl.DataFrame]]:
    """Every public table, built from the bundled data, under the name of its glossary section."""
    ws = analysis.read_witnesses(ROOT / "data/aprender-lambda")
    run = analysis.read_run(ROOT / "data/experiment-cpu/default")  # an experiment run: first_ops.json, no arms
    served = analysis.read_run(ROOT / "data/llamacpp-cpu/cache-prompt")  # a served run: widths from metrics, both references
    dump = analysis.read_dumps(ROOT / "data/vllm-cpu/prefix-cache/captures/")
    study_path = tmp_path_factory.mktemp("study") / "study"
    analysis.write_dataset(ROOT / "data/experiment-cpu", study_path)
    study, per_run = analysis.scan_study(study_path), analysis.study_tables(study_path)
    history = analysis.read_history([*analysis.default_runs(), *analysis.default_sources()])
    pairs = analysis.read_dump(default_rl_pairs()[0])
    # the bundled pairs carry no advantage, which prime-rl's masked metrics need: a step that has one
    step = pl.DataFrame({"sequence": ["a", "a", "b"], "position": [0, 1, 0], "rollout_logprob": [-0.1, -2.0, -0.5],
                         "trainer_logprob": [-0.12, -1.9, -0.4], "mask": [True, True, True], "advantage": [1.0, 1.0, -1.0]})
    modes = [analysis.read_run(ROOT / f"data/experiment-cpu/{mode}") for mode in ("default", "fixed-tiles", "batch-invariant", "row-invariant")]
    attribution = analysis.attribution_table(served)
    return {
        "WitnessSet: witnesses": [ws.witnesses], "WitnessSet: bands": [ws.bands], "WitnessSet: slots": [ws.slots],
        "WitnessSet: markers": [ws.markers], "WitnessSet: discrepancies": [ws.discrepancies],
        "Dump and Run: tokens": [dump.tokens, run.tokens], "Dump and Run: candidates": [dump.candidates, run.candidates],
        "Dump and Run: requests": [dump.requests, run.requests],
        "slot_table": [analysis.slot_table(run)], "reference_table": [reference_table(served)], "band_table": [analysis.band_table(run)],
        "prompt_table": [analysis.prompt_table(run)], "flip_table": [analysis.flip_table(run)], "drift_table": [analysis.drift_table(run)],
        "band_forks": [analysis.band_forks(run)], "width_table": [analysis.width_table(served)],
        "observer_table": [analysis.observer_table(served)], "accuracy_table": [analysis.accuracy_table(served)[0]],
        "first_op_table": [analysis.first_op_table(run)],
        "study_tables": [per_run[name] for name in ("slots", "bands", "prompts", "refs", "precision")], "Study: runs": [study.runs],
        "Study: tokens, candidates, requests": [study.tokens.head(1).collect(), study.candidates.head(1).collect(),
                                                study.requests.head(1).collect()],
        "mode_comparison": [analysis.mode_comparison(modes)], "engine_table": [analysis.engine_table(analysis.default_runs())],
        "attribution_table": [attribution], "attribution_shares": [analysis.attribution_shares(attribution)],
        "judge": [analysis.judge([run, ws]).frame],
        "History: entries": [history.entries], "History: bands": [history.bands], "History: markers": [history.markers],
        "History: regressions": [history.regressions()],
        "mismatch_table": [analysis.mismatch_table(pairs), analysis.mismatch_table(step)],
        "mismatch_summary": [analysis.mismatch_summary(pairs), analysis.mismatch_summary(step)],
    }


def _columns(frames: list[pl.DataFrame]) -> list[str]:
    """The tables' columns under their coming names, in order, each once."""
    return list(dict.fromkeys(name for frame in frames for name in frame.columns))


def _covers(pattern: str, name: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern)  # `env_*`: one column per witness environment switch


def test_every_section_is_a_table_and_every_table_a_section(tables):
    sections = documented()
    assert sorted(set(tables) - set(sections)) == [], "tables without a glossary section"
    assert sorted(set(sections) - set(tables) - {"reference_margins"}) == [], "glossary sections of no table"
    assert all(sections[name] for name in tables), [name for name in tables if not sections[name]]


def test_every_column_is_in_the_glossary(tables):
    sections = documented()
    missing = {}
    for name, frames in tables.items():
        words = sections.get(name, []) + [w for other in INHERITS.get(name, ()) for w in sections.get(other, [])]
        lacking = [column for column in _columns(frames) if not any(_covers(word, column) for word in words)]
        if lacking:
            missing[name] = lacking
    assert missing == {}, f"columns docs/glossary.md does not document, by table: {missing}"


def test_no_documented_column_is_gone(tables):
    sections = documented()
    stale = {}
    for name, frames in tables.items():
        columns = _columns(frames)
        gone = [word for word in sections.get(name, []) if not any(_covers(word, column) for column in columns)]
        if gone:
            stale[name] = gone
    assert stale == {}, f"columns docs/glossary.md documents that the table no longer has, by table: {stale}"


def test_the_glossary_is_in_the_toctree():
    assert re.search(r"^glossary$", (ROOT / "docs" / "index.md").read_text(encoding="utf-8"), re.M)
