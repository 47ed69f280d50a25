#!/usr/bin/env python3
"""Each module's mutation score from the last ``mutmut run``: killed / (mutants - timeouts).

Mutants a stopped run never reached are counted apart, and make the module's score incomplete.

Mutants listed in ``mutation-equivalents.txt`` (``mutant_name  # why it cannot be killed``) count
as killed; a listed mutant that a test kills anyway is said, so the list stays honest. Survivors are
printed so they can be read with ``.venv/bin/mutmut show NAME``.

Usage: .venv/bin/python scripts/mutation_score.py analysis/verdicts/_v3.py [analysis/metrics/parity/_parity.py ...]
       .venv/bin/python scripts/mutation_score.py --survivors analysis/verdicts/_v3.py ...   # their names only, one per line
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KILLED = {1, 3, 37}
TIMEOUT = {36, -24, 24, 152, 255}


def equivalents() -> dict[str, str]:
    """mutant name -> reason, from mutation-equivalents.txt."""
    path = ROOT / "mutation-equivalents.txt"
    listed = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        name, _, why = line.partition("#")
        if name.strip():
            listed[name.strip()] = why.strip()
    return listed


def score(module: str, listed: dict[str, str]) -> tuple[float | None, list[str], list[str], int]:
    """The score, the survivors, the listed equivalents that were killed after all, and how many mutants
    are not yet run (a run stopped early). A mutant no test reaches ("no tests") is a survivor."""
    meta = ROOT / "mutants" / f"{module}.meta"
    if not meta.exists():
        raise SystemExit(f"error: {meta}: no results; run bash scripts/mutation.sh {module}")
    codes = {k: c for k, c in json.loads(meta.read_text())["exit_code_by_key"].items()}
    pending = sum(1 for c in codes.values() if c is None)
    codes = {k: c for k, c in codes.items() if c is not None}
    timeouts = [k for k, c in codes.items() if c in TIMEOUT]
    killed = [k for k, c in codes.items() if c in KILLED]
    survivors = [k for k, c in codes.items() if c not in KILLED and c not in TIMEOUT and k not in listed]
    killed_anyway = [k for k in killed if k in listed]
    counted = len(codes) - len(timeouts)
    equivalent = sum(1 for k, c in codes.items() if k in listed and c not in KILLED and c not in TIMEOUT)
    return ((len(killed) + equivalent) / counted if counted else None), survivors, killed_anyway, pending


def main(modules: list[str]) -> int:
    listed = equivalents()
    if modules[:1] == ["--survivors"]:
        for module in modules[1:]:
            print("\n".join(score(module, listed)[1]))
        return 0
    worst = 1.0
    for module in modules:
        value, survivors, killed_anyway, pending = score(module, listed)
        shown = "no mutants" if value is None else f"{value:.1%}"
        print(f"{module}: {shown} ({len(survivors)} surviving" + (f", {pending} not yet run: incomplete)" if pending else ")"))
        for name in survivors:
            print(f"    survived: {name}")
        for name in killed_anyway:
            print(f"    listed as equivalent but killed: {name} (take it off the list)")
        worst = min(worst, value if value is not None else 1.0, 0.0 if pending else 1.0)
    return 0 if worst >= 0.97 else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
