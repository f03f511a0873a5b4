#!/usr/bin/env python3
"""Copies the JSON results of a GPU run (the files scripts/gpu/run_all.sh leaves under $OUT) into
docs/results/gpu/, stamping each with the commit and the command that produced it, then
regenerates docs/benchmarks.md.

    python3 scripts/gpu/collect_results.py /work/.device/N [--commit SHA]
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COMMANDS = {
    "decode_attention.json": "scripts/gpu/run_all.sh bench-kernels (build-gpu/bin/bench_decode_attention --json ...)",
    "torch_decode_attention.json": "scripts/gpu/run_all.sh bench-kernels (python3 scripts/bench/torch_decode_attention.py --json ...)",
    "prefill_attention.json": "scripts/gpu/run_all.sh bench-kernels (build-gpu/bin/bench_prefill_attention --json ...)",
    "torch_prefill_attention.json": "scripts/gpu/run_all.sh bench-kernels (python3 scripts/bench/torch_prefill_attention.py --json ...)",
    "e2e.json": "scripts/gpu/run_all.sh bench-e2e (build-gpu/bin/bench_e2e --json ...)",
    "hf_decode.json": "scripts/gpu/run_all.sh bench-e2e (python3 scripts/bench/hf_decode.py --json ...)",
    "smollm2_gpu.json": "scripts/gpu/run_all.sh bench-model (lychee bench --device cuda --prompt-tokens 512 --gen-tokens 128 --batch 4)",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--commit", default=subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip())
    args = ap.parse_args()
    dest = os.path.join(ROOT, "docs", "results", "gpu")
    os.makedirs(dest, exist_ok=True)
    for d in args.dirs:
        for name, command in COMMANDS.items():
            src = os.path.join(d, name)
            if not os.path.exists(src):
                continue
            data = json.load(open(src))
            data["lychee_commit"] = args.commit
            data["lychee_command"] = command
            data.setdefault("date", datetime.date.today().isoformat())
            with open(os.path.join(dest, name), "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            print(f"{name}: {os.path.join(dest, name)}")
    subprocess.check_call(["python3", os.path.join(ROOT, "scripts", "report_benchmarks.py")])


if __name__ == "__main__":
    main()
