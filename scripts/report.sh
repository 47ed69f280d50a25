#!/usr/bin/env bash
# Render the parity report: sets up .venv with bia alone, none of its extras (scripts/setup.sh; the report
# needs no torch, transformers or Ray), then runs `bia report` with the
# given arguments and --force (it replaces its own output). With no sources it reads the embedded default data.
set -euo pipefail
cd "$(dirname "$0")/.."
BIA_EXTRAS="${BIA_EXTRAS-}" bash scripts/setup.sh
exec .venv/bin/bia report --force "$@"  # the main job: it replaces the report it wrote last time
