#!/usr/bin/env bash
# Issue 14 item 1 / the paper's claim 4 (Ratio is the best selection strategy at equal sparsity),
# as a paired test on the CPU reference: Top-k and Ratio at two equal sparsities (10% and 20% of a
# 2K context kept by the sparse heads: Top-k 208 / Ratio 0.1, Top-k 416 / Ratio 0.2) on the same
# samples, with the setting of scripts/eval_strategies_cpu.sh (default model, committed HardKuma
# roles, block 16, depth 0.5) and three times its samples (SAMPLES, default 9 per task: 72 per row),
# full attention for reference; scripts/paired_strategies.py gives each pair's paired difference.
#   scripts/eval_strategy_pairs_cpu.sh [out_dir] (default docs/results/strategies_cpu/pairs; ~35 min, 2 cores)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/docs/results/strategies_cpu/pairs}"
lychee="$root/build/bin/lychee"
mkdir -p "$out"
common=(eval --device cpu --lengths 2048 --depths 0.5 --samples "${SAMPLES:-9}" --block-size 16
        --heads "$root/docs/results/train/hardkuma/roles.json")
run() {  # NAME ARGS...
  local name="$1"; shift
  echo "eval_strategy_pairs_cpu: $name ($(date -u +%H:%M:%S))" >&2
  "$lychee" "${common[@]}" "$@" --json "$out/eval_$name.json" --markdown "$out/eval_$name.md" \
    > /dev/null 2> "$out/eval_$name.log"
}
run full --policies full
run topk --policies lychee --budgets 208,416
run ratio_0.1 --policies lychee --select ratio --select-value 0.1
run ratio_0.2 --policies lychee --select ratio --select-value 0.2
python3 "$root/scripts/strategies_table.py" "$out" > "$out/table.md"
{
  python3 "$root/scripts/paired_strategies.py" "$out/eval_topk.json:lychee topk 208 block 16" \
    "$out/eval_ratio_0.1.json:lychee ratio 0.1 block 16"
  echo
  python3 "$root/scripts/paired_strategies.py" "$out/eval_topk.json:lychee topk 416 block 16" \
    "$out/eval_ratio_0.2.json:lychee ratio 0.2 block 16"
} > "$out/paired.md"
cat "$out/table.md" "$out/paired.md"
