#!/usr/bin/env bash
# Create .venv and install bia with the extras asked for (default: what the tests need). Idempotent: installs
# only when pyproject.toml changed since the last install, or when an extra asked for is not installed yet.
#   bash scripts/setup.sh                  # the test suite's: test, torch, hf, ray, fast and docs extras (about 2.6 GB)
#   BIA_EXTRAS= bash scripts/setup.sh      # bia alone: what the report, witness, dumps and probe commands need
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
extras="${BIA_EXTRAS-test,torch,hf,ray,fast,docs}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.bia-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
# The stamp holds pyproject.toml's hash and the extras installed with it; a set of extras the venv already has is
# not installed again (the report's bare install does not undo the tests' larger one).
have_hash="" have_extras=""
[ -f "$stamp" ] && read -r have_hash have_extras < "$stamp"
missing=""
for extra in ${extras//,/ }; do
    case ",$have_extras," in *",$extra,"*) ;; *) missing="$missing $extra" ;; esac
done
if [ "$have_hash" != "$want" ] || [ -n "$missing" ]; then
    [ "$have_hash" = "$want" ] || have_extras=""
    all=$(printf '%s\n' ${have_extras//,/ } ${extras//,/ } | sort -u | paste -sd, -)
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet --editable ".${all:+[$all]}"
    echo "$want $all" > "$stamp"
fi
