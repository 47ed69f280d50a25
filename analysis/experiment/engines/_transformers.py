"""Hugging Face transformers as an in-process engine: ``generate`` functions for :func:`analysis.probe_callable`.

Researchers and RL trainers batch prompts through transformers' own ``generate`` with left padding (the padding
side a decoder-only model needs); whether a padded batch gives a prompt's bits alone is the question these
adapters let bia ask. Each returns ``generate(prompts)`` giving, per prompt, the greedy tokens, each chosen
token's logprob (``log_softmax`` of the model's raw logits in float32) and its top-k candidates.

:func:`padded_generate` runs ``model.generate`` on the whole batch at once; :func:`continuous_generate` runs
``model.generate_batch``, transformers' continuous-batching generation, where the installed release has it.
Every request decodes exactly ``max_new_tokens`` tokens (the end-of-sequence token is not allowed to stop it
early), so that streams of one prompt compare token by token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Generate = Callable[[list[str]], list[dict[str, Any]]]
PAGE_SIZE = 32  # tokens per page of the continuous-batching KV cache


def load_checkpoint(checkpoint: str | Path, *, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """A causal LM checkpoint folder's model (in eval mode) and tokenizer, the tokenizer set to pad on the left.

    Parameters
    ----------
    checkpoint : str or path
        A local Hugging Face checkpoint folder (with ``config.json``).
    dtype : str, default "float32"
        The torch dtype's name the weights load in.
    device : str, default "cpu"
        The torch device.

    Returns
    -------
    tuple of (model, tokenizer)

    Examples
    --------
    >>> import tempfile
    >>> from analysis.experiment import bundled_model
    >>> from analysis.experiment.engines import write_hf_checkpoint
    >>> model, tokenizer = load_checkpoint(write_hf_checkpoint(bundled_model(), Path(tempfile.mkdtemp()) / "tiny"))
    >>> type(model).__name__, tokenizer.padding_side
    ('GPT2LMHeadModel', 'left')
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(checkpoint)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder}: not a Hugging Face checkpoint folder (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = (
        "left"  # a decoder-only model continues from the last position: padding goes before the prompt
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # Any: transformers types PreTrainedModel.to as a functools wrapper, which mypy cannot call as a bound method
    loaded: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    model = loaded.to(device).eval()
    return model, tokenizer


def padded_generate(model: Any, tokenizer: Any, *, max_new_tokens: int = 64, top_k: int = 5) -> Generate:
    """``generate(prompts)`` that runs transformers' ``model.generate`` greedily on the prompts as one left-padded batch.

    Parameters
    ----------
    model, tokenizer
        A causal LM and its tokenizer (:func:`load_checkpoint` gives both).
    max_new_tokens : int
        Tokens each request decodes (all of them: the end-of-sequence token does not stop it).
    top_k : int
        Candidates kept per step.

    Returns
    -------
    callable
        ``generate(prompts: list[str]) -> list[dict]``, one ``{"token_ids", "logprobs", "top_logprobs"}`` per prompt,
        what :func:`analysis.probe_callable` takes.

    Examples
    --------
    >>> import tempfile
    >>> from analysis.experiment import bundled_model
    >>> from analysis.experiment.engines import write_hf_checkpoint
    >>> generate = padded_generate(*load_checkpoint(write_hf_checkpoint(bundled_model(), Path(tempfile.mkdtemp()) / "t")), max_new_tokens=4)
    >>> alone, = generate(["If the argument is"])
    >>> batched = generate(["If the argument is", "Hi"])[0]
    >>> len(alone["token_ids"]), alone["token_ids"] == batched["token_ids"]
    (4, True)
    """
    import torch

    def generate(prompts: list[str]) -> list[dict[str, Any]]:
        encoded = tokenizer(list(prompts), return_tensors="pt", padding=True).to(model.device)
        with torch.no_grad():
            out = model.generate(
                **encoded,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                num_beams=1,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=tokenizer.pad_token_id,
            )
        chosen = out.sequences[:, encoded["input_ids"].shape[1] :]
        return _results(torch.stack(out.logits, dim=1), chosen, top_k)

    return generate


def continuous_generate(model: Any, tokenizer: Any, *, max_new_tokens: int = 64, top_k: int = 5) -> Generate:
    """``generate(prompts)`` that runs transformers' continuous-batching ``model.generate_batch`` on the prompts.

    Its outputs carry each chosen token's logprob only, so ``top_logprobs`` is left out. Raises ``ValueError``
    when the installed transformers has no ``generate_batch``.

    Parameters
    ----------
    model, tokenizer
        A causal LM and its tokenizer (:func:`load_checkpoint` gives both).
    max_new_tokens : int
        Tokens each request decodes.
    top_k : int
        Unused: continuous batching reports no candidates (kept for one signature with :func:`padded_generate`).

    Returns
    -------
    callable
        ``generate(prompts: list[str]) -> list[dict]``, as :func:`padded_generate`'s.
    """
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    if not hasattr(model, "generate_batch"):
        import transformers

        raise ValueError(
            f"transformers {transformers.__version__} has no continuous-batching generate_batch; use padded_generate"
        )

    def generate(prompts: list[str]) -> list[dict[str, Any]]:
        ids = [tokenizer(p)["input_ids"] for p in prompts]
        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            eos_token_id=-1,
            pad_token_id=tokenizer.pad_token_id,
        )
        # a cache sized for these requests (sized by default from free memory, it takes half a minute a call on a CPU)
        pages = -(-(max(map(len, ids)) + max_new_tokens) // PAGE_SIZE) + 1
        sizing = ContinuousBatchingConfig(
            return_logprobs=True,
            page_size=PAGE_SIZE,
            num_blocks=len(ids) * pages,
            max_batch_tokens=max(256, sum(map(len, ids)) + len(ids)),
        )
        outputs = model.generate_batch(
            ids, generation_config=config, continuous_batching_config=sizing, progress_bar=False, warmup=False
        )  # warm-up captures CUDA graphs: nothing to capture on a CPU
        ordered = sorted(outputs.values(), key=lambda o: int(str(o.request_id).rsplit("_", 1)[-1]))
        return [{"token_ids": list(o.generated_tokens), "logprobs": [float(v) for v in o.logprobs]} for o in ordered]

    return generate


def _results(logits: Any, chosen: Any, top_k: int) -> list[dict[str, Any]]:
    """Per row: the chosen tokens, their logprobs and the top-k, from logits ``[batch, steps, vocab]`` (one pass of torch ops)."""
    import torch

    logprobs = torch.log_softmax(logits.float(), dim=-1)
    own = logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    top_values, top_ids = logprobs.topk(top_k, dim=-1)
    return [
        {"token_ids": ids, "logprobs": values, "top_logprobs": [list(zip(i, v)) for i, v in zip(tids, tvalues)]}
        for ids, values, tids, tvalues in zip(chosen.tolist(), own.tolist(), top_ids.tolist(), top_values.tolist())
    ]


def transformers_engines(
    checkpoint: str | Path, *, max_new_tokens: int = 64, top_k: int = 5, dtype: str = "float32", device: str = "cpu"
) -> dict[str, Generate]:
    """The ways transformers batches, by name: ``padded`` always, ``continuous`` where the release has ``generate_batch``.

    Parameters
    ----------
    checkpoint : str or path
        A local Hugging Face checkpoint folder.
    max_new_tokens : int, default 64
        Greedy tokens each request decodes.
    top_k : int, default 5
        Candidates recorded per step.
    dtype : str, default "float32"
        The torch dtype's name the weights load in.
    device : str, default "cpu"
        The torch device.

    Returns
    -------
    dict of str to Generate

    Examples
    --------
    >>> import tempfile
    >>> from analysis.experiment import bundled_model
    >>> from analysis.experiment.engines import write_hf_checkpoint
    >>> "padded" in transformers_engines(write_hf_checkpoint(bundled_model(), Path(tempfile.mkdtemp()) / "t"), max_new_tokens=2)
    True
    """
    model, tokenizer = load_checkpoint(checkpoint, dtype=dtype, device=device)
    engines = {"padded": padded_generate(model, tokenizer, max_new_tokens=max_new_tokens, top_k=top_k)}
    if hasattr(model, "generate_batch"):
        engines["continuous"] = continuous_generate(model, tokenizer, max_new_tokens=max_new_tokens, top_k=top_k)
    return engines


__all__: Sequence[str] = ["continuous_generate", "load_checkpoint", "padded_generate", "transformers_engines"]
