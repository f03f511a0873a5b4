// FP8 E4M3 (the "fn" variant of the OCP 8-bit floating point spec, CUDA's __nv_fp8_e4m3): 1 sign,
// 4 exponent (bias 7) and 3 mantissa bits; largest finite 448, smallest subnormal 2^-9, no
// infinities, 0x7F / 0xFF are NaN.
//
// lychee's FP8 weights (--weights fp8 on the GPU, --cpu-weights fp8 for the CPU reference): each
// output channel (row) of a linear weight gets one f32 scale s = max|row| / 448 and its values are
// stored as e4m3(w / s), rounded to nearest, ties to even, saturating at ±448; a product is then
// s · Σ e4m3 · x. The quantiser is this one host function for both backends, so the CPU reference
// (which multiplies the dequantised f32 values) and the GPU read the very same codes.
#pragma once

#include <cstdint>

namespace lychee {

constexpr float kE4m3Max = 448.0f;

// Round to nearest e4m3, ties to even; |x| > 448 (and ±inf) saturate to ±448; NaN -> 0x7F|sign.
uint8_t f32_to_e4m3(float x);
// Exact (every e4m3 value is an f32); NaN codes give a quiet NaN.
float e4m3_to_f32(uint8_t code);

// The row scale: max|row| / 448 (1 for an all-zero row, so that zeros stay zeros).
float e4m3_row_scale(const float* row, int64_t n);

// rows x cols row-major f32 -> e4m3 codes [rows, cols] and one scale per row.
void quantize_rows_e4m3(const float* w, int64_t rows, int64_t cols, uint8_t* codes, float* scales);

// In place: every row replaced by scale · e4m3_to_f32(e4m3(w / scale)), the values the FP8
// weights stand for (the CPU reference's --cpu-weights fp8).
void round_rows_through_e4m3(float* w, int64_t rows, int64_t cols);

}  // namespace lychee
