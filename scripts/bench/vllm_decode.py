#!/usr/bin/env python3
"""vLLM as the peer of bench_e2e: time per output token (TPOT) of vLLM on a model of a named shape
(Llama-3-8B by default) with dummy weights (--load-format dummy: random values, no checkpoint), at
the same batches and contexts as bench/bench_e2e.cu, with vLLM's defaults otherwise (its default
attention backend, CUDA graphs on). Writes JSON whose rows have bench_e2e's keys (batch, context,
policy "vllm", tpot_ms, tokens_per_s), so scripts/bench/vllm_compare.py puts them beside lychee's.

    python3 scripts/bench/vllm_decode.py --contexts 16384,131072 --batches 1,4,8 --json vllm.json
    python3 scripts/bench/vllm_decode.py --write-model-dir DIR      (only the model folder, for vllm serve)

The model folder (a temporary one, or --model-dir) holds config.json of the shape and a word-level
tokenizer of the shape's vocabulary (tokenizer.json: token i is "t<i>"), so `vllm serve DIR
--load-format dummy` takes the same random token-id prompts as `lychee serve` without any
download. The offline benchmark skips the tokenizer (skip_tokenizer_init, token-id prompts).

How TPOT is measured, per (batch, context): `batch` prompts of `context` random token ids
(distinct per row and shape, seeded) are generated once with max_tokens 1 (prefill, kept by the
prefix cache), then, --repeats times, the same prompts with max_tokens 1 (t1: the cache hit, the
last block recomputed, one token) and with max_tokens 1 + --steps (t2, ignore_eos); TPOT = median
(t2 - t1) / steps: the decode steps alone, the prefill and per-call costs cancelled. Every row of
the batch decodes at once: a shape whose KV does not fit vLLM's cache (num_gpu_blocks x
block_size tokens, all rows at context + steps + 1) is skipped and says so, as bench_e2e skips.
The JSON is rewritten after every shape, so a run stopped by its time limit keeps its rows.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

# bench_e2e's named shapes (src/model/config.cpp): Llama-3's published config.json values.
SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8),
    "llama3-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8),
}
VOCAB = 128256
MAX_POSITIONS = 131072 + 1024  # lychee's llama3_8b_shape().max_context


def hf_config(shape):
    """config.json of a named shape (Hugging Face LlamaForCausalLM), bf16."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape '{shape}' (known: {', '.join(SHAPES)})")
    c = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=VOCAB,
             max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5, rope_theta=500000.0,
             hidden_act="silu", tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
             head_dim=128, bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16",
             initializer_range=0.02, use_cache=True)
    c.update(SHAPES[shape])
    return c


def tokenizer_json(vocab):
    """A word-level tokenizer of `vocab` tokens "t0".."t{vocab-1}" split on whitespace (the
    tokenizers library's format), "t0" doubling as the unknown token."""
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab)}, "unk_token": "t0"},
    }


def write_model_dir(path, shape):
    """Writes config.json, generation_config.json, tokenizer.json and tokenizer_config.json of the
    shape into path (created); returns path."""
    os.makedirs(path, exist_ok=True)
    cfg = hf_config(shape)
    files = {
        "config.json": cfg,
        "generation_config.json": {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]},
        "tokenizer.json": tokenizer_json(cfg["vocab_size"]),
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": MAX_POSITIONS,
                                  "bos_token": f"t{cfg['bos_token_id']}", "eos_token": f"t{cfg['eos_token_id']}",
                                  "unk_token": "t0", "clean_up_tokenization_spaces": False},
    }
    for name, obj in files.items():
        with open(os.path.join(path, name), "w") as f:
            json.dump(obj, f)
    return path


def int_list(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{s}'")
    if not v or any(x < 1 for x in v):
        raise argparse.ArgumentTypeError(f"expected positive integers, got '{s}'")
    return v


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--contexts", type=int_list, default=[16384, 32768, 65536, 131072])
    ap.add_argument("--batches", type=int_list, default=[1, 4, 8])
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed per call (default 32, bench_e2e's)")
    ap.add_argument("--repeats", type=int, default=3, help="(t1, t2) pairs per shape; the median is kept")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    ap.add_argument("--max-model-len", type=int, default=0,
                    help="default: the longest context + steps + 64, at most the shape's positions")
    ap.add_argument("--enforce-eager", action="store_true", help="CUDA graphs off (default: on, vLLM's default)")
    ap.add_argument("--attention-backend", default="",
                    help="a vLLM attention backend name (default: vLLM's choice, recorded in the JSON)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-dir", help="write the model folder here (default: a temporary folder)")
    ap.add_argument("--write-model-dir", metavar="DIR", help="only write the model folder of --shape to DIR and exit")
    ap.add_argument("--json")
    ap.add_argument("--tag", default="", help="stored in the JSON (e.g. the commit)")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.repeats < 1:
        ap.error("--steps and --repeats must be >= 1")
    if not 0.1 <= a.gpu_memory_utilization <= 0.98:
        ap.error("--gpu-memory-utilization must be in [0.1, 0.98]")
    if a.tensor_parallel_size < 1:
        ap.error("--tensor-parallel-size must be >= 1")
    need = max(a.contexts) + a.steps + 2
    if a.max_model_len == 0:
        a.max_model_len = min(MAX_POSITIONS, max(a.contexts) + a.steps + 64)
    if a.max_model_len < need:
        ap.error(f"--max-model-len {a.max_model_len} is below the longest context + steps + 2 ({need})")
    if a.max_model_len > MAX_POSITIONS:
        ap.error(f"--max-model-len {a.max_model_len} is past the shape's {MAX_POSITIONS} positions")
    return a


def prompt_ids(batch, context, vocab, seed):
    """`batch` distinct prompts of `context` token ids in [10, vocab - 10), seeded by (seed, batch,
    context): no two rows or shapes share a prefix, so each shape's first call prefills all."""
    rng = random.Random(f"{seed}/{batch}/{context}")
    return [[rng.randrange(10, vocab - 10) for _ in range(context)] for _ in range(batch)]


def plan(batches, contexts, steps, kv_tokens):
    """[(batch, context, skip reason or None)]: a shape is skipped when its rows at context + steps + 1
    do not fit kv_tokens (None: unknown, nothing skipped)."""
    out = []
    for b in batches:
        for c in contexts:
            need = b * (c + steps + 1)
            reason = None
            if kv_tokens is not None and need > kv_tokens:
                reason = f"KV cache does not fit: {b} x {c + steps + 1} = {need} tokens, vLLM's cache holds {kv_tokens}"
            out.append((b, c, reason))
    return out


def kv_capacity(llm):
    """Tokens vLLM's KV cache holds (num_gpu_blocks x block_size), or None where this version hides it."""
    try:
        cc = llm.llm_engine.vllm_config.cache_config
        if cc.num_gpu_blocks:
            return int(cc.num_gpu_blocks) * int(cc.block_size)
    except AttributeError:
        pass
    return None


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def time_shape(llm, sampling, batch, context, args, vocab):
    ps = [{"prompt_token_ids": p} for p in prompt_ids(batch, context, vocab, args.seed)]
    one = sampling(max_tokens=1, ignore_eos=True, temperature=0.0, detokenize=False)
    many = sampling(max_tokens=1 + args.steps, min_tokens=1 + args.steps, ignore_eos=True, temperature=0.0,
                    detokenize=False)
    llm.generate(ps, one, use_tqdm=False)  # prefill; the prefix cache keeps it
    per_step = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        llm.generate(ps, one, use_tqdm=False)
        t1 = time.perf_counter() - t0
        t0 = time.perf_counter()
        outs = llm.generate(ps, many, use_tqdm=False)
        t2 = time.perf_counter() - t0
        got = [len(o.outputs[0].token_ids) for o in outs]
        if any(g != 1 + args.steps for g in got):
            raise RuntimeError(f"asked for {1 + args.steps} tokens per row, got {got}")
        per_step.append((t2 - t1) / args.steps)
    return 1e3 * statistics.median(per_step), [1e3 * x for x in per_step]


def main(argv=None):
    args = parse_args(argv)
    if args.write_model_dir:
        print(write_model_dir(args.write_model_dir, args.shape))
        return 0
    model_dir = write_model_dir(args.model_dir or tempfile.mkdtemp(prefix=f"vllm_{args.shape}_"), args.shape)
    if args.attention_backend:
        os.environ["VLLM_ATTENTION_BACKEND"] = args.attention_backend
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=model_dir, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
              max_model_len=args.max_model_len, max_num_seqs=max(args.batches), enable_prefix_caching=True,
              gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager,
              tensor_parallel_size=args.tensor_parallel_size, seed=args.seed)
    startup_s = time.perf_counter() - t0
    kv_tokens = kv_capacity(llm)
    backend = os.environ.get("VLLM_ATTENTION_BACKEND", "")
    print(f"vLLM {vllm.__version__}, torch {torch.__version__}, {gpu_name()}; shape {args.shape}, dummy weights; "
          f"startup {startup_s:.1f} s; KV cache {kv_tokens} tokens; CUDA graphs {'off' if args.enforce_eager else 'on'}",
          flush=True)
    print(f"{'batch':>6} {'context':>8} {'TPOT ms':>10} {'tok/s':>9}", flush=True)
    rows = []
    out = dict(engine="vllm", vllm=vllm.__version__, torch=torch.__version__, gpu=gpu_name(),
               model=f"{args.shape} shape, dummy bf16 weights", shape=args.shape, config=hf_config(args.shape),
               attention_backend=backend or "vLLM default", max_model_len=args.max_model_len,
               kv_cache_tokens=kv_tokens, startup_s=startup_s, steps=args.steps, repeats=args.repeats,
               command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]), tag=args.tag, rows=rows)

    def save():  # after every row: a run cut short by its time limit keeps the rows it has
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(out, f, indent=1)
            os.replace(args.json + ".tmp", args.json)

    for batch, ctx, skip in plan(args.batches, args.contexts, args.steps, kv_tokens):
        if skip:
            print(f"{batch:6d} {ctx:8d}   skipped: {skip}", flush=True)
            rows.append(dict(batch=batch, context=ctx, policy="vllm", skipped=skip))
            save()
            continue
        try:
            ms, each = time_shape(llm, SamplingParams, batch, ctx, args, VOCAB)
        except Exception as e:  # a shape that fails (out of memory) leaves the others
            print(f"{batch:6d} {ctx:8d}   failed: {type(e).__name__}: {e}", flush=True)
            rows.append(dict(batch=batch, context=ctx, policy="vllm", skipped=f"{type(e).__name__}: {e}"))
            save()
            continue
        print(f"{batch:6d} {ctx:8d} {ms:10.3f} {batch * 1e3 / ms:9.1f}", flush=True)
        rows.append(dict(batch=batch, context=ctx, policy="vllm", tpot_ms=ms, tpot_ms_each=each,
                         tokens_per_s=batch * 1e3 / ms, tensor_parallel=args.tensor_parallel_size,
                         cuda_graphs=not args.enforce_eager, steps=args.steps))
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
