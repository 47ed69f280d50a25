"""RL sampler-trainer mismatch, one family of the measures: the rollout's logprobs against the trainer's recompute of
the same tokens, as each framework logs it (``_rl``), over the per-token pass (``_mismatch``, ``_mismatch_blocks``,
``_mismatch_block_sums``, ``_mismatch_kernel`` compiled where numba is installed) and the sampling masks' support
(``_support``)."""

from ._rl import mismatch_summary, mismatch_table
from ._support import SamplingMaskError

__all__ = ["SamplingMaskError", "mismatch_summary", "mismatch_table"]
