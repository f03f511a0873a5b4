#!/usr/bin/env bash
# The whole test suite: dependencies, assets, build (CPU; CUDA code compiled when nvcc is
# found), the GoogleTest suite through CTest, the server's pytest suite (the openai client against
# a real `lychee serve`), the Python package's pytest suite (tests/python: the package installed
# from this tree with pip), every example of README.md and docs/*.md (tests/docs), the analysis
# scripts' tests (tests/scripts), and the parser fuzzers.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install_deps.sh"
"$root/scripts/fetch_assets.sh"
"$root/scripts/build.sh"
# --no-tests=error: a build or discovery that registers no test fails instead of passing empty.
ctest --test-dir "${LYCHEE_BUILD_DIR:-$root/build}" --output-on-failure --no-tests=error -j "$(nproc)"
# The server end to end and the Python package, in a virtual environment (PyPI's openai, pytest,
# numpy, matplotlib for scripts/plot_*.py, the package's build requirements, and sglang-router for
# the replicas behind a router, tests/server/test_router.py); pytest's exit status fails this
# script (set -e).
build="${LYCHEE_BUILD_DIR:-$root/build}"
venv="$build/venv-server-tests"
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check openai pytest numpy matplotlib nanobind scikit-build-core \
  mypy huggingface_hub "sglang-router==0.3.2"
# The package (pyproject.toml) is built in the CLI's build tree, with the tree's own CUDA setting:
# every layer's objects are reused and only the bindings compile (seconds when up to date).
cuda="$(sed -n 's/^LYCHEE_CUDA:STRING=//p' "$build/CMakeCache.txt")"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps \
  --config-settings=build-dir="$build" --config-settings=cmake.define.LYCHEE_CUDA="${cuda:-AUTO}" "$root"
# One run per folder: each folder's conftest.py is imported as the module `conftest`.
LYCHEE_BUILD_DIR="$build" "$venv/bin/python" -m pytest -q -rs "$root/tests/server"
LYCHEE_BUILD_DIR="$build" "$venv/bin/python" -m pytest -q -rs "$root/tests/python"
# Every command and code block of README.md and docs/*.md, as written (the GPU ones are skipped here
# and run by the GPU machine with LYCHEE_DOCS_GPU=1).
LYCHEE_BUILD_DIR="$build" "$venv/bin/python" -m pytest -q -rs "$root/tests/docs"
# The analysis scripts behind committed results (tables, paired comparisons, figures).
"$venv/bin/python" -m pytest -q "$root/tests/scripts"
"$root/scripts/fuzz.sh"
