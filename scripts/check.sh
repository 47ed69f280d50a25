#!/usr/bin/env bash
# The fast tier (make check): lint, format, types, the layer contracts, and every test not marked slow or engine,
# doctests included, property tests drawing a third of their examples (tests/conftest.py: examples). Meant to run
# before each commit, in under 3 minutes on 2 cores (docs/development.md records
# its wall time). The whole suite, with the real engines, the browser and the docs build, is scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lint.sh
BIA_EXAMPLES_SCALE="${BIA_EXAMPLES_SCALE:-0.34}" exec .venv/bin/python -m pytest -m "not slow and not engine" -q "$@"
