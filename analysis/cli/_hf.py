"""``bia experiment --hf CHECKPOINT``: transformers' own batched generation probed in process, one run per way it batches."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import typer

from ..core import OutputExists
from ._args import _fail, _parse_ladder, _read_lines


def hf_command(
    checkpoint: Path,
    output: Path,
    prompts: Path | None,
    ladder: str,
    layout: str,
    max_tokens: int,
    top_k: int,
    dtype: str,
    device: str,
    force: bool,
) -> None:
    """The command's work once its options are parsed: each run written, or the fault in one line.

    Parameters
    ----------
    checkpoint : Path
        A Hugging Face causal LM checkpoint folder, or bia's own model file (``.safetensors``), as ``--hf`` gives it.
    output : Path
        The folder for the runs: one per way transformers batches.
    prompts : Path, optional
        A text file of prompts, one per line; bia's own prompts when None.
    ladder : str
        The batch sizes, comma separated.
    layout : str
        ``copies`` or ``needle``.
    max_tokens : int
        Tokens generated per request.
    top_k : int
        Candidates recorded per step.
    dtype : str
        ``float32`` or ``bfloat16``.
    device : str
        ``cpu``, or ``cuda``.
    force : bool
        Replace runs already in ``output``.

    Raises
    ------
    typer.Exit
        Exit 2 with the fault in one line: a missing or bad checkpoint, an occupied output, a bad setting.
    """
    from ..experiment import DEFAULT_PROMPTS
    from ..probe import CallableError

    texts = DEFAULT_PROMPTS if prompts is None else _read_lines(prompts, "--prompts")
    try:
        for folder in transformers_runs(
            checkpoint,
            output,
            prompts=texts,
            ladder=_parse_ladder(ladder),
            layout=layout,
            max_tokens=max_tokens,
            top_k=top_k,
            dtype=dtype,
            device=device,
            force=force,
        ):
            typer.echo(f"wrote {folder}")
    except (
        CallableError,
        FileNotFoundError,
        OutputExists,
        ValueError,
    ) as exc:  # a file an option reads: a bad option (docs/cli.md)
        raise _fail(exc) from None


def transformers_runs(
    checkpoint: Path,
    output: Path,
    *,
    prompts: Sequence[str],
    ladder: Sequence[int],
    layout: str,
    max_tokens: int,
    top_k: int,
    dtype: str,
    device: str,
    force: bool,
) -> list[Path]:
    """Probe each way the installed transformers batches (``padded``, and ``continuous`` where it exists) on ``checkpoint``
    and write ``OUTPUT/<way>``; the run folders written.

    Parameters
    ----------
    checkpoint : Path
        A Hugging Face causal LM checkpoint folder, or bia's own model file (``.safetensors``, written as a GPT-2
        checkpoint first).
    output : Path
        The folder that receives ``padded/`` and ``continuous/``.
    prompts : sequence of str
        The prompts.
    ladder : sequence of int
        The batch sizes c.
    layout : str
        ``copies`` or ``needle`` (see :func:`analysis.probe.probe_callable`).
    max_tokens : int
        Tokens generated per request.
    top_k : int
        Candidates recorded per step.
    dtype : str
        The model's dtype: ``float32`` or ``bfloat16``.
    device : str
        Where the model runs: ``cpu`` or ``cuda``.
    force : bool
        Replace runs already in ``output``.

    Returns
    -------
    list of Path

    Raises
    ------
    FileNotFoundError
        No such checkpoint.
    ValueError
        A checkpoint that is neither a Hugging Face folder nor bia's model.
    OutputExists
        A run already in the way, without ``force``.
    """
    import transformers

    from ..core import claim_output
    from ..experiment.engines import transformers_engines, write_hf_checkpoint
    from ..probe import probe_callable

    if not checkpoint.exists():
        raise FileNotFoundError(f"--hf {checkpoint}: no such folder")
    own = (
        checkpoint.is_file() and checkpoint.suffix == ".safetensors"
    )  # bia's own model (data/tiny-model), written as GPT-2 first
    if not own and not (checkpoint / "config.json").is_file():
        raise ValueError(
            f"--hf {checkpoint}: not a Hugging Face checkpoint folder (no config.json), nor bia's model (.safetensors)"
        )
    for way in ("padded", "continuous"):  # refused before the model loads, as the experiment's own runs are
        claim_output(output / way, force=force, what=f"the transformers {way} run", folder=True)
    with tempfile.TemporaryDirectory(prefix="bia-hf-") as scratch:
        folder = write_hf_checkpoint(checkpoint, Path(scratch) / checkpoint.stem) if own else checkpoint
        engines = transformers_engines(folder, max_new_tokens=max_tokens, top_k=top_k, dtype=dtype, device=device)
    written = []
    for way, generate in engines.items():
        run = probe_callable(
            generate,
            prompts,
            output / way,
            ladder=ladder,
            layout=layout,
            force=force,
            engine=f"transformers {transformers.__version__} ({way} batching)",
            model=checkpoint.stem if own else checkpoint.name,
        )
        written.append(cast(Path, run.path))  # read back from the folder it was written to: it has its path
    return written
