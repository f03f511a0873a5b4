#!/usr/bin/env python3
"""Times torch.nn.functional.scaled_dot_product_attention decode (flash and cuDNN backends) at the
shapes of bench/bench_decode_attention.cu, so the two can be compared in the same run.

One query token per sequence, GQA (enable_gqa=True), contiguous bf16 q [B, H, 1, d] and k/v
[B, H_kv, L, d]; bandwidth = K+V bytes / time. CUDA events around each call after warm-up, median
of --reps calls, input sets rotated so that at least 400 MB of KV is touched per rotation (L2 is
50 MB). A device-to-device copy is timed in the same run (bytes read + written).

    python3 scripts/bench/torch_decode_attention.py --json torch_decode.json
"""
import argparse
import datetime
import json
import math
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
ROTATE_BYTES = 400e6
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def time_calls(fn, n_sets, warmup, reps):
    for i in range(warmup):
        fn(i % n_sets)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (a, b) in enumerate(ev):
        a.record()
        fn(i % n_sets)
        b.record()
    torch.cuda.synchronize()
    us = [a.elapsed_time(b) * 1e3 for a, b in ev]
    return statistics.median(us), min(us)


def copy_bandwidth():
    n = 1 << 30
    src = torch.ones(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    med, _ = time_calls(lambda i: dst.copy_(src), 1, 5, 20)
    return 2 * n / (med * 1e-6)


def driver_version():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - the version is informative only
        return "unknown"


def bench_shape(batch, context, backends, warmup, reps):
    kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * 2
    n_sets = max(1, min(16, math.ceil(ROTATE_BYTES / kv_bytes)))
    gen = torch.Generator(device="cuda").manual_seed(batch * 131 + context)
    sets = []
    for _ in range(n_sets):
        q = torch.randn(batch, HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(batch, KV_HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(batch, KV_HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        sets.append((q, k, v))
    rows = []
    for name in backends:
        row = {"batch": batch, "context": context, "backend": name, "kv_bytes": kv_bytes, "input_sets": n_sets}
        try:
            with sdpa_kernel(BACKENDS[name]):
                def call(i):
                    q, k, v = sets[i]
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                med, best = time_calls(call, n_sets, warmup, reps)
            row.update(us_median=med, us_min=best, gbs=kv_bytes / med / 1e3)
        except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is reported, not fatal
            row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        rows.append(row)
    del sets
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--contexts", default="16384,32768,65536,131072")
    ap.add_argument("--backends", default="flash,cudnn")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    reps = max(50, args.reps)
    backends = [b for b in args.backends.split(",") if b]

    copy_bw = copy_bandwidth()
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, driver {driver_version()}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write)")
    rows = []
    for b in [int(x) for x in args.batches.split(",")]:
        for c in [int(x) for x in args.contexts.split(",")]:
            for r in bench_shape(b, c, backends, args.warmup, reps):
                if "us_median" in r:
                    r["pct_copy"] = 100 * r["kv_bytes"] / (r["us_median"] * 1e-6) / copy_bw
                rows.append(r)
                msg = r.get("error") or f"{r['us_median']:8.1f} us, {r['gbs']:6.0f} GB/s, {r['pct_copy']:5.1f}% of copy"
                print(f"  batch {b} context {c:6d} {r['backend']:5s}: {msg}", flush=True)

    print("\n| batch | context | backend | µs | GB/s | % copy |\n|---|---|---|---|---|---|")
    for r in rows:
        if "us_median" in r:
            print(f"| {r['batch']} | {r['context'] // 1024}K | {r['backend']} | {r['us_median']:.1f} | "
                  f"{r['gbs']:.0f} | {r['pct_copy']:.1f} |")
        else:
            print(f"| {r['batch']} | {r['context'] // 1024}K | {r['backend']} | error | | |")
    if args.json:
        doc = {
            "benchmark": "torch_sdpa_decode",
            "gpu": gpu,
            "driver": driver_version(),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join([sys.executable] + sys.argv),
            "copy_bandwidth_gbs": copy_bw / 1e9,
            "shape": {"n_heads": HEADS, "n_kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "dtype": "bf16",
                      "layout": "q [B, H, 1, d], k/v [B, H_kv, L, d] contiguous"},
            "reps": reps,
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
