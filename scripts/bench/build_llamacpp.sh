#!/usr/bin/env bash
# Builds llama.cpp's llama-bench and llama-completion for side-by-side CPU benchmarks, from the
# copy vendored in the PyPI source package of llama-cpp-python (this machine reaches PyPI, not
# GitHub). Prints the directory that holds the binaries. Idempotent: a finished build is reused.
#   scripts/bench/build_llamacpp.sh [version]      (default 0.3.36: llama.cpp build 0c1e570)
# LLAMACPP_ISA=native (default): GGML_NATIVE=ON, every extension this CPU has (AVX-512, VNNI, AMX).
# LLAMACPP_ISA=avx2: AVX2 + FMA + F16C + BMI2 only (no AVX-512, no AVX-VNNI), into build-avx2/: llama.cpp
# as it runs on a plain AVX2 CPU, to set beside lychee with LYCHEE_QUANT_VNNI=0 on a newer one.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
version="${1:-0.3.36}"
dir="${LLAMACPP_DIR:-$root/.cache/llamacpp-$version}"
isa="${LLAMACPP_ISA:-native}"
case "$isa" in
  native) build="$dir/build"; isa_flags=(-DGGML_NATIVE=ON) ;;
  avx2) build="$dir/build-avx2"
        isa_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                   -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF) ;;
  *) echo "llamacpp: LLAMACPP_ISA must be native or avx2, got '$isa'" >&2; exit 2 ;;
esac
bin="$build/bin"
if [[ -x "$bin/llama-bench" && -x "$bin/llama-completion" ]]; then echo "$bin"; exit 0; fi
mkdir -p "$dir"
if [[ ! -f "$dir/src/CMakeLists.txt" ]]; then
  echo "llamacpp: downloading llama_cpp_python==$version (sdist) from PyPI" >&2
  mkdir -p "$dir/sdist"
  # (pip prepares the package's metadata in an isolated environment; nothing is built or installed)
  python3 -m pip download --quiet --no-deps --no-binary :all: "llama_cpp_python==$version" -d "$dir/sdist" >&2
  tar -xzf "$dir/sdist/llama_cpp_python-$version.tar.gz" -C "$dir/sdist"
  rm -rf "$dir/src"
  mv "$dir/sdist/llama_cpp_python-$version/vendor/llama.cpp" "$dir/src"
  rm -rf "$dir/sdist"
fi
echo "llamacpp: building llama-bench and llama-completion in $build (~15-35 min on 2 cores)" >&2
cmake -S "$dir/src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  "${isa_flags[@]}" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_TOOLS=ON >&2
ninja -C "$build" -j "${LLAMACPP_JOBS:-2}" llama-bench llama-completion >&2
echo "$bin"
