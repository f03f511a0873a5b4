// Activation quantisation, the portable scalar dot products and the run-time choice of kernels.
// The scalar kernels follow the AVX2 ones block for block (integer sums per 32 elements, one f32
// scale product per block) so that the two can be checked against each other tightly.
#include "cpu/quant_dot.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/error.h"

namespace lychee::cpu {

void quantize_row_q8(const float* x, int64_t n, Q8Block* out) {
  LY_ASSERT(n % 32 == 0);
#if defined(__x86_64__)
  if (detected_quant_isa() == QuantIsa::kAvx2) {  // the same blocks bit for bit (tested)
    avx2::quantize_q8(x, n, out);
    return;
  }
#endif
  quantize_row_q8_scalar(x, n, out);
}

void quantize_row_q8_scalar(const float* x, int64_t n, Q8Block* out) {
  LY_ASSERT(n % 32 == 0);
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    Q8Block& o = out[b];
    o.d = d;
    for (int h = 0; h < 2; ++h) {
      int sum = 0;
      for (int i = 16 * h; i < 16 * h + 16; ++i) {
        // |x * id| <= 127 up to rounding; the clamp keeps a rounding to 128 in range.
        const int q = std::clamp(int(std::nearbyint(x[i] * id)), -127, 127);
        o.q[i] = int8_t(q);
        sum += q;
      }
      o.sum[h] = int16_t(sum);
    }
    o.ds = d * float(o.sum[0] + o.sum[1]);
  }
}

namespace {

float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

int sum_of(const Q8Block& a) { return a.sum[0] + a.sum[1]; }

// Σ w[i] q[i] over 32 elements whose weights come from `weight(i)`.
template <typename F>
int dot32(const int8_t* q, F weight) {
  int s = 0;
  for (int i = 0; i < 32; ++i) s += weight(i) * q[i];
  return s;
}

float dot_q8_0(const uint8_t* w, const Q8Block* a, int64_t n) {
  float acc = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b, w += 34) {
    const auto* q = reinterpret_cast<const int8_t*>(w + 2);
    const int s = dot32(a[b].q, [&](int i) { return int(q[i]); });
    acc += load_f16(w) * a[b].d * float(s);
  }
  return acc;
}

// Q4_0 / Q4_1 nibbles: byte j holds element j (low nibble) and element j + 16 (high nibble).
int nibble32(const uint8_t* q, int i) { return i < 16 ? q[i] & 0x0f : q[i - 16] >> 4; }

float dot_q4_0(const uint8_t* w, const Q8Block* a, int64_t n) {
  float acc = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b, w += 18) {
    const int s = dot32(a[b].q, [&](int i) { return nibble32(w + 2, i); }) - 8 * sum_of(a[b]);
    acc += load_f16(w) * a[b].d * float(s);
  }
  return acc;
}

float dot_q4_1(const uint8_t* w, const Q8Block* a, int64_t n) {
  float acc = 0.0f, acc_min = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b, w += 20) {
    const int s = dot32(a[b].q, [&](int i) { return nibble32(w + 4, i); });
    acc += load_f16(w) * a[b].d * float(s);
    acc_min = std::fma(load_f16(w + 2), a[b].ds, acc_min);
  }
  return acc + acc_min;
}

// The 6-bit scales and mins of a Q4_K/Q5_K super-block (layout in core/dtype.cpp).
void unpack_k_scales(const uint8_t* s, int sc[8], int mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

// Q4_K and Q5_K (qh == nullptr for Q4_K): sub-block j of 32 is the activation block 8 * sb + j;
// x = d * sc[j] * q - dmin * mn[j].
float dot_k45(const uint8_t* w, const Q8Block* a, int64_t n, int64_t block_bytes, bool five) {
  float acc = 0.0f;
  for (int64_t sb = 0; sb < n / 256; ++sb, w += block_bytes, a += 8) {
    const float d = load_f16(w), dmin = load_f16(w + 2);
    int sc[8], mn[8];
    unpack_k_scales(w + 4, sc, mn);
    const uint8_t* qh = five ? w + 16 : nullptr;
    const uint8_t* qs = w + (five ? 48 : 16);
    for (int j = 0; j < 8; ++j) {
      const uint8_t* q = qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      const int s = dot32(a[j].q, [&](int i) {
        return ((q[i] >> shift) & 0x0f) | (qh != nullptr ? ((qh[i] >> j) & 1) << 4 : 0);
      });
      acc += a[j].d * (d * float(sc[j] * s) - dmin * float(mn[j] * sum_of(a[j])));
    }
  }
  return acc;
}

float dot_q4_k(const uint8_t* w, const Q8Block* a, int64_t n) { return dot_k45(w, a, n, 144, false); }
float dot_q5_k(const uint8_t* w, const Q8Block* a, int64_t n) { return dot_k45(w, a, n, 176, true); }

// Q6_K: group g (0..3) of half h holds elements 128h + 32g + l: low 4 bits from
// ql[64h + 32(g % 2) + l] (nibble g / 2), top 2 bits from bits 2g of qh[32h + l]; q - 32 with an
// int8 scale per 16 elements.
float dot_q6_k(const uint8_t* w, const Q8Block* a, int64_t n) {
  float acc = 0.0f;
  for (int64_t sb = 0; sb < n / 256; ++sb, w += 210, a += 8) {
    const auto* scales = reinterpret_cast<const int8_t*>(w + 192);
    const float d = load_f16(w + 208);
    for (int h = 0; h < 2; ++h)
      for (int g = 0; g < 4; ++g) {
        const uint8_t* ql = w + 64 * h + 32 * (g % 2);
        const uint8_t* qh = w + 128 + 32 * h;
        const Q8Block& ab = a[4 * h + g];
        const int sc0 = scales[8 * h + 2 * g], sc1 = scales[8 * h + 2 * g + 1];
        int s[2] = {0, 0};
        for (int l = 0; l < 32; ++l)
          s[l / 16] += (((ql[l] >> (4 * (g / 2))) & 0x0f) | (((qh[l] >> (2 * g)) & 3) << 4)) * ab.q[l];
        const int total = sc0 * (s[0] - 32 * ab.sum[0]) + sc1 * (s[1] - 32 * ab.sum[1]);
        acc += d * ab.d * float(total);
      }
  }
  return acc;
}

float dot_q8_k(const uint8_t* w, const Q8Block* a, int64_t n) {
  float acc = 0.0f;
  for (int64_t sb = 0; sb < n / 256; ++sb, w += 292, a += 8) {
    float d;
    std::memcpy(&d, w, 4);
    const auto* q = reinterpret_cast<const int8_t*>(w + 4);
    for (int j = 0; j < 8; ++j) {
      const int s = dot32(a[j].q, [&](int i) { return int(q[32 * j + i]); });
      acc += d * a[j].d * float(s);
    }
  }
  return acc;
}

}  // namespace

QuantIsa detected_quant_isa() {
  static const QuantIsa isa = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
      return QuantIsa::kAvx2;
#endif
    return QuantIsa::kScalar;
  }();
  return isa;
}

bool quant_vnni() {
  static const bool vnni = [] {
#if defined(__x86_64__)
    const char* env = std::getenv("LYCHEE_QUANT_VNNI");
    return detected_quant_isa() == QuantIsa::kAvx2 && __builtin_cpu_supports("avxvnni") &&
           !(env != nullptr && std::string_view(env) == "0");
#else
    return false;
#endif
  }();
  return vnni;
}

const char* quant_isa_name(QuantIsa isa) {
  return isa != QuantIsa::kAvx2 ? "scalar" : quant_vnni() ? "avx2 + avx-vnni" : "avx2";
}

namespace {

// The kernels of one instruction set, by block type.
struct KernelSet {
  QuantDotFn q8_0, q4_0, q4_1, q4_k, q5_k, q6_k, q8_k;
  QuantDot4Fn q4_1_rows4;  // nullptr: callers loop the one-row kernel
};

const KernelSet& kernels(QuantIsa isa) {
  static const KernelSet scalar{dot_q8_0, dot_q4_0, dot_q4_1, dot_q4_k, dot_q5_k, dot_q6_k, dot_q8_k, nullptr};
#if defined(__x86_64__)
  static const KernelSet avx2{avx2::dot_q8_0, avx2::dot_q4_0, avx2::dot_q4_1, avx2::dot_q4_k, avx2::dot_q5_k,
                              avx2::dot_q6_k, avx2::dot_q8_k, avx2::dot4_q4_1};
  static const KernelSet vnni{avx2vnni::dot_q8_0, avx2vnni::dot_q4_0, avx2vnni::dot_q4_1, avx2vnni::dot_q4_k,
                              avx2vnni::dot_q5_k, avx2vnni::dot_q6_k, avx2vnni::dot_q8_k, avx2vnni::dot4_q4_1};
  if (isa == QuantIsa::kAvx2) return quant_vnni() ? vnni : avx2;
#endif
  return scalar;
}

}  // namespace

QuantDot4Fn quant_dot4_fn(DType t, QuantIsa isa) {
  if (isa == QuantIsa::kAvx2 && detected_quant_isa() != QuantIsa::kAvx2) return nullptr;
  return t == DType::kQ4_1 ? kernels(isa).q4_1_rows4 : nullptr;
}

void dequantize_row(DType t, const uint8_t* w, int64_t n, float* out, QuantIsa isa) {
#if defined(__x86_64__)
  if (isa == QuantIsa::kAvx2 && detected_quant_isa() == QuantIsa::kAvx2) {
    switch (t) {
      case DType::kQ8_0: avx2::dequant_q8_0(w, n, out); return;
      case DType::kQ4_0: avx2::dequant_q4_0(w, n, out); return;
      case DType::kQ4_1: avx2::dequant_q4_1(w, n, out); return;
      default: break;
    }
  }
#endif
  convert_to_f32(t, w, n, out);
}

QuantDotFn quant_dot_fn(DType t, QuantIsa isa) {
  LY_CHECK(isa == QuantIsa::kScalar || detected_quant_isa() == QuantIsa::kAvx2, ErrorCode::kUnsupported,
           "the AVX2 quantised dot products need a CPU with AVX2, FMA and F16C");
  const KernelSet& k = kernels(isa);
  switch (t) {
    case DType::kQ8_0: return k.q8_0;
    case DType::kQ4_0: return k.q4_0;
    case DType::kQ4_1: return k.q4_1;
    case DType::kQ4_K: return k.q4_k;
    case DType::kQ5_K: return k.q5_k;
    case DType::kQ6_K: return k.q6_k;
    case DType::kQ8_K: return k.q8_k;
    default: break;
  }
  fail(ErrorCode::kUnsupported, "no quantised dot product for {} weights", dtype_name(t));
}

}  // namespace lychee::cpu
