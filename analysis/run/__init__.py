"""A run: the unit a probe or an experiment writes and the report reads.

Layout of a run directory (``run_version`` 2; version 1, which named ``c`` ``band_c``, is read as legacy)::

    manifest.json        identity, sampler, ladder, declared_min, environment, requested and
                         effective settings, prompts, and m_formed per band
    captures/*.jsonl     raw captures as received, one request per line, in bia's capture
                         envelope: {"sse": "<raw SSE>" | "response": {...}, "arrival_times": [...],
                         "t_sent": ..., "prompt_id": ..., "role": "reference" | "band",
                         "c": c, "slot": i, "repeat": r}
                         (role "reference": slot 0 is ref #1, slot 1 ref #2; "observer": a band's
                         twin fired without logprobs; "filler": the needle layout's other requests)
    partial/             the probe's requests in flight (raw bytes and event times); a stopped run
                         keeps them, and ``Run.missing`` names them
    refused.jsonl        the bytes of streams the probe refused; superseded/: what a resume set aside
    derived/             Parquet tables, rebuildable from captures/ (``Run.write_derived``); derived/pieces/ the same
                         parsed a chunk at a time and split by prompt (:func:`run_pieces`, what judge reads)
    witness.json         an aprender witness_version 3, rebuildable (``to_witness``)
    first_ops.json       an experiment's first op that differs per batched step (``first_op_table``)

:func:`read_run` reads it; :func:`assemble_run` builds the same object from loose dumps and a
mapping of which file is which prompt, band and slot, :func:`assemble_dumps` from dumps whose capture
envelopes say so (or a mapping file, or one band per file); :func:`write_run` writes a run as a
directory that :func:`read_run` reads back to the same frames.
"""

from ._arms import ARM_REPEATS, ARM_WORDS, ARMS, PREFIX_SHARES, arm_words, legacy_arm, run_arms
from ._assemble import assemble_dumps, read_mapping
from ._band_tables import band_forks, band_table, width_table
from ._batch import LAYOUTS as LAYOUTS  # for the probe and the experiment, not the API pages
from ._batch import ROTATING as ROTATING
from ._batch import band_batch as band_batch
from ._batch import batch_id as batch_id
from ._batch import filler_text as filler_text
from ._batch import rotating_batch as rotating_batch
from ._drift_tables import drift_by_c, drift_envelope, drift_table, drift_with_c
from ._export import to_witness, write_witness
from ._first_ops import first_op_table, first_ops_record, has_first_ops
from ._formed import jsonable as jsonable  # for the studies, which write a run's manifest, not the API pages
from ._layout import (
    RUN_VERSION,
    CapturesCutShort,
    RunError,
    RunLike,
    Unit,
    band_widths,
    load_manifest,
    plan,
    remake_step,
)
from ._layout import width_evidence as width_evidence  # for the probe's fire-again rule, not the API pages
from ._mlperf import read_mlperf_pair
from ._model import Run
from ._open import read_run
from ._pieces import plan_run as plan_run  # for the studies' streamed runs, not the API pages
from ._pieces import prepare_pieces as prepare_pieces  # for the studies' prepare_runs, not the API pages
from ._pieces import run_pieces
from ._piecewise import merged_tables as merged_tables  # for the studies and views, not the API pages
from ._piecewise import piecewise as piecewise
from ._prompt_tables import (
    accuracy_table,
    flip_table,
    observer_table,
    prompt_table,
    reference_margins,
)
from ._read import assemble_run
from ._slot_tables import SLOT_COLUMNS as SLOT_COLUMNS  # for readers that ask for some columns, not the API pages
from ._slot_tables import reference_table, slot_table
from ._steps import numbered_steps as numbered_steps  # for the studies, not the API pages
from ._steps import references
from ._write import write_run

__all__ = [
    "ARMS",
    "ARM_REPEATS",
    "ARM_WORDS",
    "PREFIX_SHARES",
    "RUN_VERSION",
    "CapturesCutShort",
    "Run",
    "RunError",
    "RunLike",
    "Unit",
    "accuracy_table",
    "arm_words",
    "assemble_dumps",
    "assemble_run",
    "band_forks",
    "band_table",
    "band_widths",
    "drift_by_c",
    "drift_envelope",
    "drift_table",
    "drift_with_c",
    "first_op_table",
    "first_ops_record",
    "flip_table",
    "has_first_ops",
    "legacy_arm",
    "load_manifest",
    "observer_table",
    "plan",
    "prompt_table",
    "read_mapping",
    "read_mlperf_pair",
    "read_run",
    "reference_margins",
    "reference_table",
    "references",
    "remake_step",
    "run_arms",
    "run_pieces",
    "slot_table",
    "to_witness",
    "width_table",
    "write_run",
    "write_witness",
]
