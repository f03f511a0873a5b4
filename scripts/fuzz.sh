#!/usr/bin/env bash
# Builds the libFuzzer targets for the safetensors and GGUF header parsers and the server's
# request parser with ASan + UBSan
# and runs each for a bounded number of executions (LYCHEE_FUZZ_RUNS, default 200000), starting
# from the committed corpus fuzz/corpus/<format>/ (valid files written by make_seeds, plus every
# crash input ever found), copied so that the run's new inputs stay out of the source tree.
# On a failure the whole fuzzer output is printed, and the crash input is named: once fixed,
# commit it to fuzz/corpus/<format>/ so that every later run replays it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"
cmake -S "$root/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang >/dev/null
ninja -C "$build" >/dev/null
runs="${LYCHEE_FUZZ_RUNS:-200000}"
for target in gguf safetensors request; do
  seeds="$root/fuzz/corpus/$target"
  if [ -z "$(ls -A "$seeds" 2>/dev/null)" ]; then
    echo "lychee: no seed corpus in $seeds (make it with: $build/make_seeds $target $seeds)" >&2
    exit 1
  fi
  corpus="$build/corpus_$target"
  rm -rf "$corpus" && mkdir -p "$corpus"
  cp "$seeds"/* "$corpus"/
  log="$build/fuzz_$target.log"
  echo "lychee: fuzzing the $target parser for $runs runs from $(ls "$seeds" | wc -l) committed inputs" >&2
  if ! "$build/fuzz_$target" -runs="$runs" -max_len=4096 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$build/crash_${target}_" "$corpus" >"$log" 2>&1; then
    cat "$log" >&2
    echo "lychee: the $target fuzzer failed (full output above); inputs: $(ls "$build"/crash_"${target}"_* 2>/dev/null | tr '\n' ' ')" >&2
    exit 1
  fi
  tail -4 "$log" >&2
done
