#!/usr/bin/env bash
# The static checks both tiers run (scripts/check.sh, scripts/test.sh): ruff's rules and formatter, mypy, and
# import-linter's contracts, each over analysis/ with the settings in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check analysis
.venv/bin/ruff format --check analysis
.venv/bin/mypy
# The layer contract (pyproject's [tool.importlinter]): an import against the pipeline's direction, a circle, or an
# import of another folder's private module fails here with the importing module and line named.
.venv/bin/lint-imports --no-cache
