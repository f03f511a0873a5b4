#include "cpu/weight_linear.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "cpu/ops.h"

namespace lychee::cpu {

namespace {

// y[n, m] with x quantised row by row: each output element one integer dot product over a
// weight row. Parallel over weight rows; dynamic chunks so that a thread preempted by another
// process does not hold the others at the barrier (as ops.h's f32 matrix-vector product).
void quant_rows(const float* x, const WeightView& w, float* y, int n, QuantIsa isa, LinearScratch& s) {
  const int64_t k = w.cols, m = w.rows, nb = k / 32;
  s.qx.resize(size_t(n * nb));
  for (int i = 0; i < n; ++i) quantize_row_q8(x + i * k, k, s.qx.data() + i * nb);
  const QuantDotFn dot = quant_dot_fn(w.dtype, isa);
  const Q8Block* qx = s.qx.data();
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t j = 0; j < m; ++j) {
    const uint8_t* row = w.data + j * w.row_bytes;
    for (int i = 0; i < n; ++i) y[i * m + j] = dot(row, qx + i * nb, k);
  }
}

// y[n, m] through sgemm over tiles of dequantised weight rows (a tile is at most ~8 MiB, so the
// LM head of a large vocabulary is never expanded whole).
void dequant_gemm(const float* x, const WeightView& w, float* y, int n, LinearScratch& s) {
  const int64_t k = w.cols, m = w.rows;
  const int64_t tile_rows = std::clamp<int64_t>((int64_t(1) << 21) / k, 1, m);
  s.tile.resize(size_t(tile_rows * k));
  for (int64_t j0 = 0; j0 < m; j0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, m - j0);
    float* tile = s.tile.data();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) convert_to_f32(w.dtype, w.data + (j0 + r) * w.row_bytes, k, tile + r * k);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, int(rows), int(k), 1.0f, x, int(k), tile,
                int(k), 0.0f, y + j0, int(m));
  }
}

}  // namespace

void linear(const float* x, const WeightView& w, const float* b, float* y, int n, QuantIsa isa,
            LinearScratch& scratch) {
  LY_ASSERT(w.data != nullptr);
  if (!w.quantized()) {
    linear(x, w.f32(), b, y, n, int(w.cols), int(w.rows));
    return;
  }
  if (n <= kQuantMaxRows)
    quant_rows(x, w, y, n, isa, scratch);
  else
    dequant_gemm(x, w, y, n, scratch);
  if (b != nullptr)
    for (int i = 0; i < n; ++i)
      for (int64_t j = 0; j < w.rows; ++j) y[i * w.rows + j] += b[j];
}

void weight_row_f32(const WeightView& w, int64_t row, float* dst) {
  LY_ASSERT(w.data != nullptr && row >= 0 && row < w.rows);
  convert_to_f32(w.dtype, w.data + row * w.row_bytes, w.cols, dst);
}

}  // namespace lychee::cpu
