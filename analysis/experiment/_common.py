"""What the experiment's run, its replay with taps (:mod:`.model`) and the trainer's recompute (:mod:`.trainer`)
share: the error that names an option, the bundled model, the weights' hash and the band layout.

Nothing here imports torch, and nothing here imports the rest of ``analysis.experiment``, so every part
of it sits above this module and none imports the package's face.
"""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

from ..run import band_batch


def bundled_model() -> Path:
    """The small byte-level model shipped under ``data/tiny-model/``."""
    from ..io import bundled

    return bundled("data/tiny-model/tiny_lm.safetensors")


class ExperimentError(ValueError):
    """A setting of :func:`run_experiment` that cannot work; the message names the option."""


def check_device(device: str) -> None:
    """Refuse a device torch cannot use here (:class:`ExperimentError`, naming ``--device``).

    Parameters
    ----------
    device : str
        ``cpu``, ``cuda`` or ``cuda:N``; a CUDA device needs a torch that sees a GPU.

    Examples
    --------
    >>> check_device("cpu")
    >>> check_device("tpu")
    Traceback (most recent call last):
    ...
    analysis.ExperimentError: --device: expected cpu, cuda or cuda:N, got 'tpu'
    """
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ExperimentError(f"--device: expected cpu, cuda or cuda:N, got {device!r}")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ExperimentError(
                f"--device {device}: this torch ({torch.__version__}) sees no GPU; install a CUDA build of torch on a GPU machine"
            )


def weights_sha256(path: Path) -> str:
    """sha256 of a weights file, or of a model directory's files in name order.

    Parameters
    ----------
    path : pathlib.Path
        A weights file or a model directory.

    Returns
    -------
    str
        The hex digest.
    """
    digest = hashlib.sha256()
    for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if file.is_file():
            digest.update(file.read_bytes())
    return digest.hexdigest()


def experiment_batch(
    prompt: list[int], prompts: list[list[int]], c: int, layout: str, rng: random.Random
) -> tuple[list[list[int]], int]:
    """The batch for one band and the row of the target request: in the needle layout the other rows are the
    other prompts' tokens, or, with one prompt, its tokens reversed (:func:`analysis.run.band_batch` places them).

    Parameters
    ----------
    prompt : list of int
        The band's target prompt, as token ids.
    prompts : list of list of int
        Every prompt of the experiment (the target among them).
    c : int
        The band's width.
    layout : {"copies", "needle"}
        How the batch is laid out.
    rng : random.Random
        Draws the target's row in the needle layout.

    Returns
    -------
    tuple of (list of list of int, int)
        The batch's rows and the target's row.
    """
    others = [p for p in prompts if p != prompt] or [prompt[::-1]]  # needle with one prompt: its reverse as filler
    return band_batch(prompt, others, c, layout, rng)
