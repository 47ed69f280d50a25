"""In-process engines: a user's batched ``generate`` function probed as ``bia probe`` probes a server.

:func:`probe_callable` calls ``generate(prompts)`` with each prompt alone (the two m=1 references) and then
with batches of c prompts at every c of the ladder, and writes what came back as a run directory: each
request one line of ``captures/requests.jsonl``, a chat completion in the capture envelope with its tokens as
``token_id:N`` placeholders (which every bia reader takes as the id), its chosen logprobs and top candidates,
and the call's wall time as the request's ``timings`` (llama.cpp's fields). The batch width is known exactly:
``generate`` received c prompts at once, so every band is formed at its c.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import platform
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from ..core import build_folder, claim_output, progress_bar
from ..run import LAYOUTS, RUN_VERSION, Run, band_batch, batch_id, read_run
from ._settings import ProbeSettings


class CallableError(ValueError):
    """A setting of :func:`probe_callable`, or what ``generate`` returned for one call; the message names the call and field."""


def probe_callable(
    generate: Callable[[list[str]], Sequence[Mapping[str, Any]]],
    prompts: Sequence[str] | None,
    output: str | os.PathLike[str],
    *,
    ladder: Sequence[int] | None = None,
    layout: str | None = None,
    repeats: int | None = None,
    engine: str | None = None,
    model: str | None = None,
    seed: int | None = None,
    force: bool = False,
    progress: bool | None = None,
    settings: ProbeSettings | None = None,
) -> Run:
    """Probe an in-process engine: call ``generate`` alone and in batches of c, and write the run as ``bia probe`` does.

    Parameters
    ----------
    generate : callable
        ``generate(prompts: list[str])`` returns one mapping per prompt, in order: ``token_ids`` (list of int),
        ``logprobs`` (list of float, each chosen token's), and optionally ``top_logprobs`` (per token, a list of
        ``(token_id, logprob)`` pairs). It must decode greedily, so that a prompt alone repeats itself.
    prompts : sequence of str, or None
        The prompts; each is the target of its own references and bands (None: the ``settings``' prompts).
    output : path
        The run directory to write (refused when it holds something, unless ``force``).
    ladder : sequence of int, default (1, 4, 8, 16)
        The batch sizes c; each prompt is sent in one batch of each c per repeat.
    layout : {"copies", "needle"}, default "copies"
        ``copies``: the batch is c copies of the prompt, every row recorded; ``needle``: the prompt at a seeded row
        among the other prompts, only its row recorded.
    repeats : int, default 1
        How many times each band is sent.
    engine, model : str, optional
        What the run's identity names (by default ``generate``'s qualified name, and nothing).
    seed : int, default 0
        The needle layout's row choice.
    force : bool
        Replace a run already in ``output``.
    progress : bool, optional
        A bar over the sequences on stderr; by default only in a terminal.
    settings : ProbeSettings, optional
        The options this probe shares with a server's (:class:`analysis.probe.ProbeSettings`): ``ladder``, ``layout``,
        ``repeats``, ``seed``, ``model``, ``progress``, ``engine`` (its ``auto`` is ``generate``'s name), and ``prompts`` when
        ``prompts`` is None. A keyword given (not None) wins over the settings' value; one given by neither takes its default.

    Returns
    -------
    Run
        The run written, as :func:`analysis.read_run` reads it; :func:`analysis.judge` gives its verdict.

    Raises
    ------
    CallableError
        A bad setting, or a call whose result is not one mapping per prompt with those fields (named with the
        call's c, repeat and row).

    Examples
    --------
    >>> import tempfile
    >>> def generate(prompts):  # a toy engine whose logprobs shift by 2**-20 in a batch: the bits part, the tokens do not
    ...     return [{"token_ids": [len(p), 7], "logprobs": [-0.5, -0.25 - (len(prompts) > 1) * 2**-20]} for p in prompts]
    >>> run = probe_callable(generate, ["Hello"], tempfile.mkdtemp(), ladder=[1, 2])
    >>> from analysis import judge
    >>> judge(run).verdict, judge(run)["first"][0]
    ('RED', 'p0 c=2 repeat 0 slot 0: its logprob bits differ from ref #1 from token 1 (up to 32 ULP)')
    """
    if settings is not None:  # what the call leaves out (None), the settings give
        if prompts is None:  # texts, or mappings, which _check_settings refuses: a callable takes texts alone
            prompts = cast("list[str]", list(settings.prompts))
        ladder, layout, repeats, seed, model, progress = (
            settings.ladder if ladder is None else ladder,
            settings.layout if layout is None else layout,
            settings.repeats if repeats is None else repeats,
            settings.seed if seed is None else seed,
            settings.model if model is None else model,
            settings.progress if progress is None else progress,
        )
        engine = (
            engine if engine is not None else None if settings.engine == "auto" else settings.engine
        )  # auto: generate's name
    ladder, layout, repeats, seed = (
        (1, 4, 8, 16) if ladder is None else ladder,
        "copies" if layout is None else layout,
        1 if repeats is None else repeats,
        0 if seed is None else seed,
    )
    texts, ladder = _check_settings(prompts, ladder, layout, repeats)
    final = claim_output(output, force=force, what="the run", folder=True)
    bar = progress_bar(len(texts) * (2 + repeats * sum(ladder)), progress, "seq")
    try:
        with build_folder(final) as folder:  # built aside and renamed into place whole, as bia experiment does
            lines, m_formed = _fire(generate, texts, ladder, layout, repeats, seed, bar.update)
            (folder / "captures").mkdir()
            (folder / "captures" / "requests.jsonl").write_text(
                "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8"
            )
            manifest = _manifest(generate, texts, ladder, layout, repeats, engine, model, seed, m_formed, lines)
            (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    finally:
        bar.close()
    return read_run(final)


def _check_settings(
    prompts: Sequence[str] | None, ladder: Sequence[int], layout: str, repeats: int
) -> tuple[list[str], list[int]]:
    """The prompts and the ladder as lists, once checked; a CallableError names the first setting no run can be made
    of."""
    if isinstance(prompts, str) or not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise CallableError(f"prompts: expected a non-empty list of non-empty strings, got {prompts!r}")
    ladder = list(ladder)
    if (
        not ladder
        or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in ladder)
        or len(set(ladder)) != len(ladder)
    ):
        raise CallableError(f"ladder: expected distinct batch sizes >= 1, got {ladder!r}")
    if layout not in LAYOUTS:
        raise CallableError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout == "needle" and len(prompts) < 2:
        raise CallableError("layout: needle puts the prompt among other prompts; give at least two")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise CallableError(f"repeats: expected an integer >= 1, got {repeats!r}")
    return list(prompts), ladder


def _fire(
    generate, prompts: list[str], ladder: list[int], layout: str, repeats: int, seed: int, advance: Callable[[int], Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every call of the plan, in the probe's order: a prompt's two references, then its bands, repeat by repeat."""
    lines, m_formed = [], []
    by_text = {text: f"p{index}" for index, text in reversed(list(enumerate(prompts)))}  # a text twice: its first id
    for index, prompt in enumerate(prompts):
        pid = f"p{index}"
        for slot in (0, 1):
            (out,), seconds = _call(generate, [prompt], f"{pid} ref #{slot + 1}")
            lines.append(
                _envelope(out, seconds, unit=f"{pid}/reference/s{slot}", prompt_id=pid, role="reference", slot=slot)
            )
            advance(1)
        rng = random.Random(seed + index)
        for repeat in range(repeats):
            for c in ladder:
                batch, target = band_batch(prompts[index], prompts[:index] + prompts[index + 1 :], c, layout, rng)
                outs, seconds = _call(generate, batch, f"{pid} c={c} repeat {repeat}")
                unit = f"{pid}/band/c{c}/r{repeat}"
                rows = range(c) if layout == "copies" else [target]
                ids = [batch_id(text, by_text) for text in batch]
                lines += [
                    _envelope(
                        outs[row],
                        seconds,
                        unit=unit,
                        prompt_id=pid,
                        role="band",
                        c=c,
                        slot=slot,
                        repeat=repeat,
                        batch_row=row,
                        row=row,
                        batch=ids,
                    )
                    for slot, row in enumerate(rows)
                ]
                m_formed.append(
                    {
                        "unit": unit,
                        "prompt_id": pid,
                        "role": "band",
                        "c": c,
                        "repeat": repeat,
                        "widths": [c],
                        "steps": max(len(o["token_ids"]) for o in outs),
                    }
                )
                advance(c)
    return lines, m_formed


def _call(generate, batch: list[str], where: str) -> tuple[list[dict[str, Any]], float]:
    """One call, timed, with its result checked: one mapping per prompt, each with its fields."""
    started = time.perf_counter()
    result = generate(list(batch))
    seconds = time.perf_counter() - started
    if isinstance(result, (str, bytes, Mapping)) or not isinstance(result, Sequence) or len(result) != len(batch):
        got = (
            f"{len(result)} items"
            if isinstance(result, Sequence) and not isinstance(result, (str, bytes))
            else repr(type(result).__name__)
        )
        raise CallableError(
            f"generate, call {where}: expected a list of {len(batch)} results (one per prompt), got {got}"
        )
    return [_checked(item, f"generate, call {where}, row {row}") for row, item in enumerate(result)], seconds


def _checked(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        raise CallableError(f"{where}: expected a mapping with token_ids and logprobs, got {type(item).__name__}")
    ids, logprobs = item.get("token_ids"), item.get("logprobs")
    if not isinstance(ids, Sequence) or isinstance(ids, (str, bytes)) or not all(_is_int(t) for t in ids):
        raise CallableError(f"{where}: field token_ids: expected a list of integers, got {ids!r:.80}")
    if (
        not isinstance(logprobs, Sequence)
        or isinstance(logprobs, (str, bytes))
        or len(logprobs) != len(ids)
        or not all(_is_logprob(v) for v in logprobs)
    ):
        raise CallableError(
            f"{where}: field logprobs: expected one finite logprob <= 0 per token ({len(ids)}), got {logprobs!r:.80}"
        )
    top = item.get("top_logprobs")
    if top is not None and (
        not isinstance(top, Sequence)
        or len(top) != len(ids)
        or not all(isinstance(step, Sequence) and all(_is_pair(p) for p in step) for step in top)
    ):
        raise CallableError(
            f"{where}: field top_logprobs: expected per token a list of (token_id, logprob) pairs, got {top!r:.80}"
        )
    return {
        "token_ids": [int(t) for t in ids],
        "logprobs": [float(v) for v in logprobs],
        "top_logprobs": None if top is None else [[(int(t), float(v)) for t, v in step] for step in top],
    }


def _is_int(value: Any) -> bool:
    """An int, numpy's included (they have ``__index__``), never a bool."""
    return not isinstance(value, bool) and (isinstance(value, int) or hasattr(value, "__index__"))


def _is_logprob(value: Any) -> bool:
    """A finite number <= 0 (numpy's float32 too), never a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value) and value <= 0


def _is_pair(pair: Any) -> bool:
    return isinstance(pair, Sequence) and len(pair) == 2 and _is_int(pair[0]) and _is_logprob(pair[1])


def _envelope(out: dict[str, Any], seconds: float, **placement: Any) -> dict[str, Any]:
    """One request as a chat completion in the capture envelope; the call's time is its ``timings``."""

    def token(i: int) -> str:
        return f"token_id:{i}"

    tops = out["top_logprobs"] or [[] for _ in out["token_ids"]]
    entries = [
        {"token": token(t), "logprob": v, "top_logprobs": [{"token": token(c), "logprob": w} for c, w in top]}
        for t, v, top in zip(out["token_ids"], out["logprobs"], tops)
    ]
    n = len(out["token_ids"])
    response = {
        "id": f"{placement['unit']}/s{placement['slot']}",
        "object": "chat.completion",
        "model": "callable",
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {"role": "assistant", "content": None},
                "logprobs": {"content": entries},
            }
        ],
        "usage": {"completion_tokens": n},
        "timings": {
            "predicted_n": n,
            "predicted_ms": round(1000 * seconds, 3),
            "predicted_per_second": round(n / seconds, 3) if seconds > 0 and n else None,
        },
    }
    return {"response": response, "t_sent": 0.0, **placement}


def _manifest(
    generate,
    prompts: list[str],
    ladder: list[int],
    layout: str,
    repeats: int,
    engine: str | None,
    model: str | None,
    seed: int,
    m_formed: list[dict[str, Any]],
    lines: list[dict[str, Any]],
) -> dict[str, Any]:
    name = engine or getattr(generate, "__qualname__", None) or type(generate).__name__
    entries = [entry for line in lines for entry in line["response"]["choices"][0]["logprobs"]["content"]]
    steps = max((len(line["response"]["choices"][0]["logprobs"]["content"]) for line in lines), default=0)
    top = max((len(entry["top_logprobs"]) for entry in entries), default=0)
    return {
        "run_version": RUN_VERSION,
        "producer": "bia probe_callable",
        "identity": {
            "engine": name,
            "model": {"path": model} if model else None,
            "host": platform.node(),
            "commit": None,
        },
        "environment": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "platform": platform.platform(),
        },
        "sampler": {
            "temperature": 0.0,
            "seed": seed,
            "max_tokens": steps,
            "top_logprobs": top or None,
            "ignore_eos": None,
        },
        "ladder": ladder,
        "repeats": repeats,
        "declared_min": min(64, steps),
        "max_constant_run": 16,
        "requested": {"layout": layout},
        "effective": {"layout": layout},
        "prompts": [{"prompt_id": f"p{i}", "text": p} for i, p in enumerate(prompts)],
        "m_formed": m_formed,
        "complete": True,
        "widths": "exact: generate received each band's c prompts in one call",
    }
