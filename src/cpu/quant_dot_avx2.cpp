// AVX2 dot products of GGUF block-quantised weight rows with Q8Block activations
// (cpu/quant_dot.h says what they compute; quant_dot.cpp holds the scalar twins they are tested
// against). Compiled with -mavx2 -mfma -mf16c (src/CMakeLists.txt) and called only after
// detected_quant_isa() found those at run time; it includes only <immintrin.h> and
// cpu/q8_block.h so that no inline function of another header is compiled here with AVX2 code.
//
// Each 32-element block: the weights' codes as unsigned bytes against the activations' int8 with
// _mm256_maddubs_epi16 (pairs summed to int16: at most 2 * 63 * 127 = 16002 for 6-bit codes,
// 2 * 128 * 127 for |int8| codes, so no saturation), _mm256_madd_epi16 with the block's integer
// scale (or 1) to int32 lanes, then one f32 FMA with the block's f32 scale product. Offsets and
// mins use the activation block's sums. On 2 cores a decode step is bound by these instructions,
// not by memory (docs/results/cpu_quantized.md), so quant_dot_vnni.cpp compiles this file again
// (namespace avx2vnni) with the scale-1 pair sums as one AVX-VNNI instruction (dot_u8_ones).
#if defined(__x86_64__)

#include <immintrin.h>

#include "cpu/q8_block.h"

#ifndef LY_QUANT_NS
#define LY_QUANT_NS avx2
#endif

namespace lychee::cpu::LY_QUANT_NS {
namespace {

inline float f16(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load_q(const Q8Block& a) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q)); }

// u: 32 unsigned codes (< 128), q: 32 int8 -> 8 int32 lanes of scale16-weighted pair sums.
inline __m256i dot_u8(__m256i u, __m256i q, __m256i scale16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), scale16);
}

#include "cpu/quant_avx2_pairs.h"

// 16 bytes of Q4 nibbles -> 32 codes in element order (low nibbles 0..15, high nibbles 16..31).
inline __m256i unpack_nibbles16(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

inline int sum_of(const Q8Block& a) { return a.sum[0] + a.sum[1]; }

void unpack_k_scales(const uint8_t* s, int sc[8], int mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

}  // namespace

float dot_q8_0(const uint8_t* w, const Q8Block* a, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const int64_t nb = n / 32;
  int64_t b = 0;
  // Signed x signed: |w| as unsigned against q carrying w's sign.
  auto block = [&](int64_t i) {
    const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 34 * i + 2));
    const __m256i p = dot_u8_ones(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(load_q(a[i]), wq));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16(w + 34 * i) * a[i].d));
  };
  for (; b + 1 < nb; b += 2) {
    acc0 = _mm256_add_ps(acc0, block(b));
    acc1 = _mm256_add_ps(acc1, block(b + 1));
  }
  if (b < nb) acc0 = _mm256_add_ps(acc0, block(b));
  return hsum(_mm256_add_ps(acc0, acc1));
}

float dot_q4_0(const uint8_t* w, const Q8Block* a, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float offset = 0.0f;  // Σ d_w d_a 8 Σq: the "- 8" of every code
  const int64_t nb = n / 32;
  auto block = [&](int64_t i, __m256 acc) {
    const float s = f16(w + 18 * i) * a[i].d;
    offset += s * float(8 * sum_of(a[i]));
    const __m256i p = dot_u8_ones(unpack_nibbles16(w + 18 * i + 2), load_q(a[i]));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s), acc);
  };
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    acc0 = block(b, acc0);
    acc1 = block(b + 1, acc1);
  }
  if (b < nb) acc0 = block(b, acc0);
  return hsum(_mm256_add_ps(acc0, acc1)) - offset;
}

float dot_q4_1(const uint8_t* w, const Q8Block* a, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float acc_min = 0.0f;
  const int64_t nb = n / 32;
  auto block = [&](int64_t i, __m256 acc) {
    const uint8_t* wb = w + 20 * i;
    acc_min = __builtin_fmaf(f16(wb + 2), a[i].ds, acc_min);
    const __m256i p = dot_u8_ones(unpack_nibbles16(wb + 4), load_q(a[i]));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16(wb) * a[i].d), acc);
  };
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    acc0 = block(b, acc0);
    acc1 = block(b + 1, acc1);
  }
  if (b < nb) acc0 = block(b, acc0);
  return hsum(_mm256_add_ps(acc0, acc1)) + acc_min;
}

// dot_q4_1 for four activation rows: per row the same accumulators, operations and order as
// dot_q4_1 (two vector accumulators over alternate blocks, the mins summed in block order), the
// nibbles and the weight scales unpacked once per block for the four.
void dot4_q4_1(const uint8_t* w, const Q8Block* a, int64_t a_stride, int64_t n, float* out) {
  __m256 acc0[4], acc1[4];
  float acc_min[4];
  for (int r = 0; r < 4; ++r) {
    acc0[r] = _mm256_setzero_ps();
    acc1[r] = _mm256_setzero_ps();
    acc_min[r] = 0.0f;
  }
  const int64_t nb = n / 32;
  auto block = [&](int64_t i, __m256* acc) {
    const uint8_t* wb = w + 20 * i;
    const float wd = f16(wb), wm = f16(wb + 2);
    const __m256i u = unpack_nibbles16(wb + 4);
    for (int r = 0; r < 4; ++r) {
      const Q8Block& ab = a[r * a_stride + i];
      acc_min[r] = __builtin_fmaf(wm, ab.ds, acc_min[r]);
      const __m256i p = dot_u8_ones(u, load_q(ab));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(wd * ab.d), acc[r]);
    }
  };
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) {
    block(b, acc0);
    block(b + 1, acc1);
  }
  if (b < nb) block(b, acc0);
  for (int r = 0; r < 4; ++r) out[r] = hsum(_mm256_add_ps(acc0[r], acc1[r])) + acc_min[r];
}

namespace {

// Q4_K (five = false) and Q5_K: per 256-element super-block 8 sub-blocks of 32, sub-block j
// against activation block j; x = d sc[j] q - dmin mn[j], q's fifth bit (Q5_K) bit j of qh[l].
template <bool five>
float dot_k45(const uint8_t* w, const Q8Block* a, int64_t n) {
  constexpr int64_t kBlockBytes = five ? 176 : 144;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps();
  float acc_min = 0.0f;
  for (int64_t sb = 0; sb < n / 256; ++sb, w += kBlockBytes, a += 8) {
    const float d = f16(w), dmin = f16(w + 2);
    int sc[8], mn[8];
    unpack_k_scales(w + 4, sc, mn);
    const uint8_t* qs = w + (five ? 48 : 16);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (five) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
    for (int p = 0; p < 4; ++p) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * p));
      __m256i lo = _mm256_and_si256(raw, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      if constexpr (five) {
        const __m256i b0 = _mm256_set1_epi8(char(1 << (2 * p))), b1 = _mm256_set1_epi8(char(1 << (2 * p + 1)));
        const __m256i sixteen = _mm256_set1_epi8(16);
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), sixteen));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen));
      }
      const int j = 2 * p;
      const __m256i p0 = dot_u8(lo, load_q(a[j]), _mm256_set1_epi16(int16_t(sc[j])));
      const __m256i p1 = dot_u8(hi, load_q(a[j + 1]), _mm256_set1_epi16(int16_t(sc[j + 1])));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(d * a[j].d), acc);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(d * a[j + 1].d), acc);
      acc_min += dmin * (a[j].d * float(mn[j] * sum_of(a[j])) + a[j + 1].d * float(mn[j + 1] * sum_of(a[j + 1])));
    }
  }
  return hsum(acc) - acc_min;
}

}  // namespace

float dot_q4_k(const uint8_t* w, const Q8Block* a, int64_t n) { return dot_k45<false>(w, a, n); }
float dot_q5_k(const uint8_t* w, const Q8Block* a, int64_t n) { return dot_k45<true>(w, a, n); }

// Q6_K: group g of half h (elements 128h + 32g + l) takes its low 4 bits from
// ql[64h + 32(g % 2) + l] (nibble g / 2) and its top 2 from bits 2g of qh[32h + l]; one int8
// scale per 16 elements (the two halves of a 32-lane vector), code - 32.
float dot_q6_k(const uint8_t* w, const Q8Block* a, int64_t n) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  float offset = 0.0f;
  for (int64_t sb = 0; sb < n / 256; ++sb, w += 210, a += 8) {
    const auto* scales = reinterpret_cast<const int8_t*>(w + 192);
    const float d = f16(w + 208);
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 32 * h));
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * h + 32));
      for (int g = 0; g < 4; ++g) {
        const __m256i ql = g % 2 == 0 ? ql0 : ql1;
        const __m256i lo = g < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
        const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), m2);
        const __m256i code = _mm256_or_si256(lo, _mm256_slli_epi16(top, 4));
        const Q8Block& ab = a[4 * h + g];
        const int sc0 = scales[8 * h + 2 * g], sc1 = scales[8 * h + 2 * g + 1];
        const __m256i scale16 = _mm256_set_m128i(_mm_set1_epi16(int16_t(sc1)), _mm_set1_epi16(int16_t(sc0)));
        const float s = d * ab.d;
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8(code, load_q(ab), scale16)), _mm256_set1_ps(s), acc);
        offset += s * float(32 * (sc0 * ab.sum[0] + sc1 * ab.sum[1]));
      }
    }
  }
  return hsum(acc) - offset;
}

float dot_q8_k(const uint8_t* w, const Q8Block* a, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < n / 256; ++sb, w += 292, a += 8) {
    float d;
    __builtin_memcpy(&d, w, 4);
    for (int j = 0; j < 8; ++j) {
      const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 4 + 32 * j));
      const __m256i p = dot_u8_ones(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(load_q(a[j]), wq));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a[j].d), acc);
    }
  }
  return hsum(acc);
}

// quantize_row_q8 (quant_dot.cpp) 32 elements at a time, bit for bit: the same max, d = amax / 127
// and 1 / d as scalars, x * (1 / d) rounded to nearest even by vcvtps2dq (as nearbyint in the
// default rounding mode), clamped to +-127, and the two halves' exact sums. A decode step
// quantises ~120 rows serially between the products' parallel regions.
void quantize_q8(const float* x, int64_t n, Q8Block* out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + 8 * i);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                                   _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float d = _mm_cvtss_f32(m4) / 127.0f;
    const __m256 id = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    __m256i r[4];
    for (int i = 0; i < 4; ++i)
      r[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)), lo), hi);
    // packs interleave 4-element groups across the 128-bit halves; the permute puts them back in order
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    Q8Block& o = out[b];
    o.d = d;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.q),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    for (int h = 0; h < 2; ++h) {
      const __m256i s8 = _mm256_add_epi32(r[2 * h], r[2 * h + 1]);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      o.sum[h] = int16_t(_mm_cvtsi128_si32(s4));
    }
    o.ds = d * float(o.sum[0] + o.sum[1]);
  }
}

// Dequantisation (the dequantised sgemm's tiles, weight_linear.cpp): each element d * q (+ m) as
// one multiply and one add, unfused, so every value equals core/dtype.cpp's convert_to_f32 (compiled
// with -ffp-contract=off) bit for bit.
namespace {

// Bytes 0..7 of v as 8 floats (unsigned).
inline __m256 u8x8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

}  // namespace

void dequant_q8_0(const uint8_t* w, int64_t n, float* out) {
  for (int64_t b = 0; b < n / 32; ++b, w += 34, out += 32) {
    const __m256 d = _mm256_set1_ps(f16(w));
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; ++i)
      _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[i]))));
  }
}

void dequant_q4_0(const uint8_t* w, int64_t n, float* out) {
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const __m256i eight = _mm256_set1_epi32(8);
  for (int64_t b = 0; b < n / 32; ++b, w += 18, out += 32) {
    const __m256 d = _mm256_set1_ps(f16(w));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    const __m128i lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; ++i) {
      const __m256i c = _mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[i]), eight);
      _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(c)));
    }
  }
}

void dequant_q4_1(const uint8_t* w, int64_t n, float* out) {
  const __m128i low4 = _mm_set1_epi8(0x0f);
  for (int64_t b = 0; b < n / 32; ++b, w += 20, out += 32) {
    const __m256 d = _mm256_set1_ps(f16(w)), m = _mm256_set1_ps(f16(w + 2));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 4));
    const __m128i lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_add_ps(_mm256_mul_ps(d, u8x8_to_ps(parts[i])), m));
  }
}

}  // namespace lychee::cpu::LY_QUANT_NS

#endif  // __x86_64__
