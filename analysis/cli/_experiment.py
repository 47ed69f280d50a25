"""``bia experiment``: a real transformer decoded at several batch sizes in each kernel mode, written as bia runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..core import OutputExists
from ._args import _fail, _need_extra, _parse_ladder, _read_lines, _read_runs, _row_invariant_blas


def experiment_command(
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for the runs (one per kernel mode).")] = Path(
        "runs/experiment"
    ),
    prompts: Annotated[Path | None, typer.Option(help="A text file of prompts, one per line.")] = None,
    ladder: Annotated[str, typer.Option(metavar="C,C,...", help="Batch sizes, comma separated.")] = "1,4,8,16",
    modes: Annotated[
        str,
        typer.Option(
            metavar="MODE,MODE,...",
            help="Kernel modes, comma separated: default, one-by-one, fixed-tiles, "
            "row-invariant (batch-invariant: one-by-one's old name).",
        ),
    ] = "default,one-by-one,fixed-tiles",
    layout: Annotated[
        str, typer.Option(metavar="LAYOUT", help="copies (c copies of one prompt) or needle (the prompt among others).")
    ] = "copies",
    dtype: Annotated[str, typer.Option(metavar="DTYPE", help="float32 or bfloat16.")] = "float32",
    device: Annotated[str, typer.Option(metavar="DEVICE", help="cpu, or cuda when torch sees a GPU.")] = "cpu",
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 64,
    top_k: Annotated[int, typer.Option(help="Candidates recorded per step.")] = 20,
    seed: Annotated[int, typer.Option(help="Seed for the needle positions.")] = 0,
    model: Annotated[
        Path | None, typer.Option(help="Model weights (safetensors + .json); the bundled tiny model by default.")
    ] = None,
    trainer: Annotated[
        bool,
        typer.Option(
            "--trainer",
            help="Also recompute every sampled sequence as an RL trainer does (one forward "
            "pass per sequence, in the run's kernel mode) and write the sampler-trainer "
            "pairs to OUTPUT/trainer/<mode>.jsonl (a prime-rl token export).",
        ),
    ] = False,
    trainer_batch: Annotated[int, typer.Option(help="Sequences per trainer forward pass.")] = 8,
    recompute: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="RUN",
            help="With --trainer: recompute this experiment run "
            "instead of decoding new ones (OUTPUT/trainer/<run folder>.jsonl). Repeatable.",
        ),
    ] = None,
    hf: Annotated[
        Path | None,
        typer.Option(
            "--hf",
            metavar="CHECKPOINT",
            help="Instead of bia's kernel modes, probe transformers' own "
            "batched generate on this causal LM checkpoint folder (or bia's own model file, data/tiny-model/tiny_lm.safetensors): left-padded (OUTPUT/padded) "
            "and continuous batching where the release has it (OUTPUT/continuous).",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace runs already in the output folder.")] = False,
) -> None:
    """Decode a real transformer at several batch sizes in each kernel mode and write bia runs."""
    _need_extra("torch", "torch", "experiment")
    if hf is not None:
        _need_extra("transformers", "hf", "experiment --hf")
        from ._hf import hf_command

        return hf_command(hf, output, prompts, ladder, layout, max_tokens, top_k, dtype, device, force)
    from ..experiment import DEFAULT_PROMPTS, ExperimentError, run_experiment
    from ..experiment.trainer import write_trainer_pairs
    from ..run import RunError

    if recompute and not trainer:
        raise _fail(ExperimentError("--recompute: give --trainer too (it recomputes runs as a trainer does)"))
    if trainer_batch < 1:  # said before any decoding, not after it
        raise _fail(ExperimentError(f"--trainer-batch: expected an integer >= 1, got {trainer_batch}"))
    _read_runs(recompute or [], "--recompute")
    _row_invariant_blas(modes.split(","))

    texts = DEFAULT_PROMPTS if prompts is None else _read_lines(prompts, "--prompts")
    try:
        folders = (
            list(recompute)
            if recompute
            else run_experiment(
                output,
                prompts=texts,
                ladder=_parse_ladder(ladder),
                modes=modes.split(","),
                layout=layout,
                dtype=dtype,
                device=device,
                max_tokens=max_tokens,
                top_k=top_k,
                seed=seed,
                model_path=model,
                progress=sys.stderr.isatty(),
                force=force,
            )
        )
        for folder in folders if not recompute else []:
            typer.echo(f"wrote {folder}")
        for folder in folders if trainer else []:
            pairs = write_trainer_pairs(
                folder,
                output / "trainer" / f"{Path(folder).name}.jsonl",
                batch_size=trainer_batch,
                model_path=model,
                force=force,
            )
            typer.echo(f"wrote {pairs}")
    except (ExperimentError, OutputExists, RunError, ValueError) as exc:
        raise _fail(exc) from None
