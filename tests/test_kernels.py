"""The fixed-tiles kernel mode: every request's bits equal its own decode alone (m=1) at every batch size c
in 1..32, at every slot position, in both layouts, in float32 and bfloat16, with prompt lengths mixed in one
batch; the same check finds the drift with the mode off, and with plain matmuls in place of the tiles."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from analysis.experiment import bundled_model  # noqa: E402
from analysis.experiment import kernels  # noqa: E402
from analysis.experiment.decode import decode  # noqa: E402
from analysis.experiment.model import load_model  # noqa: E402

# lengths from 5 to 80 bytes: with the completion, one batch spans one to three attention splits
PROMPTS = [
    "Raise",
    "If the argument is",
    "Return a new list of the values in the order given",
    "This function returns the number of items in the sequence; if the argument is not a sequence, raise",
]
TOKENS = 6
LADDER = range(1, 33)


def _bits(decoded) -> tuple:
    return decoded.token_ids, decoded.logprobs, decoded.top_ids, decoded.top_logprobs


def _batch(layout: str, c: int) -> list[int]:
    """The prompt index of every row: ``copies`` is c copies of one prompt; ``needle`` mixes every prompt, each
    c placing each prompt at other slot positions, so over the ladder every prompt sits at every position."""
    if layout == "copies":
        return [c % len(PROMPTS)] * c
    return [(row + c) % len(PROMPTS) for row in range(c)]


def _mismatches(model, mode: str, layout: str) -> list[tuple[int, int]]:
    """(c, row) of every row whose tokens, logprobs or top-k differ in any bit from its prompt decoded alone."""
    encoded = [model.encode(p) for p in PROMPTS]
    alone = [_bits(decode(model, [p], mode=mode, max_tokens=TOKENS, top_k=3)[0]) for p in encoded]
    found = []
    for c in LADDER:
        rows = _batch(layout, c)
        outs = decode(model, [encoded[i] for i in rows], mode=mode, max_tokens=TOKENS, top_k=3)
        found += [(c, row) for row, (i, out) in enumerate(zip(rows, outs)) if _bits(out) != alone[i]]
    return found


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def model(request):
    return load_model(bundled_model(), getattr(torch, request.param))


@pytest.fixture(scope="module")
def float32_model():
    return load_model(bundled_model(), torch.float32)


@pytest.mark.parametrize("layout", ["copies", "needle"])
def test_fixed_tiles_rows_equal_m1_at_every_c_and_position(model, layout):
    assert _mismatches(model, "fixed-tiles", layout) == []


def test_the_same_check_finds_the_default_modes_drift(float32_model):
    """The check above with the mode off: batched rows part from m=1 somewhere on the ladder."""
    assert len(_mismatches(float32_model, "default", "needle")) > 0


def test_the_same_check_fails_with_plain_matmuls_in_place_of_the_tiles(float32_model, monkeypatch):
    """fixed-tiles with no padding to whole tiles and its Linear layers as one plain matmul over the batch's rows
    (the shapes torch sees in the default mode): the tiles are what buys the bits."""
    monkeypatch.setattr(kernels, "_padded", lambda ids, positions, rows, limits, cache: (ids, positions, rows, limits))
    monkeypatch.setattr(kernels, "_linear", lambda layer, x: torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert len(_mismatches(float32_model, "fixed-tiles", "needle")) > 0


def test_a_rerun_is_bit_identical(model):
    encoded = [model.encode(PROMPTS[i]) for i in _batch("needle", 32)]
    first, again = (decode(model, encoded, mode="fixed-tiles", max_tokens=TOKENS, top_k=3) for _ in range(2))
    assert [_bits(o) for o in first] == [_bits(o) for o in again]


def test_rows_match_the_default_mode_within_rounding(float32_model):
    """The same model, other summation orders: the logprobs of a request alone agree to float32 rounding."""
    prompt = float32_model.encode(PROMPTS[2])
    tiled, plain = (decode(float32_model, [prompt], mode=mode, max_tokens=TOKENS, top_k=3)[0] for mode in ("fixed-tiles", "default"))
    assert tiled.token_ids == plain.token_ids
    assert max(abs(a - b) for a, b in zip(tiled.logprobs, plain.logprobs)) < 1e-4


def test_a_hugging_face_model_is_refused():
    class Other(torch.nn.Module):
        pass

    with pytest.raises(ValueError, match="the fixed-tiles mode runs bia.s own TinyLM layers"):
        decode(Other(), [[1, 2]], mode="fixed-tiles", max_tokens=1, top_k=1)
