#!/usr/bin/env bash
# Configures and builds lychee into build/ (CUDA on when nvcc is found; LYCHEE_CUDA=OFF to skip).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${LYCHEE_BUILD_DIR:-$root/build}"
args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}")
if [ -n "${LYCHEE_CUDA:-}" ]; then args+=(-DLYCHEE_CUDA="$LYCHEE_CUDA"); fi
if [ -n "${LYCHEE_DEPS_PREFIX:-}" ]; then args+=(-DLYCHEE_DEPS_PREFIX="$LYCHEE_DEPS_PREFIX"); fi
cmake "${args[@]}" >/dev/null
ninja -C "$build" -j "${LYCHEE_JOBS:-$(nproc)}"
