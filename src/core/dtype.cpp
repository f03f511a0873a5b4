#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace lychee {

namespace {
constexpr int64_t kQK = 256;  // elements in a k-quant super-block (ggml's QK_K)
}  // namespace

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kQ8_0: return "Q8_0";
    case DType::kQ4_0: return "Q4_0";
    case DType::kQ4_1: return "Q4_1";
    case DType::kQ4_K: return "Q4_K";
    case DType::kQ5_K: return "Q5_K";
    case DType::kQ6_K: return "Q6_K";
    case DType::kQ8_K: return "Q8_K";
  }
  return "?";
}

int64_t dtype_block_elems(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1: return 32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ8_K: return kQK;
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
    case DType::kQ4_K: return 2 + 2 + 12 + kQK / 2;
    case DType::kQ5_K: return 2 + 2 + 12 + kQK / 8 + kQK / 2;
    case DType::kQ6_K: return kQK / 2 + kQK / 4 + kQK / 16 + 2;
    case DType::kQ8_K: return 4 + kQK + kQK / 16 * 2;
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

float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// The 8 six-bit scales and mins of a Q4_K/Q5_K super-block, packed in 12 bytes: bytes 0-3 hold
// scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; bytes 8-11 hold the low 4 bits of scales
// 4-7 (low nibble) and mins 4-7 (high nibble), whose top 2 bits are the top bits of bytes 0-7.
void unpack_k_scales(const uint8_t* s, uint8_t sc[8], uint8_t mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = uint8_t((s[j + 8] & 0x0f) | ((s[j] >> 6) << 4));
    mn[j + 4] = uint8_t((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
  }
}

// Q4_K: 8 sub-blocks of 32; sub-block j reads the low (j even) or high (j odd) nibbles of bytes
// [32 * (j / 2), +32). x = (d * sc) * q - dmin * m, each product rounded to f32 as ggml does (the
// build turns off FMA contraction for this file, so results match the reference bit for bit).
void dequant_q4_k(const uint8_t* src, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 144, dst += kQK) {
    const float d = load_f16(src), dmin = load_f16(src + 2);
    uint8_t sc[8], mn[8];
    unpack_k_scales(src + 4, sc, mn);
    const uint8_t* qs = src + 16;
    for (int j = 0; j < 8; ++j) {
      const float dl = d * float(sc[j]), ml = dmin * float(mn[j]);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = (j % 2) * 4;
      for (int l = 0; l < 32; ++l) dst[32 * j + l] = dl * float((q[l] >> shift) & 0x0f) - ml;
    }
  }
}

// Q5_K: Q4_K's nibbles plus a fifth bit: bit j of qh[l] for element l of sub-block j.
void dequant_q5_k(const uint8_t* src, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 176, dst += kQK) {
    const float d = load_f16(src), dmin = load_f16(src + 2);
    uint8_t sc[8], mn[8];
    unpack_k_scales(src + 4, sc, mn);
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + 48;
    for (int j = 0; j < 8; ++j) {
      const float dl = d * float(sc[j]), ml = dmin * float(mn[j]);
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = (j % 2) * 4;
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> shift) & 0x0f) | (((qh[l] >> j) & 1) << 4);
        dst[32 * j + l] = dl * float(v) - ml;
      }
    }
  }
}

// Q6_K: two halves of 128. In half h, element r takes its low 4 bits from ql[64h + r % 64]
// (low nibble for r < 64, high otherwise) and its top 2 bits from bits 2 * (r / 32) of
// qh[32h + r % 32]; q = bits - 32, and each 16 elements share an int8 scale: x = (d * sc) * q.
void dequant_q6_k(const uint8_t* src, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 210, dst += kQK) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const auto* scales = reinterpret_cast<const int8_t*>(src + 192);
    const float d = load_f16(src + 208);
    for (int e = 0; e < kQK; ++e) {
      const int h = e / 128, r = e % 128;
      const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
      const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
      const float dl = d * float(scales[e / 16]);
      dst[e] = dl * float((lo | (hi << 4)) - 32);
    }
  }
}

// Q8_K: f32 d, 256 x int8, then 16 int16 sums of 16 quants each (for ggml's dot products).
void dequant_q8_k(const uint8_t* src, int64_t n_blocks, float* dst) {
  for (int64_t b = 0; b < n_blocks; ++b, src += 292, dst += kQK) {
    float d;
    std::memcpy(&d, src, 4);
    const auto* q = reinterpret_cast<const int8_t*>(src + 4);
    for (int i = 0; i < kQK; ++i) dst[i] = d * float(q[i]);
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
    case DType::kQ4_K: dequant_q4_k(s, n / kQK, dst); return;
    case DType::kQ5_K: dequant_q5_k(s, n / kQK, dst); return;
    case DType::kQ6_K: dequant_q6_k(s, n / kQK, dst); return;
    case DType::kQ8_K: dequant_q8_k(s, n / kQK, dst); return;
    case DType::kI32: break;
  }
  fail(ErrorCode::kUnsupported, "cannot convert {} to F32", dtype_name(t));
}

}  // namespace lychee
