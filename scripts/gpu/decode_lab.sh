#!/usr/bin/env bash
# Decode-attention lab: split planning (waves of CTAs) and PDL on/off at the sizes where fixed
# costs matter (batch 1 and 4, 16K-64K). Prints one line per configuration.
set -u
scripts/gpu/run_all.sh build || exit 1
B="build-gpu/bin/bench_decode_attention --batches 1,4 --contexts 16384,32768,65536 --reps 100"
for waves in 1 2 3; do
  for pdl in 0 1; do
    echo "=== waves $waves, PDL off=$pdl"
    if [ "$pdl" = 1 ]; then env LYCHEE_DECODE_WAVES=$waves LYCHEE_NO_PDL=1 $B; else env LYCHEE_DECODE_WAVES=$waves $B; fi 2>&1 | grep -E "^\| [14] \|"
  done
done
