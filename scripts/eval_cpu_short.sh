#!/usr/bin/env bash
# The first accuracy table: every task and policy on the CPU reference at short lengths, with
# KV bytes read. Writes docs/results/eval_cpu_short.{json,md} (stamped with the commit).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/docs/results"
cmd=(eval --lengths 512,1024 --depths 0.25,0.5,0.75 --budgets 128,256 --block-size 16
     --json "$out/eval_cpu_short.json" --markdown "$out/eval_cpu_short.md")
"$root/build/bin/lychee" "${cmd[@]}"
python3 - "$out/eval_cpu_short.json" <<'PY'
import json, subprocess, sys
p = sys.argv[1]
d = json.load(open(p))
d.setdefault("run", {})["commit"] = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
json.dump(d, open(p, "w"), indent=1)
PY
