"""Across runs: studies larger than memory, the history of runs over time, and runs side by side."""

from ._attribution import attribution_shares, attribution_table, prefill_table
from ._history import HistoryError, append_history, read_history
from ._history_frames import RESULT_SETTINGS, History
from ._certificate import certificate
from ._engines import engine_table
from ._judge import judge
from ._judgement import judge_runs
from ._judgement_frame import EXIT_CODES, VERDICTS, Judgement, worst
from ._judgement_words import rate_words
from ._comparison import mode_comparison
from ._study import Study, scan_study, study_tables, write_dataset
from ._attribution import LADDER, UNEXPLAINED
from ._certificate import certificate_document
from ._engines import default_engine_reference
from ..verdicts import REGRESSION_RULES, SERIES
from ._comparison import engine_label
from ._rl_mismatch import TOP_SEQUENCES, largest_k3, mismatch_summaries, mismatch_tokens, stale_pairs, trainer_pairs
from ._witness_judgement import judge_witnesses

__all__ = ["EXIT_CODES", "History", "HistoryError", "Judgement", "LADDER", "REGRESSION_RULES", "RESULT_SETTINGS", "SERIES", "Study", "TOP_SEQUENCES", "UNEXPLAINED", "VERDICTS", "append_history", "attribution_shares", "attribution_table", "certificate", "certificate_document", "default_engine_reference", "engine_label", "engine_table", "judge", "judge_runs", "judge_witnesses", "largest_k3", "mismatch_summaries", "mismatch_tokens", "mode_comparison", "prefill_table", "rate_words", "read_history", "scan_study", "stale_pairs", "study_tables", "trainer_pairs", "worst", "write_dataset"]
