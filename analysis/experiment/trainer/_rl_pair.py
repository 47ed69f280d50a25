"""A real sampler-trainer pair, made as an RL loop makes one: vLLM samples, transformers recomputes the same tokens.

An RL loop samples rollouts with an inference engine, then recomputes the sampled tokens' logprobs in the trainer
with one teacher-forced forward pass over prompt and completion, in batches. Here a real vLLM server
(:func:`~analysis.experiment.engines.vllm_server`) samples greedily and returns each sampled token's logprob
(:func:`sample_rollouts`), and transformers' ``GPT2LMHeadModel``, loaded from the same checkpoint
(:func:`~analysis.experiment.engines.write_hf_checkpoint`), recomputes them (:func:`trainer_logprobs`). The pair is
written as prime-rl's token export (:func:`write_pair`: ``schema_version`` 1, ``token_ids``,
``inference_logprobs``, ``trainer_logprobs``, ``loss_mask``), which bia reads as a dump whose candidates carry the
trainer's recompute, so ``analysis.mismatch_summary(read_dumps(path))`` scores it in every framework's terms.

``scripts/rl_pair.py`` writes the bundled pair (``data/vllm-hf-pair/``); ``tests/test_vllm.py`` makes one against
the real server in CI. torch and transformers are imported only when a recompute runs.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from ...core import claim_output
from ..engines import SERVED_NAME


class PairError(ValueError):
    """A rollout that cannot be paired: the server's answer lacks the token ids or logprobs, or they disagree."""


def rollout_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    """The chat request a rollout sends: greedy, every sampled token's logprob, and the token ids of prompt and
    completion (vLLM's ``return_token_ids``), so the trainer scores exactly the tokens the sampler saw.

    Parameters
    ----------
    prompt : str
        The user message.
    max_tokens : int
        Tokens to sample (no end token stops it).

    Returns
    -------
    dict

    Examples
    --------
    >>> body = rollout_body("def f", 8)
    >>> body["temperature"], body["logprobs"], body["return_token_ids"], body["max_tokens"]
    (0, True, True, 8)
    """
    return {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "logprobs": True,
        "return_token_ids": True,
    }


def rollout_from_answer(answer: Any, where: str) -> dict[str, Any]:
    """One rollout from vLLM's chat answer: ``prompt_ids``, ``token_ids`` and their ``logprobs``; a :class:`PairError`
    naming ``where`` and the field when any is missing or they disagree in length.

    Parameters
    ----------
    answer : object
        The parsed JSON answer.
    where : str
        The rollout's name in errors (``prompt 3``).

    Returns
    -------
    dict

    Examples
    --------
    >>> answer = {"prompt_token_ids": [100, 101], "choices": [{"token_ids": [32, 120], "finish_reason": "length",
    ...           "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.25}]}}]}
    >>> rollout_from_answer(answer, "p0")
    {'prompt_ids': [100, 101], 'token_ids': [32, 120], 'logprobs': [-0.5, -1.25], 'finish_reason': 'length'}
    """
    if not isinstance(answer, dict) or not answer.get("choices"):
        raise PairError(f"{where}: the answer has no choices: {str(answer)[:200]}")
    choice = answer["choices"][0]
    prompt_ids, token_ids = answer.get("prompt_token_ids"), choice.get("token_ids")
    content = (choice.get("logprobs") or {}).get("content")
    for field, value in (
        ("prompt_token_ids", prompt_ids),
        ("choices[0].token_ids", token_ids),
        ("choices[0].logprobs.content", content),
    ):
        if not isinstance(value, list) or not value:
            raise PairError(f"{where}: {field} is missing or empty (vLLM gives it with return_token_ids and logprobs)")
    content = cast(list, content)  # a non-empty list: checked above
    if len(content) != len(token_ids):
        raise PairError(
            f"{where}: choices[0].logprobs.content holds {len(content)} entries for {len(token_ids)} token_ids"
        )
    return {
        "prompt_ids": prompt_ids,
        "token_ids": token_ids,
        "logprobs": [float(step["logprob"]) for step in content],
        "finish_reason": choice.get("finish_reason"),
    }


def sample_rollouts(
    url: str, prompts: Sequence[str], *, max_tokens: int = 64, timeout_s: float = 300.0
) -> list[dict[str, Any]]:
    """Sample every prompt at once from a vLLM server at ``url``, as a rollout batch is sampled: greedy, with the
    sampled tokens' logprobs and ids (see :func:`rollout_from_answer`), in the prompts' order.

    Parameters
    ----------
    url : str
        The server's base URL.
    prompts : sequence of str
        The prompts, all sent at once.
    max_tokens : int, default 64
        Tokens sampled per rollout.
    timeout_s : float, default 300.0
        The HTTP client's timeout, in seconds.

    Returns
    -------
    list of dict
    """
    import httpx

    async def one(client: httpx.AsyncClient, index: int, prompt: str) -> dict[str, Any]:
        response = await client.post(f"{url}/v1/chat/completions", json=rollout_body(prompt, max_tokens))
        if response.status_code != 200:
            raise PairError(f"prompt {index}: HTTP {response.status_code}: {response.text[:300]}")
        return rollout_from_answer(response.json(), f"prompt {index}")

    async def every() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            return list(await asyncio.gather(*(one(client, i, p) for i, p in enumerate(prompts))))

    return asyncio.run(every())


def trainer_logprobs(
    checkpoint: str | os.PathLike[str], rollouts: Sequence[dict[str, Any]], *, batch_size: int = 8
) -> list[list[float]]:
    """Each rollout's completion tokens scored as a trainer scores them: transformers' model loaded from
    ``checkpoint`` in float32, one teacher-forced forward pass per batch of ``batch_size`` rollouts over prompt and
    completion (padded on the right, masked), each completion token's log-softmax at the position before it.

    Parameters
    ----------
    checkpoint : str or path
        The local checkpoint folder the sampler served (never downloaded).
    rollouts : sequence of dict
        The rollouts (``prompt_ids``, ``token_ids``).
    batch_size : int, default 8
        Rollouts per forward pass.

    Returns
    -------
    list of list of float
        Per rollout, one logprob per completion token.

    Examples
    --------
    >>> trainer_logprobs("unused", [])
    []
    """
    if not rollouts:
        return []
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, local_files_only=True, dtype=torch.float32
    ).eval()
    out: list[list[float]] = []
    for start in range(0, len(rollouts), batch_size):
        batch = rollouts[start : start + batch_size]
        sequences = [list(r["prompt_ids"]) + list(r["token_ids"]) for r in batch]
        width = max(map(len, sequences))
        ids = torch.tensor([s + [0] * (width - len(s)) for s in sequences])
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
        with torch.no_grad():
            logprobs = model(input_ids=ids, attention_mask=mask).logits.float().log_softmax(-1)
        scored = logprobs[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]  # position i scores token i + 1
        for row, rollout in enumerate(batch):
            first = len(rollout["prompt_ids"]) - 1
            out.append(scored[row, first : first + len(rollout["token_ids"])].tolist())
    return out


def write_pair(
    path: str | os.PathLike[str],
    rollouts: Sequence[dict[str, Any]],
    trainer: Sequence[Sequence[float]],
    *,
    sample_ids: Sequence[str] | None = None,
    force: bool = False,
) -> Path:
    """Write the pair as prime-rl's token export (JSON lines, ``schema_version`` 1), one rollout a line: its
    completion's ``token_ids``, the sampler's ``inference_logprobs``, the trainer's ``trainer_logprobs``, a
    ``loss_mask`` of ones, and ``prompt_token_ids`` and ``finish_reason`` (kept by bia's reader as extras).

    Parameters
    ----------
    path : str or path
        The JSON-lines file to write.
    rollouts : sequence of dict
        The sampler's rollouts, as :func:`sample_rollouts` gives them.
    trainer : sequence of sequence of float
        The trainer's logprobs, one list per rollout, as :func:`trainer_logprobs` gives them.
    sample_ids : sequence of str, optional
        Each rollout's ``sample_id``; by default ``r0``, ``r1``, ...
    force : bool, default False
        Replace a file already there.

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import tempfile
    >>> from analysis import read_dumps
    >>> rollouts = [{"prompt_ids": [100], "token_ids": [32, 120], "logprobs": [-0.5, -1.25], "finish_reason": "length"}]
    >>> path = write_pair(Path(tempfile.mkdtemp()) / "pair.jsonl", rollouts, [[-0.5, -1.0]])
    >>> read_dumps(path).candidates["cand_logprob"].to_list()  # the trainer's recompute
    [-0.5, -1.0]
    """
    if len(trainer) != len(rollouts):
        raise PairError(f"{len(trainer)} trainer recomputes for {len(rollouts)} rollouts")
    path = claim_output(path, force=force, what="the sampler-trainer pair")
    lines = []
    for index, (rollout, scored) in enumerate(zip(rollouts, trainer)):
        if len(scored) != len(rollout["token_ids"]):
            raise PairError(f"rollout {index}: the trainer scored {len(scored)} tokens of {len(rollout['token_ids'])}")
        lines.append(
            json.dumps(
                {
                    "schema_version": 1,
                    "sample_id": sample_ids[index] if sample_ids else f"r{index}",
                    "token_ids": list(rollout["token_ids"]),
                    "inference_logprobs": list(rollout["logprobs"]),
                    "trainer_logprobs": [float(x) for x in scored],
                    "loss_mask": [True] * len(scored),
                    "prompt_token_ids": list(rollout["prompt_ids"]),
                    "finish_reason": rollout.get("finish_reason"),
                }
            )
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
