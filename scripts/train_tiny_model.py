"""Train the small byte-level model the experiment decodes with, on text every Python has offline.

The corpus is the docstrings of a fixed list of standard-library modules (this Python's own), so
the model's next-byte distributions have the near-ties of a real language model rather than of
random weights. Seeded and deterministic; a few minutes on 2 CPU cores.

Run: .venv/bin/python scripts/train_tiny_model.py [--steps 1500] [--out data/tiny-model/tiny_lm.safetensors]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analysis.experiment.model import ModelConfig, TinyLM  # noqa: E402

MODULES = ("argparse", "ast", "collections", "contextlib", "dataclasses", "datetime", "decimal", "email.message", "enum", "fractions",
           "functools", "heapq", "http.client", "inspect", "io", "itertools", "json", "logging", "os", "pathlib", "pickle", "random",
           "re", "shutil", "socket", "statistics", "string", "subprocess", "tempfile", "textwrap", "threading", "typing", "unittest",
           "urllib.parse", "uuid", "zipfile")


def corpus() -> str:
    """Docstrings of the modules above, their classes and functions, in a fixed order."""
    texts = []
    for name in MODULES:
        module = importlib.import_module(name)
        texts.append(inspect.getdoc(module) or "")
        for attr in sorted(dir(module)):
            obj = getattr(module, attr, None)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == module.__name__:
                doc = inspect.getdoc(obj)
                if doc:
                    texts.append(doc)
    return "\n\n".join(t for t in texts if t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("data/tiny-model/tiny_lm.safetensors"))
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    text = corpus()
    data = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
    cfg = ModelConfig()
    model = TinyLM(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=args.steps)
    valid = torch.ones(args.batch, args.seq, dtype=torch.bool)
    positions = torch.arange(args.seq)[None].expand(args.batch, -1)
    start, losses = time.time(), []
    for step in range(args.steps):
        offsets = torch.randint(0, data.numel() - args.seq - 1, (args.batch,))
        batch = torch.stack([data[o : o + args.seq + 1] for o in offsets.tolist()])
        logits, _ = model(batch[:, :-1], positions, valid)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  {time.time() - start:.0f} s", flush=True)
    from safetensors.torch import save_file

    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(args.out))
    meta = {
        "config": cfg.to_dict(),
        "command": f"python scripts/train_tiny_model.py --steps {args.steps} --batch {args.batch} --seq {args.seq}",
        "corpus": {"what": "docstrings of these standard-library modules, their classes and functions", "modules": MODULES,
                   "bytes": int(data.numel()), "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "python": platform.python_version()},
        "seed": 0,
        "steps": args.steps,
        "final_loss_mean_last_100": sum(losses[-100:]) / len(losses[-100:]),
        "torch": torch.__version__,
        "seconds": round(time.time() - start, 1),
    }
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB); mean loss of the last 100 steps {meta['final_loss_mean_last_100']:.3f}")


if __name__ == "__main__":
    main()
