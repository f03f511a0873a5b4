#!/usr/bin/env bash
# The whole test suite: dependencies, assets, build (CPU; CUDA code compiled when nvcc is
# found), the GoogleTest suite through CTest, and the header-parser fuzzers.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install_deps.sh"
"$root/scripts/fetch_assets.sh"
"$root/scripts/build.sh"
# --no-tests=error: a build or discovery that registers no test fails instead of passing empty.
ctest --test-dir "${LYCHEE_BUILD_DIR:-$root/build}" --output-on-failure --no-tests=error -j "$(nproc)"
"$root/scripts/fuzz.sh"
