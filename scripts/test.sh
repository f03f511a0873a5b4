#!/usr/bin/env bash
# The whole test suite: dependencies, assets, build (CPU; CUDA code compiled when nvcc is
# found), the GoogleTest suite through CTest, the server's pytest suite (the openai client against
# a real `lychee serve`), and the parser fuzzers.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install_deps.sh"
"$root/scripts/fetch_assets.sh"
"$root/scripts/build.sh"
# --no-tests=error: a build or discovery that registers no test fails instead of passing empty.
ctest --test-dir "${LYCHEE_BUILD_DIR:-$root/build}" --output-on-failure --no-tests=error -j "$(nproc)"
# The server end to end, in a virtual environment (PyPI's openai and pytest); pytest's exit status
# fails this script (set -e).
venv="${LYCHEE_BUILD_DIR:-$root/build}/venv-server-tests"
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check openai pytest
LYCHEE_BUILD_DIR="${LYCHEE_BUILD_DIR:-$root/build}" "$venv/bin/python" -m pytest -q "$root/tests/server"
"$root/scripts/fuzz.sh"
