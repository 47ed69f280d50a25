#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only) from the llama.cpp source vendored
# in the llama-cpp-python source distribution on PyPI, for testing bia against a
# real llama.cpp server.
#
# - Fetches the sdist with `pip download --no-deps --no-binary :all:` (PyPI only;
#   no git clone, no other downloads), unpacks it, and builds vendor/llama.cpp
#   with cmake (Ninja if available, else make), CURL off, native CPU tuning off.
# - The binary is cached outside any clone, keyed by version:
#     ${BIA_CACHE:-$HOME/.cache/bia}/llama.cpp/<version>/bin/llama-server
# - Idempotent: if that binary exists it prints the path and exits at once.
# - The last line on stdout is the binary path; all build chatter goes to stderr.
# - Static libraries (BUILD_SHARED_LIBS=OFF), so the cached binary does not
#   depend on the build tree's libllama.so/libggml.so.
#
# Time: about 7.5 minutes from scratch on 2 cores with GCC 12.2 (measured 437 s:
# ~30 s to download the ~77 MB sdist, ~6.5 min to compile 206 ninja steps).
# Later runs return at once.  The cache holds ~375 MB (sdist + build tree).  BUILD_SECONDS is printed to stderr at the end.
#
# Env: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), BIA_CACHE, PYTHON (python
# whose pip to use; default: python3), BUILD_JOBS (default 2).
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${BIA_CACHE:-$HOME/.cache/bia}"
ROOT="$CACHE/llama.cpp/$VERSION"
BIN="$ROOT/bin/llama-server"
PY="${PYTHON:-python3}"
JOBS="${BUILD_JOBS:-2}"

if [[ -x "$BIN" ]]; then
    echo "$BIN"
    exit 0
fi

start=$(date +%s)
WORK="$ROOT/work"
mkdir -p "$WORK/sdist" "$ROOT/bin"

tarball="$WORK/sdist/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$tarball" ]]; then
    "$PY" -m pip download --no-deps --no-binary :all: \
        "llama-cpp-python==$VERSION" -d "$WORK/sdist" >&2
fi

src="$WORK/llama_cpp_python-$VERSION"
if [[ ! -d "$src/vendor/llama.cpp" ]]; then
    rm -rf "$src"
    tar -xzf "$tarball" -C "$WORK"
fi
lcpp="$src/vendor/llama.cpp"
[[ -f "$lcpp/CMakeLists.txt" ]] || { echo "no vendored llama.cpp in $src" >&2; exit 1; }

gen=()
if command -v ninja >/dev/null 2>&1; then gen=(-G Ninja); fi

cmake -S "$lcpp" -B "$WORK/build" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release "${gen[@]}" >&2
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >&2

built="$WORK/build/bin/llama-server"
[[ -x "$built" ]] || { echo "build finished but $built is missing" >&2; exit 1; }
cp "$built" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
"$BIN" --version >&2 || true
echo "BUILD_SECONDS=$(( $(date +%s) - start ))" >&2
echo "$BIN"
