#!/usr/bin/env bash
# On the GPU machine, one call: build (build-prefill), run the prefill attention tests, one
# compute-sanitizer pass over a cuDNN and a fallback case, then both benchmarks (ours and torch's)
# on the same GPU. Logs and JSON land in $OUT; the last lines printed are the summary tables.
#   scripts/bench/prefill_attention_gpu.sh [extra bench_prefill_attention args, e.g. --lengths 8192]
set -uo pipefail
out="${OUT:-/tmp/out}"
mkdir -p "$out"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version())'
  ldconfig -p | grep -E "libcudnn\.so|libnvrtc\.so" | head -4
} > "$out/env.log" 2>&1
cat "$out/env.log"

cmake -S . -B build-prefill -G Ninja > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
ninja -C build-prefill -j16 lychee_tests bench_prefill_attention > "$out/build.log" 2>&1 ||
  { grep -B2 -A12 -m3 "FAILED\|error" "$out/build.log"; exit 1; }

build-prefill/bin/lychee_tests --gtest_filter='*PrefillAttention*' > "$out/tests.log" 2>&1
echo "tests: rc=$?"; grep -E "^\[  (FAILED|SKIPPED|PASSED) |FINDING|Failure|cuDNN .* was not used" "$out/tests.log" | head -40

if command -v compute-sanitizer > /dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 build-prefill/bin/lychee_tests \
    --gtest_filter='*MatchesCpuReference/Cudnn_G4_D128_P64:*MatchesCpuReference/Fallback_G4_D128_P16' \
    > "$out/sanitizer.log" 2>&1
  echo "compute-sanitizer memcheck: rc=$? (9 = errors found; see sanitizer.log)"
  grep -m5 -E "Invalid|ERROR SUMMARY" "$out/sanitizer.log"
fi

python3 scripts/bench/torch_prefill_attention.py --json "$out/torch_prefill_attention.json" \
  > "$out/torch_bench.log" 2>&1
echo "torch bench: rc=$?"
build-prefill/bin/bench_prefill_attention --commit "$commit" --json "$out/prefill_attention.json" "$@" \
  > "$out/bench.log" 2>&1
echo "lychee bench: rc=$?"
cat "$out/torch_bench.log"
tail -25 "$out/bench.log"
