#!/usr/bin/env python3
"""Probe a real llama.cpp server serving bia's byte-level model, with and without prompt caching.

Writes the model as GGUF (``analysis.experiment.engines.gguf``), starts ``llama-server -np 16 --metrics``
on loopback (built by ``scripts/build_llama_server.sh``), and runs ``bia probe`` at c = 1, 4, 8, 16
on the two default prompts, once with llama.cpp's prompt cache on (its default) and once with
``--no-cache-prompt``. The bundled runs under ``data/llamacpp-cpu/`` were written by:

    .venv/bin/python scripts/llamacpp_runs.py --out data/llamacpp-cpu --force

then each run's ``derived/`` cache by ``read_run``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analysis.core._output import OutputExists, claim_output  # noqa: E402
from analysis.experiment import DEFAULT_PROMPTS, bundled_model  # noqa: E402
from analysis.experiment.engines import llama_server, write_gguf  # noqa: E402
from analysis.probe import probe  # noqa: E402
from analysis.run import read_run  # noqa: E402

MODES = {"cache-prompt": True, "no-cache-prompt": False}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/llamacpp-cpu"), help="folder for one run per prompt-cache mode")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--top-logprobs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="llama-server -t (its default otherwise)")
    parser.add_argument("--force", action="store_true", help="replace runs already in --out")
    args = parser.parse_args()
    try:  # refused before the server is started, as every bia writer does
        for mode in MODES:
            claim_output(args.out / mode, force=args.force, what=f"the {mode} run", folder=True)
    except OutputExists as exc:
        sys.exit(f"error: {exc}")
    with tempfile.TemporaryDirectory(prefix="bia-gguf-") as tmp:
        model = write_gguf(bundled_model(), Path(tmp) / "bia-tiny-byte-lm.gguf")
        for mode, cache in MODES.items():
            folder = args.out / mode
            with llama_server(model, parallel=16, cache_prompt=cache, threads=args.threads) as url:
                asyncio.run(probe(url, folder, prompts=list(DEFAULT_PROMPTS), max_tokens=args.max_tokens,
                                  top_logprobs=args.top_logprobs))
            read_run(folder)  # writes derived/
            print(f"wrote {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
