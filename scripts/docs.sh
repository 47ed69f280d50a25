#!/usr/bin/env bash
# Build the documentation site into docs/_build/html: sets up .venv (scripts/setup.sh, which installs
# the docs extra), then runs Sphinx offline with warnings as errors and every reference checked
# (-W --keep-going -n). The notebooks in notebooks/ are executed during the build; a failing cell,
# a broken reference or any warning fails it (non-zero exit). Extra arguments go to sphinx-build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export BIA_OFFLINE=1          # the notebooks read the embedded data only, never the network
export PYTHONHASHSEED=0
start=$(date +%s)
# -E: a fresh environment every time, so no warning hides in a page an earlier build kept.
.venv/bin/python -m sphinx -b html -E -W --keep-going -n -q -T -d docs/_build/doctrees "$@" docs docs/_build/html
echo "docs: built docs/_build/html/index.html in $(( $(date +%s) - start )) s" >&2
