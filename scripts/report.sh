#!/usr/bin/env bash
# Render the parity report: sets up .venv (scripts/setup.sh), then runs `bia report` with the
# given arguments and --force (it replaces its own output). With no sources it reads the embedded default data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/bia report --force "$@"  # the main job: it replaces the report it wrote last time
