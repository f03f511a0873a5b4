// Element types of checkpoints and tensors, and scalar conversions between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace lychee {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI32,
  kQ8_0,  // ggml block of 32: f16 scale d, 32 x int8 q; x = d * q
  kQ4_0,  // ggml block of 32: f16 scale d, 16 bytes of nibbles; x = d * (q - 8)
  kQ4_1,  // ggml block of 32: f16 scale d, f16 min m, 16 bytes of nibbles; x = d * q + m
  // k-quants: super-blocks of 256 in sub-blocks with their own 6- or 8-bit scales (ggml's
  // block_q4_K etc.; layouts in dtype.cpp).
  kQ4_K,  // 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
  kQ5_K,  // 176 bytes: as Q4_K plus 32 bytes of fifth bits
  kQ6_K,  // 210 bytes: 128 bytes low nibbles, 64 bytes high 2 bits, 16 x int8 scales, f16 d
  kQ8_K,  // 292 bytes: f32 d, 256 x int8 q, 16 x int16 block sums (unused here); x = d * q
};

std::string_view dtype_name(DType t);

// Elements per storage block (1 for plain types, 32 for Q8_0/Q4_0/Q4_1, 256 for the k-quants).
int64_t dtype_block_elems(DType t);
// Bytes per storage block.
int64_t dtype_block_bytes(DType t);
// Bytes taken by n elements; n must be a multiple of the block size (checked by callers).
inline int64_t dtype_bytes(DType t, int64_t n) { return n / dtype_block_elems(t) * dtype_block_bytes(t); }

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Convert n elements of type t (plain or block-quantised) at src to f32 at dst.
void convert_to_f32(DType t, const void* src, int64_t n, float* dst);

}  // namespace lychee
