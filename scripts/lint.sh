#!/usr/bin/env bash
# The static checks both tiers run (scripts/check.sh, scripts/test.sh): ruff's rules and formatter, mypy, and
# import-linter's contracts, each over analysis/ with the settings in pyproject.toml. ruff and mypy check the paired
# notebooks' code too (notebooks/*.py, jupytext's percent format; the formatter leaves them as laid out by hand).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check analysis notebooks/*.py
.venv/bin/ruff format --check analysis
.venv/bin/mypy  # pyproject's [tool.mypy] files: analysis and notebooks
# The layer contract (pyproject's [tool.importlinter]): an import against the pipeline's direction, a circle, or an
# import of another folder's private module fails here with the importing module and line named.
.venv/bin/lint-imports --no-cache
