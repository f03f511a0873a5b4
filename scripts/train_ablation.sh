#!/usr/bin/env bash
# The trainer's ablation table: retrieval accuracy of LycheeDecode with the head sets that the
# HardKuma, direct-optimise and HardConcrete gates learned (docs/results/train/<run>/roles.json,
# trained by scripts/gpu/run_all.sh train), and HardKuma trained with inference-style propagation,
# at the same number of retrieval heads and the same budget, next to full attention and the
# untrained stand-in. Runs on the CPU reference (sparse policies are served there). Writes
# docs/results/train/ablation.{json,md} and each run's eval records to docs/results/train/eval/.
#   scripts/train_ablation.sh [LENGTHS] [SAMPLES]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
res="$root/docs/results/train"
lengths="${1:-1024,2048}"
samples="${2:-2}"
tmp="$(mktemp -d)"
evals="$res/eval"
mkdir -p "$evals"
common=(eval --tasks passkey,niah_single --lengths "$lengths" --depths 0.2,0.5,0.8
        --samples "$samples" --budgets 256 --block-size 16)
runs=()
for run in hardkuma direct hardconcrete hardkuma-propagate-retrieval; do
  f="$res/$run/roles.json"
  [ -f "$f" ] || { echo "missing $f: train it first (scripts/gpu/run_all.sh train GATE ...)" >&2; exit 1; }
  # Equal head counts: the N gated heads with the largest E[z] (plus layer 0).
  python3 "$root/scripts/roles_top_n.py" "$f" "$tmp/$run.json"
  echo "== $run" >&2
  "$root/build/bin/lychee" "${common[@]}" --policies lychee --heads "$tmp/$run.json" --json "$evals/$run.json"
  runs+=("$run=$evals/$run.json")
done
echo "== stand-in and full" >&2
"$root/build/bin/lychee" "${common[@]}" --policies full,lychee --json "$evals/base.json"
runs+=("base=$evals/base.json")
python3 "$root/scripts/ablation_table.py" --out "$res/ablation" \
  --command "scripts/train_ablation.sh $lengths $samples" "${runs[@]}"
rm -rf "$tmp"
