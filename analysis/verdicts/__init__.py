"""Verdicts: aprender's V3 serving-shape check, the witness rules of each version, and the trend's regression rules."""

from ._regressions import REGRESSION_RULES, SERIES, Rule, regressions
from ._v3 import EXIT_MISSING, EXIT_RED, ShapeVerdict, shape_check, shape_check_data, shape_check_text
from ._v3_policy import PolicyError, V3Policy
from ._witness_rules import derive_band_result, derive_run_verdict

__all__ = [
    "EXIT_MISSING",
    "EXIT_RED",
    "REGRESSION_RULES",
    "SERIES",
    "PolicyError",
    "Rule",
    "ShapeVerdict",
    "V3Policy",
    "derive_band_result",
    "derive_run_verdict",
    "regressions",
    "shape_check",
    "shape_check_data",
    "shape_check_text",
]
