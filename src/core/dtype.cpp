#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace lychee {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kQ8_0: return "Q8_0";
    case DType::kQ4_0: return "Q4_0";
    case DType::kQ4_1: return "Q4_1";
  }
  return "?";
}

int64_t dtype_block_elems(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1: return 32;
    default: return 1;
  }
}

int64_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kI32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kQ8_0: return 2 + 32;
    case DType::kQ4_0: return 2 + 16;
    case DType::kQ4_1: return 2 + 2 + 16;
  }
  return 0;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: value = man * 2^-24
      float f = std::ldexp(float(man), -24);
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;      // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;     // overflow (>= 65520 rounds to inf)
  if (abs < 0x38800000u) {                           // subnormal or zero in f16
    float a;
    std::memcpy(&a, &abs, 4);
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));  // a / 2^-24, ties to even
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);    // round to nearest even at bit 13
  return sign | uint16_t((r - 0x38000000u) >> 13);
}

namespace {

void dequant_q8_0(const uint8_t* src, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 34, dst += 32) {
    uint16_t d16;
    std::memcpy(&d16, src, 2);
    const float d = f16_to_f32(d16);
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int i = 0; i < 32; ++i) dst[i] = d * float(q[i]);
  }
}

// Nibble order (ggml): byte j holds element j in its low nibble and element j+16 in its high one.
void dequant_q4_0(const uint8_t* src, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 18, dst += 32) {
    uint16_t d16;
    std::memcpy(&d16, src, 2);
    const float d = f16_to_f32(d16);
    const uint8_t* q = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * float(int(q[j] & 0x0f) - 8);
      dst[j + 16] = d * float(int(q[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const uint8_t* src, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 20, dst += 32) {
    uint16_t d16, m16;
    std::memcpy(&d16, src, 2);
    std::memcpy(&m16, src + 2, 2);
    const float d = f16_to_f32(d16);
    const float m = f16_to_f32(m16);
    const uint8_t* q = src + 4;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * float(q[j] & 0x0f) + m;
      dst[j + 16] = d * float(q[j] >> 4) + m;
    }
  }
}

}  // namespace

void convert_to_f32(DType t, const void* src, int64_t n, float* dst) {
  const auto* s = static_cast<const uint8_t*>(src);
  LY_ASSERT(n % dtype_block_elems(t) == 0);
  switch (t) {
    case DType::kF32: std::memcpy(dst, s, size_t(n) * 4); return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    case DType::kQ8_0: dequant_q8_0(s, n / 32, dst); return;
    case DType::kQ4_0: dequant_q4_0(s, n / 32, dst); return;
    case DType::kQ4_1: dequant_q4_1(s, n / 32, dst); return;
    case DType::kI32: break;
  }
  fail(ErrorCode::kUnsupported, "cannot convert {} to F32", dtype_name(t));
}

}  // namespace lychee
