#!/usr/bin/env bash
# Render the parity report: sets up .venv with bia alone, none of its extras (scripts/setup.sh; the report
# needs no torch, transformers or Ray), then runs `bia report` with the
# given arguments and --force (it replaces its own output). With no sources it reads the embedded default data.
# It works from any folder: the checkout's .venv is set up, and the report is written where the caller stands (paths given
# are read from there too).
set -euo pipefail
here="$PWD"
root="$(cd "$(dirname "$0")/.." && pwd)"
(cd "$root" && BIA_EXTRAS="${BIA_EXTRAS-}" bash scripts/setup.sh)
cd "$here"
exec "$root/.venv/bin/bia" report --force "$@"  # the main job: it replaces the report it wrote last time
