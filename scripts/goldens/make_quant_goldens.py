#!/usr/bin/env python3
"""Writes the dequantisation goldens that tests/test_quant_goldens.cpp compares lychee against.

Runs anywhere with numpy and the `gguf` package from PyPI (`pip install gguf numpy`; no torch):

    python3 scripts/goldens/make_quant_goldens.py

For each ggml block type it writes tests/golden/quants/<TYPE>.blocks (raw blocks, random bytes
with mostly finite scales) and <TYPE>.f32 (the little-endian f32 values the gguf package's
reference dequantiser gives for them). The gguf package has no Q8_K dequantiser (ggml uses Q8_K
only for activations); its values are computed here from the block layout (f32 d, 256 x int8 q,
16 x int16 sums; x = d * q), and the bytes/size come from gguf's GGML_QUANT_SIZES like the others.
"""
import os

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "golden", "quants")

# Byte offsets of each type's f16 scale fields (d, dmin), overwritten with finite values in most
# blocks so the golden exercises real arithmetic; the rest keep random bytes (inf/NaN included).
F16_FIELDS = {
    T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
N_BLOCKS = {T.Q8_0: 64, T.Q4_0: 64, T.Q4_1: 64, T.Q4_K: 24, T.Q5_K: 24, T.Q6_K: 24, T.Q8_K: 24}


def random_blocks(rng, qtype, n_blocks):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    n_raw = 2  # the last blocks keep fully random bytes
    if qtype == T.Q8_K:
        d = rng.uniform(-1e-2, 1e-2, size=n_blocks).astype("<f4")
        raw[:-n_raw, 0:4] = d[:-n_raw].view(np.uint8).reshape(-1, 4)
        # Random f32 bytes may be NaN; keep these finite too so the f32 golden is plain.
        raw[-n_raw:, 0:4] = d[-n_raw:].view(np.uint8).reshape(-1, 4)
    else:
        for off in F16_FIELDS[qtype]:
            vals = rng.uniform(-0.05, 0.05, size=n_blocks).astype("<f2")
            raw[:-n_raw, off:off + 2] = vals[:-n_raw].view(np.uint8).reshape(-1, 2)
        # The very last block's scale is +inf: inf * 0 gives NaN, inf * q gives +-inf.
        off = F16_FIELDS[qtype][0]
        raw[-1, off:off + 2] = np.array([0x7c00], dtype="<u2").view(np.uint8)
    return raw


def q8_k_values(raw):
    d = raw[:, 0:4].copy().view("<f4").astype(np.float32)  # [n_blocks, 1]
    q = raw[:, 4:260].view(np.int8).astype(np.float32)
    return (d * q).astype(np.float32)


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(16)
    for qtype, n_blocks in N_BLOCKS.items():
        raw = random_blocks(rng, qtype, n_blocks)
        with np.errstate(all="ignore"):
            values = q8_k_values(raw) if qtype == T.Q8_K else dequantize(raw, qtype)
        values = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
        assert values.size == n_blocks * GGML_QUANT_SIZES[qtype][0]
        raw.tofile(os.path.join(OUT, f"{qtype.name}.blocks"))
        values.tofile(os.path.join(OUT, f"{qtype.name}.f32"))
        print(f"{qtype.name}: {n_blocks} blocks, {raw.nbytes} + {values.nbytes} bytes, "
              f"{int(np.isnan(values).sum())} NaN")


if __name__ == "__main__":
    main()
