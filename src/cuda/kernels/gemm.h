// Matrix products through cuBLAS: y[n][m] = x[n][k] · w[m][k]ᵀ, bf16 inputs, fp32 accumulation.
// The handle owns a fixed workspace so the products can be captured in CUDA graphs.
#pragma once

#include <cublas_v2.h>

#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"

namespace lychee::cuda {

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y: [n][m] bf16.
  void bf16_out(const bf16* x, const bf16* w, bf16* y, int n, int k, int m);
  // y: [n][m] f32 (the LM head's logits).
  void f32_out(const bf16* x, const bf16* w, float* y, int n, int k, int m);

 private:
  void run(const bf16* x, const bf16* w, void* y, cudaDataType_t y_type, int n, int k, int m);
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer<uint8_t> workspace_;
};

}  // namespace lychee::cuda
