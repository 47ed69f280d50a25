"""The fixed-tiles and row-invariant kernel modes: every request's bits equal its own decode alone (m=1) at every
batch size c in 1..32, at every slot position, in both layouts, in float32 and bfloat16, with prompt lengths mixed in
one batch; the same check finds the drift with the mode off, with plain matmuls in place of the tiles, and with lone
rows handed to the BLAS's GEMV. row-invariant's one-pass forward over prompt and completion gives every token the
bits its decode step gave."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from analysis.experiment import bundled_model  # noqa: E402
from analysis.experiment.model import decode, kernels, load_model, rowwise  # noqa: E402
from analysis.experiment.modes import INVARIANT_MODES, PREFILL_DECODE_MODES  # noqa: E402

pytestmark = pytest.mark.slow

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


@pytest.mark.parametrize("mode", ["fixed-tiles", "row-invariant"])
@pytest.mark.parametrize("layout", ["copies", "needle"])
def test_packed_modes_rows_equal_m1_at_every_c_and_position(model, mode, layout):
    assert _mismatches(model, mode, layout) == []


def test_the_invariant_modes_are_named():
    assert INVARIANT_MODES == ("one-by-one", "fixed-tiles", "row-invariant")
    assert PREFILL_DECODE_MODES == ("fixed-tiles", "row-invariant")


def test_the_same_check_finds_the_default_modes_drift(float32_model):
    """The check above with the mode off: batched rows part from m=1 somewhere on the ladder."""
    assert len(_mismatches(float32_model, "default", "needle")) > 0


def test_the_same_check_fails_with_plain_matmuls_in_place_of_the_tiles(float32_model, monkeypatch):
    """fixed-tiles with no padding to whole tiles and its Linear layers as one plain matmul over the batch's rows
    (the shapes torch sees in the default mode): the tiles are what buys the bits."""
    monkeypatch.setattr(kernels, "_padded", lambda ids, positions, rows, limits, cache: (ids, positions, rows, limits))
    monkeypatch.setattr(kernels, "_linear", lambda layer, x: torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert len(_mismatches(float32_model, "fixed-tiles", "needle")) > 0


@pytest.mark.parametrize("mode", ["fixed-tiles", "row-invariant"])
def test_a_rerun_is_bit_identical(model, mode):
    encoded = [model.encode(PROMPTS[i]) for i in _batch("needle", 32)]
    first, again = (decode(model, encoded, mode=mode, max_tokens=TOKENS, top_k=3) for _ in range(2))
    assert [_bits(o) for o in first] == [_bits(o) for o in again]


@pytest.mark.parametrize("mode", ["fixed-tiles", "row-invariant"])
def test_rows_match_the_default_mode_within_rounding(float32_model, mode):
    """The same model, other summation orders: the logprobs of a request alone agree to float32 rounding."""
    prompt = float32_model.encode(PROMPTS[2])
    packed, plain = (decode(float32_model, [prompt], mode=m, max_tokens=TOKENS, top_k=3)[0] for m in (mode, "default"))
    assert packed.token_ids == plain.token_ids
    assert max(abs(a - b) for a, b in zip(packed.logprobs, plain.logprobs)) < 1e-4


@pytest.mark.parametrize("mode", ["fixed-tiles", "row-invariant"])
def test_a_hugging_face_model_is_refused(mode):
    class Other(torch.nn.Module):
        pass

    with pytest.raises(ValueError, match=f"the {mode} mode runs bia.s own TinyLM layers"):
        decode(Other(), [[1, 2]], mode=mode, max_tokens=1, top_k=1)


def _in_place(param: torch.Tensor, value: torch.Tensor) -> None:
    """``param`` overwritten as ``load_state_dict`` or an optimizer step does it (in place, under no_grad)."""
    with torch.no_grad():
        param.copy_(value)


def test_row_invariant_reads_the_models_weights_as_they_are_now(float32_model):
    """The mode looks a model's parameters up once and keeps them: a weight changed in place, a Parameter replaced
    and a layer replaced are each decoded as a fresh copy of the changed model decodes (one the mode never saw)."""
    model = copy.deepcopy(float32_model)
    prompt = model.encode(PROMPTS[1])
    run = lambda m: _bits(decode(m, [prompt], mode="row-invariant", max_tokens=TOKENS, top_k=3)[0])  # noqa: E731
    seen = [run(model)]
    changes = [lambda: _in_place(model.head.weight, model.head.weight.flip(0)),  # in place: token k scores as 255 - k
               lambda: setattr(model.head, "weight", torch.nn.Parameter(model.head.weight.data.flip(0))),  # undone, replaced
               lambda: setattr(model.blocks[0], "fc", copy.deepcopy(model.blocks[1].fc))]  # a layer swapped for a copy
    for change in changes:
        change()
        seen.append(run(model))
        assert seen[-1] == run(copy.deepcopy(model)) and seen[-1] != seen[-2]


def test_row_invariant_is_refused_off_the_cpu():
    """It rests on MKL's CPU GEMM; a model elsewhere (here on torch's meta device, which no GPU needs) is refused by name."""
    from analysis.experiment.model import ModelConfig, TinyLM

    with pytest.raises(ValueError, match="the row-invariant mode rests on MKL's CPU GEMM; on meta use fixed-tiles"):
        decode(TinyLM(ModelConfig(n_layers=1)).to("meta"), [[1, 2]], mode="row-invariant", max_tokens=1, top_k=1)


def test_row_invariant_refuses_mkls_compatible_branch(float32_model, monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    with pytest.raises(ValueError, match="MKL_CBWR=COMPATIBLE does not: set MKL_CBWR=AVX2"):
        decode(float32_model, [[1, 2]], mode="row-invariant", max_tokens=1, top_k=1)


# --- row-invariant: what it rests on, and the prefill ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_blas_sums_every_row_alike_from_min_rows_up(float32_model, dtype):
    """The property row-invariant rests on, for each of the model's Linear shapes: on one thread, a row's GEMM
    result is the same bits whether it shares the call with 3 zero rows or sits anywhere among 4..600 rows. If a BLAS
    breaks it, this names the shape and the row count before the decode tests fail. The mode's GEMM reads a float32
    weight transposed once (``_linear_weights``): it also gives ``F.linear``'s bits, those the bundled runs were made with."""
    torch.manual_seed(0)
    layers = [float32_model.head, *(getattr(b, name) for b in float32_model.blocks[:1] for name in ("qkv", "out", "fc", "proj"))]
    for layer in layers:
        layer = copy.deepcopy(layer).to(getattr(torch, dtype))  # a copy: .to() on a module changes it in place
        x = torch.randn(640, layer.weight.shape[1], dtype=layer.weight.dtype)
        weights = rowwise._linear_weights(layer)
        with torch.no_grad(), rowwise.one_thread():  # as the mode runs: MKL's threads would split the rows
            alone = torch.cat([rowwise._linear(rowwise.pad_to_min_rows(x[i:i + 1]), weights)[:1] for i in range(len(x))])
            ladder = [(n, start) for n in (*range(4, 41), 64, 333, 600) for start in (0, 1, 3, 13)]
            parted = [(n, start) for n, start in ladder if not torch.equal(rowwise._linear(x[start:start + n], weights), alone[start:start + n])]
            unlike = [(n, start) for n, start in ladder
                      if not torch.equal(torch.nn.functional.linear(x[start:start + n], layer.weight, layer.bias), alone[start:start + n])]
        assert parted == [], f"{tuple(layer.weight.shape)} {dtype}: (rows, first row) whose bits moved: {parted[:5]}"
        assert unlike == [], f"{tuple(layer.weight.shape)} {dtype}: (rows, first row) where F.linear sums otherwise: {unlike[:5]}"


def test_lone_rows_on_the_gemv_part_from_m1(float32_model, monkeypatch):
    """row-invariant with no padding to MIN_ROWS: a lone request's rows go to the BLAS's GEMV, which sums in
    another order than its GEMM, and the check above finds the batches that part from m=1 (float32; MKL)."""
    monkeypatch.setattr(rowwise, "MIN_ROWS", 1)
    assert len(_mismatches(float32_model, "row-invariant", "needle")) > 0


def _teacher_forced(model, sequences: list[list[int]]) -> list[list[float]]:
    """One row-invariant forward over every sequence at once (a trainer's recompute): per sequence, the float32
    logprob of each token after the first, given the tokens before it."""
    lengths = torch.tensor([len(s) for s in sequences])
    cache = rowwise.TiledCache.empty(model, len(sequences), int(lengths.max()))
    ids = torch.tensor([t for s in sequences for t in s])
    positions = torch.cat([torch.arange(len(s)) for s in sequences])
    with torch.no_grad():
        logits = rowwise.forward(model, ids, positions, torch.arange(len(sequences)).repeat_interleave(lengths), cache,
                                 want=torch.arange(len(ids)), prefill=True)
    logprobs = logits.float().log_softmax(dim=-1).gather(-1, ids.roll(-1)[:, None])[:, 0].tolist()
    starts = [0, *lengths.cumsum(0).tolist()]
    return [logprobs[a: b - 1] for a, b in zip(starts, starts[1:])]


def test_row_invariant_prefill_gives_the_decode_steps_bits(model):
    """Sequences of mixed lengths decoded together (c=3), then prompt and completion scored in one forward at
    another batch size (the three plus a fourth): each completion token's logprob is the decode step's, bit for bit."""
    prompts = [model.encode(p) for p in PROMPTS[:3]]
    outs = decode(model, prompts, mode="row-invariant", max_tokens=TOKENS, top_k=3)
    sequences = [p + o.token_ids for p, o in zip(prompts, outs)]
    scored = _teacher_forced(model, sequences + [model.encode(PROMPTS[3])])
    for prompt, out, row in zip(prompts, outs, scored):
        assert row[len(prompt) - 1:] == out.logprobs


def test_prefill_on_the_gemv_parts_from_decode(float32_model, monkeypatch):
    """The check above with lone decode rows on the GEMV (no MIN_ROWS padding): the decode of one request and its
    one-pass recompute no longer agree in every bit."""
    monkeypatch.setattr(rowwise, "MIN_ROWS", 1)
    prompt = float32_model.encode(PROMPTS[1])
    out = decode(float32_model, [prompt], mode="row-invariant", max_tokens=TOKENS, top_k=3)[0]
    (row,) = _teacher_forced(float32_model, [prompt + out.token_ids])
    assert row[len(prompt) - 1:] != out.logprobs
