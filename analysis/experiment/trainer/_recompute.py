"""The RL trainer's side of the experiment: every sampled token's logprob recomputed the way a trainer
does, from one teacher-forced forward pass over prompt and completion.

An RL loop samples with an inference engine (here :func:`analysis.experiment.model.decode`, token by token with a KV cache) and
scores the same tokens again in the trainer, whose forward sees each whole sequence at once, batched
with other sequences of other lengths. The two paths give the same bits only if every kernel computes
a token's row the same way whatever the sequence length, the position and the batch: that is what
:func:`recompute_logprobs` measures, per kernel mode. :func:`write_trainer_pairs` writes a run's
sampled tokens with both logprobs as a prime-rl token export (``inference_logprobs``,
``trainer_logprobs``, ``loss_mask``), which :func:`analysis.read_dump` reads and
:func:`analysis.mismatch_summary` scores in every RL framework's terms.

How each mode batches the trainer's forward:

- ``default``: ``batch_size`` sequences right-padded to the longest (padding never attended to), one
  forward over ``[batch, length]``, as Hugging Face-style trainers pad;
- ``one-by-one``: each sequence its own batch of one;
- ``fixed-tiles``: ``batch_size`` sequences packed token after token into whole tiles
  (:mod:`analysis.experiment.model.kernels`, as packing trainers such as prime-rl's pack), each token attending to its own
  sequence;
- ``row-invariant``: the same packing, as plain GEMMs of at least 4 rows on one thread (:mod:`analysis.experiment.model.rowwise`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from ..model import check_tiled, kernels, load_model, rowwise
from ..modes import kernel_mode

__all__ = ["recompute_logprobs", "write_trainer_pairs"]


def recompute_logprobs(
    model, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *, mode: str, batch_size: int = 8
) -> list[list[float]]:
    """Every completion token's logprob from one teacher-forced forward pass, as an RL trainer recomputes it.

    Parameters
    ----------
    model : TinyLM or HFModel
        The sampler's model (:func:`analysis.experiment.model.load_model`).
    sequences : sequence of (prompt ids, completion ids)
        The sampled sequences; each prompt holds at least one token (the first completion token is
        predicted from the prompt's last).
    mode : str
        The kernel mode of the forward pass (``default``, ``one-by-one``, ``fixed-tiles``, ``row-invariant`` or an alias);
        the module's docstring says how each batches.
    batch_size : int
        Sequences per forward pass (a trainer's micro-batch).

    Returns
    -------
    list of list of float
        Per sequence, the float32 logprob of each completion token, in order (as the decode records it).

    Examples
    --------
    >>> import torch
    >>> from analysis.experiment import bundled_model
    >>> from analysis.experiment.model import decode, load_model
    >>> model = load_model(bundled_model(), torch.float32)
    >>> prompt = model.encode("If the argument is")
    >>> sampled = decode(model, [prompt], mode="fixed-tiles", max_tokens=4, top_k=1)[0]
    >>> recompute_logprobs(model, [(prompt, sampled.token_ids)], mode="fixed-tiles") == [sampled.logprobs]
    True
    """
    mode = kernel_mode(mode)
    check_tiled(model, mode)
    pairs = [(list(prompt), list(completion)) for prompt, completion in sequences]
    _check_sequences(model, pairs, batch_size)
    if mode == "one-by-one":
        batch_size = 1
    forward = {
        "fixed-tiles": functools.partial(_packed_logprobs, kernels),
        "row-invariant": functools.partial(_packed_logprobs, rowwise),
    }.get(mode, _padded_logprobs)
    out: list[list[float]] = []
    with torch.no_grad():
        for start in range(0, len(pairs), batch_size):
            out += forward(model, pairs[start : start + batch_size])
    return out


def _check_sequences(model, sequences: list[tuple[list[int], list[int]]], batch_size: int) -> None:
    """Refuse what a forward pass cannot score, naming the sequence."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    cfg = getattr(model, "cfg", None)
    for index, (prompt, completion) in enumerate(sequences):
        if not prompt:
            raise ValueError(f"sequence {index}: the prompt is empty, so nothing predicts the first completion token")
        if cfg is not None and len(prompt) + len(completion) > cfg.context:
            raise ValueError(
                f"sequence {index}: {len(prompt) + len(completion)} tokens exceed the model's context of {cfg.context}"
            )
        if cfg is not None and any(not 0 <= t < cfg.vocab for t in prompt + completion):
            raise ValueError(f"sequence {index}: a token id outside the model's vocabulary of {cfg.vocab}")


def _scored(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each position's float32 logprob of the token after it (log-softmax per row, as :func:`analysis.experiment.model.step_outputs`)."""
    return logits[..., :-1, :].float().log_softmax(dim=-1).gather(-1, ids[..., 1:, None])[..., 0]


def _padded_logprobs(model, batch: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """One forward over the batch right-padded to its longest sequence."""
    device = next(model.parameters()).device
    lengths = [len(p) + len(c) for p, c in batch]
    ids = torch.zeros(len(batch), max(lengths), dtype=torch.long, device=device)
    valid = torch.zeros(len(batch), max(lengths), dtype=torch.bool, device=device)
    for row, ((prompt, completion), n) in enumerate(zip(batch, lengths)):
        ids[row, :n] = torch.tensor(prompt + completion, device=device)
        valid[row, :n] = True
    positions = torch.arange(max(lengths), device=device).expand(len(batch), -1)
    logits, _ = model(ids, positions, valid)
    scored = _scored(logits, ids).tolist()
    return [scored[row][len(p) - 1 : n - 1] for row, ((p, _), n) in enumerate(zip(batch, lengths))]


def _packed_logprobs(packed, model, batch: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """One forward over the batch's tokens packed as rows, by a packed kernel module (``kernels``: whole tiles;
    ``rowwise``: plain GEMMs of at least 4 rows), as its decode steps run them."""
    device = next(model.parameters()).device
    lengths = torch.tensor([len(p) + len(c) for p, c in batch], device=device)
    ids = torch.tensor([t for p, c in batch for t in p + c], device=device)
    positions = torch.cat([torch.arange(int(n), device=device) for n in lengths])
    rows = torch.arange(len(batch), device=device).repeat_interleave(lengths)
    cache = packed.TiledCache.empty(model, len(batch), int(lengths.max()))
    logits = packed.forward(
        model, ids, positions, rows, cache, want=torch.arange(ids.shape[0], device=device), prefill=True
    )
    scored = _scored(
        logits, ids
    ).tolist()  # across a sequence's end these score the next sequence's first token: never read
    starts = [0, *lengths.cumsum(0).tolist()]
    return [scored[start + len(p) - 1 : start + n - 1] for (p, _), start, n in zip(batch, starts, lengths.tolist())]


def write_trainer_pairs(
    run_dir: str | Path,
    output: str | Path,
    *,
    batch_size: int = 8,
    model_path: str | Path | None = None,
    force: bool = False,
) -> Path:
    """Recompute every sampled sequence of an experiment run as a trainer does, and write the pairs as a prime-rl token export.

    The trainer runs the run's own kernel mode, dtype and device (its manifest's effective settings)
    on the same weights (checked by sha256). One line per request of the run (its references and
    every batched request), in the run's order, with ``sample_id`` the request's id,
    ``inference_logprobs`` the sampler's, ``trainer_logprobs`` the recompute's, ``loss_mask`` all 1,
    and the request's ``prompt_id``, ``role``, ``c``, ``slot``, the ``kernel_mode``, ``dtype`` and
    ``trainer_batch`` beside them.

    Parameters
    ----------
    run_dir : path
        A run directory written by :func:`analysis.run_experiment`.
    output : path
        The JSONL file to write (refused when it exists, unless ``force``).
    batch_size : int
        Sequences per trainer forward pass.
    model_path : path, optional
        The run's weights; the bundled tiny model by default.
    force : bool
        Replace ``output`` when it exists.

    Returns
    -------
    Path
        The file written, which :func:`analysis.read_dump` reads.

    Examples
    --------
    >>> import analysis, json, tempfile
    >>> pairs = write_trainer_pairs("data/experiment-cpu/default", f"{tempfile.mkdtemp()}/trainer/default.jsonl")
    >>> first = json.loads(pairs.read_text().splitlines()[0])
    >>> first["sample_id"], first["kernel_mode"], len(first["trainer_logprobs"])
    ('p0-ref1', 'default', 64)
    >>> analysis.mismatch_summary(analysis.read_dump(pairs))["bia:masked_tokens"].item()  # 62 sequences of 64 tokens
    3968
    """
    from ...core import claim_output
    from ...run import read_run
    from .._common import ExperimentError, bundled_model, weights_sha256

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ExperimentError(f"--trainer-batch: expected an integer >= 1, got {batch_size!r}")
    run = read_run(run_dir)
    settings = run.manifest.get("effective") or {}
    model_path = Path(model_path) if model_path else bundled_model()
    expected = ((run.manifest.get("identity") or {}).get("model") or {}).get("sha256")
    if expected and weights_sha256(model_path) != expected:
        raise ExperimentError(
            f"--model {model_path}: its sha256 differs from the weights {run_dir} was decoded with ({expected[:16]}...)"
        )
    output = claim_output(output, force=force, what="the trainer pairs")
    mode, dtype = settings.get("kernel_mode", "default"), settings.get("dtype", "float32")
    torch.use_deterministic_algorithms(True)
    model = load_model(model_path, getattr(torch, dtype), settings.get("device", "cpu"))
    samples = _sampled(run)
    prompts = {p["prompt_id"]: model.encode(p["text"]) for p in run.manifest.get("prompts") or []}
    missing = sorted({s["prompt_id"] for s in samples} - prompts.keys(), key=str)
    if missing:
        raise ExperimentError(
            f"{run_dir}/manifest.json: prompts: no text for prompt_id {missing[0]!r}, so its sequences cannot be recomputed"
        )
    recomputed = recompute_logprobs(
        model, [(prompts[s["prompt_id"]], s["token_ids"]) for s in samples], mode=mode, batch_size=batch_size
    )
    lines = [
        {
            "schema_version": 1,
            "sample_id": s["request_id"],
            "token_ids": s["token_ids"],
            "inference_logprobs": s["logprobs"],
            "trainer_logprobs": t,
            "loss_mask": [1] * len(t),
            "prompt_id": s["prompt_id"],
            "role": s["role"],
            "c": s["c"],
            "slot": s["slot"],
            "kernel_mode": mode,
            "dtype": dtype,
            "trainer_batch": batch_size,
        }
        for s, t in zip(samples, recomputed)
    ]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return output


def _sampled(run) -> list[dict]:
    """Each request's completion token ids and sampler logprobs in position order, with the request's identity."""
    import polars as pl

    key = ["source", "record"]
    tokens = (
        run.tokens.filter(pl.col("segment") == "completion")
        .sort(*key, "position")
        .group_by(key, maintain_order=True)
        .agg("token_id", "logprob")
    )
    requests = run.requests.select(*key, "request_id", "prompt_id", "role", "c", "slot")
    joined = requests.join(tokens, on=key, how="inner", maintain_order="left").sort(key).drop(key)
    return joined.rename({"token_id": "token_ids", "logprob": "logprobs"}).to_dicts()
