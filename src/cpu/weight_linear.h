// Products with weights as HostWeights holds them (model/checkpoint.h's WeightView): f32 through
// ops.h's linear (the oracle), block-quantised (WeightFormat::kNative) through the integer dot
// products of quant_dot.h for a few rows, and through dequantised tiles and BLAS for many.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/quant_dot.h"
#include "model/checkpoint.h"

namespace lychee::cpu {

// Up to this many rows of x, a quantised weight is used in its blocks (decode: memory-bound, the
// blocks are 4-7x fewer bytes than f32); more rows (prefill: compute-bound) dequantise W in
// row tiles and multiply with sgemm, which is faster per row than the integer products here.
constexpr int kQuantMaxRows = 4;

// Reused buffers of the quantised products (kept by the caller so decode allocates nothing).
struct LinearScratch {
  std::vector<Q8Block> qx;  // [n, k / 32]
  std::vector<float> tile;  // [tile rows, k] dequantised weights
};

// y[n, m] = x[n, k] · w[m, k]ᵀ + b[m] (b may be nullptr); w.cols == k, w.rows == m.
// `isa` picks the quantised kernels (cpu/quant_dot.h).
void linear(const float* x, const WeightView& w, const float* b, float* y, int n, QuantIsa isa,
            LinearScratch& scratch);

// Row `row` of w as f32 (an embedding lookup). dst: [w.cols].
void weight_row_f32(const WeightView& w, int64_t row, float* dst);

}  // namespace lychee::cpu
