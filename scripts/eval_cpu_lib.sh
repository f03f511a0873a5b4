# Shared by the CPU accuracy sweeps of issue 14 (scripts/eval_strategies_cpu.sh,
# scripts/eval_strategy_pairs_cpu.sh); sourced, not run. The setting: the default model on the CPU
# reference with the committed HardKuma roles, block 16, no forced sink/recent tokens (the committed
# tables' setting; LycheeDecode's default is 64 / 256 since the GPU strategy sweep), depth 0.5;
# LENGTHS (default 2048) and SAMPLES per task. `run NAME ARGS...` writes eval_NAME.{json,md,log} into $out.
lychee="$root/build/bin/lychee"
mkdir -p "$out"
common=(eval --device cpu --lengths "${LENGTHS:-2048}" --depths 0.5 --samples "${SAMPLES:-3}" --block-size 16
        --sink 0 --recent 0 --heads "$root/docs/results/train/hardkuma/roles.json")
run() {  # NAME ARGS...
  local name="$1"; shift
  echo "$(basename "$0"): $name ($(date -u +%H:%M:%S))" >&2
  "$lychee" "${common[@]}" "$@" --json "$out/eval_$name.json" --markdown "$out/eval_$name.md" \
    > /dev/null 2> "$out/eval_$name.log"
}
