#!/usr/bin/env bash
# Run the test suite: sets up .venv (scripts/setup.sh), installs Debian's chromium for the
# browser tests when it is missing and we are root, then runs pytest with any extra arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing Debian's chromium for the browser tests" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "warning: chromium is missing and cannot be installed here; browser tests will skip" >&2
    fi
fi
exec .venv/bin/python -m pytest "$@"
