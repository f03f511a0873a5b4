#!/usr/bin/env bash
# The whole test suite: dependencies, assets, build (CPU; CUDA code compiled when nvcc is
# found), the GoogleTest suite through CTest, and the header-parser fuzzers.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install_deps.sh"
"$root/scripts/fetch_assets.sh"
"$root/scripts/build.sh"
ctest --test-dir "${LYCHEE_BUILD_DIR:-$root/build}" --output-on-failure -j "$(nproc)"
"$root/scripts/fuzz.sh"
