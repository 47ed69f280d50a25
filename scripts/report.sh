#!/usr/bin/env bash
# Render the parity report: sets up .venv (scripts/setup.sh), then runs `bia report` with the
# given arguments. With no sources it reads the embedded default data (data/aprender-lambda).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/bia report "$@"
