#!/usr/bin/env bash
# Fetches vLLM (VLLM_VERSION, default 0.26.0: its wheel pins torch==2.11.0 and its extensions link
# libcudart.so.13, the GPU image's torch and CUDA; both checked below) and the wheels it needs beyond
# the GPU image HERE (PyPI), and lays them out as carry parts for the device machine:
#   .carry/vllm/part_NN/   vllm.tar.part_NN, SHA256SUMS (that part), MANIFEST.json (all of it)
# scripts/gpu/fetch_vllm.py resolves vLLM's requirements recursively (pip download --no-deps per
# requirement, cp312 manylinux x86_64; what the image holds is left to it), leaves out what a
# Llama decode and `vllm serve` do not import (its NOT_CARRIED table, with the reason for each, and
# FlashAttention 2's extension of the vLLM wheel), repacks each wheel as an xz tar (wheel_xz.py) and
# cuts them, as one tar, into parts of VLLM_PART_MIB MiB (default 32: a device call carries the
# tracked tree, ~27 MiB, plus one part within its 64 MiB). The manifest is also written to
# scripts/gpu/vllm_carry.json (tracked: what the parts hold, without the bytes).
# On one warm machine: run_all.sh vllm-stage-00 (carry .carry/vllm/part_00), vllm-stage-01, ...,
# then vllm-install and bench-vllm. Idempotent: downloads and repacks only what is missing.
#   scripts/gpu/fetch_vllm.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dl=.carry/vllm_dl     # the wheels as downloaded and their xz tars (not carried)
carry=.carry/vllm
mkdir -p "$dl" "$carry"
git check-ignore -q "$carry/part_00" || { echo "fetch_vllm: .carry is not git-ignored"; exit 1; }
export VLLM_VERSION="${VLLM_VERSION:-0.26.0}"

python3 scripts/gpu/fetch_vllm.py resolve "$dl"
python3 scripts/gpu/fetch_vllm.py verify "$dl"
VLLM_PART_MIB="${VLLM_PART_MIB:-32}" python3 scripts/gpu/fetch_vllm.py pack "$dl" "$carry"
cp "$carry/MANIFEST.json" scripts/gpu/vllm_carry.json

tree_mib=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1 | awk '{printf "%.1f", $1 / 1048576}')
echo "fetch_vllm: carry parts (one per device call, with the tracked tree of $tree_mib MiB; limit 64 MiB):"
for d in "$carry"/part_*; do
  printf '  %-22s %6.1f MiB\n' "$d/" "$(du -cb "$d"/* | tail -1 | cut -f1 | awk '{print $1 / 1048576}')"
done
