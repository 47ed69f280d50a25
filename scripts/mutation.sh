#!/usr/bin/env bash
# Mutation testing of bia's verdict and metric modules with mutmut (not part of CI: minutes to hours).
#
#   bash scripts/mutation.sh analysis/verdicts/_v3.py             # one module
#   bash scripts/mutation.sh analysis/verdicts/_v3.py analysis/metrics/parity/_parity.py
#
# Each module's mutants run against the tests that cover them (mutmut collects which tests reach
# which function first). Prints each module's score: killed / (mutants - timeouts), with the
# equivalent mutants listed in mutation-equivalents.txt counted as killed. Needs .venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pip install -q "mutmut==3.8.1"
[[ $# -gt 0 ]] || { echo "usage: bash scripts/mutation.sh analysis/MODULE.py..." >&2; exit 2; }
patterns=()
for module in "$@"; do
    [[ -f "$module" ]] || { echo "error: $module: no such module" >&2; exit 2; }
    name="${module%.py}"; name="${name//\//.}"
    patterns+=("${name}.*")
done
.venv/bin/mutmut run "${patterns[@]}" || true   # survivors make mutmut exit non-zero; the score below says how many
# mutmut keeps a mutant's result while its function is unchanged, so a survivor from an earlier run would stand
# after a new test: run the survivors again by name, which always reruns them against today's tests.
mapfile -t survivors < <(.venv/bin/python scripts/mutation_score.py --survivors "$@" | grep . || true)
[[ ${#survivors[@]} -eq 0 ]] || .venv/bin/mutmut run "${survivors[@]}" >/dev/null || true
.venv/bin/python scripts/mutation_score.py "$@"
