// AVX2 products of eight interleaved weight rows (cpu/quant_pack.h's layout) with one Q8Block
// activation row. Compiled with -mavx2 -mfma -mf16c and called only after detected_quant_isa()
// found them; like quant_dot_avx2.cpp it includes only <immintrin.h> and cpu/q8_block.h.
// quant_pack_vnni.cpp compiles it again (namespace avx2vnni) with the pair sums as vpdpbusd.
//
// Why eight rows: the one-row kernels (quant_dot_avx2.cpp) spend per 32-element block about as
// many instructions on the block's scales (two f16 conversions, a broadcast, a multiply) and on
// splitting the nibbles as on the products. Here one activation block is loaded once for eight
// rows, the eight rows' scales are converted by one vcvtph2ps, two rows' nibbles share a 32-byte
// load and one shift, and the eight rows' integer block sums are folded into one vector by three
// (Q4_1) or six (Q8_0) hadds, after which the f32 part is one vector operation for all eight.
//
// Each row's result is the scalar kernel's (quant_dot.cpp) bit for bit: the same exact integer
// sum per block, then acc += (d_w * d_a) * float(sum) in block order (a multiply, a multiply, an
// add: unfused, as the scalar code; this file is compiled with -ffp-contract=off, else GCC fuses
// _mm256_mul_ps + _mm256_add_ps into an FMA, measured 1-4 ulps off the scalar kernel) and, for Q4_1, the mins as
// fma(m_w, a.ds, acc_min) and acc + acc_min at the end.
//
// Cost per block and eight rows (AVX2): Q4_1 4 loads, 12 nibble ops, 8 maddubs, 4 adds, 4 madds,
// 3 hadds, ~8 for the f32 part: 6.5 instructions a row-block measured (callgrind, the loop
// included), against 20.3 in dot_q4_1; Q8_0 6.7 against 16.9 (docs/results/cpu_default.md). Bytes a
// row-block: 20 (Q4_1), 34 (Q8_0), the same as the file's; the layout only reorders them.
#if defined(__x86_64__)

#include <immintrin.h>

#include "cpu/q8_block.h"

#ifndef LY_QUANT_NS
#define LY_QUANT_NS avx2
#endif

namespace lychee::cpu::LY_QUANT_NS {
namespace {

#include "cpu/quant_avx2_pairs.h"

// Q4_1 codes of two rows (32 bytes: row r's 16 nibble bytes, then row r + 1's) against one
// activation block: lanes 0..3 partial sums of row r, lanes 4..7 of row r + 1. lo_q / hi_q: the
// activation's elements 0..15 / 16..31 in both 128-bit halves.
inline __m256i q4_pair(const uint8_t* p, __m256i lo_q, __m256i hi_q) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
#if defined(LY_QUANT_VNNI)
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, lo_q), hi, hi_q);
#else
  // Two maddubs of 4-bit codes: each int16 lane at most 4 x 15 x 127 = 7620 after the add.
  const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, lo_q), _mm256_maddubs_epi16(hi, hi_q));
  return _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
#endif
}

inline __m256i broadcast16(const int8_t* p) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// acc += (d_w * d_a) * float(sums), per lane, unfused (the scalar kernels' rounding).
inline __m256 add_block(__m256 acc, const uint8_t* d_w_f16, float d_a, __m256i sums) {
  const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d_w_f16)));
  const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(d_a));
  return _mm256_add_ps(acc, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(sums)));
}

}  // namespace

// w: one group, n / 32 blocks of 160 bytes: [8] f16 d, [8] f16 m (lane order 0 2 4 6 1 3 5 7),
// [4][2 rows][16] nibble bytes (rows 0 1, 2 3, 4 5, 6 7). out: [8] f32 in row order.
void dot8_q4_1(const uint8_t* w, const Q8Block* a, int64_t n, float* out) {
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b, w += 160) {
    const __m256i lo_q = broadcast16(a[b].q), hi_q = broadcast16(a[b].q + 16);
    const __m256i s01 = q4_pair(w + 32, lo_q, hi_q), s23 = q4_pair(w + 64, lo_q, hi_q);
    const __m256i s45 = q4_pair(w + 96, lo_q, hi_q), s67 = q4_pair(w + 128, lo_q, hi_q);
    // Per 128-bit half: [r0 r0 r2 r2 | r1 r1 r3 r3], then [r0 r2 r4 r6 | r1 r3 r5 r7].
    const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(s01, s23), _mm256_hadd_epi32(s45, s67));
    acc = add_block(acc, w, a[b].d, sums);
    const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16)));
    acc_min = _mm256_fmadd_ps(m, _mm256_set1_ps(a[b].ds), acc_min);
  }
  const __m256 lanes = _mm256_add_ps(acc, acc_min);
  _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(lanes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// w: one group, n / 32 blocks of 272 bytes: [8] f16 d (row order), [8 rows][32] int8 codes.
void dot8_q8_0(const uint8_t* w, const Q8Block* a, int64_t n, float* out) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b, w += 272) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].q));
    __m256i s[8];
    for (int r = 0; r < 8; ++r) {  // signed x signed: |w| as unsigned against q carrying w's sign
      const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * r));
      s[r] = dot_u8_ones(_mm256_abs_epi8(wq), _mm256_sign_epi8(q, wq));
    }
    // Per half: [r0 r1 r2 r3] of elements 0..15 | of 16..31 (and rows 4..7), then the halves added.
    const __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    const __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
    acc = add_block(acc, w, a[b].d, sums);
  }
  _mm256_storeu_ps(out, acc);
}

}  // namespace lychee::cpu::LY_QUANT_NS

#endif  // __x86_64__
