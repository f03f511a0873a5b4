#include "cuda/kernels/gemm.h"

namespace lychee::cuda {

namespace {
void check(cublasStatus_t st, const char* what, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) fail_cuda_msg(what, int(st), __FILE__, line);
}
constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLAS's recommendation for Hopper
}  // namespace

Gemm::Gemm(cudaStream_t stream) : workspace_(kWorkspaceBytes) {
  check(cublasCreate(&handle_), "cublasCreate", __LINE__);
  check(cublasSetStream(handle_, stream), "cublasSetStream", __LINE__);
  check(cublasSetWorkspace(handle_, workspace_.data(), workspace_.bytes()), "cublasSetWorkspace", __LINE__);
  check(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode", __LINE__);
}

Gemm::~Gemm() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

// Row-major y[n][m] = x[n][k] · w[m][k]ᵀ is column-major yᵀ[m][n] = w · xᵀ: cuBLAS sees w as a
// column-major k x m matrix (transposed) and x as a column-major k x n matrix.
void Gemm::run(const bf16* x, const bf16* w, void* y, cudaDataType_t y_type, int n, int k, int m) {
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, CUDA_R_16BF, k, x,
                     CUDA_R_16BF, k, &beta, y, y_type, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx", __LINE__);
}

void Gemm::bf16_out(const bf16* x, const bf16* w, bf16* y, int n, int k, int m) {
  run(x, w, y, CUDA_R_16BF, n, k, m);
}

void Gemm::f32_out(const bf16* x, const bf16* w, float* y, int n, int k, int m) {
  run(x, w, y, CUDA_R_32F, n, k, m);
}

}  // namespace lychee::cuda
