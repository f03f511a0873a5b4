#!/usr/bin/env bash
# Issue 14 item 1 / the paper's claim 4 (Ratio is the best selection strategy at equal sparsity),
# as paired tests on the CPU reference (the setting of scripts/eval_strategies_cpu.sh: default
# model, committed HardKuma roles, block 16, depth 0.5; scripts/eval_cpu_lib.sh):
#   equal  Top-k and Ratio at two equal sparsities of a 2K context (10% and 20% kept by the sparse
#          heads: Top-k 208 / Ratio 0.1, Top-k 416 / Ratio 0.2) on the same samples, SAMPLES
#          (default 9) per task, full attention for reference (~35 min on 2 cores);
#   mixed  contexts of 1K, 2K and 4K in one set, Top-k with one budget (240 tokens: 10% of the mean
#          length) against Ratio 0.1 (10% of each), SAMPLES (default 3) per task and length (~25 min).
# scripts/paired_strategies.py gives each pair's paired difference (paired.md).
#   scripts/eval_strategy_pairs_cpu.sh equal|mixed [out_dir] (default docs/results/strategies_cpu/pairs[_mixed])
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-equal}"
case "$mode" in
  equal)
    out="${2:-$root/docs/results/strategies_cpu/pairs}"
    SAMPLES="${SAMPLES:-9}"
    source "$root/scripts/eval_cpu_lib.sh"
    run full --policies full
    run topk --policies lychee --budgets 208,416
    run ratio_0.1 --policies lychee --select ratio --select-value 0.1
    run ratio_0.2 --policies lychee --select ratio --select-value 0.2
    pairs=("topk:lychee topk 208 block 16" "ratio_0.1:lychee ratio 0.1 block 16"
           "topk:lychee topk 416 block 16" "ratio_0.2:lychee ratio 0.2 block 16") ;;
  mixed)
    out="${2:-$root/docs/results/strategies_cpu/pairs_mixed}"
    LENGTHS="${LENGTHS:-1024,2048,4096}"
    source "$root/scripts/eval_cpu_lib.sh"
    run topk --policies lychee --budgets 240
    run ratio_0.1 --policies lychee --select ratio --select-value 0.1
    pairs=("topk:lychee topk 240 block 16" "ratio_0.1:lychee ratio 0.1 block 16") ;;
  *) echo "usage: $0 equal|mixed [out_dir]" >&2; exit 2 ;;
esac
python3 "$root/scripts/strategies_table.py" "$out" > "$out/table.md"
: > "$out/paired.md"
for ((i = 0; i < ${#pairs[@]}; i += 2)); do
  a="${pairs[i]}" b="${pairs[i + 1]}"
  python3 "$root/scripts/paired_strategies.py" "$out/eval_${a%%:*}.json:${a#*:}" "$out/eval_${b%%:*}.json:${b#*:}" \
    >> "$out/paired.md"
  echo >> "$out/paired.md"
done
cat "$out/table.md" "$out/paired.md"
