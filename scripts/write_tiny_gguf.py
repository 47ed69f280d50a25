#!/usr/bin/env python3
"""Write bia's bundled byte-level model (data/tiny-model/) as a GGUF file that llama-server loads.

The weights are the ones scripts/train_tiny_model.py trained (the command is recorded in
data/tiny-model/tiny_lm.json and copied into the GGUF's description); see
analysis/experiment/engines/gguf.py for how they map onto llama.cpp's gpt2 architecture.

Usage:
    .venv/bin/python scripts/write_tiny_gguf.py tiny.gguf [--weights data/tiny-model/tiny_lm.safetensors] [--dtype f32|f16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analysis.experiment import bundled_model  # noqa: E402
from analysis.experiment.engines import write_gguf  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.add_argument("--weights", type=Path, default=None, help="a .safetensors file beside its .json (the bundled model by default)")
    parser.add_argument("--dtype", choices=("f32", "f16"), default="f32", help="storage of the 2-D matrices")
    parser.add_argument("--force", action="store_true", help="overwrite the output")
    args = parser.parse_args()
    path = write_gguf(args.weights or bundled_model(), args.out, dtype=args.dtype, force=args.force)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
