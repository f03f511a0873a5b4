// The quantised activation block of the CPU's native-weight products (cpu/quant_dot.h), and the
// AVX2 kernels' entry points. This header includes nothing but <cstdint> on purpose: the AVX2
// file that includes it is compiled with -mavx2 -mfma -mf16c, and an inline function it pulled
// in from elsewhere could be emitted there with AVX2 code and chosen by the linker for callers
// on a CPU without AVX2.
#pragma once

#include <cstdint>

namespace lychee::cpu {

// 32 activations: x[i] ≈ d * q[i], d = max|x| / 127 (0 for an all-zero block), q rounded to
// nearest. sum[h] = Σ q[16h .. 16h + 15]: the weight types with an offset (Q4_0, Q6_K) or a min
// (Q4_1, Q4_K, Q5_K) take it from there; ds = d * (sum[0] + sum[1]) once per block for Q4_1's min
// term (one multiply-add per weight block instead of two products and a conversion).
struct Q8Block {
  float d;
  int16_t sum[2];
  int8_t q[32];
  float ds;
};
static_assert(sizeof(Q8Block) == 44);

// Defined in quant_dot_avx2.cpp and quant_pack_avx2.cpp (dot8_*) (namespace avx2; call only when
// detected_quant_isa() == kAvx2) and again in quant_dot_vnni.cpp and quant_pack_vnni.cpp
// (namespace avx2vnni; only when quant_vnni() is true too).
#define LY_QUANT_KERNELS(ns)                                                                       \
  namespace ns {                                                                                   \
  float dot_q8_0(const uint8_t* w, const Q8Block* a, int64_t n);                                   \
  float dot_q4_0(const uint8_t* w, const Q8Block* a, int64_t n);                                   \
  float dot_q4_1(const uint8_t* w, const Q8Block* a, int64_t n);                                   \
  float dot_q4_k(const uint8_t* w, const Q8Block* a, int64_t n);                                   \
  float dot_q5_k(const uint8_t* w, const Q8Block* a, int64_t n);                                   \
  float dot_q6_k(const uint8_t* w, const Q8Block* a, int64_t n);                                   \
  float dot_q8_k(const uint8_t* w, const Q8Block* a, int64_t n);                                   \
  void dot4_q4_1(const uint8_t* w, const Q8Block* a, int64_t a_stride, int64_t n, float* out);     \
  void dot8_q4_1(const uint8_t* w, const Q8Block* a, int64_t n, float* out);                       \
  void dot8_q8_0(const uint8_t* w, const Q8Block* a, int64_t n, float* out);                       \
  void dequant_q8_0(const uint8_t* w, int64_t n, float* out);                                      \
  void quantize_q8(const float* x, int64_t n, Q8Block* out);                                       \
  void dequant_q4_0(const uint8_t* w, int64_t n, float* out);                                      \
  void dequant_q4_1(const uint8_t* w, int64_t n, float* out);                                      \
  }
LY_QUANT_KERNELS(avx2)
LY_QUANT_KERNELS(avx2vnni)
#undef LY_QUANT_KERNELS

}  // namespace lychee::cpu
