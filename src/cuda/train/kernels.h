// The kernels of the head-role trainer's student/teacher pass (cuda/train_student.h): fp32
// forward ops that keep what their backward needs, the backward of each, the attention rows
// (dense softmax, the student's selection and dense/sparse mix, and its backward), the
// distillation loss and a TF32 flash-attention forward for the dense prefill and the teacher.
// Row-major, outermost dimension first; "raw logits" are q·k without the 1/√D scale.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/common/common.h"

namespace lychee::cuda::train_ops {

// y[n] = x[n] rounded to bf16 (nearest even), as bit patterns (the bf16 prefill's product inputs).
void round_to_bf16(const float* x, uint16_t* y, size_t n, cudaStream_t s);
// The first n of each of n_blocks blocks: y[b · y_stride + i] = bf16(x[b · x_stride + i]) for
// i < n (one layer's K/V [2 n_kv_heads][ld][head_dim], rows below the keys of a call, for cuDNN).
void round_blocks_to_bf16(const float* x, size_t x_stride, uint16_t* y, size_t y_stride, int n_blocks, size_t n,
                          cudaStream_t s);
// y[n] = x[n] widened from bf16 bit patterns to f32 (exact).
void widen_bf16(const uint16_t* x, float* y, size_t n, cudaStream_t s);
// The device-side lengths of one cuDNN SDPA call of batch 1 (cuda/kernels/prefill_attention.h):
// meta[0] = 0 (the page table: one page), meta[1] = q_len, meta[2] = kv_len.
void set_sdpa_lengths(int32_t* meta, int q_len, int kv_len, cudaStream_t s);

// x[n][d] = rows of table[vocab][d] picked by tokens[n].
void embed(const int32_t* tokens, const float* table, float* x, int n, int d, cudaStream_t s);

// x[n][d] += bias[d] (when bias is not null; written back), then
// y[n][d] = x / sqrt(mean(x²) + eps) * w[d].
void bias_rmsnorm(float* x, const float* bias, const float* w, float* y, int n, int d, float eps,
                  cudaStream_t s);

// dx[n][d] += the gradient of y = rmsnorm(x) * w with respect to x, for dy[n][d].
void rmsnorm_backward(const float* x, const float* w, const float* dy, float* dx, int n, int d,
                      float eps, cudaStream_t s);

// Per row t (position pos0 + t): adds the bias to the fused projection in place, applies the
// per-head q/k RMSNorm (Qwen3) and rotate-half RoPE, writes q and the K/V cache rows.
struct QkvPostArgs {
  float* qkv;              // [n][q_dim + 2 kv_dim]: projection output; the bias is added in place
  const float* bias;       // [q_dim + 2 kv_dim] or null
  const float* q_norm;     // [head_dim] or null
  const float* k_norm;     // [head_dim] or null
  float eps;
  const float* rope_cos;   // [max_pos][head_dim / 2]
  const float* rope_sin;   // [max_pos][head_dim / 2]
  int pos0;                // position of row 0
  float* q_out;            // [n][q_dim], rotated
  float* k_cache;          // [n_kv_heads][ld_kv][head_dim]: rows pos0 .. pos0 + n - 1 written
  float* v_cache;          // [n_kv_heads][ld_kv][head_dim]
  int ld_kv;
  int n, n_heads, n_kv_heads, head_dim;
};
void qkv_post(const QkvPostArgs& a, cudaStream_t s);

// The backward of qkv_post: gradients with respect to the rotated q and the target rows' K/V
// back to the projection output (bias included; the bias itself gets none).
struct QkvPostBackwardArgs {
  const float* qkv;        // [n][q_dim + 2 kv_dim]: the forward's projection output, bias added
  const float* q_norm;     // [head_dim] or null
  const float* k_norm;     // [head_dim] or null
  float eps;
  const float* rope_cos;   // [max_pos][head_dim / 2]
  const float* rope_sin;
  int pos0;
  const float* dq;         // [n][q_dim]
  const float* dk;         // [n_kv_heads][n][head_dim]
  const float* dv;         // [n_kv_heads][n][head_dim]
  float* dqkv;             // [n][q_dim + 2 kv_dim]
  int n, n_heads, n_kv_heads, head_dim;
};
void qkv_post_backward(const QkvPostBackwardArgs& a, cudaStream_t s);

// gu[n][2 ff] (gate columns, then up) += bias (in place, bias [2 ff] or null);
// m[n][ff] = silu(gate) * up. Four elements a thread where ff % 4 == 0 and the pointers are
// 16-byte aligned, else one (silu_mul_elementwise): the same bits either way.
void silu_mul(float* gu, const float* bias, float* m, int n, int ff, cudaStream_t s);
// silu_mul one element a thread: the fallback, and the tests' reference for the other's bits.
void silu_mul_elementwise(float* gu, const float* bias, float* m, int n, int ff, cudaStream_t s);
// dgu[n][2 ff] from the forward's gu (bias included) and dm[n][ff].
void silu_mul_backward(const float* gu, const float* dm, float* dgu, int n, int ff, cudaStream_t s);

// Materialised attention rows of one layer. Query row t of head b (KV head h = b / group) sits
// at position p = pos0 + t and sees keys 0 .. p. Logits s[b][t][j] (raw) for j < n_cols
// (n_cols = pos0 + n). One block per (t, h) handles the group's query heads.
//  - dense part: softmax(scale · s) over j <= p;
//  - sparse part (mask_in not null): softmax over the set mask_in[h][t] only;
//    w = z[h] · dense + (1 − z[h]) · sparse (z null: w = dense);
//  - selection (mask_out not null): the new set of (h, t) is {p} ∪ the k − 1 positions j < p
//    with the largest group sum of raw logits (ties: lower position first),
//    k = max(1, ceil(keep_ratio · (p + 1))). A head with select_z[h] <= 0.5 (select_z not null)
//    copies its mask_in row instead.
// Bit masks: [n_kv_heads][n][mask_words] u32, bit j of row (h, t) = position j; only words
// 0 .. p / 32 of a row are written and read.
struct AttnForwardArgs {
  const float* s;          // [n_heads][n][ld] raw logits
  float* w;                // [n_heads][n][ld] mixed probabilities, zero for p < j < n_cols (may be s)
  float4* stats;           // [n_heads][n]: (max, sum) of the dense then the sparse softmax of
                           // the scaled logits, or null
  const uint32_t* mask_in;   // or null: dense rows
  uint32_t* mask_out;        // or null: no selection
  int mask_words;
  const float* z;          // [n_kv_heads] (with mask_in)
  const float* select_z;   // [n_kv_heads] or null
  float* select_keys;      // [n_kv_heads][n][ld] global scratch for the selection's group sums, or
                           // null: shared memory (n_cols × 4 bytes per block; past ~56K columns
                           // that exceeds a block's shared memory and the caller passes scratch)
  double keep_ratio;
  float scale;
  int n, n_cols, ld, pos0, n_heads, n_kv_heads;
};
void attention_forward_rows(const AttnForwardArgs& a, cudaStream_t s);
// Dynamic shared memory attention_forward_rows needs (for the caller's capacity check);
// keys_in_smem false: the selection's keys live in select_keys.
size_t attention_forward_smem_bytes(int n_cols, int mask_words, bool select, bool keys_in_smem = true);
// The most dynamic shared memory attention_forward_rows may use on this device (a block's opt-in
// limit less the kernel's static shared memory).
size_t attention_forward_smem_limit();

// The selection of attention_forward_rows apart from its rows (GpuStudentTuning::
// separate_selection): the same sets from keys[h][t][ld], the group sums of the raw logits, here
// q̄_h · k_j with q̄_h = Σ_g q_{h·group+g} (group_sum_queries, then one product per KV head)
// rather than Σ_g of the rows' logits: one product instead of a group of passes over the rows,
// and the rows kernel without the selection's shared memory (more blocks resident) and without
// its radix passes on the critical path. keys may be overwritten. Rows of a head with
// select_z[h] <= 0.5 (select_z not null) copy their mask_in row, as in attention_forward_rows.
struct SelectRowsArgs {
  float* keys;               // [n_kv_heads][n][ld]
  const uint32_t* mask_in;   // [n_kv_heads][n][mask_words] or null (with select_z null)
  uint32_t* mask_out;        // [n_kv_heads][n][mask_words]
  int mask_words;
  const float* select_z;     // [n_kv_heads] or null
  double keep_ratio;
  int n, n_cols, ld, pos0, n_kv_heads;
  // Where the radix passes find the keys: 1 a row staged in shared memory, 0 the row where it
  // lies, 2 the row where it lies for the first pass and the candidates gathered into shared
  // memory for the rest; -1 chosen (1 where two blocks fit an SM, else 0).
  int keys_mode = -1;
  int compact_cap = 0;       // keys_mode 2: the most candidates gathered (0: 8192; fewer: the tests' fallback)
};
void select_rows(const SelectRowsArgs& a, cudaStream_t s);
// qbar[t][h · head_dim + d] = Σ_g q[t][(h · group + g) · head_dim + d] (rows of ld_q floats).
void group_sum_queries(const float* q, int ld_q, float* qbar, int n, int n_kv_heads, int group, int head_dim,
                       cudaStream_t s);

// The backward of attention_forward_rows with respect to the raw logits, for
// g[b][t][j] = dout[b][t] · v_j: overwrites g with d loss / d s (scale folded in, zero for
// j > p), writes the mixed probabilities of the target columns pos0 .. pos0 + n - 1 to w_tail
// and Σ over the group of dout · (dense − sparse) to dz_part.
struct AttnBackwardArgs {
  const float* s;          // [n_heads][n][ld] raw logits
  float* g;                // [n_heads][n][ld]
  float* w_tail;           // [n_heads][n][n]
  const float4* stats;     // [n_heads][n] from the forward
  const uint32_t* mask_in; // [n_kv_heads][n][mask_words] or null (dense layer)
  int mask_words;
  const float* z;          // [n_kv_heads] (with mask_in)
  float* dz_part;          // [n_kv_heads][n] (with mask_in)
  float scale;
  int n, n_cols, ld, pos0, n_heads, n_kv_heads;
};
void attention_backward_rows(const AttnBackwardArgs& a, cudaStream_t s);

// out[h] = Σ_t part[h][t] for h < n_kv_heads.
void reduce_rows(const float* part, float* out, int n_kv_heads, int n, cudaStream_t s);

// Squared-difference loss: a[i] becomes grad_scale · (a[i] − b[i]) and *loss (on the device)
// becomes loss_scale · Σ (a − b)², summed in double. partials: [kLossBlocks] doubles.
constexpr int kLossBlocks = 264;
void squared_difference(float* a, const float* b, size_t n, float grad_scale, double loss_scale,
                        double* partials, double* loss, cudaStream_t s);

// Dense causal attention with TF32 tensor cores (fp32 in and out), for the TF32 prefill and the
// teacher (the bf16 prefill runs cuDNN's SDPA instead, GpuStudentTuning::prefill_cudnn): q[t] at position pos0 + t against keys 0 .. pos0 + t of its KV head.
// q: [n][ld_q] (head b at column b·head_dim); caches [n_kv_heads][ld_kv][head_dim]; out like q.
// When the rows alone give too few blocks to fill the GPU (the teacher's few hundred rows), the
// keys are split over up to kMaxFlashSplits blocks whose partial outputs are merged; scratch
// (null: no split) holds splits × n × (ld_out + 2 n_heads) floats.
constexpr int kMaxFlashSplits = 8;
bool flash_supported(int head_dim);
// The number of key splits flash_attention_tf32 uses (1: none).
int flash_splits(int n, int pos0, int n_heads, size_t scratch_floats, int ld_out);
void flash_attention_tf32(const float* q, int ld_q, const float* k_cache, const float* v_cache,
                          int ld_kv, float* out, int ld_out, int n, int pos0, int n_heads,
                          int n_kv_heads, int head_dim, float scale, float* scratch,
                          size_t scratch_floats, cudaStream_t s);

}  // namespace lychee::cuda::train_ops
