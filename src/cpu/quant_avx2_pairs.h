// The byte-pair sums the AVX2 integer products share (quant_dot_avx2.cpp, quant_pack_avx2.cpp).
// Included inside those files' ISA namespace, after <immintrin.h>: each file is compiled once for
// AVX2 and again for AVX-VNNI (LY_QUANT_VNNI), and this function must take each build's instruction.
#pragma once

// Eight int32 lanes of pair sums of u (unsigned bytes) and q (int8): lane i = Σ of bytes
// 4i .. 4i + 3. AVX2: maddubs then madd with ones; AVX-VNNI: one vpdpbusd. The same integers: no
// pair of products reaches int16's limit (2 x 128 x 127 = 32512), so maddubs never saturates here.
inline __m256i dot_u8_ones(__m256i u, __m256i q) {
#if defined(LY_QUANT_VNNI)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, q);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1));
#endif
}
