#include "core/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace lychee {

uint8_t f32_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7F;
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return sign | 0x7E;  // 448 (and saturation)
  if (a == 0.0f) return sign;
  // a = f · 2^e with f in [0.5, 1): the binade [2^(e-1), 2^e); e4m3 normals start at 2^-6.
  int e;
  std::frexp(a, &e);
  const int binade = std::max(e - 1, -6);       // exponent of the leading bit (subnormals: -6)
  // 3 mantissa bits below the leading one: steps of 2^(binade - 3); exact scaling, then
  // round to nearest even (the default rounding mode) of an integer in [0, 16].
  int q = int(std::nearbyint(std::ldexp(a, 3 - binade)));
  int exp = binade;
  if (q == 16) {  // rounded up into the next binade
    q = 8;
    ++exp;
  }
  if (q < 8) return sign | uint8_t(q);  // subnormal (binade -6, no leading bit)
  return sign | uint8_t(((exp + 7) << 3) | (q - 8));
}

float e4m3_to_f32(uint8_t code) {
  const int e = (code >> 3) & 0x0F, m = code & 0x07;
  if (e == 0x0F && m == 0x07) return std::numeric_limits<float>::quiet_NaN();
  const float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
  return (code & 0x80) != 0 ? -v : v;
}

float e4m3_row_scale(const float* row, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(row[i]));
  return amax > 0.0f ? amax / kE4m3Max : 1.0f;
}

void quantize_rows_e4m3(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scales) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    const float s = e4m3_row_scale(row, cols);
    scales[r] = s;
    for (int64_t i = 0; i < cols; ++i) codes[r * cols + i] = f32_to_e4m3(row[i] / s);
  }
}

void round_rows_through_e4m3(float* w, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = w + r * cols;
    const float s = e4m3_row_scale(row, cols);
    for (int64_t i = 0; i < cols; ++i) row[i] = e4m3_to_f32(f32_to_e4m3(row[i] / s)) * s;
  }
}

}  // namespace lychee
