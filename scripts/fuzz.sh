#!/usr/bin/env bash
# Builds the libFuzzer targets for the safetensors and GGUF header parsers with ASan + UBSan
# and runs each for a bounded number of executions (LYCHEE_FUZZ_RUNS, default 200000).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"
cmake -S "$root/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang >/dev/null
ninja -C "$build" >/dev/null
runs="${LYCHEE_FUZZ_RUNS:-200000}"
for target in gguf safetensors; do
  corpus="$build/corpus_$target"
  rm -rf "$corpus" && mkdir -p "$corpus"
  "$build/make_seeds" "$target" "$corpus"
  echo "lychee: fuzzing the $target parser for $runs runs" >&2
  "$build/fuzz_$target" -runs="$runs" -max_len=4096 -timeout=10 -print_final_stats=1 "$corpus" 2>&1 | tail -4
done
