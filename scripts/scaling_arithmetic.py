#!/usr/bin/env python3
"""The arithmetic of docs/scaling.md: bytes per decode step per GPU for the Llama-3-8B shape under
tensor parallelism (TP) at 128K tokens, and the time those bytes take on an H200. Prints the tables
the document quotes; rerun after changing a figure. Facts and assumptions are named below."""

# Llama-3-8B (src/model/config.cpp: llama3_8b_shape)
L, D, H, KV, HD, FF, V = 32, 4096, 32, 8, 128, 14336, 128256
BF16 = 2
CTX = 131072                      # 128K tokens cached per sequence
BUDGET = 4096                     # tokens a sparse head reads (bench_e2e --budget)
# Measured (docs/benchmarks.md, commit 472eac8): H200 device copy bandwidth, Full/Lychee TPOT at 128K b1.
HBM = 4150e9                      # B/s, H200, measured copy bandwidth
H200_USABLE = 139 * 2**30         # B, what the device tool reports usable
MEASURED_TP1 = {"full": 9.08e-3, "lychee": 6.10e-3}
# Facts (NVIDIA H200 SXM datasheet): NVLink 4 900 GB/s per GPU in total over both directions.
NVLINK_DIR = 450e9                # B/s per direction
# One small NCCL all-reduce inside a CUDA graph on NVLink: assumed 5-10 µs before the two-GPU
# measurement; measured 6.6 µs alone (8 KiB) and 7.4 µs a call inside a decode step (two H200).
ALPHAS = (5e-6, 10e-6)

layer_w = (D * H * HD + 2 * D * KV * HD + H * HD * D + 3 * D * FF + 2 * D) * BF16
lm_head = V * D * BF16
embed = V * D * BF16
weights_read = L * layer_w + lm_head + D * BF16      # a step reads one embedding row: not counted
kv_head_token = 2 * HD * BF16                         # K and V of one KV head, one token
kv_token = L * KV * kv_head_token
dense_head = CTX * kv_head_token                      # one retrieval head of one layer, one sequence
sparse_head = BUDGET * kv_head_token
allreduce_payload_token = 2 * L * D * BF16            # two all-reduces per layer of d_model bf16
n_allreduce = 2 * L

def gb(x): return f"{x / 1e9:.2f}"

print(f"weights {gb(L * layer_w + lm_head + embed)} GB stored, {gb(weights_read)} GB read per step "
      f"(layers {gb(L * layer_w)}, LM head {gb(lm_head)}); KV {kv_token} B per token, "
      f"{gb(kv_token * CTX)} GB per 128K sequence; one dense head at 128K {dense_head / 1e6:.1f} MB, "
      f"one sparse head {sparse_head / 1e6:.2f} MB")
print(f"all-reduce payload per token per step: {allreduce_payload_token} B ({n_allreduce} calls of {D * BF16} B)\n")

print("| TP | batch | weights read / GPU GB | KV held / GPU GB | fits (weights + KV <= 139 GiB) | "
      "all-reduce payload / rank / step KB | wire bytes / rank KB | wire time µs at 450 GB/s | "
      "latency 64 x alpha µs | Full bound / GPU ms |")
print("|---|---|---|---|---|---|---|---|---|---|")
for b in (1, 8):
    for n in (1, 2, 4, 8):
        w = weights_read / n                              # LM head split by vocabulary
        kv = b * kv_token * CTX / n
        fits = (L * layer_w + lm_head) / n + embed + kv <= H200_USABLE
        pay = n_allreduce * D * BF16 * b if n > 1 else 0
        wire = 2 * (n - 1) / n * pay
        lat = "-" if n == 1 else f"{n_allreduce * ALPHAS[0] * 1e6:.0f}-{n_allreduce * ALPHAS[1] * 1e6:.0f}"
        print(f"| {n} | {b} | {gb(w)} | {gb(kv)} | {'yes' if fits else 'no'} | {pay / 1e3:.0f} | {wire / 1e3:.0f} | "
              f"{wire / NVLINK_DIR * 1e6:.2f} | {lat} | {(w + kv) / HBM * 1e3:.2f} |")

# Full, batch 1: TP=N predicted from the measured TP=1 time. Model A: the whole step scales with its
# bytes; model B: the part of the TP=1 time above the bound is a fixed per-step cost that does not shrink.
print("\nFull, batch 1, 128K, H200: predicted TPOT (ms) and ratio to TP=1")
b1 = weights_read + kv_token * CTX
t1 = MEASURED_TP1["full"]
fixed = t1 - b1 / HBM
for n in (2, 4, 8):
    by = weights_read / n + kv_token * CTX / n
    for a in ALPHAS:
        ta = t1 * by / b1 + n_allreduce * a
        tb = by / HBM + fixed + n_allreduce * a
        print(f"  TP={n} alpha {a * 1e6:.0f} µs: scaled {ta * 1e3:.2f} ({ta / t1:.2f}x)  "
              f"fixed-overhead {tb * 1e3:.2f} ({tb / t1:.2f}x)")

# LycheeDecode, 32 retrieval KV heads of 256 (bench_e2e's seeded draw): the straggler GPU of each
# layer reads its dense heads fully and its sparse heads' budget. Straggler sums from
# `lychee heads tp --shape llama3-8b --random 32 --gpus 2,4,8` (permutation rule).
STRAGGLER = {1: 32, 2: 22, 4: 19, 8: 18}
CONTIGUOUS = {1: 32, 2: 22, 4: 20, 8: 18}
print("\nLycheeDecode (32 retrieval heads, budget 4096), 128K: bytes per step on the straggler GPU")
print("| TP | batch | dense heads on straggler (sum over layers) | mean (32/N) | KV read straggler GB | "
      "KV read mean GB | weights GB | bound straggler ms | Full bound ms | Full / Lychee (bounds) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for b in (1, 8):
    for n in (1, 2, 4, 8):
        k = KV // n
        s = STRAGGLER[n]
        kv_s = b * (s * dense_head + (L * k - s) * sparse_head)
        kv_m = b * (32 * dense_head + (L * KV - 32) * sparse_head) / n
        w = weights_read / n
        full = w + b * kv_token * CTX / n
        print(f"| {n} | {b} | {s} | {32 / n:.0f} | {gb(kv_s)} | {gb(kv_m)} | {gb(w)} | {(w + kv_s) / HBM * 1e3:.2f} | "
              f"{full / HBM * 1e3:.2f} | {full / (w + kv_s):.2f} |")
for n in (4,):
    extra = (CONTIGUOUS[n] - STRAGGLER[n]) * dense_head
    print(f"\ncontiguous vs permutation at TP={n}: {CONTIGUOUS[n] - STRAGGLER[n]} dense head(s) = "
          f"{extra / 1e6:.0f} MB per sequence per step = {extra / HBM * 1e6:.0f} µs per sequence")

# Calibrated by the two-H200 measurement (docs/scaling.md "Two GPUs: measured", commit bc3f05a):
# Full, batch 1, 128K: TP=1 8.912 ms, TP=2 5.945 ms; the 64 all-reduces took 474 µs of GPU time
# per step (CUPTI: 7.4 µs a call inside the step). Fit TP1 = V + x, TP2 = V/2 + x + AR: V is the
# work that divides by N (attention and weight bytes at the efficiency reached), x the per-step
# cost that does not (norms, small kernels, launch gaps, sampling).
X2 = {"tp1": 8.912e-3, "tp2": 5.945e-3, "ar_call": 7.4e-6}
ar2 = n_allreduce * X2["ar_call"]
V = 2 * (X2["tp1"] - X2["tp2"] + ar2)
x = X2["tp1"] - V
print(f"\nFull, batch 1, 128K, calibrated on two H200s: V = {V * 1e3:.2f} ms divides by N, x = {x * 1e3:.2f} ms "
      f"does not, all-reduces {ar2 * 1e3:.2f} ms at N=2")
# A call's latency at 4 and 8 GPUs is an assumption: from the measured 7.4 µs up to 12 and 20 µs.
AR_RANGE = {2: (X2["ar_call"], X2["ar_call"]), 4: (X2["ar_call"], 12e-6), 8: (X2["ar_call"], 20e-6)}
for n in (2, 4, 8):
    lo, hi = AR_RANGE[n]
    t_lo = V / n + x + n_allreduce * lo
    t_hi = V / n + x + n_allreduce * hi
    span = f"{t_lo * 1e3:.2f}" if n == 2 else f"{t_lo * 1e3:.2f}-{t_hi * 1e3:.2f}"
    ratio = f"{t_lo / X2['tp1']:.2f}" if n == 2 else f"{t_lo / X2['tp1']:.2f}-{t_hi / X2['tp1']:.2f}"
    print(f"  TP={n}: {span} ms ({ratio}x of TP=1)")
for target in (0.6,):
    # (V/2 + x' + AR) / (V + x') <= target  <=>  x' <= (target V - V/2 - AR) / (1 - target)
    x_max = (target * V - V / 2 - ar2) / (1.0 - target)
    x_max_fast = (target * V - V / 2 - n_allreduce * 3e-6) / (1.0 - target)
    print(f"  TP=2 <= {target} x TP=1 needs x <= {x_max * 1e3:.2f} ms (or <= {x_max_fast * 1e3:.2f} ms "
          f"with 3 µs all-reduces), against {x * 1e3:.2f} ms measured")

# Replicas vs TP on 2 GPUs, Full at 128K: throughput at the largest batch that fits.
print("\nTwo H200s, Full at 128K, the largest batch that fits:")
per_seq = kv_token * CTX
rep_b = int((H200_USABLE - (L * layer_w + lm_head + embed)) // per_seq)
t_rep = (weights_read + rep_b * per_seq) / HBM
tp_b = int((2 * H200_USABLE - (L * layer_w + lm_head) - 2 * embed) // per_seq)
t_tp = (weights_read / 2 + tp_b * per_seq / 2) / HBM + n_allreduce * ALPHAS[0]
print(f"  two replicas: batch {rep_b} each, {t_rep * 1e3:.1f} ms per step, {2 * rep_b / t_rep:.0f} tokens/s in all")
print(f"  TP=2:         batch {tp_b}, {t_tp * 1e3:.1f} ms per step, {tp_b / t_tp:.0f} tokens/s")

# Mirrored rows (docs/scaling.md "Two H100s"): at batch B (a multiple of N), rows of group j use
# the permutation shifted by j GPUs, so in every layer each GPU reads the dense heads of every
# group for B/N rows: the mean, whatever the layer's retrieval count. The price: every GPU holds
# the attention weights of every head (the MLP stays split). Calibrated on the two-H100 run
# (commit dda4df8, batch 8, 128K): LycheeDecode 9.583 ms per step, Full 26.949 ms; attention summed
# over layers (eager, per GPU) slowest 5.217 ms against a mean of 4.099 ms; H100 copy 2.98 TB/s.
H100_RUN = {"lychee": 9.583e-3, "full": 26.949e-3, "attn_slowest": 5.217e-3, "attn_mean": 4.099e-3, "hbm": 2.98e12}
attn_w = L * (D * H * HD + 2 * D * KV * HD + H * HD * D) * BF16
print("\nMirrored rows, batch 8, 128K (two H100s, calibrated):")
for n in (2,):
    extra_w = attn_w * (n - 1) / n
    saved = H100_RUN["attn_slowest"] - H100_RUN["attn_mean"]
    t = H100_RUN["lychee"] - saved + extra_w / H100_RUN["hbm"]
    print(f"  TP={n}: the straggler's extra attention {saved * 1e3:.2f} ms removed, {gb(extra_w)} GB more weights "
          f"per GPU per step (+{extra_w / H100_RUN['hbm'] * 1e3:.2f} ms): LycheeDecode {t * 1e3:.2f} ms, "
          f"{H100_RUN['full'] / t:.2f}x over Full (measured {H100_RUN['full'] / H100_RUN['lychee']:.2f}x; "
          f"balance alone, no extra weights: {H100_RUN['full'] / (H100_RUN['lychee'] - saved):.2f}x)")

# The same two fits on two H200s at commit c72de62 (docs/scaling.md "Two H200s, tenth session"):
# Full, batch 1, 128K: TP=1 8.304 ms, TP=2 5.329 ms, the 64 all-reduces 492 µs per step (CUPTI,
# GPU 0: 7.7 µs a call); batch 8, 128K: LycheeDecode 7.289 ms, Full 18.726 ms, attention summed
# over layers slowest 3.817 ms against a mean of 3.017 ms; copy 4.20 TB/s.
X10 = {"tp1": 8.304e-3, "tp2": 5.329e-3, "ar": 492e-6}
V10 = 2 * (X10["tp1"] - X10["tp2"] + X10["ar"])
x10 = X10["tp1"] - V10
x10_max = (0.6 * V10 - V10 / 2 - X10["ar"]) / (1.0 - 0.6)
print(f"\nFull, batch 1, 128K, two H200s at c72de62: V = {V10 * 1e3:.2f} ms, x = {x10 * 1e3:.2f} ms, all-reduces "
      f"{X10['ar'] * 1e3:.2f} ms; TP=2 / TP=1 = {X10['tp2'] / X10['tp1']:.3f}; 0.6 needs x <= {x10_max * 1e3:.2f} ms, "
      f"i.e. TP=2 at {0.6 * X10['tp1'] * 1e3:.2f} ms ({(X10['tp2'] - 0.6 * X10['tp1']) * 1e3:.2f} ms less)")
H200_RUN = {"lychee": 7.289e-3, "full": 18.726e-3, "attn_slowest": 3.817e-3, "attn_mean": 3.017e-3, "hbm": 4.20e12}
print("Mirrored rows, batch 8, 128K (two H200s at c72de62, calibrated):")
extra_w = attn_w / 2
saved = H200_RUN["attn_slowest"] - H200_RUN["attn_mean"]
t = H200_RUN["lychee"] - saved + extra_w / H200_RUN["hbm"]
print(f"  TP=2: {saved * 1e3:.2f} ms of straggler attention removed, +{extra_w / H200_RUN['hbm'] * 1e3:.2f} ms of "
      f"weights: LycheeDecode {t * 1e3:.2f} ms, {H200_RUN['full'] / t:.2f}x over Full (measured "
      f"{H200_RUN['full'] / H200_RUN['lychee']:.2f}x)")
