// The FP8 KV cache's rule on the device (core/kv_dtype.h): one f32 scale per token and KV head,
// s = max|x| / 448 over head_dim (1 for an all-zero vector), codes e4m3(x / s) rounded to nearest
// even and saturating. The division is IEEE (__fdiv_rn), as the host's f32 `/`, so the codes and
// scales equal quantize_rows_e4m3's (core/fp8.h) on the same f32 values bit for bit.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "core/fp8.h"

namespace lychee::cuda {

__device__ __forceinline__ float kv_fp8_scale(float amax) {
  return amax > 0.0f ? __fdiv_rn(amax, kE4m3Max) : 1.0f;
}
__device__ __forceinline__ uint8_t kv_fp8_code(float x, float scale) {
  return uint8_t(__nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3));
}
// Exact: every e4m3 value is a bf16 (3 mantissa bits, exponents 2^-9 .. 2^8).
__device__ __forceinline__ float kv_fp8_value(uint8_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(code), __NV_E4M3);
  return __half2float(__half(h));
}

}  // namespace lychee::cuda
