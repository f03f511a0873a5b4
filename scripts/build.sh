#!/usr/bin/env bash
# Configures and builds lychee into build/ (CUDA on when nvcc is found; LYCHEE_CUDA=OFF to skip).
# The Python module is built by `pip install .` (pyproject.toml), which may share this tree
# (scripts/test.sh does); here it is off unless LYCHEE_PYTHON=ON.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${LYCHEE_BUILD_DIR:-$root/build}"
args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}"
      -DLYCHEE_PYTHON="${LYCHEE_PYTHON:-OFF}")
if [ -n "${LYCHEE_CUDA:-}" ]; then args+=(-DLYCHEE_CUDA="$LYCHEE_CUDA"); fi
if [ -n "${LYCHEE_DEPS_PREFIX:-}" ]; then args+=(-DLYCHEE_DEPS_PREFIX="$LYCHEE_DEPS_PREFIX"); fi
cmake "${args[@]}" >/dev/null
ninja -C "$build" -j "${LYCHEE_JOBS:-$(nproc)}"
