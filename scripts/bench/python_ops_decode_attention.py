#!/usr/bin/env python3
"""Times lychee.ops.decode_attention called from PyTorch (the binding's overhead included) and
torch's scaled_dot_product_attention (cuDNN backend) on the same dense decode problems, at the
shapes of bench/bench_decode_attention.cu's share-0 rows (32 query / 8 KV heads, d = 128, page 64,
bf16, pages in shuffled order), so the three can be compared in one run:

    python3 scripts/bench/python_ops_decode_attention.py --json python_ops.json \\
        [--cxx-json decode_attention.json]   # bench_decode_attention's JSON of the same run

Timing as the C++ benchmark: CUDA events around each call after warm-up, the median of --reps
calls, input sets rotated so that at least 400 MB of KV is touched per rotation. lychee.ops gets a
plan built once per input set (as the engine reuses plans); each timed call goes through the
Python wrapper's checks and the DLPack binding.
"""
import argparse
import datetime
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import lychee.ops as ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_decode_attention import time_calls  # noqa: E402  (the same timing as the SDPA benchmark)

HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 64
ROTATE_BYTES = 400e6


def bench_shape(batch, context, warmup, reps):
    kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * 2
    n_sets = max(1, min(16, math.ceil(ROTATE_BYTES / kv_bytes)))
    pages = context // PAGE
    gen = torch.Generator(device="cuda").manual_seed(batch * 131 + context)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    paged, dense = [], []
    for _ in range(n_sets):
        q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(batch * pages, KV_HEADS, PAGE, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn_like(k)
        table = torch.randperm(batch * pages, device="cuda", generator=gen).to(torch.int32).view(batch, pages)
        plan = ops.plan_decode(ops.dense_heads([context] * batch, KV_HEADS, HEADS // KV_HEADS, PAGE, pages),
                               batch, HEADS, KV_HEADS, HEAD_DIM, PAGE, "cuda")
        paged.append((q, k, v, table, plan, torch.empty_like(q)))
    rows = []
    med, best = time_calls(lambda i: ops.decode_attention(*paged[i][:4], lens, paged[i][4], out=paged[i][5]),
                           n_sets, warmup, reps)
    rows.append(dict(batch=batch, context=context, impl="lychee.ops", kv_bytes=kv_bytes, us_median=med, us_min=best,
                     items=paged[0][4].n_items))
    # The same problem for SDPA: contiguous K/V per sequence (the pages gathered once, untimed).
    for q, k, v, table, _, _ in paged:
        idx = table.long().reshape(-1)
        kc = k[idx].view(batch, pages, KV_HEADS, PAGE, HEAD_DIM).permute(0, 2, 1, 3, 4).reshape(batch, KV_HEADS, context, HEAD_DIM)
        vc = v[idx].view(batch, pages, KV_HEADS, PAGE, HEAD_DIM).permute(0, 2, 1, 3, 4).reshape(batch, KV_HEADS, context, HEAD_DIM)
        dense.append((q.unsqueeze(2), kc.contiguous(), vc.contiguous()))
    del paged
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            med, best = time_calls(lambda i: F.scaled_dot_product_attention(*dense[i], enable_gqa=True),
                                   n_sets, warmup, reps)
        rows.append(dict(batch=batch, context=context, impl="sdpa-cudnn", kv_bytes=kv_bytes, us_median=med,
                         us_min=best))
    except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is reported, not fatal
        rows.append(dict(batch=batch, context=context, impl="sdpa-cudnn", error=f"{type(e).__name__}: {e}"[:300]))
    del dense
    torch.cuda.empty_cache()
    return rows


def cxx_dense(path):
    """bench_decode_attention's share-0 rows: (batch, context) -> median µs."""
    if not path:
        return {}
    with open(path) as f:
        doc = json.load(f)
    return {(r["batch"], r["context"]): r["us_median"] for r in doc.get("rows", []) if r.get("sparse_share", 0) == 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--cxx-json", help="bench_decode_attention --json output of the same run (for the overhead column)")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--contexts", default="16384,32768,65536,131072")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()
    why = ops.available()
    if why:
        sys.exit(f"python_ops_decode_attention: {why}")
    cxx = cxx_dense(a.cxx_json)
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, torch {torch.__version__}; {HEADS} q / {KV_HEADS} kv heads, d {HEAD_DIM}, page {PAGE}, bf16")
    rows = []
    for b in [int(x) for x in a.batches.split(",")]:
        for c in [int(x) for x in a.contexts.split(",")]:
            for r in bench_shape(b, c, a.warmup, max(50, a.reps)):
                if "us_median" in r:
                    r["gbs"] = r["kv_bytes"] / r["us_median"] / 1e3
                    print(f"  batch {b} context {c:6d} {r['impl']:10s}: {r['us_median']:8.1f} us, {r['gbs']:6.0f} GB/s", flush=True)
                else:
                    print(f"  batch {b} context {c:6d} {r['impl']:10s}: {r['error']}", flush=True)
                rows.append(r)
    print("\n| batch | context | lychee.ops µs | C++ bench µs | ops / C++ | SDPA cuDNN µs | SDPA / ops |")
    print("|---|---|---|---|---|---|---|")
    for b in [int(x) for x in a.batches.split(",")]:
        for c in [int(x) for x in a.contexts.split(",")]:
            o = next(r for r in rows if (r["batch"], r["context"], r["impl"]) == (b, c, "lychee.ops"))
            s = next(r for r in rows if (r["batch"], r["context"], r["impl"]) == (b, c, "sdpa-cudnn"))
            k = cxx.get((b, c))
            s_us = s.get("us_median", float("nan"))
            k_txt = "" if k is None else "%.1f" % k
            ratio = "" if k is None else "%.3f" % (o["us_median"] / k)
            print("| %d | %dK | %.1f | %s | %s | %.1f | %.2f |" % (b, c // 1024, o["us_median"], k_txt, ratio, s_us,
                                                                 s_us / o["us_median"]))
    if a.json:
        doc = dict(benchmark="python_ops_decode_attention", gpu=gpu, torch=torch.__version__,
                   date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   command=" ".join([sys.executable] + sys.argv),
                   shape=dict(n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, page_size=PAGE, dtype="bf16"),
                   cxx_dense_us=[dict(batch=b, context=c, us_median=u) for (b, c), u in cxx.items()], rows=rows)
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"\nwrote {a.json}")


if __name__ == "__main__":
    main()
