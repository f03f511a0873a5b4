#!/usr/bin/env bash
# One command for a fresh machine: install dependencies, fetch the default model (into the per-user
# cache: $LYCHEE_MODELS_DIR, else ${XDG_CACHE_HOME:-~/.cache}/lychee, where the binary looks), build,
# and answer a question with it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install_deps.sh"
"$root/scripts/fetch_assets.sh"
"$root/scripts/build.sh"
echo "lychee: built $root/build/bin/lychee; asking the default model a question" >&2
"$root/build/bin/lychee" chat -p "What is the capital of France? Answer in one sentence." -n 48
