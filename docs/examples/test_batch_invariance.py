"""A pytest file as an engine's suite would hold it: docs/testing.md shows it, and tests/test_testing.py runs it with pytest."""

import pytest

from analysis.testing import assert_batch_invariant, assert_dumps_equal


def generate(prompts):
    """Your engine's batched generate: one result per prompt, greedy. This one ignores its batch, so it passes."""
    return [{"token_ids": [ord(ch) for ch in prompt], "logprobs": [-0.5] * len(prompt)} for prompt in prompts]


def test_my_engine_is_batch_invariant():
    assert_batch_invariant(generate, prompts=["The capital of France is"], ladder=[1, 4, 8])


def test_a_recorded_run_stays_batch_invariant():
    assert_batch_invariant("data/experiment-cpu/row-invariant")


def test_the_default_kernels_are_not():
    with pytest.raises(AssertionError, match="RED"):
        assert_batch_invariant("data/experiment-cpu/default")


def test_two_dumps_of_one_run_are_equal_bit_for_bit():
    assert_dumps_equal("data/experiment-cpu/fixed-tiles/captures", "data/experiment-cpu/fixed-tiles/captures")
