// Decode-product (GEMV) benchmark: our fp8_gemv (cuda/kernels/fp8_gemv.h) and bf16_gemv
// (bf16_gemv.h) against the engine's cuBLASLt bf16 product (cuda::Gemm, tuned for decode sizes)
// and cuBLASLt's own FP8 matmul, at Llama-3-8B's linear shapes (and the default 135M model's,
// s_*) and decode batches n = 1, 2, 4, 8, against a device-to-device copy measured in the same
// run. The issues' targets: FP8 decode products at >= 85% of copy bandwidth on the bytes they
// move, at n = 1 and 8; cuBLASLt where it is best, ours where it is not (issue 16); the bf16 decode
// products that bound a batch-1 step at its bandwidth (issue 17).
//
//   bench_fp8_gemv [--json FILE] [--quick] [--shapes qkv,o,gate_up,down,lm_head,s_qkv,...] [--batches 1,2,4,8]
//                  [--kernels fp8,bf16,cublas_fp8,gemv,gemv_norm,gemv8,gemv8_norm] [--reps 30]
//                  [--calls 20] [--tag TEXT]
// Kernels: fp8 (lychee_fp8), bf16 (cublaslt_bf16), cublas_fp8 (cublaslt_fp8), gemv (lychee_bf16:
// bf16_gemv, plain), gemv_norm (lychee_bf16_norm: bf16_gemv scaled by the RMSNorm factor from sums of squares,
// the fused decode layers' QKV / gate-up form; timed, not checked here: tests/test_cuda_bf16_gemv.cpp
// checks it); gemv8, gemv8_norm (lychee_fp8_fused, lychee_fp8_fused_norm: the same kernel over the FP8
// codes, Bf16GemvArgs::w8, as the fused decode layers run FP8 weights, the norm without input
// residues as FP8 products take it; the plain one checked).
// LYCHEE_FP8_GEMV_TILES=1|2|4 (read by the kernel, once per process) forces its m16 tiles per block;
// the JSON records the setting ("auto" without it). LYCHEE_COMMIT stamps the JSON. Exit status 1
// when a checked product is wrong (FAIL lines on stderr), after the table and the JSON.
//
// Operands. Random weights quantised on the host by lychee::quantize_rows_e4m3 (the engine's
// quantiser), each row's largest |value| set to 448 · 2^-e (e = 9..12) so that its scale is exactly
// 2^-e: the dequantised weights (code · scale) are then exact in bf16, and cuBLASLt's bf16 product
// runs on the very values the FP8 codes stand for. x: random bf16 in [-1, 1). cuBLASLt FP8 takes x
// as e4m3 codes with one per-tensor scale, quantised on the host outside the timing (a pipeline
// would add a quantisation kernel per product), and the weight scales as its outer-vector A scale
// (exactly our product, but x's rounding) or, where cuBLASLt has no such algorithm, as one scalar
// (the same bytes, a different product: timed, not checked).
//
// Check, every (shape, n), before timing: y against cuBLASLt's f32-output product on the
// dequantised bf16 weights, per row of y: max |y - ref| <= 2^-7 · max |ref| (ours and cuBLASLt bf16
// differ from it only in the summation order and y's bf16 rounding, ~2^-9). cuBLASLt FP8's error
// is reported, not checked (x's e4m3 rounding alone is ~2^-5).
//
// Timing, CUDA events, medians of --reps:
//   us       a CUDA graph of >= --calls calls, replayed; the calls rotate over copies of the weights
//            that total >= 4x the L2 (at least 2 copies), so no call finds its weights in L2; per
//            call. The production path: a decode step is one graph, and our kernel's PDL prologue
//            overlaps the previous call's tail as it would any previous kernel's.
//   us_cold  one call (a one-call graph) after a kernel that reads 4x the L2: adds the launch
//            latency the graph hides.
// Bytes: all a call moves, in the kernel's formats: weights, scales, x, and y (written).
// GB/s = bytes / µs; % copy = GB/s over the copy bandwidth (read + written bytes), same run.
#include <cublasLt.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_env.h"
#include "core/fp8.h"
#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "cuda/kernels/bf16_gemv.h"
#include "cuda/kernels/fp8_gemv.h"
#include "cuda/kernels/gemm.h"

#define LY_CUBLAS_CHECK(expr)                                                         \
  do {                                                                                \
    const cublasStatus_t ly_st_ = (expr);                                             \
    if (ly_st_ != CUBLAS_STATUS_SUCCESS)                                              \
      ::lychee::cuda::fail_cuda_msg(#expr, int(ly_st_), __FILE__, __LINE__);          \
  } while (0)

namespace {

using namespace lychee::cuda;

struct Shape {
  const char* name;
  int k, m;      // y[n][m] = x[n][k] · w[m][k]ᵀ
  bool f32_out;  // the LM head's logits stay f32
};
// Llama-3-8B's linear layers: fused QKV, attention output, fused gate/up, down, LM head; then the
// default model's (SmolLM2-135M: d 576, 9 + 2 x 3 heads of 64, MLP 1536, vocabulary 49152).
constexpr Shape kShapes[] = {
    {"qkv", 4096, 6144, false},    {"o", 4096, 4096, false},       {"gate_up", 4096, 28672, false},
    {"down", 14336, 4096, false},  {"lm_head", 4096, 128256, true}, {"s_qkv", 576, 960, false},
    {"s_o", 576, 576, false},      {"s_gate_up", 576, 3072, false}, {"s_down", 1536, 576, false},
    {"s_lm_head", 576, 49152, true},
};

constexpr double kTolerance = 1.0 / 128;        // 2^-7 of the row's max |ref|
constexpr double kTargetPct = 85.0;             // the issue's target, % of copy bandwidth
constexpr size_t kWorkspaceBytes = 32u << 20;   // cuBLAS's recommendation for Hopper
constexpr int kCandidates = 32;                 // cuBLASLt FP8 heuristic results timed

struct Options {
  std::string json, tag;
  std::vector<std::string> shapes = {"qkv", "o", "gate_up", "down", "lm_head"};
  std::vector<std::string> kernels = {"fp8", "bf16", "cublas_fp8"};
  std::vector<int> batches = {1, 2, 4, 8};
  int reps = 30, calls = 20, warmup = 3;
};

struct Row {
  std::string shape, kernel, out, note, check = "n/a";  // check: ok, FAIL, reported, error, n/a
  int k = 0, m = 0, n = 0, copies = 0, calls = 0;
  double bytes = 0, us = 0, us_cold = 0;  // us = 0: not run (note says why)
  double err = -1;                        // max |y - ref| / max |ref| over rows; < 0: not computed
  double vs_bf16 = 0, vs_cublas_fp8 = 0;  // time ratios (ours / theirs); 0: n/a
};

// ---- operands ------------------------------------------------------------------------------------

uint64_t mix(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float uniform(uint64_t seed, uint64_t i) {  // [-1, 1)
  return float(mix((i + 1) * 0x9E3779B97F4A7C15ull ^ seed) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// f(begin, end) over [0, n) cut into one range per hardware thread.
template <typename F>
void parallel_for(int64_t n, F&& f) {
  const int64_t n_threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 32);
  const int64_t per = (n + n_threads - 1) / n_threads;
  std::vector<std::thread> threads;
  for (int64_t b = 0; b < n; b += per) {
    const int64_t e = std::min(n, b + per);
    threads.emplace_back([&f, b, e] { f(b, e); });
  }
  for (auto& t : threads) t.join();
}

struct HostWeights {
  std::vector<uint8_t> codes;  // [m][k] e4m3
  std::vector<float> scales;   // [m] f32, exactly 2^-(9 + j % 4)
};

HostWeights make_weights(int k, int m, uint64_t seed) {
  HostWeights h{std::vector<uint8_t>(size_t(m) * k), std::vector<float>(size_t(m))};
  parallel_for(m, [&](int64_t j0, int64_t j1) {
    std::vector<float> row(static_cast<size_t>(k));  // [k] f32
    for (int64_t j = j0; j < j1; ++j) {
      const float amp = std::ldexp(lychee::kE4m3Max, -(9 + int(j % 4)));
      for (int t = 0; t < k; ++t) row[size_t(t)] = amp * uniform(seed, uint64_t(j) * uint64_t(k) + uint64_t(t));
      row[size_t(mix(seed ^ uint64_t(j)) % uint64_t(k))] = j % 2 != 0 ? -amp : amp;  // max |row| = amp
      lychee::quantize_rows_e4m3(row.data(), 1, k, h.codes.data() + size_t(j) * k, &h.scales[size_t(j)]);
    }
  });
  for (int j = 0; j < m; ++j)
    if (h.scales[size_t(j)] != std::ldexp(1.0f, -(9 + j % 4)))
      throw std::runtime_error("weight row " + std::to_string(j) + ": scale " + std::to_string(h.scales[size_t(j)]) +
                               " is not the power of two the exact-bf16 reference needs");
  return h;
}

// w[i] = bf16(e4m3(codes[i]) · scales[i / k]): exact for power-of-two scales.
__global__ void dequantize_e4m3(const uint8_t* codes, const float* scales, bf16* w, int k, size_t total) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    __nv_fp8_e4m3 c;
    c.__x = codes[i];
    w[i] = __float2bfloat16(float(c) * scales[i / size_t(k)]);
  }
}

// Reads p[0, n) (clean lines, nothing to write back): evicts the L2.
__global__ void read_through(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads
}

// One shape's operands on the device. Weight copies: the same matrix, so every copy gives one result.
struct Operands {
  int k = 0, m = 0, fp8_copies = 0, bf16_copies = 0;
  DeviceBuffer<uint8_t> w8;      // [fp8_copies][m][k] e4m3 codes
  DeviceBuffer<float> w_scale;   // [fp8_copies][m] f32
  DeviceBuffer<bf16> w16;        // [bf16_copies][m][k] bf16, code · scale exactly
  DeviceBuffer<bf16> x;          // [kFp8GemvMaxRows][k] bf16; n < 8 uses the first n rows
  DeviceBuffer<float> ss;        // gemv_norm: partial sums of squares [kFp8GemvMaxRows][ceil(k / 16)], all 1
  DeviceBuffer<uint8_t> x8;      // [kFp8GemvMaxRows][k] e4m3 codes of x / x_scale
  DeviceBuffer<float> x_scale;   // [kFp8GemvMaxRows] f32: the one per-tensor scale, repeated
  DeviceBuffer<bf16> y16;        // [kFp8GemvMaxRows][m] bf16
  DeviceBuffer<float> y32, ref;  // [kFp8GemvMaxRows][m] f32
  const uint8_t* w8_copy(int c) const { return w8.data() + size_t(c) * m * k; }
  const float* scale_copy(int c) const { return w_scale.data() + size_t(c) * m; }
  const bf16* w16_copy(int c) const { return w16.data() + size_t(c) * m * k; }
};

// Copies of `bytes` each so that a rotation reads >= 4x the L2, at least 2.
int copies_for(double bytes, size_t l2_bytes) {
  return std::max(2, int(std::ceil(4.0 * double(l2_bytes) / bytes)));
}

template <typename T>
void replicate(DeviceBuffer<T>& b, size_t one, int copies) {  // copy 0 into copies 1 ..
  for (int c = 1; c < copies; ++c)
    LY_CUDA_CHECK(cudaMemcpy(b.data() + size_t(c) * one, b.data(), one * sizeof(T), cudaMemcpyDeviceToDevice));
}

void upload_x(Operands& o, uint64_t seed) {
  const size_t nk = size_t(kFp8GemvMaxRows) * o.k;
  std::vector<float> xf(nk);  // the bf16 values, as f32
  std::vector<bf16> xb(nk);
  for (size_t i = 0; i < nk; ++i) {
    xb[i] = __float2bfloat16(uniform(seed, i));
    xf[i] = __bfloat162float(xb[i]);
  }
  std::vector<uint8_t> codes(nk);
  float scale = 0.0f;
  lychee::quantize_rows_e4m3(xf.data(), 1, int64_t(nk), codes.data(), &scale);  // one per-tensor scale
  const std::vector<float> scales(size_t(kFp8GemvMaxRows), scale);
  o.x = DeviceBuffer<bf16>(nk);
  o.x8 = DeviceBuffer<uint8_t>(nk);
  o.x_scale = DeviceBuffer<float>(scales.size());
  LY_CUDA_CHECK(cudaMemcpy(o.x.data(), xb.data(), o.x.bytes(), cudaMemcpyHostToDevice));
  LY_CUDA_CHECK(cudaMemcpy(o.x8.data(), codes.data(), o.x8.bytes(), cudaMemcpyHostToDevice));
  LY_CUDA_CHECK(cudaMemcpy(o.x_scale.data(), scales.data(), o.x_scale.bytes(), cudaMemcpyHostToDevice));
  const std::vector<float> ones(size_t(kFp8GemvMaxRows) * size_t(bf16_gemv_ss_count(o.k)), 1.0f);
  o.ss = DeviceBuffer<float>(ones.size());
  LY_CUDA_CHECK(cudaMemcpy(o.ss.data(), ones.data(), o.ss.bytes(), cudaMemcpyHostToDevice));
}

Operands make_operands(const Shape& s, size_t l2_bytes, uint64_t seed) {
  Operands o;
  o.k = s.k;
  o.m = s.m;
  const size_t mk = size_t(s.m) * s.k;
  o.fp8_copies = copies_for(double(mk), l2_bytes);
  o.bf16_copies = copies_for(2.0 * double(mk), l2_bytes);
  const HostWeights h = make_weights(s.k, s.m, seed);
  o.w8 = DeviceBuffer<uint8_t>(mk * size_t(o.fp8_copies));
  o.w_scale = DeviceBuffer<float>(size_t(s.m) * size_t(o.fp8_copies));
  LY_CUDA_CHECK(cudaMemcpy(o.w8.data(), h.codes.data(), mk, cudaMemcpyHostToDevice));
  LY_CUDA_CHECK(cudaMemcpy(o.w_scale.data(), h.scales.data(), h.scales.size() * 4, cudaMemcpyHostToDevice));
  replicate(o.w8, mk, o.fp8_copies);
  replicate(o.w_scale, size_t(s.m), o.fp8_copies);
  o.w16 = DeviceBuffer<bf16>(mk * size_t(o.bf16_copies));
  dequantize_e4m3<<<1024, 256>>>(o.w8.data(), o.w_scale.data(), o.w16.data(), s.k, mk);
  LY_CUDA_CHECK_LAUNCH();
  replicate(o.w16, mk, o.bf16_copies);
  upload_x(o, seed + 1);
  const size_t nm = size_t(kFp8GemvMaxRows) * s.m;
  o.y16 = DeviceBuffer<bf16>(nm);
  o.y32 = DeviceBuffer<float>(nm);
  o.ref = DeviceBuffer<float>(nm);
  LY_CUDA_CHECK(cudaDeviceSynchronize());
  return o;
}

// ---- cuBLASLt FP8 ------------------------------------------------------------------------------

// cuBLASLt's FP8 product in the engine's frame (gemm.cpp): row-major y[n][m] is column-major D = m x n
// = op(A) · B with A = w seen as a column-major k x m matrix, transposed, and B = x as k x n: the
// "TN" layout, the only one Hopper's FP8 kernels take. e4m3 A and B, f32 compute and scale type,
// bf16 or f32 D (C the same, beta 0).
class CublasFp8 {
 public:
  CublasFp8(cudaStream_t stream, std::function<void()> flush)
      : stream_(stream), flush_(std::move(flush)), workspace_(kWorkspaceBytes) {
    LY_CUBLAS_CHECK(cublasLtCreate(&handle_));
  }
  ~CublasFp8() {
    destroy();
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }
  CublasFp8(const CublasFp8&) = delete;
  CublasFp8& operator=(const CublasFp8&) = delete;

  // Descriptors for y[n][m] and the fastest of the heuristic's candidates on these operands, with
  // outer-vector scales (w_scale per row of w, x_scale per row of x), else scalar ones. "" when
  // ready, else why not (recorded, not fatal).
  std::string prepare(Operands& o, int n, bool f32_out);
  // y = y32 or y16 of o, from weight copy `copy`, on the stream (capturable).
  void run(Operands& o, int copy) { LY_CUBLAS_CHECK(matmul(o, copy, algo_)); }
  bool outer_vec() const { return outer_vec_; }
  const std::string& label() const { return label_; }

 private:
  void destroy();
  void create(int n, int k, int m, bool f32_out);
  std::string try_mode(Operands& o, bool outer_vec);
  int fastest(Operands& o, const cublasLtMatmulHeuristicResult_t* found, int n_found);
  cublasStatus_t matmul(Operands& o, int copy, const cublasLtMatmulAlgo_t& algo);

  cudaStream_t stream_;
  std::function<void()> flush_;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<uint8_t> workspace_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  bool f32_out_ = false, outer_vec_ = false;
  std::string label_;
};

void CublasFp8::destroy() {
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  if (a_ != nullptr) cublasLtMatrixLayoutDestroy(a_);
  if (b_ != nullptr) cublasLtMatrixLayoutDestroy(b_);
  if (d_ != nullptr) cublasLtMatrixLayoutDestroy(d_);
  desc_ = nullptr;
  a_ = b_ = d_ = nullptr;
}

void CublasFp8::create(int n, int k, int m, bool f32_out) {
  destroy();
  f32_out_ = f32_out;
  LY_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), int64_t(k)));
  LY_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), int64_t(k)));
  LY_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d_, f32_out ? CUDA_R_32F : CUDA_R_16BF, uint64_t(m), uint64_t(n), int64_t(m)));
}

cublasStatus_t CublasFp8::matmul(Operands& o, int copy, const cublasLtMatmulAlgo_t& algo) {
  // The scale pointers live in the descriptor: set per call (a captured call keeps its values).
  const void* a_scale = o.scale_copy(copy);
  const void* b_scale = o.x_scale.data();
  LY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
  LY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
  void* y = f32_out_ ? static_cast<void*>(o.y32.data()) : static_cast<void*>(o.y16.data());
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(handle_, desc_, &alpha, o.w8_copy(copy), a_, o.x8.data(), b_, &beta, y, d_, y, d_, &algo,
                        workspace_.data(), workspace_.bytes(), stream_);
}

// The candidate with the lowest median of 3 cold runs (L2 flushed, after one warm-up run), as
// cuda::Gemm's tuner times the bf16 ones; -1 if none runs.
int CublasFp8::fastest(Operands& o, const cublasLtMatmulHeuristicResult_t* found, int n_found) {
  cudaEvent_t t0, t1;
  LY_CUDA_CHECK(cudaEventCreate(&t0));
  LY_CUDA_CHECK(cudaEventCreate(&t1));
  float best = 0.0f;
  int best_i = -1;
  for (int i = 0; i < n_found; ++i) {
    std::vector<float> ms;
    for (int rep = 0; rep < 4; ++rep) {
      flush_();
      LY_CUDA_CHECK(cudaEventRecord(t0, stream_));
      const cublasStatus_t st = matmul(o, 0, found[i].algo);
      LY_CUDA_CHECK(cudaEventRecord(t1, stream_));
      LY_CUDA_CHECK(cudaEventSynchronize(t1));
      if (st != CUBLAS_STATUS_SUCCESS) break;
      float t = 0.0f;
      LY_CUDA_CHECK(cudaEventElapsedTime(&t, t0, t1));
      if (rep > 0) ms.push_back(t);
    }
    if (ms.size() < 3) continue;
    std::sort(ms.begin(), ms.end());
    if (best_i < 0 || ms[1] < best) best = ms[1], best_i = i;
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return best_i;
}

std::string CublasFp8::try_mode(Operands& o, bool outer_vec) {
  const char* name = outer_vec ? "outer-vector scales" : "scalar scales";
  const int32_t mode = outer_vec ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  for (const auto attr : {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_DESC_B_SCALE_MODE})
    if (const cublasStatus_t st = cublasLtMatmulDescSetAttribute(desc_, attr, &mode, sizeof(mode));
        st != CUBLAS_STATUS_SUCCESS)
      return std::string(name) + ": scale mode refused (status " + std::to_string(int(st)) + ")";
  // The heuristic checks the scale pointers' presence: set them (copy 0) before asking.
  const void* a_scale = o.scale_copy(0);
  const void* b_scale = o.x_scale.data();
  LY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
  LY_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
  cublasLtMatmulPreference_t pref = nullptr;
  LY_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = workspace_.bytes();
  LY_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // A plain array: std::vector of this type crashes nvcc 13's front end (an internal error).
  cublasLtMatmulHeuristicResult_t found[kCandidates] = {};
  int n_found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_, b_, d_, d_, pref, kCandidates, found, &n_found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || n_found == 0)
    return std::string(name) + ": no algorithm (heuristic status " + std::to_string(int(st)) + ", " +
           std::to_string(n_found) + " found)";
  const int best = fastest(o, found, n_found);
  if (best < 0) return std::string(name) + ": none of " + std::to_string(n_found) + " candidates ran";
  algo_ = found[best].algo;
  outer_vec_ = outer_vec;
  label_ = std::string(name) + ", candidate " + std::to_string(best) + " of " + std::to_string(n_found);
  return "";
}

std::string CublasFp8::prepare(Operands& o, int n, bool f32_out) {
  create(n, o.k, o.m, f32_out);
  const std::string outer = try_mode(o, true);
  if (outer.empty()) return "";
  const std::string scalar = try_mode(o, false);
  if (scalar.empty()) {
    label_ += " (" + outer + ")";
    return "";
  }
  return outer + "; " + scalar;
}

// ---- timing --------------------------------------------------------------------------------------

struct Context {
  Options opt;
  cudaStream_t stream = nullptr;
  DeviceBuffer<uint4> flush_buf;  // 4x the L2
  DeviceBuffer<unsigned> sink;
  std::unique_ptr<Gemm> gemm;     // the engine's bf16 products
  std::unique_ptr<CublasFp8> fp8;
  void flush() {
    read_through<<<4 * device_info().sm_count, 512, 0, stream>>>(flush_buf.data(), flush_buf.size(), sink.data());
    LY_CUDA_CHECK_LAUNCH();
  }
};

struct GraphExec {
  cudaGraphExec_t exec = nullptr;
  ~GraphExec() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

// call(0 .. calls - 1) captured on the stream into one graph.
void capture(cudaStream_t s, int calls, const std::function<void(int)>& call, GraphExec& out) {
  cudaGraph_t g = nullptr;
  LY_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    for (int i = 0; i < calls; ++i) call(i);
  } catch (...) {
    (void)cudaStreamEndCapture(s, &g);  // leave the stream usable
    if (g != nullptr) cudaGraphDestroy(g);
    throw;
  }
  LY_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  const cudaError_t err = cudaGraphInstantiate(&out.exec, g, 0);
  cudaGraphDestroy(g);
  LY_CUDA_CHECK(err);
}

// Events around body() (before() runs outside them), warmup + reps times: the median, µs.
double median_us(cudaStream_t s, int warmup, int reps, const std::function<void()>& before,
                 const std::function<void()>& body) {
  for (int i = 0; i < warmup; ++i) before(), body();
  std::vector<cudaEvent_t> ev(2 * size_t(reps));
  for (auto& e : ev) LY_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    before();
    LY_CUDA_CHECK(cudaEventRecord(ev[2 * size_t(i)], s));
    body();
    LY_CUDA_CHECK(cudaEventRecord(ev[2 * size_t(i) + 1], s));
  }
  LY_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    float ms = 0.0f;
    LY_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * size_t(i)], ev[2 * size_t(i) + 1]));
    us.push_back(1e3 * ms);
  }
  for (auto& e : ev) LY_CUDA_CHECK(cudaEventDestroy(e));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// One kernel at one (shape, n): how to call it, what it moves, how its result is judged.
struct Candidate {
  std::string kernel, note;
  double bytes = 0;
  int copies = 1;
  std::string check = "checked";  // checked, reported, none
  std::function<void(int)> call;  // call(weight copy) on the stream; empty: not runnable (note says why)
};

void time_candidate(Context& c, const Candidate& k, Row& r) {
  const int calls = k.copies * ((std::max(c.opt.calls, k.copies) + k.copies - 1) / k.copies);
  GraphExec many, one;
  capture(c.stream, calls, [&](int i) { k.call(i % k.copies); }, many);
  capture(c.stream, 1, [&](int) { k.call(0); }, one);
  const auto nothing = [] {};
  r.us = median_us(c.stream, c.opt.warmup, c.opt.reps, nothing,
                   [&] { LY_CUDA_CHECK(cudaGraphLaunch(many.exec, c.stream)); }) / calls;
  r.us_cold = median_us(c.stream, c.opt.warmup, c.opt.reps, [&] { c.flush(); },
                        [&] { LY_CUDA_CHECK(cudaGraphLaunch(one.exec, c.stream)); });
  r.calls = calls;
  r.copies = k.copies;
}

// ---- the kernels ---------------------------------------------------------------------------------

std::string tiles_setting() {  // as fp8_gemv.cu reads LYCHEE_FP8_GEMV_TILES
  const char* v = std::getenv("LYCHEE_FP8_GEMV_TILES");
  const int r = v != nullptr ? std::atoi(v) : 0;
  return r == 1 || r == 2 || r == 4 ? std::to_string(r) : "auto";
}

std::string stages_setting() {  // as fp8_gemv.cu reads LYCHEE_FP8_GEMV_STAGES
  const char* v = std::getenv("LYCHEE_FP8_GEMV_STAGES");
  char* end = nullptr;
  const long r = v != nullptr && *v != 0 ? std::strtol(v, &end, 10) : -1;
  if (end != nullptr && *end != 0) return "auto";
  return r == 0 || r == 2 || r == 3 || r == 4 ? std::to_string(r) : std::string("auto");
}

Candidate ours(Context& c, const Shape& s, Operands& o, int n) {
  Candidate k;
  k.kernel = "lychee_fp8";
  k.note = "tiles " + tiles_setting() + ", stages " + stages_setting();
  k.bytes = double(o.m) * o.k + 4.0 * o.m + 2.0 * n * o.k + (s.f32_out ? 4.0 : 2.0) * n * o.m;
  k.copies = o.fp8_copies;
  const bool f32 = s.f32_out;
  k.call = [&c, &o, n, f32](int copy) {
    if (f32)
      fp8_gemv_f32_out(o.x.data(), o.w8_copy(copy), o.scale_copy(copy), o.y32.data(), n, o.k, o.m, c.stream);
    else
      fp8_gemv(o.x.data(), o.w8_copy(copy), o.scale_copy(copy), o.y16.data(), n, o.k, o.m, c.stream);
  };
  return k;
}

Candidate cublas_bf16(Context& c, const Shape& s, Operands& o, int n) {
  Candidate k;
  k.kernel = "cublaslt_bf16";
  k.note = "cuda::Gemm, its tuner's pick";
  k.bytes = 2.0 * o.m * o.k + 2.0 * n * o.k + (s.f32_out ? 4.0 : 2.0) * n * o.m;
  k.copies = o.bf16_copies;
  const bool f32 = s.f32_out;
  k.call = [&c, &o, n, f32](int copy) {
    if (f32)
      c.gemm->f32_out(o.x.data(), o.w16_copy(copy), o.y32.data(), n, o.k, o.m);
    else
      c.gemm->bf16_out(o.x.data(), o.w16_copy(copy), o.y16.data(), n, o.k, o.m);
  };
  return k;
}

// bf16_gemv (plain: y = x · wᵀ; norm: with the input residues x_lo (x again, for the timing) and
// scaled by the RMSNorm factor from partial sums of squares, as the fused decode layers' QKV,
// gate/up and LM-head products are; its output is not the plain product's and is timed only).
// fp8: the same over the e4m3 codes and scales (Bf16GemvArgs::w8), with the norm but no x_lo (the
// FP8 products take none).
Candidate ours_bf16(Context& c, const Shape& s, Operands& o, int n, bool norm, bool fp8 = false) {
  Candidate k;
  const bool lo = norm && !fp8;
  k.kernel = std::string(fp8 ? "lychee_fp8_fused" : "lychee_bf16") + (norm ? "_norm" : "");
  const char* st = std::getenv("LYCHEE_BF16_GEMV_STAGES");
  k.note = std::string("stages ") + (st != nullptr ? st : "auto");
  k.bytes = (fp8 ? 1.0 * o.m * o.k + 4.0 * o.m : 2.0 * o.m * o.k) + 2.0 * n * o.k +
            (norm ? (lo ? 2.0 * n * o.k : 0.0) + 4.0 * n * bf16_gemv_ss_count(o.k) : 0.0) +
            (s.f32_out ? 4.0 : 2.0) * n * o.m;
  k.copies = fp8 ? o.fp8_copies : o.bf16_copies;
  if (norm) k.check = "none";
  const bool f32 = s.f32_out;
  k.call = [&c, &o, n, f32, norm, fp8, lo](int copy) {
    Bf16GemvArgs a;
    a.x = o.x.data();
    if (norm) a.ss = o.ss.data(), a.ss_count = bf16_gemv_ss_count(o.k), a.eps = 1e-5f;
    if (lo) a.x_lo = o.x.data();
    if (fp8)
      a.w8 = o.w8_copy(copy), a.w_scale = o.scale_copy(copy);
    else
      a.w = o.w16_copy(copy);
    a.out = f32 ? GemvOut::kF32 : GemvOut::kBf16;
    a.y = f32 ? static_cast<void*>(o.y32.data()) : static_cast<void*>(o.y16.data());
    a.n = n, a.k = o.k, a.m = o.m;
    bf16_gemv(a, c.stream);
  };
  return k;
}

Candidate cublas_fp8(Context& c, const Shape& s, Operands& o, int n) {
  Candidate k;
  k.kernel = "cublaslt_fp8";
  k.bytes = double(o.m) * o.k + 4.0 * o.m + double(n) * o.k + 4.0 * n + (s.f32_out ? 4.0 : 2.0) * n * o.m;
  k.copies = o.fp8_copies;
  if (const std::string why = c.fp8->prepare(o, n, s.f32_out); !why.empty()) {
    k.note = why;
    return k;
  }
  k.note = c.fp8->label();
  k.check = c.fp8->outer_vec() ? "reported" : "none";  // scalar scales: another product, timing only
  k.call = [&c, &o](int copy) { c.fp8->run(o, copy); };
  return k;
}

void compute_reference(Context& c, Operands& o, int n) {
  c.gemm->f32_out(o.x.data(), o.w16_copy(0), o.ref.data(), n, o.k, o.m);
  LY_CUDA_CHECK(cudaStreamSynchronize(c.stream));
}

// Max over rows i < n of max_j |y - ref| / max_j |ref|; the worst element described in `worst`.
double rel_error(const Operands& o, int n, bool f32_out, std::string& worst) {
  const size_t nm = size_t(n) * o.m;
  std::vector<float> y(nm), ref(nm);
  LY_CUDA_CHECK(cudaMemcpy(ref.data(), o.ref.data(), nm * 4, cudaMemcpyDeviceToHost));
  if (f32_out) {
    LY_CUDA_CHECK(cudaMemcpy(y.data(), o.y32.data(), nm * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<bf16> yb(nm);
    LY_CUDA_CHECK(cudaMemcpy(yb.data(), o.y16.data(), nm * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < nm; ++i) y[i] = __bfloat162float(yb[i]);
  }
  double err = 0.0;
  for (int i = 0; i < n; ++i) {
    const float* yr = &y[size_t(i) * o.m];
    const float* rr = &ref[size_t(i) * o.m];
    double amax = 0.0, dmax = -1.0;
    int jmax = 0;
    for (int j = 0; j < o.m; ++j) amax = std::max(amax, std::fabs(double(rr[j])));
    for (int j = 0; j < o.m; ++j) {
      const double d = std::isfinite(yr[j]) ? std::fabs(double(yr[j]) - rr[j]) : INFINITY;
      if (d > dmax) dmax = d, jmax = j;
    }
    const double e = dmax / std::max(amax, 1e-30);
    if (e > err || i == 0) {
      err = e;
      worst = "row " + std::to_string(i) + " column " + std::to_string(jmax) + ": y " + std::to_string(yr[jmax]) +
              ", ref " + std::to_string(rr[jmax]) + ", row max |ref| " + std::to_string(amax);
    }
  }
  return err;
}

// The --kernels names and the labels their rows carry.
constexpr std::pair<const char*, const char*> kKernels[] = {
    {"fp8", "lychee_fp8"},         {"bf16", "cublaslt_bf16"},        {"cublas_fp8", "cublaslt_fp8"},
    {"gemv", "lychee_bf16"},       {"gemv_norm", "lychee_bf16_norm"}, {"gemv8", "lychee_fp8_fused"},
    {"gemv8_norm", "lychee_fp8_fused_norm"}};

// The label of a --kernels name, or null for an unknown one.
const char* kernel_label(const std::string& name) {
  for (const auto& [k, label] : kKernels)
    if (name == k) return label;
  return nullptr;
}

Row bench_kernel(Context& c, const Shape& s, Operands& o, int n, const std::string& which, int& failures) {
  const Candidate k = which == "fp8"         ? ours(c, s, o, n)
                      : which == "bf16"      ? cublas_bf16(c, s, o, n)
                      : which == "gemv"      ? ours_bf16(c, s, o, n, false)
                      : which == "gemv_norm" ? ours_bf16(c, s, o, n, true)
                      : which == "gemv8"     ? ours_bf16(c, s, o, n, false, true)
                      : which == "gemv8_norm" ? ours_bf16(c, s, o, n, true, true)
                                             : cublas_fp8(c, s, o, n);
  Row r;
  r.shape = s.name, r.kernel = k.kernel, r.out = s.f32_out ? "f32" : "bf16", r.note = k.note;
  r.k = s.k, r.m = s.m, r.n = n, r.bytes = k.bytes;
  if (!k.call) return r;
  // NaN bytes first: a call that writes nothing fails instead of passing on an earlier kernel's y.
  LY_CUDA_CHECK(cudaMemsetAsync(o.y16.data(), 0xFF, o.y16.bytes(), c.stream));
  LY_CUDA_CHECK(cudaMemsetAsync(o.y32.data(), 0xFF, o.y32.bytes(), c.stream));
  k.call(0);
  LY_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  if (k.check != "none") {
    std::string worst;
    r.err = rel_error(o, n, s.f32_out, worst);
    r.check = k.check == "reported" ? "reported" : r.err <= kTolerance ? "ok" : "FAIL";
    if (r.check == "FAIL") {
      std::fprintf(stderr, "FAIL %s n=%d %s: max |y - ref| / max |ref| = %.3g > 2^-7 (%s)\n", s.name, n,
                   k.kernel.c_str(), r.err, worst.c_str());
      ++failures;
    }
  }
  time_candidate(c, k, r);
  return r;
}

// ---- report --------------------------------------------------------------------------------------

double gbs(const Row& r, double us) { return us > 0 ? r.bytes / us / 1e3 : 0.0; }

void add_ratios(std::vector<Row>& rows) {
  for (Row& r : rows)
    for (const Row& p : rows)
      if (p.shape == r.shape && p.n == r.n && p.us > 0 && r.us > 0 && &p != &r) {
        if (p.kernel == "cublaslt_bf16") r.vs_bf16 = r.us / p.us;
        if (p.kernel == "cublaslt_fp8") r.vs_cublas_fp8 = r.us / p.us;
      }
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

void print_table(const std::vector<Row>& rows, double copy_gbs) {
  std::printf("\n| shape | k | m | n | kernel | MB | µs | GB/s | %% copy | cold µs | %% copy cold | time / bf16 "
              "| time / cuBLASLt fp8 | check | err | note |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    if (r.us <= 0) {
      std::printf("| %s | %d | %d | %d | %s | %.1f | - | | | | | | | %s | | %s |\n", r.shape.c_str(), r.k, r.m, r.n,
                  r.kernel.c_str(), r.bytes / 1e6, r.check.c_str(), r.note.c_str());
      continue;
    }
    std::printf("| %s | %d | %d | %d | %s | %.1f | %.2f | %.0f | %.1f | %.2f | %.1f | %s | %s | %s | %s | %s |\n",
                r.shape.c_str(), r.k, r.m, r.n, r.kernel.c_str(), r.bytes / 1e6, r.us, gbs(r, r.us),
                100.0 * gbs(r, r.us) / copy_gbs, r.us_cold, 100.0 * gbs(r, r.us_cold) / copy_gbs,
                r.vs_bf16 > 0 ? fmt("%.2f", r.vs_bf16).c_str() : "", r.vs_cublas_fp8 > 0 ? fmt("%.2f", r.vs_cublas_fp8).c_str() : "",
                r.check.c_str(), r.err >= 0 ? fmt("%.2g", r.err).c_str() : "", r.note.c_str());
  }
  int met = 0, total = 0;
  std::string missed;
  for (const Row& r : rows)
    if (r.kernel == "lychee_fp8" && r.us > 0 && (r.n == 1 || r.n == 8)) {
      ++total;
      const double pct = 100.0 * gbs(r, r.us) / copy_gbs;
      if (pct >= kTargetPct) ++met;
      else missed += " " + r.shape + "/n" + std::to_string(r.n) + " " + fmt("%.0f%%", pct);
    }
  std::printf("\ntarget (lychee_fp8 >= %.0f%% of copy bandwidth at n = 1 and 8, graph timing): %d of %d met%s%s\n",
              kTargetPct, met, total, missed.empty() ? "" : "; missed:", missed.c_str());
}

nlohmann::json row_json(const Row& r, double copy_gbs) {
  nlohmann::json j = {{"shape", r.shape}, {"k", r.k}, {"m", r.m}, {"n", r.n}, {"kernel", r.kernel}, {"out", r.out},
                      {"bytes", r.bytes}, {"check", r.check}, {"note", r.note}};
  j["err"] = r.err >= 0 ? nlohmann::json(r.err) : nlohmann::json();
  if (r.us <= 0) {
    j["skipped"] = r.note;
    return j;
  }
  j.update({{"us", r.us}, {"us_cold", r.us_cold}, {"gbs", gbs(r, r.us)}, {"gbs_cold", gbs(r, r.us_cold)},
            {"pct_copy", 100.0 * gbs(r, r.us) / copy_gbs}, {"pct_copy_cold", 100.0 * gbs(r, r.us_cold) / copy_gbs},
            {"weight_copies", r.copies}, {"calls_per_graph", r.calls}});
  if (r.vs_bf16 > 0) j["time_vs_cublaslt_bf16"] = r.vs_bf16;
  if (r.vs_cublas_fp8 > 0) j["time_vs_cublaslt_fp8"] = r.vs_cublas_fp8;
  return j;
}

void write_json(const Options& opt, const std::string& command, const std::vector<Row>& rows, double copy_gbs) {
  const DeviceInfo& dev = device_info();
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const char* commit = std::getenv("LYCHEE_COMMIT");
  nlohmann::json j = {{"benchmark", "fp8_gemv"}, {"gpu", dev.name}, {"sm_count", dev.sm_count},
                      {"l2_bytes", dev.l2_bytes}, {"driver", lychee::bench::driver_string()}, {"date", date},
                      {"command", command}, {"tag", opt.tag}, {"commit", commit != nullptr ? commit : "unknown"},
                      {"copy_bandwidth_gbs", copy_gbs}, {"fp8_gemv_tiles", tiles_setting()}, {"fp8_gemv_stages", stages_setting()},
                      {"target_pct_copy", kTargetPct}, {"tolerance", kTolerance}, {"reps", opt.reps},
                      {"timing", "us: median per call of CUDA-graph replays of >= calls_per_graph calls rotating over "
                                 "weight_copies (>= 4x L2 in all); us_cold: one call after an L2 flush"}};
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) j["rows"].push_back(row_json(r, copy_gbs));
  std::ofstream f(opt.json);
  if (!(f << j.dump(1) << "\n")) throw std::runtime_error("cannot write " + opt.json);
  std::printf("wrote %s\n", opt.json.c_str());
}

// ---- main ----------------------------------------------------------------------------------------

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  for (size_t b = 0; b <= s.size();) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// "" when fine, else what is wrong.
std::string parse(int argc, char** argv, Options& opt) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    const std::string v = has_value ? argv[i + 1] : "";
    if (a == "--quick") {
      opt.reps = 10, opt.calls = 10, opt.warmup = 2;
      continue;
    }
    if (!has_value) return "option " + a + " needs a value (or is unknown)";
    ++i;
    if (a == "--json") opt.json = v;
    else if (a == "--tag") opt.tag = v;
    else if (a == "--shapes") opt.shapes = split(v);
    else if (a == "--kernels") opt.kernels = split(v);
    else if (a == "--batches") {
      opt.batches.clear();
      for (const std::string& b : split(v)) opt.batches.push_back(std::atoi(b.c_str()));
    } else if (a == "--reps") opt.reps = std::max(5, std::atoi(v.c_str()));
    else if (a == "--calls") opt.calls = std::max(1, std::atoi(v.c_str()));
    else return "unknown option " + a;
  }
  for (const std::string& s : opt.shapes)
    if (std::none_of(std::begin(kShapes), std::end(kShapes), [&](const Shape& k) { return s == k.name; }))
      return "unknown shape '" + s + "' (qkv, o, gate_up, down, lm_head, s_qkv, s_o, s_gate_up, s_down, s_lm_head)";
  for (const std::string& k : opt.kernels)
    if (kernel_label(k) == nullptr) {
      std::string known;
      for (const auto& [name, label] : kKernels) known += std::string(known.empty() ? "" : ", ") + name;
      return "unknown kernel '" + k + "' (" + known + ")";
    }
  for (int n : opt.batches)
    if (n < 1 || n > kFp8GemvMaxRows) return "batch " + std::to_string(n) + " out of 1..8";
  return "";
}

std::vector<Row> bench_shapes(Context& c, int& failures) {
  std::vector<Row> rows;
  for (const Shape& s : kShapes) {
    if (std::find(c.opt.shapes.begin(), c.opt.shapes.end(), s.name) == c.opt.shapes.end()) continue;
    Operands o = make_operands(s, device_info().l2_bytes, 1234 + uint64_t(s.m) * 31 + uint64_t(s.k));
    std::printf("%s: k %d, m %d, %s out; %d fp8 / %d bf16 weight copies\n", s.name, s.k, s.m,
                s.f32_out ? "f32" : "bf16", o.fp8_copies, o.bf16_copies);
    for (int n : c.opt.batches) {
      compute_reference(c, o, n);
      for (const std::string& k : c.opt.kernels) {
        try {
          rows.push_back(bench_kernel(c, s, o, n, k, failures));
        } catch (const std::exception& e) {  // recorded; a sticky CUDA error fails the next ones too
          const std::string label = kernel_label(k);
          std::fprintf(stderr, "FAIL %s n=%d %s: %s\n", s.name, n, label.c_str(), e.what());
          ++failures;
          Row r;
          r.shape = s.name, r.kernel = label, r.k = s.k, r.m = s.m, r.n = n, r.check = "error", r.note = e.what();
          rows.push_back(r);
        }
        const Row& r = rows.back();
        std::printf("  n %d %-14s %9.2f us (cold %9.2f us) %6.0f GB/s  check %s%s%s\n", n, r.kernel.c_str(), r.us,
                    r.us_cold, gbs(r, r.us), r.check.c_str(), r.note.empty() ? "" : "; ", r.note.c_str());
        std::fflush(stdout);
      }
    }
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (const std::string bad = parse(argc, argv, opt); !bad.empty()) {
    std::fprintf(stderr, "bench_fp8_gemv: %s\n", bad.c_str());
    return 2;
  }
  std::string command;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) command += ' ';
    command += argv[i];
  }
  try {
    if (const std::string why = cuda_device_status(); !why.empty()) {
      std::fprintf(stderr, "bench_fp8_gemv: no usable CUDA device: %s\n", why.c_str());
      return 1;
    }
    const DeviceInfo& dev = device_info();
    const double copy_gbs = device_copy_bandwidth_gbps();
    std::printf("%s, %d SMs, L2 %.0f MB, %s\n", dev.name, dev.sm_count, dev.l2_bytes / 1e6, lychee::bench::driver_string().c_str());
    std::printf("device-to-device copy: %.0f GB/s (read + write); fp8_gemv tiles: %s\n", copy_gbs,
                tiles_setting().c_str());
    Context c;
    c.opt = opt;
    LY_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    c.flush_buf = DeviceBuffer<uint4>(4 * dev.l2_bytes / sizeof(uint4));
    c.sink = DeviceBuffer<unsigned>(1);
    LY_CUDA_CHECK(cudaMemset(c.flush_buf.data(), 1, c.flush_buf.bytes()));
    c.gemm = std::make_unique<Gemm>(c.stream);
    c.fp8 = std::make_unique<CublasFp8>(c.stream, [&c] { c.flush(); });
    int failures = 0;
    std::vector<Row> rows = bench_shapes(c, failures);
    add_ratios(rows);
    print_table(rows, copy_gbs);
    if (!opt.json.empty()) write_json(opt, command, rows, copy_gbs);
    if (failures > 0) std::fprintf(stderr, "bench_fp8_gemv: %d product(s) FAILED the check\n", failures);
    c.fp8.reset();
    c.gemm.reset();
    LY_CUDA_CHECK(cudaStreamDestroy(c.stream));
    return failures > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fp8_gemv: %s\n", e.what());
    return 1;
  }
}
