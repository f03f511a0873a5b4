#!/usr/bin/env python3
"""Regenerates docs/benchmarks.md from the results files in docs/results/."""
import json
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RES = os.path.join(ROOT, "docs", "results")


def cpu_section():
    path = os.path.join(RES, "cpu_smollm2.json")
    if not os.path.exists(path):
        return []
    r = json.load(open(path))
    return [
        "## CPU reference backend, default model",
        "",
        f"`{r['command']}` at commit `{r['commit']}` on {r['machine']}, {r['date']} "
        f"(results file: `docs/results/cpu_smollm2.json`).",
        "",
        "| measure | value |",
        "|---|---|",
        f"| prefill ({r['prompt_tokens']} tokens) | {r['prefill_tok_s']:.1f} tok/s |",
        f"| decode ({r['gen_tokens']} tokens after {r['prompt_tokens']}) | {r['decode_tok_s']:.2f} tok/s "
        f"({1e3 / r['decode_tok_s']:.1f} ms/token) |",
        f"| memory bandwidth (measured, streaming reads) | {r.get('bandwidth_gbps', r.get('read_gbps', 0)):.1f} GB/s |",
        f"| bytes per decode step | {r['weight_bytes_per_token'] / 1e6:.1f} MB f32 weights + "
        f"{r['kv_bytes_per_token'] / 1e6:.1f} MB KV |",
        f"| decode bound (bytes / read bandwidth) | {r['decode_bound_tok_s']:.2f} tok/s |",
        f"| decode, share of the bound | {100 * r['decode_tok_s'] / r['decode_bound_tok_s']:.0f}% |",
        "",
        "The CPU backend keeps f32 weights (it is the numerical oracle), so a decode step reads "
        "4 bytes per parameter; prefill runs BLAS matrix products.",
        "",
    ]


def cpu_vs_llamacpp_section():
    path = os.path.join(RES, "cpu_vs_llamacpp.json")
    if not os.path.exists(path):
        return []
    r = json.load(open(path))
    med, ref = r["median"], r["median"]["llama.cpp"]["decode_tok_s"]
    lines = ["## CPU beside llama.cpp, same GGUF file",
             "",
             f"`{r['command']}` at commit `{r['commit']}` on {r['machine']}, {r['date']}: "
             f"{len(r['rounds']) // len(med)} alternated rounds, medians; {r['threads']} threads; "
             f"lychee's decode runs after its {r['prompt_tokens']}-token prompt, set against llama.cpp's "
             f"tg{r['gen_tokens']} at depth {r['prompt_tokens']} (results file: `docs/results/cpu_vs_llamacpp.json`, "
             "method: docs/results/cpu_quantized.md).",
             "",
             f"| engine | prefill {r['prompt_tokens']} tok/s | decode tok/s | decode / llama.cpp |",
             "|---|---:|---:|---:|"]
    for engine, m in med.items():
        lines.append(f"| {engine} | {m['prefill_tok_s']:.1f} | {m['decode_tok_s']:.1f} | {m['decode_tok_s'] / ref:.2f}x |")
    return lines + [""]


def load(name):
    path = os.path.join(RES, "gpu", name)
    return json.load(open(path)) if os.path.exists(path) else None


def speedup(peer_ms, ours_ms):
    return "" if peer_ms is None else f"{peer_ms / ours_ms:.1f}x"


def kctx(n):
    return f"{n // 1024}K"


def decode_attention_section():
    ours, peer = load("decode_attention.json"), load("torch_decode_attention.json")
    if not ours:
        return []
    torch_rows = {}
    for r in (peer or {}).get("rows", []):
        torch_rows[(r["batch"], r["context"], r["backend"])] = r
    lines = [
        "## Dense decode attention (split-KV, paged)",
        "",
        f"{ours['gpu']}, copy bandwidth {ours['copy_bandwidth_gbs']:.0f} GB/s measured in the same run; "
        f"32 q / 8 kv heads, d 128, page 64, bf16; lychee at commit `{ours['lychee_commit']}` "
        f"(`docs/results/gpu/decode_attention.json`), torch {peer.get('torch', '?') if peer else '?'} "
        "SDPA in the same session (`torch_decode_attention.json`). µs are medians; lychee's are CUDA-graph replays.",
        "",
        "| batch | context | lychee µs | GB/s | % of copy | torch cuDNN µs | torch flash µs | lychee / cuDNN |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in ours["rows"]:
        c = torch_rows.get((r["batch"], r["context"], "cudnn"), {})
        f = torch_rows.get((r["batch"], r["context"], "flash"), {})
        ratio = c["us_median"] / r["us_graph_median"] if c else float("nan")
        lines.append(f"| {r['batch']} | {kctx(r['context'])} | {r['us_graph_median']:.1f} | {r['gbs_graph']:.0f} | "
                     f"{r['pct_copy_graph']:.1f}% | {c.get('us_median', float('nan')):.1f} | "
                     f"{f.get('us_median', float('nan')):.1f} | {ratio:.2f}x |")
    lines += ["", "The last column is torch cuDNN's time over lychee's (above 1: lychee is faster).", ""]
    return lines


def prefill_attention_section():
    ours, peer = load("prefill_attention.json"), load("torch_prefill_attention.json")
    if not ours:
        return []
    best = {}
    for r in (peer or {}).get("results", []):
        if r["L"] not in best or r["tflops"] > best[r["L"]]["tflops"]:
            best[r["L"]] = r
    lines = [
        "## Dense prefill attention (causal, paged KV)",
        "",
        f"{ours['gpu']}; lychee's cuDNN {ours['cudnn']} through cudnn-frontend (pages gathered into "
        f"contiguous K/V first, see docs/kernels/prefill-attention.md), and its own FA2-style "
        f"fallback kernel, at commit `{ours['lychee_commit']}`; torch SDPA (its bundled cuDNN "
        f"{peer.get('cudnn', '?') if peer else '?'}) in the same session. 32 q / 8 kv heads, d 128; TFLOP/s "
        "count causal FLOPs (2·L²·d·heads).",
        "",
        "| L | lychee cuDNN TFLOP/s | lychee fallback TFLOP/s | best torch backend | torch TFLOP/s | lychee best / torch best |",
        "|---|---|---|---|---|---|",
    ]
    by = {}
    for r in ours["results"]:
        if r["mode"] == "prompt":
            by.setdefault(r["L"], {})[r["ran"]] = r
    for L in sorted(by):
        cud = by[L].get("cudnn", {}).get("tflops", float("nan"))
        fb = by[L].get("fallback", {}).get("tflops", float("nan"))
        t = best.get(L, {})
        ratio = max(cud, fb) / t["tflops"] if t else float("nan")
        lines.append(f"| {kctx(L)} | {cud:.0f} | {fb:.0f} | {t.get('backend', '?')} | {t.get('tflops', float('nan')):.0f} | {ratio:.0%} |")
    lines.append("")
    return lines


def fp8_gemv_section():
    r = load("fp8_gemv.json")
    if not r:
        return []
    by = {}
    for row in r["rows"]:
        by.setdefault((row["shape"], row["k"], row["m"], row["n"]), {})[row["kernel"]] = row

    def cell(row):
        return f"{row['us']:.1f} ({row['pct_copy']:.0f}%)" if row and row.get("us") else "-"

    def ratio(row, peer):
        return f"{row['us'] / peer['us']:.2f}" if row and peer and row.get("us") and peer.get("us") else "-"

    lines = [
        "## FP8 weight GEMV (decode products), Llama-3-8B shapes",
        "",
        f"{r['gpu']}, copy bandwidth {r['copy_bandwidth_gbs']:.0f} GB/s measured in the same run; lychee at commit "
        f"`{r.get('lychee_commit', r.get('commit', '?'))}` (`docs/results/gpu/fp8_gemv.json`), fp8_gemv tiles "
        f"{r['fp8_gemv_tiles']}. µs per call (median of CUDA-graph replays over weight copies larger than L2) and, in "
        "brackets, % of copy bandwidth on the bytes the call moves (weights, scales, x, y). cuBLASLt bf16 is the "
        "engine's tuned `cuda::Gemm` on the dequantised weights; cuBLASLt FP8 takes x quantised to e4m3 (not "
        f"timed). Target: lychee FP8 >= {r['target_pct_copy']:.0f}% at n = 1 and 8.",
        "",
        "| shape | k | m | n | lychee FP8 µs | cuBLASLt bf16 µs | cuBLASLt FP8 µs | lychee / bf16 | lychee / cuBLASLt FP8 | check |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (shape, k, m, n), v in by.items():
        ours, bf16, fp8 = v.get("lychee_fp8"), v.get("cublaslt_bf16"), v.get("cublaslt_fp8")
        lines.append(f"| {shape} | {k} | {m} | {n} | {cell(ours)} | {cell(bf16)} | {cell(fp8)} | {ratio(ours, bf16)} | "
                     f"{ratio(ours, fp8)} | {ours['check'] if ours else '-'} |")
    lines += ["", "Time ratios below 1: lychee's FP8 kernel is faster.", ""]
    return lines


def e2e_section():
    ours, hf = load("e2e.json"), load("hf_decode.json")
    if not ours:
        return []
    hf_rows = {(r["batch"], r["context"]): r for r in (hf or {}).get("rows", [])}
    lines = [
        "## End-to-end decode, Llama-3-8B shape (random bf16 weights)",
        "",
        f"{ours['gpu']}, copy bandwidth {ours['copy_gbps']:.0f} GB/s; {ours['weight_bytes'] / 1e9:.2f} GB of weights; "
        f"lychee full attention with CUDA graphs at commit `{ours['lychee_commit']}` (`docs/results/gpu/e2e.json`); "
        f"Hugging Face transformers {hf.get('transformers', '?') if hf else '?'} with sdpa and DynamicCache in the "
        "same session (`hf_decode.json`). TPOT = time per output token per sequence step; the bound is "
        "(weight bytes + KV bytes read) / copy bandwidth.",
        "",
        "| batch | context | lychee TPOT ms | bound ms | % of bound | HF sdpa ms | lychee speedup over HF |",
        "|---|---|---|---|---|---|---|",
    ]
    # bench_e2e writes every policy's rows; this table is full attention's (the policies: the
    # decode-step section below).
    for r in ours["rows"]:
        if r.get("policy", "full") != "full":
            continue
        h = hf_rows.get((r["batch"], r["context"]), {})
        if "skipped" in r:
            kv = r.get("kv_gib", r.get("kv_gib_per_gpu", 0.0))
            lines.append(f"| {r['batch']} | {kctx(r['context'])} | skipped ({r['skipped']}, {kv:.0f} GiB) | | | "
                         f"{h.get('tpot_ms', h.get('skipped', ''))} | |")
            continue
        hms = h.get("tpot_ms")
        lines.append(f"| {r['batch']} | {kctx(r['context'])} | {r['tpot_ms']:.2f} | {r['bound_ms']:.2f} | "
                     f"{100 * r['bound_ms'] / r['tpot_ms']:.0f}% | {hms if hms is None else f'{hms:.2f}'} | "
                     f"{speedup(hms, r['tpot_ms'])} |")
    lines.append("")
    return lines


def gpu_model_section():
    r = load("smollm2_gpu.json")
    if not r:
        return []
    return [
        "## Default model on the GPU",
        "",
        f"`{r['lychee_command']}` at commit `{r['lychee_commit']}` (`docs/results/gpu/smollm2_gpu.json`).",
        "",
        "| measure | value |",
        "|---|---|",
        f"| time to first token ({r['prompt_tokens']}-token prompt) | {r['ttft_ms']:.2f} ms |",
        f"| prefill | {r['prefill_tok_s']:.0f} tok/s |",
        f"| decode | {r['decode_tok_s']:.0f} tok/s ({1e3 / r['decode_tok_s']:.2f} ms/token) |",
        f"| decode bound (bytes / copy bandwidth) | {r['decode_bound_tok_s']:.0f} tok/s |",
    ] + ([
        f"| batched decode, {r['batched']['batch']} sequences | {r['batched']['step_ms']:.2f} ms/step, "
        f"{r['batched']['tok_s']:.0f} tok/s |"] if r.get("batched") else []) + [
        "",
        "A 135M-parameter model at batch 1 is bound by kernel latency, not bandwidth: a step is ~190 "
        "kernels replayed from a CUDA graph, six dependent ones per layer (QKV + RoPE, attention, merge, "
        "output, gate/up, down) at ~2.5-3 µs each whatever their bytes (docs/results/gpu/decode_step/README.md).",
        "",
    ]


def decode_step_section():
    """The decode step at its bound (issue 17): end to end per policy on H100 and H200, and the
    CUPTI trace summary before/after (docs/results/gpu/decode_step/)."""
    base = os.path.join(RES, "gpu", "decode_step")
    def get(name):
        path = os.path.join(base, name)
        return json.load(open(path)) if os.path.exists(path) else None
    h100, h200 = get("e2e_h100.json"), get("e2e_h200.json")
    if not h100:
        return []
    lines = ["## The decode step, every policy (LycheeDecode and the baselines end to end)", ""]
    for e2e, file in ((h100, "e2e_h100.json"), (h200, "e2e_h200.json")):
        if not e2e:
            continue
        policies = []
        for r in e2e["rows"]:
            if "tpot_ms" in r and r["policy"] not in policies:
                policies.append(r["policy"])
        lines += [f"{e2e['gpu']}, copy bandwidth {e2e['copy_gbps']:.0f} GB/s, commit `{e2e['commit']}` "
                  f"(`docs/results/gpu/decode_step/{file}`); Llama-3-8B shape, random bf16 weights, budget "
                  f"{e2e['budget']} tokens per sparse head, {e2e['retrieval_kv_heads']} of 256 KV heads retrieval "
                  "(LycheeDecode, DuoAttention); steps pipelined as `generate` runs them. Each cell: TPOT ms "
                  "(% of the policy's own bound, x over Full).", "",
                  "| batch | context | " + " | ".join(policies) + " |",
                  "|---|---|" + "---|" * len(policies)]
        cells = {}
        for r in e2e["rows"]:
            if "tpot_ms" in r:
                cells[(r["batch"], r["context"], r["policy"])] = r
        for b, c in sorted({(k[0], k[1]) for k in cells}):
            row = []
            for p in policies:
                r = cells.get((b, c, p))
                row.append("" if r is None else f"{r['tpot_ms']:.2f} ({100 * r['bound_ms'] / r['tpot_ms']:.0f}%, "
                           f"{r['speedup_vs_full']:.2f}x)")
            lines.append(f"| {b} | {kctx(c)} | " + " | ".join(row) + " |")
        for r in e2e["rows"]:
            if "skipped" in r and r.get("kv_gib"):
                lines.append(f"| {r['batch']} | {kctx(r['context'])} | skipped: the KV cache needs "
                             f"{r['kv_gib']:.0f} GiB |" + " |" * (len(policies) - 1))
        lines.append("")
    before, after = get("trace_before_h100.json"), get("trace_h100.json")
    if before and after:
        lines += ["Where a step's time goes (`bench_e2e --trace`, a CUPTI activity trace of 32 steps, per step; "
                  f"before: commit `{before['commit']}`, each step's token waited for before the next step; after: "
                  f"commit `{after['commit']}`, pipelined):", "",
                  "| context | policy | TPOT ms before -> after | device busy µs | device idle µs | host waits per step | weight products µs | attention + merge µs | selection µs |",
                  "|---|---|---|---|---|---|---|---|---|"]
        def key(r):
            return (r["context"], r["policy"])
        b_rows = {key(r): r for r in before["rows"] if "trace" in r}
        for r in after["rows"]:
            if "trace" not in r or key(r) not in b_rows:
                continue
            b, t = b_rows[key(r)], r["trace"]
            def sum_of(tr, pred):  # exposed time where the trace has it (its share of the step's span)
                return sum(k.get("exposed_us_per_step", k["us_per_step"]) for k in tr["device"] if pred(k["name"]))
            gemm = sum_of(t, lambda n: n.startswith("nvjet") or "cublas" in n.lower() or "_gemv_kernel" in n)
            attn = sum_of(t, lambda n: "decode_attention" in n or "decode_merge" in n)
            sel = sum_of(t, lambda n: "select" in n or "quest" in n or "union" in n)
            waits_b = sum(x["calls_per_step"] for x in b["trace"]["host_syncs"] if "Stream" in x["name"])
            waits_a = sum(x["calls_per_step"] for x in t["host_syncs"] if "Stream" in x["name"])
            lines.append(f"| {kctx(r['context'])} | {r['policy']} | {b['tpot_ms']:.2f} -> {r['tpot_ms']:.2f} | "
                         f"{t['device_busy_us_per_step']:.0f} | {b['trace']['device_idle_us_per_step']:.0f} -> "
                         f"{t['device_idle_us_per_step']:.0f} | {waits_b:.0f} stream syncs -> {waits_a:.0f} "
                         f"(one event wait for the token a step behind) | {gemm:.0f} | {attn:.0f} | {sel:.0f} |")
        lines += ["", "Weight products: cuBLASLt before, the engine's bf16 GEMV with the fused decode layers "
                  "after (norms, residual adds and SwiGLU inside the products; docs/results/gpu/decode_step/fused/). "
                  "Kernel times overlap under programmatic dependent launch (a kernel starts while the one "
                  "before it drains and waits inside), so the columns give each kernel's exposed time where the "
                  "trace records it (what it adds to the step's span; since 4ab9d3d), else its own time, which "
                  "counts the overlap twice; the selection's exposed time is where its side branch outlasts the "
                  "products beside it; device busy is the union. Details and the peers (FlashInfer 0.7.2.post1, torch cuDNN) in "
                  "`docs/results/gpu/decode_step/README.md`; the latency plot (`scripts/plot_e2e.py`):", "",
                  "![Time per output token against context, every policy and transformers, H100]"
                  "(results/gpu/decode_step/e2e_latency_h100.svg)", ""]
    return lines


def serving_section():
    """lychee serve under load on the GPU (docs/results/gpu/serving/, scripts/bench/serve_load.py)."""
    base = os.path.join(RES, "gpu", "serving")
    lines = []
    for name, title in (("serve_smollm2.json", "default model"), ("serve_8b.json", "Llama-3-8B shape, random weights")):
        path = os.path.join(base, name)
        if not os.path.exists(path):
            continue
        runs = json.load(open(path))
        r0 = runs[0]
        if not lines:
            lines += ["## Serving (`lychee serve` under load)", ""]
        lines += [f"{r0['gpu']}, {title}: {r0['prompt_tokens']}-token prompts, {r0['output_tokens']} output tokens, "
                  f"commit `{r0['commit']}` (`docs/results/gpu/serving/{name}`, plot "
                  f"`{name.replace('.json', '.svg')}`).", "",
                  "| policy | concurrency | requests | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | failures |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in runs:
            for lv in r["levels"]:
                lines.append(f"| {r['policy']} | {lv['concurrency']} | {lv['requests']} | {lv['output_tok_s']:.0f} | "
                             f"{lv['ttft_ms_p50']:.0f} | {lv['ttft_ms_p99']:.0f} | {lv['tpot_ms_p50']:.2f} | "
                             f"{lv['tpot_ms_p99']:.2f} | {lv['failures']} |")
        lines += ["", f"![lychee serve under load, {title}](results/gpu/serving/{name.replace('.json', '.svg')})", ""]
    long_runs = sorted(f for f in os.listdir(base) if f.startswith("serve_long_prompt") and f.endswith(".json")) \
        if os.path.isdir(base) else []
    if long_runs:
        lines += ["A 100K-token prompt arriving during 64 streams (Llama-3-8B shape, LycheeDecode): the running "
                  "streams' TPOT in a 10 s window before it and while it is served (target: p99 at most 2x).", "",
                  "| file | commit | GPU | warm server | baseline p50 / p99 ms | during p50 / p99 ms | p99 ratio | failures |",
                  "|---|---|---|---|---|---|---:|---:|"]
        for name in long_runs:
            for r in json.load(open(os.path.join(base, name))):
                i = r.get("interference")
                if not i:
                    continue
                lines.append(f"| `{name}` | `{r['commit']}` | {r['gpu']} | {'yes' if i.get('warmed_up', 'warm' in name) else 'no'} | "
                             f"{i['baseline']['tpot_ms_p50']:.1f} / {i['baseline']['tpot_ms_p99']:.1f} | "
                             f"{i['during']['tpot_ms_p50']:.1f} / {i['during']['tpot_ms_p99']:.1f} | "
                             f"{i['ratio_p99']:.2f} | {i['failures']} |")
        lines.append("")
    if lines:
        lines += ["Soak (10,000 requests, 64 streams, 10% cancelled) and what each 100K-prompt run changed: "
                  "`docs/results/gpu/serving/README.md`.", ""]
    return lines


def prefill_split_section():
    """Short prefill chunks over long caches: cuDNN, our fallback, the split-KV path (issue 13)."""
    path = os.path.join(RES, "gpu", "prefill_split", "prefill_split.json")
    if not os.path.exists(path):
        return []
    d = json.load(open(path))
    rows = [r for r in d["results"] if r["mode"] == "tail"]
    lines = ["## Short prefill chunks over long caches (split-KV)", "",
             f"{d['gpu']}, cuDNN {d['cudnn']}, commit `{d['commit']}` (`docs/results/gpu/prefill_split/prefill_split.json`); "
             f"{d['n_heads']} q / {d['n_kv_heads']} kv heads, d {d['head_dim']}: one chunk of Q queries at the end of an "
             "L-token cache. `split-kv` is what the engine runs by default there.", "",
             "| Q | L | cuDNN ms | fallback ms | split-kv ms | cuDNN / engine default |", "|---:|---:|---:|---:|---|---:|"]
    by = {(r["chunk"], r["L"], r["backend"]): r for r in rows}
    for (q, L) in sorted({(r["chunk"], r["L"]) for r in rows}, key=lambda k: (k[1], k[0])):
        c, f, sp = by.get((q, L, "cudnn")), by.get((q, L, "fallback")), by.get((q, L, "split-kv"))
        if not (c and f and sp):
            continue
        if sp.get("kv_splits", 1) <= 1:  # not split: the engine runs its backend (cuDNN) there
            lines.append(f"| {q} | {kctx(L)} | {c['median_ms']:.3f} | {f['median_ms']:.3f} | not split (cuDNN runs) | 1.00x |")
            continue
        lines.append(f"| {q} | {kctx(L)} | {c['median_ms']:.3f} | {f['median_ms']:.3f} | {sp['median_ms']:.3f} "
                     f"({sp['kv_splits']} slices) | {c['median_ms'] / sp['median_ms']:.2f}x |")
    return lines + [""]


def tensor_parallel_section():
    """TP=1 against TP=2 on two H200s (issue 18; docs/scaling.md)."""
    base = os.path.join(RES, "gpu", "tp_h200x2", "session10", "call6_c72de62", "bench-tp")
    rows = []
    for name in ("e2e_tp.json", "e2e_tp_b8.json"):
        path = os.path.join(base, name)
        if os.path.exists(path):
            d = json.load(open(path))
            rows += [(d, r) for r in d["rows"] if "tpot_ms" in r]
    if not rows:
        return []
    d0 = rows[0][0]
    lines = ["## Tensor parallelism (two H200s, Llama-3-8B shape, random bf16 weights)", "",
             f"{d0['gpu']} x2 (NVLink), NCCL {d0.get('nccl', '?')}, commit `{d0['commit']}` "
             "(`docs/results/gpu/tp_h200x2/session10/call6_c72de62/`); budget 4096, 32 of 256 KV heads retrieval; bound = "
             "the slowest GPU's bytes over the copy bandwidth. Analysis: docs/scaling.md.", "",
             "| TP | batch | context | policy | TPOT ms | bound ms | % of bound | vs Full | slowest GPU / mean attention, worst layer |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for _, r in rows:
        worst = r.get("attention_worst_layer_max_over_mean")
        lines.append(f"| {r['tensor_parallel']} | {r['batch']} | {kctx(r['context'])} | {r['policy']} | {r['tpot_ms']:.3f} | "
                     f"{r['bound_ms']:.3f} | {100 * r['bound_ms'] / r['tpot_ms']:.0f}% | {r['speedup_vs_full']:.2f}x | "
                     f"{'' if worst is None else f'{worst:.2f}'} |")
    return lines + [""]


def main():
    lines = ["# Benchmarks", "", "Generated by `scripts/report_benchmarks.py` from `docs/results/`; "
             "do not edit by hand.", ""]
    lines += decode_attention_section()
    lines += prefill_attention_section()
    lines += fp8_gemv_section()
    lines += e2e_section()
    # Summaries written by hand beside their results (the figures come from several files there).
    fp8 = os.path.join(RES, "fp8_gpu", "summary.md")
    if os.path.exists(fp8):
        lines += open(fp8).read().rstrip("\n").splitlines() + [""]
    lines += decode_step_section()
    lines += tensor_parallel_section()
    lines += serving_section()
    lines += prefill_split_section()
    lines += gpu_model_section()
    lines += cpu_section()
    lines += cpu_vs_llamacpp_section()
    earlier = os.path.join(RES, "gpu", "earlier.md")
    if os.path.exists(earlier):
        lines += ["## Earlier GPU runs", ""] + [l for l in open(earlier).read().splitlines() if not l.startswith("<!--")]
    with open(os.path.join(ROOT, "docs", "benchmarks.md"), "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
