// Products with weights as HostWeights holds them (model/checkpoint.h's WeightView): f32 through
// ops.h's linear (the oracle), block-quantised (WeightFormat::kNative) through the integer dot
// products of quant_dot.h for every row count: each output element is one integer dot product of
// a weight row with the row's own int8 quantisation, so a prompt token gets the same result in a
// chunk of any size and as a decode step (the native path is chunk-invariant; ARCHITECTURE.md).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cpu/quant_dot.h"
#include "model/checkpoint.h"

namespace lychee::cpu {

// Reused buffers of the quantised products (kept by the caller so decode allocates nothing).
struct LinearScratch {
  std::vector<Q8Block> qx;  // [n, k / 32]
  struct Fns {
    QuantDotFn dot;
    QuantDot4Fn dot4;
  };
  struct Tile {
    int product;
    int64_t j0;
  };
  std::vector<Fns> fns;     // per product of a group
  std::vector<Tile> tiles;  // the group's parallel work items
};

// One product of linear_group: y[n, w.rows] = x · wᵀ + b (b may be nullptr).
struct LinearOut {
  WeightView w;
  const float* b;
  float* y;
};

// y[n, m] = x[n, k] · w[m, k]ᵀ + b[m] (b may be nullptr); w.cols == k, w.rows == m.
// `isa` picks the quantised kernels (cpu/quant_dot.h).
void linear(const float* x, const WeightView& w, const float* b, float* y, int n, QuantIsa isa,
            LinearScratch& scratch);

// Several products of the same x (Q, K and V; gate and up): x quantised once and every weight's
// row tiles in one parallel region (a decode step has that many fewer barriers), each output
// element what linear() gives. Falls back to one linear() per product unless every weight is
// quantised with the same number of columns.
void linear_group(const float* x, std::span<const LinearOut> outs, int n, QuantIsa isa, LinearScratch& scratch);

// Row `row` of w as f32 (an embedding lookup). dst: [w.cols].
void weight_row_f32(const WeightView& w, int64_t row, float* dst);

}  // namespace lychee::cpu
