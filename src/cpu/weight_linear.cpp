#include "cpu/weight_linear.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "cpu/ops.h"

namespace lychee::cpu {

namespace {

// y[n, m] with x quantised row by row: each output element one integer dot product over a
// weight row, the same whatever n is. Tiles of 64 weight rows x 16 activation rows keep both in
// L1 (a tile of weight rows is read once per 16 rows of x instead of once per row); parallel over
// weight-row tiles, dynamic, so that a thread preempted by another process does not hold the
// others at the barrier (as ops.h's f32 matrix-vector product).
void quant_rows(const float* x, const WeightView& w, float* y, int n, QuantIsa isa, LinearScratch& s) {
  const int64_t k = w.cols, m = w.rows, nb = k / 32;
  s.qx.resize(size_t(n * nb));
  for (int i = 0; i < n; ++i) quantize_row_q8(x + i * k, k, s.qx.data() + i * nb);
  const QuantDotFn dot = quant_dot_fn(w.dtype, isa);
  const QuantDot4Fn dot4 = quant_dot4_fn(w.dtype, isa);  // bit for bit the same per row
  const Q8Block* qx = s.qx.data();
  constexpr int64_t kRowTile = 64, kXTile = 16;
  const int64_t tiles = (m + kRowTile - 1) / kRowTile;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t j0 = t * kRowTile, j1 = std::min(m, j0 + kRowTile);
    for (int64_t i0 = 0; i0 < n; i0 += kXTile) {
      const int64_t i1 = std::min<int64_t>(n, i0 + kXTile);
      for (int64_t j = j0; j < j1; ++j) {
        const uint8_t* row = w.data + j * w.row_bytes;
        int64_t i = i0;
        if (dot4 != nullptr)
          for (float out[4]; i + 4 <= i1; i += 4) {
            dot4(row, qx + i * nb, nb, k, out);
            for (int r = 0; r < 4; ++r) y[(i + r) * m + j] = out[r];
          }
        for (; i < i1; ++i) y[i * m + j] = dot(row, qx + i * nb, k);
      }
    }
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
  quant_rows(x, w, y, n, isa, scratch);
  if (b != nullptr)
    for (int i = 0; i < n; ++i)
      for (int64_t j = 0; j < w.rows; ++j) y[i * w.rows + j] += b[j];
}

void weight_row_f32(const WeightView& w, int64_t row, float* dst) {
  LY_ASSERT(w.data != nullptr && row >= 0 && row < w.rows);
  convert_to_f32(w.dtype, w.data + row * w.row_bytes, w.cols, dst);
}

}  // namespace lychee::cpu
