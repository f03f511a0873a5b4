#include "cuda/kernels/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace lychee::cuda {

namespace {

void check(cublasStatus_t st, const char* what, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) fail_cuda_msg(what, int(st), __FILE__, line);
}
constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLAS's recommendation for Hopper
constexpr int kCandidates = 32;                // heuristic results timed per decode shape
constexpr size_t kFlushBytes = 64u << 20;      // > the H100's and H200's 50 MB L2

bool tuning_enabled() {
  const char* v = std::getenv("LYCHEE_GEMM_TUNE");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// The algorithm chosen per shape, for the whole process (see gemm.h).
std::mutex g_mutex;
std::map<std::tuple<int, int, int, int>, cublasLtMatmulAlgo_t> g_chosen;

}  // namespace

// Row-major y[n][m] = x[n][k] · w[m][k]ᵀ is column-major yᵀ[m][n] = wᵀ · xᵀ with w seen as a
// column-major k x m matrix (transposed) and x as a column-major k x n matrix: the "TN" form, both
// operands k-major (which cuBLASLt's FP8 kernels require). f32 accumulation and scale type.
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // Called on a Plan a unique_ptr already owns, so that a failing call frees what was created.
  void describe(cudaDataType_t in_type, cudaDataType_t y_type, int n, int k, int m) {
    check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate", __LINE__);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "TRANSA", __LINE__);
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "TRANSB", __LINE__);
    check(cublasLtMatrixLayoutCreate(&a, in_type, k, m, k), "layout w", __LINE__);
    check(cublasLtMatrixLayoutCreate(&b, in_type, k, n, k), "layout x", __LINE__);
    check(cublasLtMatrixLayoutCreate(&c, y_type, m, n, m), "layout y", __LINE__);
  }
  // FP8 plans: the operands' scales, vectors of m (w) and n (x) f32 values on the device.
  void set_scale_pointers(const float* x_scales, const float* w_scales) {
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)),
          "A_SCALE_POINTER", __LINE__);
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales)),
          "B_SCALE_POINTER", __LINE__);
  }
  ~Plan() {
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
  }
};

Gemm::Gemm(cudaStream_t stream) : stream_(stream), workspace_(kWorkspaceBytes) {
  check(cublasLtCreate(&handle_), "cublasLtCreate", __LINE__);
}

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) delete p;
  for (auto& [key, p] : fp8_plans_) delete p;
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

// Up to found.size() algorithms for a plan's descriptors within the workspace, best first.
cublasStatus_t Gemm::heuristic(const Plan& p, std::vector<cublasLtMatmulHeuristicResult_t>& found, int& n_found) {
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", __LINE__);
  const size_t ws = workspace_.bytes();
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
        "workspace preference", __LINE__);
  n_found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref,
                                                           int(found.size()), found.data(), &n_found);
  cublasLtMatmulPreferenceDestroy(pref);
  return st;
}

Gemm::Plan& Gemm::plan(const bf16* x, const bf16* w, void* y, cudaDataType_t y_type, int n, int k, int m) {
  const Key key{n, k, m, int(y_type)};
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  p->describe(CUDA_R_16BF, y_type, n, k, m);

  std::vector<cublasLtMatmulHeuristicResult_t> found(kCandidates);
  int n_found = 0;
  check(heuristic(*p, found, n_found), "cublasLtMatmulAlgoGetHeuristic", __LINE__);
  LY_CHECK(n_found > 0, ErrorCode::kUnsupported, "cuBLASLt has no algorithm for a {}x{}x{} product", n, k, m);
  p->algo = found[0].algo;

  std::lock_guard<std::mutex> lock(g_mutex);
  if (auto it = g_chosen.find(key); it != g_chosen.end()) {
    p->algo = it->second;
  } else {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    LY_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
    if (n <= kTuneMaxRows && n_found > 1 && capturing == cudaStreamCaptureStatusNone && tuning_enabled()) {
      // Time each candidate on the real operands, L2 flushed before each run (decode reads its
      // weights from HBM once per step), median of 3; y is rewritten by the caller's run after.
      DeviceBuffer<uint8_t> flush(kFlushBytes);
      cudaEvent_t t0, t1;
      LY_CUDA_CHECK(cudaEventCreate(&t0));
      LY_CUDA_CHECK(cudaEventCreate(&t1));
      const float alpha = 1.0f, beta = 0.0f;
      float best = 0.0f;
      int best_i = 0;
      for (int i = 0; i < n_found; ++i) {
        std::vector<float> ms;
        for (int rep = 0; rep < 4; ++rep) {
          LY_CUDA_CHECK(cudaMemsetAsync(flush.data(), rep, flush.bytes(), stream_));
          LY_CUDA_CHECK(cudaEventRecord(t0, stream_));
          const cublasStatus_t r = cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y,
                                                  p->c, &found[size_t(i)].algo, workspace_.data(), workspace_.bytes(), stream_);
          LY_CUDA_CHECK(cudaEventRecord(t1, stream_));
          LY_CUDA_CHECK(cudaEventSynchronize(t1));
          if (r != CUBLAS_STATUS_SUCCESS) break;
          float t = 0.0f;
          LY_CUDA_CHECK(cudaEventElapsedTime(&t, t0, t1));
          if (rep > 0) ms.push_back(t);  // the first run warms the algorithm's kernels
        }
        if (ms.size() < 3) continue;
        std::sort(ms.begin(), ms.end());
        if (best == 0.0f || ms[1] < best) {
          best = ms[1];
          best_i = i;
        }
      }
      cudaEventDestroy(t0);
      cudaEventDestroy(t1);
      p->algo = found[size_t(best_i)].algo;
      LY_LOG_DEBUG("gemm {}x{}x{}: candidate {} of {} fastest ({:.1f} us)", n, k, m, best_i, n_found, best * 1e3);
      g_chosen.emplace(key, p->algo);
    }
  }
  Plan* raw = p.release();
  plans_.emplace(key, raw);
  return *raw;
}

void Gemm::run(const bf16* x, const bf16* w, void* y, cudaDataType_t y_type, int n, int k, int m) {
  Plan& p = plan(x, w, y, y_type, n, k, m);
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_.data(),
                       workspace_.bytes(), stream_),
        "cublasLtMatmul", __LINE__);
}

// The FP8 product in the bf16 one's layout: e4m3 inputs, bf16 C/D, and A's (w's) and B's (x's)
// scales as vectors of m and n f32 values (outer-vector scaling). The scale pointers are set on
// every call (they differ between matrices of one shape); the algorithm is the heuristic's first
// (prefill products are compute-bound, not the GEMVs kTuneMaxRows is for).
bool Gemm::fp8_bf16_out(const uint8_t* x, const float* x_scales, const uint8_t* w, const float* w_scales, bf16* y,
                        int n, int k, int m) {
  const std::tuple<int, int, int> key{n, k, m};
  auto it = fp8_plans_.find(key);
  if (it == fp8_plans_.end()) {
    auto p = std::make_unique<Plan>();
    p->describe(CUDA_R_8F_E4M3, CUDA_R_16BF, n, k, m);
    const cublasLtMatmulMatrixScale_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof(vec)),
          "A_SCALE_MODE", __LINE__);
    check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof(vec)),
          "B_SCALE_MODE", __LINE__);
    p->set_scale_pointers(x_scales, w_scales);  // in place before the heuristic sees the descriptor
    std::vector<cublasLtMatmulHeuristicResult_t> found(1);
    int n_found = 0;
    const cublasStatus_t st = heuristic(*p, found, n_found);
    Plan* raw = nullptr;
    if (st == CUBLAS_STATUS_SUCCESS && n_found > 0) {
      p->algo = found[0].algo;
      raw = p.release();
    } else {
      LY_LOG_INFO("cuBLASLt offers no FP8 product with per-row scales for {}x{}x{} (status {}): widening to bf16",
                  n, k, m, int(st));
    }
    it = fp8_plans_.emplace(key, raw).first;
  }
  Plan* p = it->second;
  if (p == nullptr) return false;
  p->set_scale_pointers(x_scales, w_scales);
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo,
                       workspace_.data(), workspace_.bytes(), stream_),
        "cublasLtMatmul (fp8)", __LINE__);
  return true;
}

void Gemm::bf16_out(const bf16* x, const bf16* w, bf16* y, int n, int k, int m) {
  run(x, w, y, CUDA_R_16BF, n, k, m);
}

void Gemm::f32_out(const bf16* x, const bf16* w, float* y, int n, int k, int m) {
  run(x, w, y, CUDA_R_32F, n, k, m);
}

}  // namespace lychee::cuda
