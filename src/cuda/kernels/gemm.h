// Matrix products through cuBLASLt: y[n][m] = x[n][k] · w[m][k]ᵀ, bf16 inputs, fp32 accumulation.
// The handle owns a fixed workspace so the products can be captured in CUDA graphs.
//
// Algorithm choice: cuBLASLt's heuristic, except for decode-sized products (n <= kTuneMaxRows),
// which are memory-bound GEMVs where the heuristic's first pick can read the weights at half the
// bandwidth (Llama-3-8B's output projection: 52%): the first such product of a shape, run outside
// graph capture, times the heuristic's candidates with a cold L2 and keeps the fastest. The choice
// is shared by every Gemm of the process, so two runners compute the same sums in the same order.
// LYCHEE_GEMM_TUNE=0 turns the timing off (the heuristic's first pick everywhere).
#pragma once

#include <cublasLt.h>

#include <map>
#include <tuple>
#include <vector>

#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"

namespace lychee::cuda {

class Gemm {
 public:
  static constexpr int kTuneMaxRows = 64;

  explicit Gemm(cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y: [n][m] bf16.
  void bf16_out(const bf16* x, const bf16* w, bf16* y, int n, int k, int m);
  // y: [n][m] f32 (the LM head's logits).
  void f32_out(const bf16* x, const bf16* w, float* y, int n, int k, int m);
  // FP8 e4m3 operands, each row with its f32 scale (cuBLASLt's outer-vector scaling):
  // y[i][j] = bf16(x_scales[i] · w_scales[j] · Σ_t e4m3(x[i][t]) · e4m3(w[j][t])), f32 accumulation;
  // x [n][k] and w [m][k] codes, y [n][m] bf16, k a multiple of 16, pointers 16-byte aligned.
  // Returns false, having enqueued nothing, where this cuBLASLt / GPU offers no such product for the
  // shape (probed once per shape: outer-vector FP8 scaling needs a recent cuBLASLt on Hopper or
  // later); the caller then takes another path.
  bool fp8_bf16_out(const uint8_t* x, const float* x_scales, const uint8_t* w, const float* w_scales, bf16* y,
                    int n, int k, int m);

 private:
  struct Plan;  // descriptors and the chosen algorithm of one shape
  using Key = std::tuple<int, int, int, int>;  // n, k, m, output type
  void run(const bf16* x, const bf16* w, void* y, cudaDataType_t y_type, int n, int k, int m);
  Plan& plan(const bf16* x, const bf16* w, void* y, cudaDataType_t y_type, int n, int k, int m);
  cublasStatus_t heuristic(const Plan& p, std::vector<cublasLtMatmulHeuristicResult_t>& found, int& n_found);
  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<uint8_t> workspace_;
  std::map<Key, Plan*> plans_;
  std::map<std::tuple<int, int, int>, Plan*> fp8_plans_;  // nullptr: no FP8 algorithm for the shape
};

}  // namespace lychee::cuda
