#include "cpu/weight_linear.h"

#include <algorithm>
#include <cstring>

#include <cblas.h>

#include "core/error.h"
#include "cpu/ops.h"
#include "cpu/quant_pack.h"

namespace lychee::cpu {

namespace {

// Rows j0..j1 of y[n, m] = qx · wᵀ: each output element one integer dot product of a weight row
// with an activation row's int8 blocks, the same whatever n is. Within a tile, 16 activation rows
// at a time keep both in L1 (a weight row is read once per 16 rows of x). A matrix in eight-row
// groups (w.row_group == 8, cpu/quant_pack.h) goes through fns.dot8 a group at a time (j0 and
// j1 multiples of 8 but at the end), its rows past the last group through fns.dot.
void quant_tile(const WeightView& w, const LinearScratch::Fns& fns, const Q8Block* qx, float* y, int64_t n,
                int64_t j0, int64_t j1) {
  const int64_t k = w.cols, m = w.rows, nb = k / 32;
  const int64_t grouped_end = fns.dot8 != nullptr ? std::min(j1, m / kPackRows * kPackRows) : j0;
  constexpr int64_t kXTile = 16;
  for (int64_t i0 = 0; i0 < n; i0 += kXTile) {
    const int64_t i1 = std::min<int64_t>(n, i0 + kXTile);
    for (int64_t j = j0; j < grouped_end; j += kPackRows)
      for (int64_t i = i0; i < i1; ++i) fns.dot8(w.data + j * w.row_bytes, qx + i * nb, k, y + i * m + j);
    for (int64_t j = std::max(j0, grouped_end); j < j1; ++j) {
      const uint8_t* row = w.data + j * w.row_bytes;
      int64_t i = i0;
      if (fns.dot4 != nullptr)  // bit for bit what dot gives per row
        for (float out[4]; i + 4 <= i1; i += 4) {
          fns.dot4(row, qx + i * nb, nb, k, out);
          for (int r = 0; r < 4; ++r) y[(i + r) * m + j] = out[r];
        }
      for (; i < i1; ++i) y[i * m + j] = fns.dot(row, qx + i * nb, k);
    }
  }
}

constexpr int64_t kRowTile = 64;  // weight rows per parallel work item (a multiple of kPackRows)

void add_bias(const float* b, float* y, int n, int64_t m) {
  if (b != nullptr)
    for (int i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) y[i * m + j] += b[j];
}

// Row j of a quantised w as f32 (dequantize_row's values), from either layout.
void dequantize_weight_row(const WeightView& w, int64_t j, float* out, QuantIsa isa) {
  if (w.row_group != kPackRows) {
    dequantize_row(w.dtype, w.data + j * w.row_bytes, w.cols, out, isa);
    return;
  }
  thread_local std::vector<uint8_t> bytes;  // [w.row_bytes]: the row as the file has it
  bytes.resize(size_t(w.row_bytes));
  packed_row(w.dtype, w.data, w.rows, w.cols, j, bytes.data());
  dequantize_row(w.dtype, bytes.data(), w.cols, out, isa);
}

// y[n, m] = x · wᵀ through sgemm on w dequantised a tile of rows at a time into s.wf: each tile's
// rows dequantised in parallel (guided, as the integer products: a preempted thread holds no large
// share), then one sgemm writes the tile's columns of y (row stride m).
void dequant_gemm(const float* x, const WeightView& w, float* y, int n, QuantIsa isa, LinearScratch& s) {
  const int64_t k = w.cols, m = w.rows;
  const int64_t tile_rows = std::clamp<int64_t>(kDequantTileBytes / (k * int64_t(sizeof(float))), 1, m);
  s.wf.resize(size_t(tile_rows * k));
  float* wf = s.wf.data();
  for (int64_t j0 = 0; j0 < m; j0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, m - j0);
#pragma omp parallel for schedule(guided)
    for (int64_t j = 0; j < rows; ++j) dequantize_weight_row(w, j0 + j, wf + j * k, isa);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, int(rows), int(k), 1.0f, x, int(k), wf, int(k), 0.0f,
                y + j0, int(m));
  }
}

}  // namespace

LinearProduct choose_product(int64_t n_rows, int64_t min_gemm_rows) {
  return min_gemm_rows > 0 && n_rows >= min_gemm_rows ? LinearProduct::kDequantGemm : LinearProduct::kQuantDot;
}

void linear(const float* x, const WeightView& w, const float* b, float* y, int n, QuantIsa isa,
            LinearScratch& scratch, LinearProduct product) {
  LY_ASSERT(w.data != nullptr);
  if (!w.quantized()) {
    linear(x, w.f32(), b, y, n, int(w.cols), int(w.rows));
    return;
  }
  if (product == LinearProduct::kDequantGemm) {
    dequant_gemm(x, w, y, n, isa, scratch);
    add_bias(b, y, n, w.rows);
    return;
  }
  const LinearOut one{w, b, y};
  linear_group(x, std::span<const LinearOut>(&one, 1), n, isa, scratch);
}

// Parallel over weight-row tiles of all the products, guided: the first chunks are long runs of
// contiguous tiles, later ones shorter, so that each thread streams long contiguous ranges (tiles
// dealt one at a time in turn read memory ~1.5x slower on 2 cores: the prefetchers lose the
// stream every 23 KB) and a thread preempted by another process still does not hold the others
// at the barrier (as ops.h's f32 matrix-vector product).
void linear_group(const float* x, std::span<const LinearOut> outs, int n, QuantIsa isa, LinearScratch& s,
                  LinearProduct product) {
  if (outs.empty()) return;
  const int64_t k = outs[0].w.cols, nb = k / 32;
  bool together = product == LinearProduct::kQuantDot;
  for (const LinearOut& o : outs) together &= o.w.quantized() && o.w.cols == k && o.w.data != nullptr;
  if (!together) {
    for (const LinearOut& o : outs) linear(x, o.w, o.b, o.y, n, isa, s, product);
    return;
  }
  s.qx.resize(size_t(n * nb));
  for (int i = 0; i < n; ++i) quantize_row_q8(x + i * k, k, s.qx.data() + i * nb);
  s.fns.clear();
  s.tiles.clear();
  for (size_t p = 0; p < outs.size(); ++p) {
    const WeightView& w = outs[p].w;
    if (w.row_group == kPackRows)  // rows past the last group: the scalar kernel, as dot8's rows
      s.fns.push_back({quant_dot_fn(w.dtype, QuantIsa::kScalar), nullptr, quant_dot8_fn(w.dtype, isa)});
    else
      s.fns.push_back({quant_dot_fn(w.dtype, isa), quant_dot4_fn(w.dtype, isa), nullptr});
    for (int64_t j0 = 0; j0 < outs[p].w.rows; j0 += kRowTile) s.tiles.push_back({int(p), j0});
  }
  const Q8Block* qx = s.qx.data();
  const int64_t n_tiles = int64_t(s.tiles.size());
#pragma omp parallel for schedule(guided)
  for (int64_t t = 0; t < n_tiles; ++t) {
    const LinearScratch::Tile tile = s.tiles[size_t(t)];
    const LinearOut& o = outs[size_t(tile.product)];
    quant_tile(o.w, s.fns[size_t(tile.product)], qx, o.y, n, tile.j0, std::min(o.w.rows, tile.j0 + kRowTile));
  }
  for (const LinearOut& o : outs) add_bias(o.b, o.y, n, o.w.rows);
}

void weight_row_f32(const WeightView& w, int64_t row, float* dst) {
  LY_ASSERT(w.data != nullptr && row >= 0 && row < w.rows);
  if (w.row_group == kPackRows) {
    thread_local std::vector<uint8_t> bytes;  // [w.row_bytes]: the row as the file has it
    bytes.resize(size_t(w.row_bytes));
    packed_row(w.dtype, w.data, w.rows, w.cols, row, bytes.data());
    convert_to_f32(w.dtype, bytes.data(), w.cols, dst);
    return;
  }
  convert_to_f32(w.dtype, w.data + row * w.row_bytes, w.cols, dst);
}

}  // namespace lychee::cpu
