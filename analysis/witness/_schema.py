"""The witness frames' columns, and what each witness version and a release marker are known by.

The five frame schemas (witnesses, bands, slots, markers, discrepancies), the env knobs a witness records, the
verdict each exit code stands for, the probe that writes each version, and the keys that make a document a marker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

ENV_KEYS = (
    "APR_DECODE_GEMM",
    "BATCHED_PREFILL",
    "CUBLAS_GEMM_THRESHOLD",
    "CUDA_BATCH_WINDOW_MS",
    "FP8_DECODE",
    "FP8_PREFILL",
    "FUSED_GATE_UP",
    "ITERATION_SCHEDULER",
    "MULTI_PROMPT_PREFILL",
)
VERDICTS = ("PASS", "FAIL", "UNMEASURABLE")
EXIT_TO_VERDICT = {0: "PASS", 1: "FAIL", 2: "UNMEASURABLE"}
# Who writes each layout: aprender's Python probe (1, 2), its Rust port, and bia's own runs (3).
EXPECTED_PROBE = {1: ("perf041",), 2: ("perf041",), 3: ("perf041-rs", "bia")}

WITNESS_SCHEMA: dict[str, PolarsDataType] = {
    "source": pl.String,
    "witness_version": pl.Int64,
    "probe": pl.String,
    "host": pl.String,
    "commit": pl.String,
    "binary_sha256": pl.String,
    "prompt_sha256": pl.String,
    "model_path": pl.String,
    "model_dir": pl.String,
    "model_sha256": pl.String,
    "temperature": pl.Float64,
    "seed": pl.Int64,
    "ignore_eos": pl.Boolean,
    "max_tokens": pl.Int64,
    "top_logprobs": pl.Int64,
    "declared_min": pl.Int64,
    **{f"env_{key}": pl.String for key in ENV_KEYS},
    "notes": pl.List(pl.String),
    "reference_stable": pl.Boolean,
    "reference_tokens": pl.Int64,
    "reference_token_count_source": pl.String,
    "reference_self_divergence_at": pl.Int64,
    "reference_reason": pl.String,
    "recorded_exit": pl.Int64,
    "recorded_verdict": pl.String,
    "derived_verdict": pl.String,
    "verdict_agrees": pl.Boolean,
    "n_bands": pl.Int64,
    "extra": pl.String,
}
BAND_SCHEMA: dict[str, PolarsDataType] = {
    "source": pl.String,
    "witness_version": pl.Int64,
    "host": pl.String,
    "commit": pl.String,
    "band_index": pl.Int64,
    "c": pl.Int64,
    "m_formed": pl.Int64,
    "result": pl.String,
    "derived_result": pl.String,
    "result_agrees": pl.Boolean,
    "derivation_note": pl.String,
    "divergence_at": pl.Int64,
    "declared_min": pl.Int64,
    "top2_margin_at_divergence": pl.Float64,
    "decode_tok_s": pl.Float64,
    "intra_agree_to": pl.Int64,
    "max_constant_run": pl.Int64,
    "max_constant_run_declared": pl.Int64,
    "reason": pl.String,
    "n_slots": pl.Int64,
    "extra": pl.String,
}
SLOT_SCHEMA: dict[str, PolarsDataType] = {
    "source": pl.String,
    "witness_version": pl.Int64,
    "band_index": pl.Int64,
    "c": pl.Int64,
    "i": pl.Int64,
    "completion_tokens": pl.Int64,
    "finish_reason": pl.String,
    "token_count_source": pl.String,
    "agree_to": pl.Int64,
    "intra_agree_to": pl.Int64,
    "constant_run": pl.Int64,
    "decode_tok_s": pl.Float64,
    "refused": pl.String,
    "extra": pl.String,
}
MARKER_SCHEMA: dict[str, PolarsDataType] = {
    "source": pl.String,
    "cc": pl.String,
    "commit": pl.String,
    "exit": pl.Int64,
    "host": pl.String,
    "max_m": pl.Int64,
    "sha256": pl.String,
    "started_utc": pl.Datetime("us", "UTC"),
    "status": pl.String,
    "status_agrees": pl.Boolean,
    "extra": pl.String,
}
DISCREPANCY_SCHEMA: dict[str, PolarsDataType] = {
    "source": pl.String,
    "record": pl.String,
    "field": pl.String,
    "recorded": pl.String,
    "derived": pl.String,
    "rule": pl.String,
}


MARKER_KEYS = frozenset({"cc", "max_m", "status", "started_utc"})
