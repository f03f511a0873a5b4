#!/usr/bin/env bash
# What FP8 e4m3 weights (one scale per output channel, core/fp8.h) cost the default model, measured
# on the CPU reference, which holds exactly the values GPU FP8 weights stand for:
#   - retrieval accuracy of every policy with f32 and with FP8 weights on the same samples, compared
#     pairwise (scripts/compare_eval.py);
#   - perplexity and KL(f32 || FP8) of the next-token distributions over a fixed text, under full
#     attention and under LycheeDecode.
#   scripts/eval_fp8_cpu.sh [out_dir]        (default docs/results/fp8_cpu; ~30 min on 2 cores)
# FP8_SELECTOR_QKV (default fp8, as the committed results were made: every linear matrix rounded)
# is passed as --fp8-selector-qkv; bf16 gives the engine's default since 559e9ec (the Q/K/V of the
# layers that choose tokens for other heads kept f32 on the CPU; docs/results/fp8_gpu).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/docs/results/fp8_cpu}"
lychee="$root/build/bin/lychee"
roles="$root/docs/results/train/hardkuma/roles.json"
mkdir -p "$out"
keep=(--fp8-selector-qkv "${FP8_SELECTOR_QKV:-fp8}")
eval_args=(eval --device cpu --lengths 2048 --depths 0.1,0.5,0.9 --samples 2
           --policies full,lychee,quest,tidal,duo --budgets 256 --block-size 16 --heads "$roles")
for w in f32 fp8; do
  echo "eval_fp8_cpu: eval with $w weights" >&2
  "$lychee" "${eval_args[@]}" "${keep[@]}" --cpu-weights "$w" --json "$out/eval_$w.json" --markdown "$out/eval_$w.md" \
    > /dev/null 2> "$out/eval_$w.log"
done
python3 "$root/scripts/compare_eval.py" "$out/eval_f32.json" "$out/eval_fp8.json" --names f32 fp8 \
  --markdown "$out/compare.md"
ppl=(perplexity --device cpu -c 1024 --windows 4 --base-cpu-weights f32 "${keep[@]}")
lychee_policy=(--policy lychee --budget 256 --block-size 16 --heads "$roles")
"$lychee" "${ppl[@]}" --cpu-weights fp8 --json "$out/ppl_fp8_full.json" | tee "$out/ppl_fp8_full.txt"
"$lychee" "${ppl[@]}" --cpu-weights f32 "${lychee_policy[@]}" --json "$out/ppl_f32_lychee.json" | tee "$out/ppl_f32_lychee.txt"
"$lychee" "${ppl[@]}" --cpu-weights fp8 "${lychee_policy[@]}" --json "$out/ppl_fp8_lychee.json" | tee "$out/ppl_fp8_lychee.txt"
