#!/usr/bin/env bash
# LycheeDecode's four selection strategies with the paper's parameter grid (its appendix tables:
# Top-k, Top-p p = 0.99 / 0.995 / 0.999, Threshold tau = 1e-4 / 1e-5 / 1e-6, Ratio with 90 / 80 /
# 70% sparsity, i.e. 10 / 20 / 30% of the context kept), on the CPU reference with the default
# model and the committed HardKuma roles, block 16, at 2K; Top-k at 1/32, 1/16, 1/8 of the
# context (the paper's 1024-4096 of LongBench's lengths, scaled); full attention for reference.
# Each run writes eval_<name>.json / .md; scripts/strategies_table.py makes the table.
#   scripts/eval_strategies_cpu.sh [out_dir] (default docs/results/strategies_cpu; ~40 min, 2 cores)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/docs/results/strategies_cpu}"
source "$root/scripts/eval_cpu_lib.sh"
run full --policies full
run topk --policies lychee --budgets 64,128,256
for p in 0.99 0.995 0.999; do run "topp_$p" --policies lychee --select topp --select-value "$p"; done
for t in 1e-4 1e-5 1e-6; do run "threshold_$t" --policies lychee --select threshold --select-value "$t"; done
for r in 0.1 0.2 0.3; do run "ratio_$r" --policies lychee --select ratio --select-value "$r"; done
python3 "$root/scripts/strategies_table.py" "$out" > "$out/table.md"
cat "$out/table.md"
