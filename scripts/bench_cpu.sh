#!/usr/bin/env bash
# CPU benchmark of the default model: writes docs/results/cpu_smollm2.json stamped with the
# command, commit, machine and date, then regenerates docs/benchmarks.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd=(bench --prompt-tokens 512 --gen-tokens 128 --repeats 3)
tmp="$(mktemp)"
"$root/build/bin/lychee" "${cmd[@]}" --json "$tmp"
python3 - "$tmp" "$root/docs/results/cpu_smollm2.json" "lychee ${cmd[*]}" <<'PY'
import json, subprocess, sys, datetime, platform, os
src, dst, command = sys.argv[1:4]
r = json.load(open(src))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
r.update(command=command, commit=subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip(),
         dirty=bool(subprocess.check_output(["git", "status", "--porcelain", "--untracked-files=no"], text=True).strip()),
         machine=f"{cpu}, {os.cpu_count()} cores", date=datetime.date.today().isoformat())
json.dump(r, open(dst, "w"), indent=2, sort_keys=True)
PY
rm -f "$tmp"
python3 "$root/scripts/report_benchmarks.py"
