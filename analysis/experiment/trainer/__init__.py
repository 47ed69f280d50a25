"""The trainer family of the experiment: a sampler's tokens recomputed as an RL trainer recomputes them, with
one teacher-forced forward pass per sequence, and each pair written as prime-rl's token export.

:func:`write_trainer_pairs` recomputes an experiment run's sampled sequences in its kernel mode with bia's
own model (:func:`recompute_logprobs`); :func:`sample_rollouts`, :func:`trainer_logprobs` and
:func:`write_pair` make a real pair, vLLM sampling and transformers recomputing.

Importing this face does not import torch: the two recompute functions are loaded on first use.
"""

from ._rl_pair import PairError, rollout_body, rollout_from_answer, sample_rollouts, trainer_logprobs, write_pair

_TORCH_NAMES = ("recompute_logprobs", "write_trainer_pairs")  # in ._recompute, which imports torch


def __getattr__(name: str):
    if name in _TORCH_NAMES:
        from . import _recompute

        return getattr(_recompute, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PairError",
    "recompute_logprobs",
    "rollout_body",
    "rollout_from_answer",
    "sample_rollouts",
    "trainer_logprobs",
    "write_pair",
    "write_trainer_pairs",
]
