"""Across runs: studies larger than memory, the history of runs over time, and runs side by side."""

from ..verdicts import REGRESSION_RULES, SERIES
from ._attribution import LADDER, UNEXPLAINED, attribution_shares, attribution_table, prefill_table
from ._certificate import certificate, certificate_document
from ._comparison import engine_label, mode_comparison
from ._engines import default_engine_reference, engine_table
from ._history import HistoryError, append_history, read_history
from ._history_frames import RESULT_SETTINGS, History
from ._judge import judge
from ._judge_study import judge_runs
from ._judgement_cost import RATIO_HEADING, RATIO_WORDS, baseline_words, ratio_cell, run_decode_cost
from ._judgement_domain import domain_words
from ._judgement_evidence import BATCHED_ARMS, STATE_COLUMNS, part_counts, request_states
from ._judgement_frame import EXIT_CODES, VERDICTS, Judgement, worst
from ._judgement_words import rate_words
from ._next_steps import repro_folder, repro_step
from ._rl_mismatch import TOP_SEQUENCES, largest_k3, mismatch_summaries, mismatch_tokens, stale_pairs, trainer_pairs
from ._sources import (
    HISTORY_READS,
    KINDS,
    NothingToRead,
    Sources,
    SourceSkipped,
    dump_kind,
    is_history,
    is_run_dir,
    is_study,
    looks_like_witness,
    run_directories,
    sort_sources,
)
from ._streamed import open_runs, prepare_runs
from ._study import Study, scan_study, study_tables, write_dataset
from ._witness_judgement import judge_witnesses

__all__ = [
    "BATCHED_ARMS",
    "EXIT_CODES",
    "HISTORY_READS",
    "KINDS",
    "LADDER",
    "RATIO_HEADING",
    "RATIO_WORDS",
    "REGRESSION_RULES",
    "RESULT_SETTINGS",
    "SERIES",
    "STATE_COLUMNS",
    "TOP_SEQUENCES",
    "UNEXPLAINED",
    "VERDICTS",
    "History",
    "HistoryError",
    "Judgement",
    "NothingToRead",
    "SourceSkipped",
    "Sources",
    "Study",
    "append_history",
    "attribution_shares",
    "attribution_table",
    "baseline_words",
    "certificate",
    "certificate_document",
    "default_engine_reference",
    "domain_words",
    "dump_kind",
    "engine_label",
    "engine_table",
    "is_history",
    "is_run_dir",
    "is_study",
    "judge",
    "judge_runs",
    "judge_witnesses",
    "largest_k3",
    "looks_like_witness",
    "mismatch_summaries",
    "mismatch_tokens",
    "mode_comparison",
    "open_runs",
    "part_counts",
    "prefill_table",
    "prepare_runs",
    "rate_words",
    "ratio_cell",
    "read_history",
    "repro_folder",
    "repro_step",
    "request_states",
    "run_decode_cost",
    "run_directories",
    "scan_study",
    "sort_sources",
    "stale_pairs",
    "study_tables",
    "trainer_pairs",
    "worst",
    "write_dataset",
]
