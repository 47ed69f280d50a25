#!/usr/bin/env bash
# One night of a scheduled study: probe a server (or take a run already written), add it to the
# history, and render tonight's parity report and the trend over every night so far.
#
#   bash scripts/nightly.sh http://gpu-box:8000 /srv/bia/history /srv/bia/reports    # probes into /srv/bia/runs/<date>
#   bash scripts/nightly.sh runs/2026-11-30 /srv/bia/history /srv/bia/reports        # a run written elsewhere
#
# BIA_NIGHT names the night (the UTC date by default); BIA_RUNS is where probed runs go (beside the
# history by default); BIA is the bia command (this checkout's .venv/bin/bia by default). Every
# step stops the night on error (set -e), so a failed probe never reaches the history.
set -euo pipefail
source="$1" history="$2" reports="$3"
night="${BIA_NIGHT:-$(date -u +%F)}"
bia="${BIA:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/bia}"
mkdir -p "$reports"
if [[ "$source" == http://* || "$source" == https://* ]]; then
    run="${BIA_RUNS:-$(dirname "$history")/runs}/$night"
    $bia probe "$source" -o "$run"
else
    run="$source"
fi
$bia history "$run" -o "$history"
$bia report "$run" -o "$reports/parity-$night.html" --force
$bia trend "$history" -o "$reports/trend.html" --force
