// Products with weights as HostWeights holds them (model/checkpoint.h's WeightView): f32 through
// ops.h's linear (the oracle); block-quantised (WeightFormat::kNative) by one of two products,
// chosen per call by the row count (choose_product):
//  - kQuantDot, the integer dot products of quant_dot.h: each output element one integer dot
//    product of a weight row with the row's own int8 quantisation, the same whatever the row count
//    (a prompt token gets in a chunk of any size what it gets as a decode step). The weights are
//    read once, as blocks: the fast product for decode steps and short chunks.
//  - kDequantGemm: the matrix dequantised to f32 a tile of rows at a time into a scratch buffer
//    (at most kDequantTileBytes, so no f32 copy of the model is held) and multiplied with the f32
//    rows through sgemm: OpenBLAS's register-blocked sgemm runs ~1.8x the integer products' flops,
//    and one dequantisation serves every row of the chunk. Activations stay f32 (no int8 rounding).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cpu/quant_dot.h"
#include "cpu/quant_pack.h"
#include "model/checkpoint.h"

namespace lychee::cpu {

enum class LinearProduct { kQuantDot, kDequantGemm };

// Row counts from which choose_product takes kDequantGemm: kDefaultGemmRows, measured on the
// default model's Q4_1 matrices (docs/results/cpu_default.md); kNoGemm never does (every row through
// the integer products: chunk-invariant, ARCHITECTURE.md).
inline constexpr int64_t kDefaultGemmRows = 128;
inline constexpr int64_t kNoGemm = 0;
// The product for n_rows activation rows against a block-quantised matrix: kDequantGemm when
// min_gemm_rows > 0 and n_rows >= min_gemm_rows, else kQuantDot. The crossover does not depend on
// the matrix's shape: the dequantisation costs m·k once, the saving is n·m·k.
LinearProduct choose_product(int64_t n_rows, int64_t min_gemm_rows);

// The f32 scratch of a kDequantGemm tile: at most this many bytes (a tile holds at least one row).
inline constexpr int64_t kDequantTileBytes = int64_t(8) << 20;

// Reused buffers of the quantised products (kept by the caller so decode allocates nothing).
struct LinearScratch {
  std::vector<Q8Block> qx;  // [n, k / 32]
  struct Fns {
    QuantDotFn dot;
    QuantDot4Fn dot4;  // nullptr: none
    QuantDot8Fn dot8;  // a matrix in eight-row groups (cpu/quant_pack.h), else nullptr
  };
  struct Tile {
    int product;
    int64_t j0;
  };
  std::vector<Fns> fns;     // per product of a group
  std::vector<Tile> tiles;  // the group's parallel work items
  std::vector<float> wf;    // kDequantGemm: [tile rows, k] f32
};

// One product of linear_group: y[n, w.rows] = x · wᵀ + b (b may be nullptr).
struct LinearOut {
  WeightView w;
  const float* b;
  float* y;
};

// y[n, m] = x[n, k] · w[m, k]ᵀ + b[m] (b may be nullptr); w.cols == k, w.rows == m.
// `isa` picks the quantised kernels (cpu/quant_dot.h), `product` how a quantised w is multiplied
// (an f32 w always goes through ops.h's linear).
void linear(const float* x, const WeightView& w, const float* b, float* y, int n, QuantIsa isa,
            LinearScratch& scratch, LinearProduct product = LinearProduct::kQuantDot);

// Several products of the same x (Q, K and V; gate and up). kQuantDot: x quantised once and every
// weight's row tiles in one parallel region (a decode step has that many fewer barriers), each
// output element what linear() gives; falls back to one linear() per product unless every weight
// is quantised with the same number of columns. kDequantGemm: one linear() per product.
void linear_group(const float* x, std::span<const LinearOut> outs, int n, QuantIsa isa, LinearScratch& scratch,
                  LinearProduct product = LinearProduct::kQuantDot);

// Row `row` of w as f32 (an embedding lookup). dst: [w.cols].
void weight_row_f32(const WeightView& w, int64_t row, float* dst);

}  // namespace lychee::cpu
