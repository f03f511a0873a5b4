#!/usr/bin/env python3
"""Time per output token of Hugging Face transformers (sdpa attention, DynamicCache) on a
Llama-3-8B-shaped model with random bf16 weights, at the same contexts and batches as
bench/bench_e2e.cu, for the comparison in the same run. Writes JSON.

    python3 scripts/bench/hf_decode.py --contexts 16384,32768 --batches 1,4 --json hf.json
"""
import argparse
import json
import time

import torch
import transformers


def llama3_8b_config():
    return transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072 + 1024,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False)


def time_decode(model, cfg, batch, ctx, steps):
    cache = transformers.DynamicCache()
    kv_shape = (batch, cfg.num_key_value_heads, ctx, cfg.hidden_size // cfg.num_attention_heads)
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(kv_shape, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(kv_shape, dtype=torch.bfloat16, device="cuda")
        cache.update(k, v, layer)
    ids = torch.full((batch, 1), 1000, dtype=torch.long, device="cuda")
    times = []
    with torch.no_grad():
        for i in range(steps + 3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t0)
            cache.crop(ctx)
    times.sort()
    return 1e3 * times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", default="16384,32768,65536,131072")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    cfg = llama3_8b_config()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM._from_config(cfg, torch_dtype=torch.bfloat16,
                                                           attn_implementation="sdpa").eval()
    rows = []
    for batch in map(int, args.batches.split(",")):
        for ctx in map(int, args.contexts.split(",")):
            try:
                ms = time_decode(model, cfg, batch, ctx, args.steps)
                rows.append(dict(batch=batch, context=ctx, tpot_ms=ms))
                print(f"HF transformers sdpa: batch {batch} context {ctx}: {ms:.2f} ms/token", flush=True)
            except torch.OutOfMemoryError:
                rows.append(dict(batch=batch, context=ctx, skipped="out of memory"))
                print(f"HF transformers sdpa: batch {batch} context {ctx}: out of memory", flush=True)
            torch.cuda.empty_cache()
    out = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               transformers=transformers.__version__, cache="DynamicCache", attn="sdpa", rows=rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
