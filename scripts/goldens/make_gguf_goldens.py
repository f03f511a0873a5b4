#!/usr/bin/env python3
"""Converts the committed tiny Hugging Face golden models into small GGUF files for the GGUF
parity tests (tests/test_gguf_models.cpp). Runs anywhere: `pip install gguf numpy` (no torch).

    python3 scripts/goldens/make_gguf_goldens.py

The files follow the layout llama.cpp's converter gives each architecture:
  * tensor names token_embd / blk.N.attn_q ... / output_norm / output (absent when tied);
  * 1-D tensors (norms, biases) in F32, matrices in the checkpoint's own type (F32/F16/BF16) or
    quantised;
  * architecture `llama` for Llama and Mistral models, whose Q/K rows (and biases) are interleaved
    per head for ggml's pairwise RoPE; `qwen2` / `qwen3` keep Hugging Face's row order (llama.cpp
    runs them with NeoX, rotate-half RoPE);
  * <arch>.* hyper-parameters, with attention.key_length/value_length since head_dim is explicit;
  * the tokenizer as tokenizer.ggml.* (model gpt2, tokens, token_type, merges, pre, special ids,
    add_bos_token) and tokenizer.chat_template.

Quantised files: only matrices whose rows are whole blocks can be quantised (32 for Q8_0, 256 for
the k-quants); the others keep the checkpoint's type, as llama.cpp's mixed files do. The tiny
models' only such rows are attn_output's (n_heads x 64 columns): Qwen3's 256 take k-quants, Qwen2's
320 take Q8_0. The k-quant blocks are made by this script's own simple quantiser (the gguf package
only dequantises k-quants); the script checks that the package's dequantiser reads them back close
to the original weights.

Outputs (committed): tests/golden/gguf/<name>.gguf
"""
import json
import os
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "tests", "golden", "models")
OUT = os.path.join(ROOT, "tests", "golden", "gguf")

# output name, source model, GGUF architecture, {tensor-name suffix: type per layer} for quantised
# matrices, general.file_type (llama_ftype).
FILES = [
    ("llama_f32", "llama_tied_f32", "llama", {}, 0),
    ("mistral_f32", "mistral_f32", "llama", {}, 0),
    ("qwen2_f16", "qwen2_untied_f16", "qwen2", {}, 1),
    ("qwen2_q8_0", "qwen2_untied_f16", "qwen2", {"attn_output.weight": [Q.Q8_0, Q.Q8_0]}, 7),
    ("qwen3_bf16", "qwen3_tied_bf16", "qwen3", {}, 32),
    # A Q4_K_M-style mix (file type 15): Q4_K, with Q5_K and Q6_K in other layers.
    ("qwen3_q4_k_m", "qwen3_tied_bf16", "qwen3",
     {"attn_output.weight": [Q.Q4_K, Q.Q5_K, Q.Q6_K]}, 15),
]

HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def read_safetensors(path):
    """{name: (dtype string, shape, raw little-endian bytes)} of one safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[base + a:base + b])
    return out


def to_f32(dtype, shape, raw):
    if dtype == "F32":
        return np.frombuffer(raw, "<f4").reshape(shape).copy()
    if dtype == "F16":
        return np.frombuffer(raw, "<f2").astype(np.float32).reshape(shape)
    if dtype == "BF16":
        u = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape)
    raise ValueError(dtype)


def interleave_rows(w, n_heads):
    """HF rotate-half row order -> ggml pairwise order: within each head, HF row j*hd/2 + i goes
    to row 2i + j (what lychee's Checkpoint::read_f32 undoes)."""
    rows = w.shape[0]
    hd = rows // n_heads
    idx = np.empty(rows, dtype=np.int64)
    for h in range(n_heads):
        for i in range(hd // 2):
            for j in range(2):
                idx[h * hd + 2 * i + j] = h * hd + j * (hd // 2) + i
    return w[idx]


# --- k-quant blocks (layouts as in gguf.quants' dequantisers) --------------------------------

def f16_bytes(x):
    return np.asarray(x, dtype="<f2").reshape(-1, 1).view(np.uint8)


def pack_k_scales(sc, mn):
    """8 six-bit scales and mins -> the 12-byte packing of Q4_K/Q5_K. sc, mn: [n, 8] uint8."""
    s = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    s[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    return s


def quantize_qk_min(x, n_levels):
    """Q4_K/Q5_K style: x ~= (d * sc_j) * q - dmin * mn_j over sub-blocks of 32.
    x: [n, 256] f32 -> (d, dmin, sc, mn, q) with q: [n, 8, 32] in 0..n_levels-1."""
    xs = x.reshape(-1, 8, 32)
    lo = np.minimum(xs.min(axis=2), 0.0)
    hi = xs.max(axis=2)
    scale = (hi - lo) / (n_levels - 1)
    d = (scale.max(axis=1) / 63).astype(np.float16).astype(np.float32)
    dmin = ((-lo).max(axis=1) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmin[:, None] > 0, np.rint(-lo / dmin[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = d[:, None] * sc
        off = dmin[:, None] * mn
        q = np.where(step[..., None] > 0, np.rint((xs + off[..., None]) / step[..., None]), 0)
    return d, dmin, sc, mn, q.clip(0, n_levels - 1).astype(np.uint8)


def quantize_q4_k(x):
    d, dmin, sc, mn, q = quantize_qk_min(x, 16)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), pack_k_scales(sc, mn), qs], axis=1)


def quantize_q5_k(x):
    d, dmin, sc, mn, q = quantize_qk_min(x, 32)
    lo = q & 15
    qs = (lo[:, 0::2, :] | (lo[:, 1::2, :] << 4)).reshape(-1, 128)
    hi = (q >> 4) & 1  # [n, 8, 32]: bit j of qh[l] is sub-block j's fifth bit
    qh = np.zeros((x.shape[0], 32), dtype=np.uint8)
    for j in range(8):
        qh |= hi[:, j, :] << j
    return np.concatenate([f16_bytes(d), f16_bytes(dmin), pack_k_scales(sc, mn), qh, qs], axis=1)


def quantize_q6_k(x):
    xs = x.reshape(-1, 16, 16)
    amax = np.abs(xs).max(axis=2)
    scale = amax / 31
    d = (scale.max(axis=1) / 127).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(-128, 127).astype(np.int8)
        step = d[:, None] * sc.astype(np.float32)
        q = np.where(step[..., None] != 0, np.rint(xs / step[..., None]), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(-1, 256)
    ql = np.zeros((x.shape[0], 128), dtype=np.uint8)
    qh = np.zeros((x.shape[0], 64), dtype=np.uint8)
    for e in range(256):
        h, r = divmod(e, 128)
        ql[:, 64 * h + r % 64] |= (q[:, e] & 15) << (4 * (r // 64))
        qh[:, 32 * h + r % 32] |= (q[:, e] >> 4) << (2 * (r // 32))
    return np.concatenate([ql, qh, sc.view(np.uint8), f16_bytes(d)], axis=1)


def quantize(w, qtype):
    """w: [rows, cols] f32 -> [rows, bytes per row] uint8 blocks; checked with gguf's dequantiser."""
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    blocks = w.reshape(-1, block).astype(np.float32)
    if qtype == Q.Q8_0:
        raw = gguf.quants.quantize(blocks, qtype)
    else:
        raw = {Q.Q4_K: quantize_q4_k, Q.Q5_K: quantize_q5_k, Q.Q6_K: quantize_q6_k}[qtype](blocks)
    raw = raw.reshape(w.shape[0], -1)
    back = gguf.quants.dequantize(raw, qtype).reshape(w.shape)
    bits = {Q.Q8_0: 8, Q.Q4_K: 4, Q.Q5_K: 5, Q.Q6_K: 6}[qtype]
    err = np.abs(back - w).max() / np.abs(w).max()
    assert err < 2.0 ** (2 - bits), f"{qtype.name} round trip error {err}"
    return raw


# --- tokenizer -------------------------------------------------------------------------------

def tokenizer_metadata(writer, model_dir, vocab_size, pre):
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8"))
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    types = {i: 1 for i in by_id}  # 1: normal
    for a in tok.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4  # control / user-defined
    n = max(vocab_size, max(by_id) + 1)
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n)]
    token_types = [types.get(i, 5) for i in range(n)]  # 5: unused (padding)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)

    def content(v):
        return v["content"] if isinstance(v, dict) else v

    ids = {t: i for i, t in enumerate(tokens)}
    for field, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id),
                       ("pad_token", writer.add_pad_token_id)):
        if cfg.get(field) is not None:
            add(ids[content(cfg[field])])
    writer.add_add_bos_token(bool(cfg.get("add_bos_token", False)))
    if cfg.get("chat_template"):
        writer.add_chat_template(cfg["chat_template"])


# --- the files -------------------------------------------------------------------------------

def convert(out_name, src, arch, quant, file_type):
    model_dir = os.path.join(MODELS, src)
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg["head_dim"]
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))

    path = os.path.join(OUT, out_name + ".gguf")
    w = gguf.GGUFWriter(path, arch)
    w.add_name(out_name)
    w.add_file_type(file_type)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    pre = "qwen2" if arch.startswith("qwen") else "gpt-2"
    tokenizer_metadata(w, model_dir, cfg["vocab_size"], pre)

    for hf_name in sorted(tensors, key=lambda s: (s.count("layers."), s)):
        dtype, shape, raw = tensors[hf_name]
        if hf_name in HF_TO_GGUF:
            name, layer = HF_TO_GGUF[hf_name], None
        else:
            parts = hf_name.split(".")
            assert parts[:2] == ["model", "layers"], hf_name
            layer, suffix = int(parts[2]), ".".join(parts[3:])
            name = f"blk.{layer}.{LAYER_NAMES[suffix]}"
        x = to_f32(dtype, shape, raw)
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_q.bias")):
            x = interleave_rows(x, n_heads)
        if arch == "llama" and name.endswith(("attn_k.weight", "attn_k.bias")):
            x = interleave_rows(x, n_kv)
        suffix = name.split(".", 2)[-1] if layer is not None else None
        if layer is not None and suffix in quant:
            qtype = quant[suffix][layer]
            w.add_tensor(name, quantize(x, qtype), raw_dtype=qtype)
        elif x.ndim == 1 or dtype == "F32":
            w.add_tensor(name, x.astype(np.float32))
        elif dtype == "F16":
            w.add_tensor(name, x.astype(np.float16))
        else:  # BF16: the original bits (the f32 values are exact), permuted like x
            bits = (x.view(np.uint32) >> 16).astype(np.uint16)
            w.add_tensor(name, bits.view(np.uint8).reshape(x.shape[0], -1), raw_dtype=Q.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: {os.path.getsize(path)} bytes")


def main():
    os.makedirs(OUT, exist_ok=True)
    for spec in FILES:
        convert(*spec)


if __name__ == "__main__":
    main()
