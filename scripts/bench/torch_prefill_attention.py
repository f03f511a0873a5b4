#!/usr/bin/env python3
"""Times torch's fused SDPA backends on the shapes of bench/bench_prefill_attention.cu, so that the
lead can report our prefill attention as a ratio to the best torch backend in the same run.

One sequence of L tokens, causal (is_causal=True: top-left, which equals bottom-right when
q_len == kv_len), 32 query / 8 KV heads with enable_gqa=True, head_dim 128, bf16, contiguous
[1, H, L, d] tensors. Backends: FLASH_ATTENTION and CUDNN_ATTENTION, each forced alone with
torch.nn.attention.sdpa_kernel. If a backend rejects enable_gqa, K and V are expanded to 32 heads
(repeat_interleave, outside the timed region) and the result says "gqa": "expanded".

    python3 scripts/bench/torch_prefill_attention.py [--lengths 8192,...] [--reps N] [--json FILE]

Timing: CUDA events around each call after two warm-up calls; median over the repetitions.
FLOPs = 4 * d * H * L * (L + 1) / 2, as in the C++ benchmark.
"""
import argparse
import datetime
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
BOUND_TFLOPS = 790.0  # measured bf16 matrix rate on the H100 (shared/design/performance.md)


def time_backend(backend, q, k, v, reps):
    """Median ms of one SDPA call on `backend`, and how GQA was expressed."""
    def call(kk, vv, gqa):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)

    gqa_mode, kk, vv, gqa = "native", k, v, True
    try:
        out = call(kk, vv, gqa)
    except RuntimeError:
        gqa_mode, gqa = "expanded", False
        kk = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        vv = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        out = call(kk, vv, gqa)
    call(kk, vv, gqa)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        call(kk, vv, gqa)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times), min(times), max(times), gqa_mode, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="8192,16384,32768,65536,131072")
    ap.add_argument("--reps", type=int, default=0, help="0: 20 up to 16K, 10 at 32K, 5 above")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(f"GPU {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    results = []
    for L in [int(x) for x in args.lengths.split(",")]:
        reps = args.reps or (20 if L <= 16384 else 10 if L <= 32768 else 5)
        gen = torch.Generator(device=dev).manual_seed(L)
        # Uniform in [-1, 1): never zeros in practice, like the C++ benchmark's data.
        q = torch.rand(1, HEADS, L, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=gen) * 2 - 1
        k = torch.rand(1, KV_HEADS, L, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=gen) * 2 - 1
        v = torch.rand(1, KV_HEADS, L, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=gen) * 2 - 1
        flops = 4.0 * HEAD_DIM * HEADS * L * (L + 1) / 2
        outs = {}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            row = {"L": L, "backend": name, "reps": reps}
            try:
                med, lo, hi, gqa_mode, out = time_backend(backend, q, k, v, reps)
                outs[name] = out
                row.update(median_ms=med, min_ms=lo, max_ms=hi, gqa=gqa_mode,
                           tflops=flops / (med * 1e-3) / 1e12)
                print(f"L {L:6d}  torch {name:5s}  median {med:9.3f} ms  [{lo:9.3f}, {hi:9.3f}]  "
                      f"{row['tflops']:6.1f} TFLOP/s  {100 * row['tflops'] / BOUND_TFLOPS:5.1f}% of bound  "
                      f"(gqa {gqa_mode})")
            except Exception as e:  # a backend that cannot run this shape is recorded, not fatal
                row["error"] = f"{type(e).__name__}: {e}"
                print(f"L {L:6d}  torch {name:5s}  failed: {row['error']}", file=sys.stderr)
            results.append(row)
        if len(outs) == 2:
            a, b = outs["cudnn"].float(), outs["flash"].float()
            print(f"L {L:6d}  ||cudnn - flash|| / ||flash|| = {((a - b).norm() / b.norm()).item():.2e}")
        del q, k, v, outs
        torch.cuda.empty_cache()
    if args.json:
        doc = {
            "bench": "torch_prefill_attention",
            "gpu": props.name,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "n_heads": HEADS, "n_kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
            "bound_tflops": BOUND_TFLOPS,
            "results": results,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
