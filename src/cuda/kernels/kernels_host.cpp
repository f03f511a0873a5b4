// The checked entry points of kernels.cu (kernels.h) that take arguments worth checking: host
// code, because their errors are formatted by fmt (core/error.h), which nvcc does not compile.
#include <cstdint>

#include "core/error.h"
#include "cuda/kernels/kernels.h"

namespace lychee::cuda {

void dequantize_e4m3(const uint8_t* codes, const float* scales, bf16* out, int rows, int cols, cudaStream_t s) {
  LY_CHECK(rows >= 1 && cols >= 1, ErrorCode::kInvalidArgument,
           "dequantize_e4m3: rows = {}, cols = {}; expected both >= 1", rows, cols);
  LY_CHECK(cols % 16 == 0, ErrorCode::kUnsupported,
           "dequantize_e4m3: cols = {} is not a multiple of 16 (the kernel reads 16 codes at a time)", cols);
  LY_CHECK(codes != nullptr && scales != nullptr && out != nullptr, ErrorCode::kInvalidArgument,
           "dequantize_e4m3: null pointer (codes {}, scales {}, out {})", static_cast<const void*>(codes),
           static_cast<const void*>(scales), static_cast<const void*>(out));
  LY_CHECK(reinterpret_cast<uintptr_t>(codes) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
           ErrorCode::kInvalidArgument, "dequantize_e4m3: codes ({}) and out ({}) must be 16-byte aligned",
           static_cast<const void*>(codes), static_cast<const void*>(out));
  detail::launch_dequantize_e4m3(codes, scales, out, rows, cols, s);
}

void quantize_activations_e4m3(const bf16* x, uint8_t* codes, float* scales, int rows, int cols, cudaStream_t s) {
  LY_CHECK(rows >= 1 && cols >= 1, ErrorCode::kInvalidArgument,
           "quantize_activations_e4m3: rows = {}, cols = {}; expected both >= 1", rows, cols);
  LY_CHECK(cols % 16 == 0, ErrorCode::kUnsupported,
           "quantize_activations_e4m3: cols = {} is not a multiple of 16 (FP8 GEMM operands)", cols);
  LY_CHECK(x != nullptr && codes != nullptr && scales != nullptr, ErrorCode::kInvalidArgument,
           "quantize_activations_e4m3: null pointer (x {}, codes {}, scales {})", static_cast<const void*>(x),
           static_cast<const void*>(codes), static_cast<const void*>(scales));
  LY_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(codes) % 16 == 0,
           ErrorCode::kInvalidArgument, "quantize_activations_e4m3: x ({}) and codes ({}) must be 16-byte aligned",
           static_cast<const void*>(x), static_cast<const void*>(codes));
  detail::launch_quantize_activations_e4m3(x, codes, scales, rows, cols, s);
}

}  // namespace lychee::cuda
