"""``bia serve``: the experiment's model served as an OpenAI-compatible chat endpoint with continuous batching."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ._args import _check_log_file, _fail, _need_extra, _row_invariant_blas


def serve_command(
    host: Annotated[
        str, typer.Option(metavar="ADDRESS", help="Address to listen on (loopback by default).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    mode: Annotated[
        str,
        typer.Option(
            metavar="MODE",
            help="Kernel mode: default, one-by-one, fixed-tiles or "
            "row-invariant (batch-invariant: one-by-one's old name).",
        ),
    ] = "default",
    dtype: Annotated[str, typer.Option(metavar="DTYPE", help="float32 or bfloat16.")] = "float32",
    device: Annotated[str, typer.Option(metavar="DEVICE", help="cpu, or cuda when torch sees a GPU.")] = "cpu",
    model: Annotated[Path | None, typer.Option(help="Model weights; the bundled tiny model by default.")] = None,
    log_file: Annotated[
        Path | None, typer.Option(help="Append the per-step batch log here (what bia probe --server-log reads).")
    ] = None,
    batch_window_ms: Annotated[
        float,
        typer.Option(
            min=0,
            metavar="MS",
            help="An idle server that gets a request waits until no other has arrived for this long (at most 10 such "
            "windows) before its first decode step, so requests sent together decode in one batch; 0 steps at once.",
        ),
    ] = 50.0,
    max_batch: Annotated[
        int | None,
        typer.Option(
            min=1, metavar="N", help="The most requests one decode step holds; the rest wait. No limit by default."
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("-v", "--verbose", help="Also print every decode step's batch line on the terminal.")
    ] = False,
) -> None:
    """Serve the experiment's model as an OpenAI-compatible chat endpoint with continuous batching.

    The terminal gets a line per request (and the start-up line); every decode step's batch line goes to --log-file, and
    to the terminal only with -v. Requests that arrive within --batch-window-ms of each other at an idle server start
    decoding together."""
    import logging

    _need_extra("torch", "torch", "serve")
    _row_invariant_blas([mode])

    from ..core import mode_as_asked
    from ..experiment import ExperimentError, bundled_model
    from ..experiment.modes import KERNEL_MODES, MODE_ALIASES, kernel_mode

    if mode not in KERNEL_MODES and mode not in MODE_ALIASES:
        raise _fail(
            f"--mode takes one of {', '.join(KERNEL_MODES)} (batch-invariant is one-by-one's old name), got {mode!r}"
        )
    if not batch_window_ms < float("inf"):
        raise _fail(f"--batch-window-ms takes a number of milliseconds >= 0, got {batch_window_ms}")
    if dtype not in ("float32", "bfloat16"):
        raise _fail(f"--dtype takes float32 or bfloat16, got {dtype!r}")
    weights = model or bundled_model()
    if not weights.exists():
        raise _fail(f"--model {weights}: no such file or folder")
    if weights.is_dir() and kernel_mode(mode) in ("fixed-tiles", "row-invariant"):
        raise _fail(f"--mode {kernel_mode(mode)} runs bia's own model's layers, not a Hugging Face model's ({weights})")
    if log_file is not None:
        _check_log_file(log_file)
    import torch

    from ..experiment import check_device
    from ..experiment.model import load_model
    from ..serve import create_app, serve

    try:
        check_device(device)
        loaded = load_model(weights, getattr(torch, dtype), device)
    except ExperimentError as exc:
        raise _fail(str(exc)) from None
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise _fail(f"--model {weights}: cannot load it: {exc}") from None
    terminal = logging.StreamHandler()
    if not verbose:  # a step a line is thousands of lines for a few probes: the log file keeps them
        terminal.addFilter(lambda record: record.name != "bia.serve" or record.levelno > logging.INFO)
    handlers: list[logging.Handler] = [terminal]
    if log_file is not None:
        try:
            handlers.append(logging.FileHandler(log_file))
        except OSError as exc:  # checked above; this is what changed since
            raise _fail(f"--log-file {log_file}: cannot be written: {exc.strerror or exc}") from None
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=handlers)
    if not serve(
        create_app(loaded, mode, Path(weights).stem, batch_window_ms=batch_window_ms, max_batch=max_batch),
        host,
        port,
        said=f"kernel mode {mode_as_asked(mode, kernel_mode(mode))}, {dtype} on {device}, model {Path(weights).stem}",
    ):
        raise _fail(
            f"--host {host} --port {port}: cannot listen there (the port in use, or an address not of this machine)"
        )
