set -u
scripts/gpu/run_all.sh build || exit 1
TORCH_CUDNN=$(python3 -c "import nvidia.cudnn as c; import os; print(os.path.join(list(c.__path__)[0], 'lib'))")
ls $TORCH_CUDNN | head -3
B="build-gpu/bin/bench_prefill_attention --backends cudnn --lengths 16384,65536 --no-chunked --reps 8"
run() { echo "=== $1"; shift; env "$@" $B 2>&1 | grep -E "^prompt|ran fallback|error" | head -4; }
run "paged system-cudnn" LYCHEE_X=0
run "contiguous system-cudnn" LYCHEE_PREFILL_CONTIGUOUS=1
run "contiguous noragged system-cudnn" LYCHEE_PREFILL_CONTIGUOUS=1 LYCHEE_PREFILL_NO_RAGGED=1
run "contiguous noragged nopadding system-cudnn" LYCHEE_PREFILL_CONTIGUOUS=1 LYCHEE_PREFILL_NO_RAGGED=1 LYCHEE_PREFILL_NO_PADDING=1
run "paged torch-cudnn" LD_LIBRARY_PATH=$TORCH_CUDNN
run "contiguous torch-cudnn" LD_LIBRARY_PATH=$TORCH_CUDNN LYCHEE_PREFILL_CONTIGUOUS=1
run "contiguous noragged nopadding torch-cudnn" LD_LIBRARY_PATH=$TORCH_CUDNN LYCHEE_PREFILL_CONTIGUOUS=1 LYCHEE_PREFILL_NO_RAGGED=1 LYCHEE_PREFILL_NO_PADDING=1
LD_LIBRARY_PATH=$TORCH_CUDNN LYCHEE_PREFILL_CONTIGUOUS=1 build-gpu/bin/lychee_tests --gtest_brief=1 --gtest_filter='*Prefill*' 2>&1 | tail -3
