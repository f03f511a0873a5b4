#!/usr/bin/env bash
# What the FP8 KV cache (--kv-cache-dtype fp8: e4m3 codes with one scale per token and KV head,
# core/kv_dtype.h) costs the default model, measured on the CPU reference, whose f32 cache then
# holds exactly the values the GPU's FP8 pages stand for:
#   - perplexity and KL of the next-token distributions over a fixed text (the Paul Graham
#     essays), FP8 KV against the unrounded cache, under full attention and under each sparse
#     policy (each policy also with the unrounded cache, so that FP8's share can be read off);
#   - retrieval accuracy of every policy with the unrounded and with the FP8 cache on the same
#     samples, compared pairwise with 95% intervals (scripts/compare_eval.py).
#   scripts/eval_kv8_cpu.sh [out_dir]        (default docs/results/kv8_cpu)
# KV8_PARTS (default "ppl eval") picks the parts; KV8_PPL_POLICIES (default "lychee quest tidal
# duo") the sparse policies of the perplexity part, KV8_PPL_CTX / KV8_PPL_WINDOWS (default 1024 / 4)
# its window length and count, KV8_PPL_FULL=0 leaves out the full-attention run; KV8_EVAL_ARGS (default: 2048 tokens, depths
# 0.1/0.5/0.9, one sample each) the eval's lengths, depths and samples; KV8_CPU_WEIGHTS (default
# f32) the weights of both sides. The GPU runs the whole eval (2K-8K): scripts/gpu/run_all.sh kv8-accuracy.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/docs/results/kv8_cpu}"
lychee="$root/build/bin/lychee"
roles="$root/docs/results/train/hardkuma/roles.json"
weights=(--cpu-weights "${KV8_CPU_WEIGHTS:-f32}")
mkdir -p "$out"
# The policies' settings: those of docs/results/fp8_cpu (budget 256 tokens, LycheeDecode's block 16).
declare -A policy_args=(
  [lychee]="--policy lychee --budget 256 --block-size 16 --heads $roles"
  [quest]="--policy quest --budget 256"
  [tidal]="--policy tidal --budget 256"
  [duo]="--policy duo --heads $roles"
)
for part in ${KV8_PARTS:-ppl eval}; do
  case "$part" in
    ppl)
      ppl=(perplexity --device cpu -c "${KV8_PPL_CTX:-1024}" --windows "${KV8_PPL_WINDOWS:-4}" "${weights[@]}"
           --base-kv-cache-dtype bf16)
      if [ "${KV8_PPL_FULL:-1}" = 1 ]; then
        echo "eval_kv8_cpu: perplexity, full attention" >&2
        "$lychee" "${ppl[@]}" --kv-cache-dtype fp8 --json "$out/ppl_fp8_full.json" | tee "$out/ppl_fp8_full.txt"
      fi
      for p in ${KV8_PPL_POLICIES:-lychee quest tidal duo}; do
        for kv in bf16 fp8; do
          echo "eval_kv8_cpu: perplexity, $p, $kv KV" >&2
          # shellcheck disable=SC2086  # the policy's flags are words
          "$lychee" "${ppl[@]}" --kv-cache-dtype $kv ${policy_args[$p]} --json "$out/ppl_${kv}_$p.json" \
            | tee "$out/ppl_${kv}_$p.txt"
        done
      done ;;
    eval)
      # shellcheck disable=SC2206
      eval_args=(eval --device cpu ${KV8_EVAL_ARGS:---lengths 2048 --depths 0.1,0.5,0.9 --samples 1}
                 --policies full,lychee,quest,tidal,duo --budgets 256 --block-size 16 --heads "$roles" "${weights[@]}")
      for kv in bf16 fp8; do
        echo "eval_kv8_cpu: eval with the $kv KV cache" >&2
        "$lychee" "${eval_args[@]}" --kv-cache-dtype $kv --json "$out/eval_$kv.json" --markdown "$out/eval_$kv.md" \
          > /dev/null 2> "$out/eval_$kv.log"
      done
      python3 "$root/scripts/compare_eval.py" "$out/eval_bf16.json" "$out/eval_fp8.json" --names bf16 fp8 \
        --markdown "$out/compare.md" ;;
    *) echo "eval_kv8_cpu: unknown part '$part' (KV8_PARTS: ppl, eval)" >&2; exit 2 ;;
  esac
done
