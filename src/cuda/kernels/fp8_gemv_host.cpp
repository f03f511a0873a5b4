// The checked entry points of the FP8 matrix-vector kernel (fp8_gemv.h): host code, because
// their errors are formatted by fmt (core/error.h), which nvcc does not compile.
#include <cstdint>

#include "core/error.h"
#include "cuda/kernels/fp8_gemv.h"

namespace lychee::cuda {

void check_fp8_gemv_args(const void* x, const uint8_t* w, const float* w_scale, const void* y, int n, int k, int m) {
  LY_CHECK(n >= 1, ErrorCode::kInvalidArgument, "fp8_gemv: n = {} rows of x; expected at least 1", n);
  LY_CHECK(n <= kFp8GemvMaxRows, ErrorCode::kUnsupported,
           "fp8_gemv: n = {} rows of x; the kernel takes 1 to {} (decode batches)", n, kFp8GemvMaxRows);
  LY_CHECK(k >= 1 && m >= 1, ErrorCode::kInvalidArgument, "fp8_gemv: k = {}, m = {}; expected both >= 1", k, m);
  LY_CHECK(k % 16 == 0, ErrorCode::kUnsupported,
           "fp8_gemv: k = {} is not a multiple of 16 (the weight rows must be 16-byte aligned)", k);
  LY_CHECK(x != nullptr && w != nullptr && w_scale != nullptr && y != nullptr, ErrorCode::kInvalidArgument,
           "fp8_gemv: null pointer (x {}, w {}, w_scale {}, y {})", x, static_cast<const void*>(w),
           static_cast<const void*>(w_scale), y);
  LY_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0,
           ErrorCode::kInvalidArgument, "fp8_gemv: x ({}) and w ({}) must be 16-byte aligned", x,
           static_cast<const void*>(w));
}

namespace {
void check_variant(Fp8GemvVariant v) {
  LY_CHECK(v.tiles == 0 || v.tiles == 1 || v.tiles == 2 || v.tiles == 4, ErrorCode::kInvalidArgument,
           "fp8_gemv: tiles = {} (0 for the automatic choice, or 1, 2, 4)", v.tiles);
  LY_CHECK(v.stages == -1 || v.stages == 0 || (v.stages >= 2 && v.stages <= 4), ErrorCode::kInvalidArgument,
           "fp8_gemv: stages = {} (-1 for the automatic choice, 0, or 2 to 4)", v.stages);
}
}  // namespace

void fp8_gemv(const bf16* x, const uint8_t* w, const float* w_scale, bf16* y, int n, int k, int m,
              cudaStream_t stream, Fp8GemvVariant variant) {
  check_fp8_gemv_args(x, w, w_scale, y, n, k, m);
  check_variant(variant);
  detail::launch_fp8_gemv(x, w, w_scale, y, n, k, m, stream, variant);
}

void fp8_gemv_f32_out(const bf16* x, const uint8_t* w, const float* w_scale, float* y, int n, int k, int m,
                      cudaStream_t stream, Fp8GemvVariant variant) {
  check_fp8_gemv_args(x, w, w_scale, y, n, k, m);
  check_variant(variant);
  detail::launch_fp8_gemv_f32_out(x, w, w_scale, y, n, k, m, stream, variant);
}

}  // namespace lychee::cuda
