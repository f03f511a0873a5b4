// attend_head (decode_attention.h) with AVX2 + FMA, for head dims that are a multiple of 8.
// Compiled with -mavx2 -mfma and called only when the CPU has them (decode_attention.cpp checks);
// it includes only <immintrin.h> and <cstdint>, so that no inline function of another header is
// emitted here with AVX2 code (q8_block.h says why), and takes its score buffer from the caller.
//
// Against the portable loops (SSE2, no FMA, the output row loaded and stored once per key): the
// scores as 8-wide FMAs, and the weighted sum of V with 32 output columns held in 4 registers
// over all keys, so each V element is loaded once and the output stored once. A step at 512
// tokens spends ~18% of its time here with the portable loops (docs/results/cpu_default.md).
#if defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>

namespace lychee::cpu::avx2 {

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Σ_d q[d] k[d] over hd (a multiple of 8) elements: two accumulators, summed at the end.
inline float dot(const float* q, const float* k, int hd) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int d = 0;
  for (; d + 16 <= hd; d += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), a1);
  }
  if (d < hd) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
  return hsum(_mm256_add_ps(a0, a1));
}

}  // namespace

// p: [n] scratch. The same steps as the portable attend_head: scores * scale, their max, exp of
// the differences and their sum, then out = Σ_j (p_j / sum) v_j.
void attend_head(const float* qh, const float* kh, const float* vh, int hd, const int32_t* tokens, int n,
                 float scale, float* out, float* p) {
  float mx = -__builtin_inff();
  for (int j = 0; j < n; ++j) {
    p[j] = dot(qh, kh + int64_t(tokens != nullptr ? tokens[j] : j) * hd, hd) * scale;
    mx = p[j] > mx ? p[j] : mx;
  }
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    p[j] = __builtin_expf(p[j] - mx);
    sum += p[j];
  }
  const float inv = 1.0f / sum;
  for (int j = 0; j < n; ++j) p[j] *= inv;
  for (int d0 = 0; d0 < hd; d0 += 32) {
    const int w = hd - d0 < 32 ? (hd - d0) / 8 : 4;  // 8-column registers in this pass
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int j = 0; j < n; ++j) {
      const float* vj = vh + int64_t(tokens != nullptr ? tokens[j] : j) * hd + d0;
      const __m256 pj = _mm256_set1_ps(p[j]);
      for (int c = 0; c < w; ++c) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * c), acc[c]);
    }
    for (int c = 0; c < w; ++c) _mm256_storeu_ps(out + d0 + 8 * c, acc[c]);
  }
}

}  // namespace lychee::cpu::avx2

#endif  // __x86_64__
