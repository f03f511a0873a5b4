"""A plain PyTorch Llama decode loop whose attention is lychee's paged decode kernel (lychee.ops),
checked against the engine: greedy tokens from the same prompt must equal lychee.Engine's.

    python examples/torch_llama_decode.py                       # the default model, 32 tokens
    python examples/torch_llama_decode.py -m path/to/model -n 64 -p "The Roman Empire"

Needs a CUDA build of lychee on a Hopper GPU, torch, and numpy (safetensors for HF directories).
A Hugging Face directory is loaded with safetensors; a GGUF file (the default model) through
lychee.read_weights (the engine's loader: dequantised, Hugging Face names and layout); the arithmetic
follows the engine's GPU path: bf16 weights and matrix inputs, f32 residual stream and norms,
rotate-half RoPE, a paged bf16 KV cache of 64-token pages, dense prefill by torch's SDPA, then one
lychee.ops.decode_attention per layer and step (one plan per step, shared by every layer).
Models with RoPE scaling (Llama-3.1) are not handled here.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

import lychee
import lychee.ops as ops

PAGE = 64


def rmsnorm(x, w, eps):  # x [n, d] f32 -> bf16, as the engine's add_rmsnorm
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w).bfloat16()


def rope(x, pos, inv_freq):  # x [n, heads, hd] bf16, rotate-half, computed in f32
    ang = pos[:, None].float() * inv_freq[None, :]  # [n, hd/2]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).bfloat16()


def load_weights(model):
    """name -> tensor in Hugging Face names and layout."""
    if model is not None and os.path.isdir(model):
        from safetensors.torch import load_file
        index = os.path.join(model, "model.safetensors.index.json")
        files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
        w = {}
        for f in files:
            w.update(load_file(os.path.join(model, f)))
        return w
    return {k: torch.from_numpy(v) for k, v in lychee.read_weights(model).items()}


class TorchLlama:
    def __init__(self, model, cfg, max_tokens, dev):
        w = load_weights(model)
        extra = [k for k in w if k.endswith("_proj.bias") or "q_norm" in k or "k_norm" in k]
        if extra:
            sys.exit(f"torch_llama_decode: a plain Llama only; this model has {extra[0]} (biases / q-k norms)")
        self.c, self.dev = cfg, dev
        bf = lambda t: t.to(dev, torch.bfloat16)  # noqa: E731
        f32 = lambda t: t.to(dev, torch.float32)  # noqa: E731
        self.emb = bf(w["model.embed_tokens.weight"])
        self.out = bf(w.get("lm_head.weight", w["model.embed_tokens.weight"]))
        self.norm = f32(w["model.norm.weight"])
        self.layers = []
        for i in range(cfg["n_layers"]):
            p = f"model.layers.{i}."
            g = lambda n: w[p + n]  # noqa: E731
            self.layers.append(dict(
                attn_norm=f32(g("input_layernorm.weight")), ffn_norm=f32(g("post_attention_layernorm.weight")),
                wqkv=bf(torch.cat([g("self_attn.q_proj.weight"), g("self_attn.k_proj.weight"),
                                   g("self_attn.v_proj.weight")])),
                wo=bf(g("self_attn.o_proj.weight")),
                wgu=bf(torch.cat([g("mlp.gate_proj.weight"), g("mlp.up_proj.weight")])),
                wdown=bf(g("mlp.down_proj.weight"))))
        hd = cfg["head_dim"]
        self.inv_freq = (cfg["rope_theta"] ** (-torch.arange(0, hd, 2, device=dev).float() / hd))
        if "rope_freqs.weight" in w:  # GGUF llama3 frequency factors
            self.inv_freq = self.inv_freq / f32(w["rope_freqs.weight"])
        n_pages = math.ceil(max_tokens / PAGE)
        shape = (n_pages, cfg["n_kv_heads"], PAGE, hd)
        self.k = [torch.zeros(shape, dtype=torch.bfloat16, device=dev) for _ in self.layers]
        self.v = [torch.zeros(shape, dtype=torch.bfloat16, device=dev) for _ in self.layers]
        self.table = torch.arange(n_pages, dtype=torch.int32, device=dev)[None, :]  # one sequence, pages in order
        self.len = 0

    def forward(self, tokens):  # tokens [n] int64 -> logits of the last one [vocab] f32
        c = self.c
        n, hq, hkv, hd = len(tokens), c["n_heads"], c["n_kv_heads"], c["head_dim"]
        pos = torch.arange(self.len, self.len + n, device=self.dev)
        x = self.emb[tokens].float()
        if n == 1:  # decode: one plan for this step, shared by every layer
            seq_lens = torch.tensor([self.len + 1], dtype=torch.int32, device=self.dev)
            plan = ops.plan_decode(ops.dense_heads([self.len + 1], hkv, hq // hkv, PAGE, self.table.shape[1]),
                                   1, hq, hkv, hd, PAGE, self.dev)
        for i, L in enumerate(self.layers):
            h = rmsnorm(x, L["attn_norm"], c["rms_eps"])
            q, k, v = (h @ L["wqkv"].T).split([hq * hd, hkv * hd, hkv * hd], -1)
            q, k = rope(q.view(n, hq, hd), pos, self.inv_freq), rope(k.view(n, hkv, hd), pos, self.inv_freq)
            self.k[i][pos // PAGE, :, pos % PAGE] = k
            self.v[i][pos // PAGE, :, pos % PAGE] = v.view(n, hkv, hd)
            if n == 1:
                att = ops.decode_attention(q, self.k[i], self.v[i], self.table, seq_lens, plan)
            else:  # prefill of the prompt (position 0 on): dense causal attention
                kk = k.repeat_interleave(hq // hkv, 1).transpose(0, 1)
                vv = v.view(n, hkv, hd).repeat_interleave(hq // hkv, 1).transpose(0, 1)
                att = F.scaled_dot_product_attention(q.transpose(0, 1), kk, vv, is_causal=True).transpose(0, 1)
            x = x + (att.reshape(n, hq * hd) @ L["wo"].T).float()
            g, u = (rmsnorm(x, L["ffn_norm"], c["rms_eps"]) @ L["wgu"].T).chunk(2, -1)
            x = x + ((F.silu(g.float()) * u.float()).bfloat16() @ L["wdown"].T).float()
        self.len += n
        return rmsnorm(x[-1:], self.norm, c["rms_eps"]).float() @ self.out.float().T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=None, help="model directory or .gguf (default: the default model)")
    ap.add_argument("-p", "--prompt", default="The capital of France is Paris. The Roman Empire")
    ap.add_argument("-n", "--tokens", type=int, default=32)
    a = ap.parse_args()
    why = ops.available()
    if why:
        sys.exit(f"torch_llama_decode: {why}")
    torch.backends.cuda.matmul.allow_tf32 = False
    engine = lychee.Engine(a.model, device="cuda")
    ids = engine.tokenize(a.prompt)
    want = engine.generate(ids, max_tokens=a.tokens, ignore_eos=True).tokens
    model = TorchLlama(a.model, engine.config, len(ids) + a.tokens, torch.device("cuda"))
    got = []
    with torch.no_grad():
        logits = model.forward(torch.tensor(ids, device="cuda"))
        for _ in range(a.tokens):
            tok = int(logits.argmax())
            got.append(tok)
            logits = model.forward(torch.tensor([tok], device="cuda"))
    same = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), len(want))
    print(f"prompt: {a.prompt!r} ({len(ids)} tokens)")
    print(f"torch + lychee.ops: {engine.detokenize(got)!r}")
    print(f"lychee engine:      {engine.detokenize(want)!r}")
    print(f"tokens equal: {same}/{len(want)}" + ("" if same == len(want) else f" (first difference at {same})"))
    sys.exit(0 if same == len(want) else 1)


if __name__ == "__main__":
    main()
