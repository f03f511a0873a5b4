#!/usr/bin/env python3
"""Writes a Hugging Face model directory of a known shape with random bf16 weights, for timing
`lychee train-heads` (and the engine) at that shape through the real loader: config.json,
sharded model-NNNNN-of-NNNNN.safetensors with model.safetensors.index.json, and the default
model's tokenizer (tokenizer.json and tokenizer_config.json, converted from the SmolLM2 GGUF's
tokenizer.ggml.* keys; its 49152 ids fit any vocabulary at least that large).

  make_random_checkpoint.py --shape llama3-8b --tokenizer-gguf GGUF --out DIR [--layers N] [--shard-gb 4]
  make_random_checkpoint.py --tokenizer-only --tokenizer-gguf GGUF --out DIR   (the tokenizer files alone)
  make_random_checkpoint.py --shape llama3-8b --tokenizer-dir HF_DIR --out DIR  (copy tokenizer.json and
                                                                               tokenizer_config.json instead)

The weights: matrices uniform with std 0.5/sqrt(fan_in), norms around 1, embeddings std 0.5
(activations stay O(1) over the layers; nothing measured depends on the values). Random bits
come from torch on the GPU when there is one (seconds for 8 B values), else from torch or numpy
on the CPU. The safetensors writer is the format's spec (8-byte little-endian header length,
the JSON header, the raw bytes), so only torch or numpy is needed, not the safetensors package.
"""
import argparse
import json
import os
import struct
import sys

SHAPES = {
    # name: (layers, d_model, heads, kv_heads, head_dim, d_ff, vocab, rope_theta, extra config)
    "llama3-8b": (32, 4096, 32, 8, 128, 14336, 128256, 500000.0,
                  {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 131072, "tie_word_embeddings": False}),
    "qwen2.5-7b": (28, 3584, 28, 4, 128, 18944, 152064, 1000000.0,
                   {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rms_norm_eps": 1e-6,
                    "max_position_embeddings": 131072, "tie_word_embeddings": False}),
    # The same files at a size the CPU trains in seconds (tests/test_random_checkpoint.cpp).
    "tiny": (2, 32, 2, 1, 16, 48, 49152, 500000.0,
             {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5,
              "max_position_embeddings": 4096, "tie_word_embeddings": False}),
}

# ---- the default model's tokenizer, from its GGUF metadata ----

GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_metadata(path):
    """The key/value section of a GGUF file (versions 2 and 3) as a dict; tensors are not read."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # the tokenizer keys of SmolLM2 take ~2 MB; 64 MB bounds any metadata

    pos = 0

    def take(n):
        nonlocal pos
        if pos + n > len(data):
            raise ValueError(f"{path}: metadata runs past the first {len(data)} bytes at offset {pos}")
        b = data[pos:pos + n]
        pos += n
        return b

    def scalar(fmt):
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    def string():
        return take(scalar("<Q")).decode("utf-8", errors="surrogateescape")

    def value(t):
        if t in GGUF_SCALARS:
            return scalar(GGUF_SCALARS[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = scalar("<I"), scalar("<Q")
            return [value(et) for _ in range(n)]
        raise ValueError(f"{path}: unknown GGUF value type {t} at offset {pos}")

    if take(4) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (magic)")
    version = scalar("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} (2 or 3 expected)")
    scalar("<Q")  # tensor count
    n_kv = scalar("<Q")
    kv = {}
    for _ in range(n_kv):
        key = string()
        kv[key] = value(scalar("<I"))
    return kv


def write_tokenizer(gguf_path, out_dir):
    """tokenizer.json (byte-level BPE, SmolLM2's pre-tokenizer: single digits, then ByteLevel) and
    tokenizer_config.json (bos/eos, the chat template) from the GGUF's tokenizer.ggml.* keys."""
    kv = gguf_metadata(gguf_path)
    if kv.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{gguf_path}: tokenizer.ggml.model is {kv.get('tokenizer.ggml.model')!r}, expected 'gpt2'")
    tokens = kv["tokenizer.ggml.tokens"]
    types = kv.get("tokenizer.ggml.token_type", [1] * len(tokens))
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(tokens) if types[i] == 3]
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": kv["tokenizer.ggml.merges"]},
    }
    cfg = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 131072,
           "bos_token": tokens[kv["tokenizer.ggml.bos_token_id"]], "eos_token": tokens[kv["tokenizer.ggml.eos_token_id"]]}
    if "tokenizer.chat_template" in kv:
        cfg["chat_template"] = kv["tokenizer.chat_template"]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8", errors="surrogateescape") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return len(tokens)


def copy_tokenizer(src_dir, out_dir):
    """tokenizer.json and tokenizer_config.json (when present) of src_dir; returns the vocabulary size."""
    import shutil
    path = os.path.join(src_dir, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    n = len(tok["model"]["vocab"]) + sum(1 for t in tok.get("added_tokens", []) if t["content"] not in tok["model"]["vocab"])
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(path, os.path.join(out_dir, "tokenizer.json"))
    cfg = os.path.join(src_dir, "tokenizer_config.json")
    if os.path.exists(cfg):
        shutil.copy(cfg, os.path.join(out_dir, "tokenizer_config.json"))
    return n


# ---- random weights ----

def tensor_specs(shape):
    """(name, shape, kind) of every weight, in Hugging Face names; kind: norm, bias, embed, matrix."""
    L, d, h, kvh, hd, ff, vocab, _, extra = SHAPES[shape]
    qkv_bias = extra["model_type"] == "qwen2"
    specs = [("model.embed_tokens.weight", (vocab, d), "embed")]
    for l in range(L):
        p = f"model.layers.{l}."
        specs += [(p + "input_layernorm.weight", (d,), "norm"),
                  (p + "self_attn.q_proj.weight", (h * hd, d), "matrix"),
                  (p + "self_attn.k_proj.weight", (kvh * hd, d), "matrix"),
                  (p + "self_attn.v_proj.weight", (kvh * hd, d), "matrix"),
                  (p + "self_attn.o_proj.weight", (d, h * hd), "matrix")]
        if qkv_bias:
            specs += [(p + "self_attn.q_proj.bias", (h * hd,), "bias"), (p + "self_attn.k_proj.bias", (kvh * hd,), "bias"),
                      (p + "self_attn.v_proj.bias", (kvh * hd,), "bias")]
        specs += [(p + "post_attention_layernorm.weight", (d,), "norm"),
                  (p + "mlp.gate_proj.weight", (ff, d), "matrix"), (p + "mlp.up_proj.weight", (ff, d), "matrix"),
                  (p + "mlp.down_proj.weight", (d, ff), "matrix")]
    specs += [("model.norm.weight", (d,), "norm"), ("lm_head.weight", (vocab, d), "matrix")]
    return specs


def random_bf16_bytes(shape, kind, seed):
    """Little-endian bf16 bytes of a random tensor (see the module docstring for the values)."""
    n = 1
    for s in shape:
        n *= s
    mean, std = {"norm": (1.0, 0.1), "bias": (0.0, 0.02), "embed": (0.0, 0.5)}.get(kind, (0.0, 0.5 / shape[-1] ** 0.5))
    a = std * 3.0 ** 0.5  # uniform on [mean - a, mean + a] has this std
    try:
        import torch
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        g = torch.Generator(device=dev).manual_seed(seed)
        t = torch.rand(n, generator=g, device=dev, dtype=torch.float32).mul_(2 * a).add_(mean - a)
        return t.to(torch.bfloat16).view(torch.int16).cpu().numpy().tobytes()
    except ImportError:
        pass
    try:
        import numpy as np
        x = np.random.default_rng(seed).uniform(mean - a, mean + a, n).astype(np.float32)
        return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # truncation to bf16
    except ImportError:  # plain Python: fine for the tiny shape only
        import random
        rng = random.Random(seed)
        words = (struct.unpack("<I", struct.pack("<f", rng.uniform(mean - a, mean + a)))[0] >> 16 for _ in range(n))
        return struct.pack(f"<{n}H", *words)


def write_safetensors(path, tensors):
    """tensors: [(name, shape, bytes)] in bf16, written per the safetensors format."""
    header, off = {}, 0
    for name, shape, b in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, b in tensors:
            f.write(b)


def write_checkpoint(shape, out_dir, n_layers, shard_bytes):
    L, d, h, kvh, hd, ff, vocab, theta, extra = SHAPES[shape]
    cfg = dict(extra, hidden_size=d, intermediate_size=ff, num_hidden_layers=n_layers or L,
               num_attention_heads=h, num_key_value_heads=kvh, head_dim=hd, vocab_size=vocab, rope_theta=theta,
               hidden_act="silu", torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
    specs = [s for s in tensor_specs(shape)
             if not s[0].startswith("model.layers.") or int(s[0].split(".")[2]) < cfg["num_hidden_layers"]]
    shards, cur, cur_bytes = [], [], 0
    for name, shp, kind in specs:
        n_bytes = 2
        for s in shp:
            n_bytes *= s
        if cur and cur_bytes + n_bytes > shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append((name, shp, kind))
        cur_bytes += n_bytes
    shards.append(cur)
    weight_map, total, seed = {}, 0, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = []
        for name, shp, kind in shard:
            seed += 1
            tensors.append((name, shp, random_bf16_bytes(shp, kind, seed)))
            weight_map[name] = fname
        write_safetensors(os.path.join(out_dir, fname), tensors)
        total += sum(len(b) for _, _, b in tensors)
        print(f"wrote {fname} ({sum(len(b) for _, _, b in tensors) / 2**30:.1f} GiB)", flush=True)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer-gguf", help="the default model's GGUF (its tokenizer is converted)")
    src.add_argument("--tokenizer-dir", help="a directory with tokenizer.json (and tokenizer_config.json) to copy")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the shape's (0: all)")
    ap.add_argument("--shard-gb", type=float, default=4.0)
    ap.add_argument("--tokenizer-only", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.tokenizer_gguf:
        n_tokens = write_tokenizer(a.tokenizer_gguf, a.out)
    else:
        n_tokens = copy_tokenizer(a.tokenizer_dir, a.out)
    print(f"tokenizer: {n_tokens} tokens from {a.tokenizer_gguf or a.tokenizer_dir}")
    if a.tokenizer_only:
        return 0
    if SHAPES[a.shape][6] < n_tokens:
        sys.exit(f"--shape {a.shape}: vocabulary {SHAPES[a.shape][6]} is smaller than the tokenizer's {n_tokens}")
    total = write_checkpoint(a.shape, a.out, a.layers, int(a.shard_gb * 2**30))
    print(f"{a.shape}: {total / 2**30:.1f} GiB of bf16 weights in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
