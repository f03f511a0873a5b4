// Private to the GpuStudent implementation (train_student.cpp: the pass; train_student_setup.cpp:
// weights, buffers): the state of a GpuStudent and the helpers both files use.
#pragma once

#include <cublas_v2.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "cuda/kernels/prefill_attention.h"
#include "cuda/train/kernels.h"
#include "cuda/train/student.h"

namespace lychee::cuda {

namespace ops = train_ops;

namespace train_detail {

inline void check_blas(cublasStatus_t st, const char* what, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) fail_cuda_msg(what, int(st), __FILE__, line);
}

constexpr size_t kBlasWorkspaceBytes = 32u << 20;
constexpr int kContextChunk = 8192;          // prefill rows per forward on the flash path
constexpr int kMinMaterialisedRows = 256;    // prefill rows per forward on the materialised path
constexpr int kNumEvents = 8;
constexpr int kMaxMarks = 32;  // profiling events of one layer

inline size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

struct LayerWeights {
  const float* attn_norm = nullptr;  // [d]
  const float* wqkv = nullptr;       // [q_dim + 2 kv_dim][d]
  const float* bqkv = nullptr;       // [q_dim + 2 kv_dim] or null
  const float* q_norm = nullptr;     // [head_dim] or null
  const float* k_norm = nullptr;
  const float* wo = nullptr;         // [d][q_dim]
  const float* bo = nullptr;         // [d] or null
  const float* ffn_norm = nullptr;   // [d]
  const float* wgu = nullptr;        // [2 ff][d]: gate rows, then up rows
  const float* bgu = nullptr;        // [2 ff] or null
  const float* wd = nullptr;         // [d][ff]
  const float* bd = nullptr;         // [d] or null
};

}  // namespace train_detail

using namespace train_detail;

struct GpuStudent::Impl {
  ModelConfig c;
  train::StudentOptions opt;
  GpuStudentTuning tuning;
  int max_context = 0, max_targets = 0;
  int d = 0, hd = 0, n_heads = 0, n_kv = 0, group = 0, q_dim = 0, kv_dim = 0, qkv_dim = 0, ff = 0,
      vocab = 0, n_layers = 0;
  float scale = 0.0f;
  int ld_max = 0, mask_words = 0, rows_mat = 0, act_rows = 0;
  bool use_flash = false;
  bool prefill_bf16 = false;  // tuning.prefill_bf16 where it applies
  bool prefill_cudnn = false, teacher_cudnn = false;  // tuning's, where they apply
  bool long_chunks = false;   // the prefill in chunks of kContextChunk rows (flash or cuDNN attention)
  bool keys_in_global = false;  // the selection's keys in select_keys (contexts past shared memory)
  bool in_prefill = false;    // set_context is running: its products may use bf16

  int device = 0;  // the CUDA device current at construction; every public call makes it current
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cudaEvent_t ev[kNumEvents] = {};
  cudaEvent_t marks[kMaxMarks] = {};
  const char* mark_names[kMaxMarks] = {};  // nullptr: the mark starts a span (no interval ends there)
  int n_marks = 0;
  DeviceBuffer<uint8_t> blas_ws;

  DeviceBuffer<float> weights;
  DeviceBuffer<uint16_t> weights_bf16;  // with prefill_bf16: the arena from bf16_base on (the layers) rounded
  size_t bf16_base = 0;                 // arena offset of weights_bf16[0] (floats)
  DeviceBuffer<uint16_t> act_bf16;      // with prefill_bf16: [act_rows][max(d, q_dim, ff)] product input
  // cuDNN SDPA (prefill_cudnn / teacher_cudnn): its graphs, and one layer's inputs in bf16.
  std::unique_ptr<PrefillAttention> sdpa;
  DeviceBuffer<uint16_t> kv_bf16;       // [2][n_kv][ld_sdpa][hd]: one layer's K, V rows below the call's keys
  int ld_sdpa = 0;                      // max_context rounded up to 64: cuDNN's one page, whole key tiles
  DeviceBuffer<uint16_t> q_bf16, o_bf16;  // [sdpa_rows][q_dim]: the rounded q, the attention output
  DeviceBuffer<int32_t> sdpa_meta;      // [3]: the page table (one page), q_len, kv_len
  std::vector<LayerWeights> lw;
  const float *embed = nullptr, *out_norm = nullptr, *output = nullptr;
  DeviceBuffer<float> rope_cos, rope_sin;  // [max_context][head_dim / 2]
  DeviceBuffer<float> kv;                  // [n_layers][2][n_kv][max_context][head_dim]

  // Scratch rows (prefill chunk, teacher, student).
  DeviceBuffer<float> x, h, qkv, q, att, gu, m;
  DeviceBuffer<float> s_buf, g_buf;        // [n_heads][rows][ld]
  DeviceBuffer<float> flash_scratch;       // key-split partials of the teacher's flash attention
  DeviceBuffer<float> s_store;             // [n_layers][n_heads][max_targets][ld_max]
  // What the student's backward needs, per layer.
  DeviceBuffer<float> xs;                  // [n_layers + 1][max_targets][d]: layer inputs, final residual
  DeviceBuffer<float> x2s;                 // [n_layers][max_targets][d]: after the attention residual
  DeviceBuffer<float> qkvs;                // [n_layers][max_targets][qkv_dim]: projection + bias
  DeviceBuffer<float> qs;                  // [n_layers][max_targets][q_dim]: rotated q
  DeviceBuffer<float> gus;                 // [n_layers][max_targets][2 ff]: gate/up + bias
  DeviceBuffer<float4> stats;              // [n_layers][n_heads][max_targets]
  DeviceBuffer<uint32_t> masks;            // [n_layers][n_kv][max_targets][mask_words]
  DeviceBuffer<float> select_keys;         // [n_kv][max_targets][ld_max] when keys_in_global
  DeviceBuffer<float> hfin, logits, teacher_out;
  DeviceBuffer<float> dx, dh, dqkv, da, dgu, dm, dq, dk, dv, w_tail, dz_part, dz_dev, z_dev;
  DeviceBuffer<double> loss_partials, loss_dev;
  DeviceBuffer<int32_t> ctx_tokens, tgt_tokens;
  PinnedBuffer<int32_t> ctx_pinned, tgt_pinned;
  PinnedBuffer<float> z_pinned, dz_pinned;
  PinnedBuffer<double> loss_pinned;

  int L = 0, T = 0;
  bool have_context = false, have_teacher = false, have_student = false;

  Impl(const ModelConfig& config, const WeightSource& ws, const train::StudentOptions& o, int mc,
       int mt, const GpuStudentTuning& tu);
  ~Impl();
  void release();  // the stream, cuBLAS handle and events
  void upload_weights(const WeightSource& ws);
  void allocate();

  // A profiling event after the op `name` of layer l (name null: the start of a span).
  void mark(int l, const char* name) {
    if (tuning.profile_layer < 0 || l != tuning.profile_layer || n_marks >= kMaxMarks) return;
    LY_CUDA_CHECK(cudaEventRecord(marks[n_marks], stream));
    mark_names[n_marks++] = name;
  }

  float* kc(int l) { return kv.data() + size_t(l) * 2 * n_kv * max_context * hd; }
  float* vc(int l) { return kc(l) + size_t(n_kv) * max_context * hd; }
  float* layer_rows(DeviceBuffer<float>& b, int l, int width) { return b.data() + size_t(l) * max_targets * width; }
  uint32_t* mask(int l) { return masks.data() + size_t(l) * n_kv * max_targets * mask_words; }

  // Row-major C[M][N] = alpha · op(A)[M][K] · op(B)[K][N] + beta · C, batched with strides.
  void gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, long long sa,
            const float* B, int ldb, long long sb, float beta, float* C, int ldc, long long sc,
            int batch = 1) {
    const float alpha = 1.0f;
    check_blas(cublasSgemmStridedBatched(blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         N, M, K, &alpha, B, ldb, sb, A, lda, sa, &beta, C, ldc, sc, batch),
               "cublasSgemmStridedBatched", __LINE__);
  }
  // y[n][m] (+)= x[n][k] · W[m][k]ᵀ. In the bf16 prefill: W's bf16 copy and x rounded to bf16,
  // bf16 tensor cores with f32 accumulation and output.
  void linear(const float* x_, const float* w, float* y, int n, int k, int m_, float beta) {
    if (in_prefill && prefill_bf16) {
      LY_ASSERT(size_t(n) * k <= act_bf16.size());
      ops::round_to_bf16(x_, act_bf16.data(), size_t(n) * k, stream);
      return linear_bf16(act_bf16.data(), w, y, n, k, m_, beta);
    }
    gemm(false, true, n, m_, k, x_, k, 0, w, k, 0, beta, y, m_, 0);
  }
  // The same from an input already in bf16, xb[n][k] bits, with W's bf16 copy (prefill_bf16).
  void linear_bf16(const uint16_t* xb, const float* w, float* y, int n, int k, int m_, float beta) {
    LY_ASSERT(prefill_bf16 && w >= weights.data() + bf16_base && w < weights.data() + weights.size());
    const float alpha = 1.0f;
    check_blas(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, m_, n, k, &alpha,
                            weights_bf16.data() + (size_t(w - weights.data()) - bf16_base), CUDA_R_16BF, k, xb,
                            CUDA_R_16BF, k, &beta, y, CUDA_R_32F, m_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (bf16 prefill)", __LINE__);
  }
  // dx[n][k] = dy[n][m] · W[m][k]
  void linear_backward(const float* dy, const float* w, float* dx_, int n, int k, int m_) {
    gemm(false, false, n, k, m_, dy, m_, 0, w, k, 0, 0.0f, dx_, k, 0);
  }
  // For each query head b = h·group + g, batched over h: out_b = A_b · op(B_h), A_b = a + b·a_col
  // rows of lda floats, B_h = K or V rows of layer l. Output head b at out + b·out_head.
  void per_head(int l, bool use_k, bool b_transposed, int n, int n_out, int k_dim, const float* a,
                int lda, long long a_head, float* out, int ldo, long long out_head) {
    const float* cache = use_k ? kc(l) : vc(l);
    for (int g = 0; g < group; ++g)
      gemm(false, b_transposed, n, n_out, k_dim, a + g * a_head, lda, group * a_head, cache, hd,
           (long long)max_context * hd, 0.0f, out + g * out_head, ldo, group * out_head, n_kv);
  }

  // Dense causal attention of rows pos0 .. pos0 + n − 1 from q; true: the output is in o_bf16
  // (cuDNN), false: in att.
  bool dense_attention(int l, int n, int pos0);
  void sdpa_attention(int l, int n, int pos0);
  std::string sdpa_backend_name() const;
  void dense_layer(int l, float* xr, int n, int pos0, bool full, bool profile = false);
  void student_layer_forward(int l);
  void student_layer_backward(int l, bool input_grad);
  void check_tokens(std::span<const int32_t> tokens, const char* what) const;
  // Makes `device` current for this thread (data-parallel ranks drive their GPUs from threads).
  void use_device() const { LY_CUDA_CHECK(cudaSetDevice(device)); }
};

}  // namespace lychee::cuda
