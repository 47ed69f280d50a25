"""Across runs: studies larger than memory, the history of runs over time, and runs side by side."""

from ._attribution import attribution_shares, attribution_table, prefill_table
from ._history import RESULT_SETTINGS, History, HistoryError, append_history, read_history
from ._certificate import certificate
from ._engines import engine_table
from ._judge import judge
from ._judgement import Judgement, answer_html
from ._modes import mode_comparison
from ._study import Study, scan_study, study_tables, write_dataset

__all__ = ["Judgement", "RESULT_SETTINGS", "History", "HistoryError", "Study", "answer_html", "append_history", "attribution_shares", "attribution_table", "certificate", "engine_table", "judge", "mode_comparison", "prefill_table", "read_history", "scan_study", "study_tables", "write_dataset"]
