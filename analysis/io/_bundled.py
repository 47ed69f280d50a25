"""The data and notebooks shipped with bia: inside the installed package, else in the source checkout."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # the installed analysis/ folder


def bundled(relative: str) -> Path:
    """A file shipped with bia: inside the installed package, else in the source checkout.

    Parameters
    ----------
    relative : str
        The file's or folder's path relative to the checkout's root, e.g. ``data/aprender-lambda``.

    Returns
    -------
    Path

    Raises
    ------
    FileNotFoundError
        Neither place holds it.
    """
    for base in (PACKAGE / "_bundled", PACKAGE.parent):
        candidate = base / relative
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"bia's bundled {relative} is missing from {PACKAGE}")


def default_sources() -> list[str]:
    """The embedded default data: the real perf041 witnesses and markers from host "lambda".

    Examples
    --------
    >>> default_sources()
    ['data/aprender-lambda']
    """
    return [_shown(bundled("data/aprender-lambda"))]


def _shown(path: Path) -> str:
    """A bundled path as a reader would type it: relative to the working folder when it lies inside it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if relative.startswith("..") else relative


def default_runs() -> list[str]:
    """The embedded default runs: the torch experiment on CPU in its four kernel modes (``data/experiment-cpu``),
    then a real llama.cpp server on CPU with and without its prompt cache (``data/llamacpp-cpu``), then a real
    vLLM server (its CPU build) with and without its prefix cache (``data/vllm-cpu``), then Hugging Face transformers
    in process, continuous and left-padded batching (``data/transformers-cpu``): one model through every engine.

    Examples
    --------
    >>> [run.rsplit("/", 2)[-2:] for run in default_runs()]  # doctest: +NORMALIZE_WHITESPACE
    [['experiment-cpu', 'batch-invariant'], ['experiment-cpu', 'default'], ['experiment-cpu', 'fixed-tiles'],
     ['experiment-cpu', 'row-invariant'], ['llamacpp-cpu', 'cache-prompt'], ['llamacpp-cpu', 'no-cache-prompt'], ['vllm-cpu', 'no-prefix-cache'], ['vllm-cpu', 'prefix-cache'],
     ['transformers-cpu', 'continuous'], ['transformers-cpu', 'padded']]
    """
    return [
        _shown(p.parent)
        for folder in ("data/experiment-cpu", "data/llamacpp-cpu", "data/vllm-cpu", "data/transformers-cpu")
        for p in sorted(bundled(folder).glob("*/manifest.json"))
    ]


def default_rl_pairs() -> list[str]:
    """The embedded sampler-trainer pairs: a real vLLM server's greedy rollouts and their recompute by transformers
    from the same checkpoint (``data/vllm-hf-pair``, prime-rl's token export; ``analysis.mismatch_summary`` reads it).

    Examples
    --------
    >>> [path.rsplit("/", 2)[-2:] for path in default_rl_pairs()]
    [['vllm-hf-pair', 'pairs.jsonl']]
    """
    return [_shown(bundled("data/vllm-hf-pair/pairs.jsonl"))]
