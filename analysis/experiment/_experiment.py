"""The experiment itself: every prompt decoded at every c of the ladder in each kernel mode, written
as one bia run directory per mode (:func:`run_experiment`), and the replay with taps that writes a run's
``first_ops.json`` (:func:`write_first_ops`, the model family's, imported when called, as torch is)."""

from __future__ import annotations

import json
import platform
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core import build_folder, claim_output, progress_bar
from ..run import LAYOUTS, RUN_VERSION, batch_id
from ._common import ExperimentError, bundled_model, check_device, experiment_batch, weights_sha256
from .modes import KERNEL_MODES, MODE_ALIASES, kernel_mode

# Chosen because the bundled byte-level model answers them in prose, with a few near-ties, rather
# than drifting into a long run of indentation (which the frozen-slot rule would rightly flag).
DEFAULT_PROMPTS = (
    "If the argument is",
    "This function returns",
)


def _capture(decoded, request_id: str, model_name: str, model) -> tuple[str, list[float]]:
    """One request as a live SSE capture (one chunk per token) and its event arrival times."""

    def token(i: int) -> dict[str, Any]:
        text, data = model.token(i)
        return {"id": i, "token": text, "bytes": list(data)}

    events: list[dict[str, Any]] = [
        {
            "id": request_id,
            "object": "chat.completion.chunk",
            "model": model_name,
            "stream_mode": "live",
            "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}],
        }
    ]
    times = [0.0]
    for step, tid in enumerate(decoded.token_ids):
        entry = {
            **token(tid),
            "logprob": decoded.logprobs[step],
            "top_logprobs": [
                {**token(c), "logprob": v} for c, v in zip(decoded.top_ids[step], decoded.top_logprobs[step])
            ],
        }
        last = step == len(decoded.token_ids) - 1
        events.append(
            {
                "id": request_id,
                "object": "chat.completion.chunk",
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": token(tid)["token"]},
                        "logprobs": {"content": [entry]},
                        "finish_reason": "length" if last else None,
                    }
                ],
            }
        )
        times.append(decoded.arrivals[step])
    events.append(
        {
            "id": request_id,
            "object": "chat.completion.chunk",
            "model": model_name,
            "choices": [],
            "usage": {"prompt_tokens": len(decoded.prompt), "completion_tokens": len(decoded.token_ids)},
        }
    )
    times.append(times[-1])
    text = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events) + "data: [DONE]\n\n"
    return text, [*times, times[-1]]


def run_experiment(
    out: str | Path,
    *,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    ladder: Sequence[int] = (1, 4, 8, 16),
    modes: Sequence[str] = ("default", "one-by-one", "fixed-tiles"),
    layout: str = "copies",
    dtype: str = "float32",
    device: str = "cpu",
    max_tokens: int = 64,
    top_k: int = 20,
    seed: int = 0,
    model_path: str | Path | None = None,
    declared_min: int | None = None,
    progress: bool = False,
    force: bool = False,
    taps: bool = True,
) -> list[Path]:
    """Decode every prompt at every c of the ladder in each kernel mode; write one run directory per mode.

    Every setting is checked before anything is decoded (:class:`ExperimentError` names it), and a
    mode's run directory that already holds something is refused unless ``force`` (then replaced).

    With ``taps``, each run is then replayed with taps on every op and its ``first_ops.json`` written
    (``write_first_ops``): for every batched step that differs from m=1, the first op that does.

    With ``progress``, a bar on stderr counts the sequences decoded (and replayed with taps), with an ETA.

    Parameters
    ----------
    out : str or path
        The folder that receives one run directory per mode, named after it.
    prompts : sequence of str, default ``DEFAULT_PROMPTS``
        The prompts, each decoded alone (twice, as ref #1 and ref #2) and in every band; non-empty.
    ladder : sequence of int, default (1, 4, 8, 16)
        The batch sizes ``c``, distinct and at least 1.
    modes : sequence of str, default ("default", "one-by-one", "fixed-tiles")
        The kernel modes (``KERNEL_MODES``, or an alias ``analysis.experiment.modes.kernel_mode`` accepts), distinct.
    layout : {"copies", "needle"}, default "copies"
        A band of ``c`` copies of the prompt (every row recorded), or the prompt at one drawn row among the
        other prompts (that row recorded).
    dtype : {"float32", "bfloat16"}, default "float32"
        The model's weights and activations.
    device : str, default "cpu"
        ``cpu``, ``cuda`` or ``cuda:N``.
    max_tokens : int, default 64
        Greedy tokens decoded per sequence (every one: no end token stops it).
    top_k : int, default 20
        Candidates recorded per step.
    seed : int, default 0
        Seeds torch, and the needle layout's row draws (``seed + prompt index``).
    model_path : str or path, optional
        A bia weights file or a Hugging Face model folder; by default the bundled tiny model.
    declared_min : int, optional
        The manifest's ``declared_min``; by default ``min(64, max_tokens)``.
    progress : bool, default False
        Show the progress bar.
    force : bool, default False
        Replace a mode's run directory that already holds something.
    taps : bool, default True
        Also write each run's ``first_ops.json``.

    Returns
    -------
    list of pathlib.Path
        The run directories, which :func:`analysis.run.read_run` reads.
    """
    import torch

    from ..run import read_run
    from .model import decode, load_model
    from .model import write_first_ops as replay_with_taps

    _check_settings(prompts, ladder, modes, layout, dtype, device, max_tokens, top_k, declared_min)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model_path = Path(model_path) if model_path else bundled_model()
    if not model_path.exists():
        raise ExperimentError(f"--model {model_path}: no such file or folder")
    if any(kernel_mode(m) == "row-invariant" for m in modes):
        from .model.rowwise import check_blas

        try:
            check_blas()
        except ValueError as exc:
            raise ExperimentError(f"--modes: {exc}") from None
        if device != "cpu":
            raise ExperimentError(
                f"--modes: the row-invariant mode rests on MKL's CPU GEMM; on --device {device} use fixed-tiles"
            )
    own = [kernel_mode(m) for m in modes if kernel_mode(m) in ("fixed-tiles", "row-invariant")]
    if model_path.is_dir() and own:
        raise ExperimentError(
            f"--modes: {' and '.join(own)} run{'s' if len(own) == 1 else ''} bia's own model's layers, not a Hugging Face "
            f"model's ({model_path}); leave {'it' if len(own) == 1 else 'them'} out of --modes"
        )
    if not force:  # refused before the model is loaded; with force, cleared only once it has loaded
        for mode in modes:
            claim_output(Path(out) / mode, what=f"the {mode} run", folder=True)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    try:
        model = load_model(model_path, torch_dtype, device)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ExperimentError(f"--model {model_path}: cannot load it: {exc}") from None
    _check_fits(model, prompts, max_tokens, top_k)
    folders = [claim_output(Path(out) / mode, force=force, what=f"the {mode} run", folder=True) for mode in modes]
    weights_sha = weights_sha256(model_path)
    encoded = [model.encode(p) for p in prompts]
    written = []
    bar = progress_bar(
        len(modes) * len(prompts) * (3 + sum(ladder) + (1 + sum(ladder) if taps else 0)), progress, "seq"
    )  # and replays
    for mode, final in zip(modes, folders):
        with build_folder(final) as folder:  # built aside, renamed into place whole: a kill leaves no half run
            bar.set_description(f"{mode}: decoding")
            (folder / "captures").mkdir(parents=True, exist_ok=True)
            lines, m_formed, identical = [], [], True
            for index, prompt in enumerate(encoded):
                pid = f"p{index}"
                refs = [decode(model, [prompt], mode=mode, max_tokens=max_tokens, top_k=top_k)[0] for _ in range(2)]
                again = decode(model, [prompt], mode=mode, max_tokens=max_tokens, top_k=top_k)[0]
                bar.update(3)
                identical &= (
                    again.token_ids == refs[0].token_ids and again.logprobs == refs[0].logprobs
                )  # bits: floats compare exactly
                for slot, ref in enumerate(refs):
                    sse, times = _capture(ref, f"{pid}-ref{slot + 1}", model_path.stem, model)
                    lines.append(
                        {
                            "sse": sse,
                            "arrival_times": times,
                            "t_sent": 0.0,
                            "prompt_id": pid,
                            "role": "reference",
                            "slot": slot,
                        }
                    )
                rng = random.Random(seed + index)
                for c in ladder:
                    batch, target = experiment_batch(prompt, encoded, c, layout, rng)
                    outs = decode(model, batch, mode=mode, max_tokens=max_tokens, top_k=top_k)
                    m_formed.append({"prompt_id": pid, "c": c, "widths": [c], "steps": max_tokens})
                    recorded = range(c) if layout == "copies" else [target]
                    ids = [_row_id(model, row, encoded) for row in batch]
                    for slot, row in enumerate(recorded):
                        sse, times = _capture(outs[row], f"{pid}-c{c}-s{slot}", model_path.stem, model)
                        lines.append(
                            {
                                "sse": sse,
                                "arrival_times": times,
                                "t_sent": 0.0,
                                "prompt_id": pid,
                                "role": "band",
                                "c": c,
                                "slot": slot,
                                "repeat": 0,
                                "batch_row": row,
                                "row": row,
                                "batch": ids,
                            }
                        )
                    bar.update(c)
            (folder / "captures" / "requests.jsonl").write_text(
                "\n".join(json.dumps(line, ensure_ascii=False) for line in lines) + "\n"
            )
            settings = {
                "kernel_mode": mode,
                "dtype": dtype,
                "device": device,
                "layout": layout,
            }  # as asked; effective below
            manifest = {
                "run_version": RUN_VERSION,
                "producer": "bia experiment",
                "identity": {
                    "host": platform.node(),
                    "engine": "bia torch (analysis.experiment)",
                    "commit": None,
                    "binary_sha256": weights_sha,
                    "model": {"path": model_path.name, "sha256": weights_sha},
                },
                "sampler": {
                    "temperature": 0.0,
                    "seed": seed,
                    "ignore_eos": True,
                    "max_tokens": max_tokens,
                    "top_logprobs": top_k,
                },
                "ladder": list(ladder),
                "declared_min": declared_min if declared_min is not None else min(64, max_tokens),
                "max_constant_run": 16,
                "environment": {
                    "torch": torch.__version__,
                    "python": platform.python_version(),
                    "machine": platform.machine(),
                    "threads": torch.get_num_threads(),
                    "deterministic_algorithms": True,
                    "cuda": torch.version.cuda if device.startswith("cuda") else None,
                    "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
                },
                "requested": settings,
                "effective": {
                    **settings,
                    "kernel_mode": kernel_mode(mode),
                    "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                    "device": str(next(model.parameters()).device),
                },
                "prompts": [{"prompt_id": f"p{i}", "text": p} for i, p in enumerate(prompts)],
                "m_formed": m_formed,
                "determinism": {
                    "checked": True,
                    "identical": identical,
                    "what": "the m=1 reference decoded a third time gave the same tokens and float32 logprob bits",
                },
            }
            (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            if taps:  # after the timed decode, so that the taps never slow the rates the run records
                bar.set_description(f"{mode}: first ops")
                try:
                    replay_with_taps(folder, model=model, advance=bar.update)
                except (
                    ExperimentError
                ) as exc:  # a decode that does not repeat bit for bit: the run stands, without first ops
                    import warnings

                    warnings.warn(f"no first_ops.json: {exc}", stacklevel=2)
        read_run(
            final
        ).write_derived()  # the Parquet tables, rebuildable from captures/, naming the captures where they stay
        written.append(final)
    bar.close()
    return written


def _row_id(model, tokens: list[int], encoded: list[list[int]]) -> str:
    """A batch row as the capture envelope names it: its prompt's id, or a filler's (see :func:`analysis.run.batch_id`)."""
    if tokens in encoded:
        return f"p{encoded.index(tokens)}"
    return batch_id(b"".join(model.token(t)[1] for t in tokens).decode("utf-8", "replace"), {})


def _check_settings(prompts, ladder, modes, layout, dtype, device, max_tokens, top_k, declared_min) -> None:
    """Refuse, before anything is loaded or decoded, settings that cannot give a run."""
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ExperimentError(f"--prompts: expected at least one non-empty prompt, got {list(prompts)!r}"[:300])
    if (
        not ladder
        or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in ladder)
        or len(set(ladder)) != len(ladder)
    ):
        raise ExperimentError(f"--ladder: expected distinct batch sizes >= 1, got {list(ladder)!r}")
    known = (*KERNEL_MODES, *MODE_ALIASES)
    if (
        not modes
        or any(mode not in known for mode in modes)
        or len({kernel_mode(m) for m in modes if m in known}) != len(modes)
    ):
        raise ExperimentError(
            f"--modes: expected distinct kernel modes among {', '.join(KERNEL_MODES)} (batch-invariant is one-by-one's "
            f"old name), got {list(modes)!r}"
        )
    if layout not in LAYOUTS:
        raise ExperimentError(f"--layout: expected 'copies' or 'needle', got {layout!r}")
    if dtype not in ("float32", "bfloat16"):
        raise ExperimentError(f"--dtype: expected 'float32' or 'bfloat16', got {dtype!r}")
    check_device(device)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ExperimentError(f"--max-tokens: expected an integer >= 1, got {max_tokens!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ExperimentError(f"--top-k: expected an integer >= 1, got {top_k!r}")
    if declared_min is not None and (
        isinstance(declared_min, bool) or not isinstance(declared_min, int) or declared_min < 0
    ):
        raise ExperimentError(f"declared_min: expected an integer >= 0, got {declared_min!r}")


def _check_fits(model, prompts, max_tokens: int, top_k: int) -> None:
    """The model's own limits: candidates within its vocabulary, prompt and completion within its context."""
    cfg = getattr(model, "cfg", None)
    if cfg is None:  # a Hugging Face model: its own errors name its limits
        return
    if top_k > cfg.vocab:
        raise ExperimentError(f"--top-k {top_k}: the model has only {cfg.vocab} tokens")
    longest = max(len(model.encode(p)) for p in prompts)
    if longest + max_tokens > cfg.context:
        raise ExperimentError(
            f"--max-tokens {max_tokens}: the longest prompt ({longest} tokens) and the completion exceed the model's "
            f"context of {cfg.context} tokens"
        )


def write_first_ops(run_dir: str | Path, *, model=None, model_path: str | Path | None = None) -> Path:
    """Replay an experiment run with taps on every op and write its ``first_ops.json``, which
    :func:`analysis.first_op_table` reads (see ``analysis.experiment.model.write_first_ops``;
    imported here when called, as torch is).

    Parameters
    ----------
    run_dir : str or path
        A run directory written by :func:`analysis.run_experiment`.
    model : TinyLM, optional
        The model the run decoded, already loaded.
    model_path : str or path, optional
        Otherwise the weights to load: by default the bundled model.

    Returns
    -------
    pathlib.Path
        The ``first_ops.json`` written.

    Examples
    --------
    >>> import tempfile
    >>> from analysis import first_op_table, read_run
    >>> (run,) = run_experiment(tempfile.mkdtemp(), prompts=["Hi"], ladder=[2], modes=["fixed-tiles"], max_tokens=4, taps=False)
    >>> write_first_ops(run).name, first_op_table(read_run(run)).height
    ('first_ops.json', 0)
    """
    from .model import write_first_ops as write

    return write(run_dir, model=model, model_path=model_path)
