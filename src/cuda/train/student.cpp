// GpuStudent's pass: the dense prefill of the context, the teacher, the student's forward with
// the selection and mix, the loss and the backward (docs/trainer.md, "The pass").
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda/train/student_impl.h"

namespace lychee::cuda {

void GpuStudent::Impl::check_tokens(std::span<const int32_t> tokens, const char* what) const {
  for (size_t i = 0; i < tokens.size(); ++i)
    LY_CHECK(tokens[i] >= 0 && tokens[i] < vocab, ErrorCode::kInvalidArgument,
             "GpuStudent: {} token id {} at index {} is outside the vocabulary (size {})", what, tokens[i],
             i, vocab);
}

// Dense causal attention of rows at positions pos0 .. pos0 + n - 1 (q → att, or o_bf16 for cuDNN).
bool GpuStudent::Impl::dense_attention(int l, int n, int pos0) {
  if (in_prefill ? prefill_cudnn : teacher_cudnn) {
    sdpa_attention(l, n, pos0);
    return true;
  }
  if (use_flash) {
    ops::flash_attention_tf32(q.data(), q_dim, kc(l), vc(l), max_context, att.data(), q_dim, n, pos0,
                              n_heads, n_kv, hd, scale, flash_scratch.data(), flash_scratch.size(), stream);
    return false;
  }
  const int n_cols = pos0 + n, ld = int(round_up(size_t(n_cols), 4));
  LY_ASSERT(n <= rows_mat && ld <= ld_max);
  float* S = s_buf.data();
  per_head(l, true, true, n, n_cols, hd, q.data(), q_dim, hd, S, ld, (long long)n * ld);
  ops::AttnForwardArgs fa{};
  fa.s = S, fa.w = S, fa.mask_words = mask_words, fa.keep_ratio = opt.keep_ratio, fa.scale = scale;
  fa.n = n, fa.n_cols = n_cols, fa.ld = ld, fa.pos0 = pos0, fa.n_heads = n_heads, fa.n_kv_heads = n_kv;
  ops::attention_forward_rows(fa, stream);
  per_head(l, false, false, n, hd, n_cols, S, ld, (long long)n * ld, att.data(), q_dim, hd);
  return false;
}

// cuDNN's SDPA (batch 1, the layer's K/V as one contiguous page of ld_sdpa rows) on bf16
// copies: rows 0 .. pos0 + n − 1 of K and V rounded (K and V of a layer are adjacent, so that is
// 2 n_kv blocks of the cache), q rounded; o_bf16 [n][q_dim]. The rounding reads the visible keys
// once more in f32 (an 8B model at 32K: ~30 GB over the step's 124 calls, ~8 ms at 4 TB/s, against
// ~0.5 s of attention at cuDNN's rate).
void GpuStudent::Impl::sdpa_attention(int l, int n, int pos0) {
  const int n_keys = pos0 + n;
  LY_ASSERT(n_keys <= max_context && size_t(n) * q_dim <= q_bf16.size());
  ops::round_blocks_to_bf16(kc(l), size_t(max_context) * hd, kv_bf16.data(), size_t(ld_sdpa) * hd, 2 * n_kv,
                            size_t(n_keys) * hd, stream);
  ops::round_to_bf16(q.data(), q_bf16.data(), size_t(n) * q_dim, stream);
  ops::set_sdpa_lengths(sdpa_meta.data(), n, n_keys, stream);
  PrefillAttentionArgs a;
  a.q = reinterpret_cast<const bf16*>(q_bf16.data());
  a.k_pool = reinterpret_cast<const bf16*>(kv_bf16.data());
  a.v_pool = a.k_pool + size_t(n_kv) * ld_sdpa * hd;
  a.page_table = sdpa_meta.data();
  a.q_lens = sdpa_meta.data() + 1;
  a.kv_lens = sdpa_meta.data() + 2;
  a.out = reinterpret_cast<bf16*>(o_bf16.data());
  a.batch = 1, a.q_len_max = n, a.max_kv_len = n_keys, a.n_heads = n_heads, a.n_kv_heads = n_kv, a.head_dim = hd;
  a.page_size = ld_sdpa, a.n_pages = 1, a.max_pages = 1;
  a.scale = scale;
  a.kv_contiguous = true;
  sdpa->run(a, stream);
}

std::string GpuStudent::Impl::sdpa_backend_name() const {
  if (!sdpa) return "none";
  switch (sdpa->last_backend()) {
    case PrefillAttention::Backend::kCudnn: return "cudnn";
    case PrefillAttention::Backend::kSplitKv: return "split-kv";
    case PrefillAttention::Backend::kFallback: return "fallback (" + sdpa->fallback_reason() + ")";
  }
  return "?";
}

// One layer of the frozen model's forward over rows xr[n][d] in place; full = false stops after
// writing the layer's K/V (the prefill's last layer).
void GpuStudent::Impl::dense_layer(int l, float* xr, int n, int pos0, bool full, bool profile) {
  const LayerWeights& w = lw[size_t(l)];
  const int pl = profile ? l : -1;
  mark(pl, nullptr);
  ops::bias_rmsnorm(xr, l > 0 ? lw[size_t(l) - 1].bd : nullptr, w.attn_norm, h.data(), n, d, c.rms_eps, stream);
  linear(h.data(), w.wqkv, qkv.data(), n, d, qkv_dim, 0.0f);
  ops::qkv_post({qkv.data(), w.bqkv, w.q_norm, w.k_norm, c.rms_eps, rope_cos.data(), rope_sin.data(), pos0,
                 q.data(), kc(l), vc(l), max_context, n, n_heads, n_kv, hd},
                stream);
  if (!full) return;
  mark(pl, "teacher: norm, QKV, RoPE");
  const bool out_bf16 = dense_attention(l, n, pos0);
  mark(pl, "teacher: attention");
  if (out_bf16 && in_prefill && prefill_bf16) {
    linear_bf16(o_bf16.data(), w.wo, xr, n, q_dim, d, 1.0f);  // the O projection's input is bf16 anyway
  } else {
    if (out_bf16) ops::widen_bf16(o_bf16.data(), att.data(), size_t(n) * q_dim, stream);
    linear(att.data(), w.wo, xr, n, q_dim, d, 1.0f);
  }
  ops::bias_rmsnorm(xr, w.bo, w.ffn_norm, h.data(), n, d, c.rms_eps, stream);
  linear(h.data(), w.wgu, gu.data(), n, d, 2 * ff, 0.0f);
  ops::silu_mul(gu.data(), w.bgu, m.data(), n, ff, stream);
  linear(m.data(), w.wd, xr, n, ff, d, 1.0f);
  mark(pl, "teacher: O, norm, MLP");
}

void GpuStudent::Impl::student_layer_forward(int l) {
  const LayerWeights& w = lw[size_t(l)];
  float* xr = layer_rows(xs, l, d);
  float* x2 = layer_rows(x2s, l, d);
  float* qkvl = layer_rows(qkvs, l, qkv_dim);
  float* ql = layer_rows(qs, l, q_dim);
  float* gul = layer_rows(gus, l, 2 * ff);
  mark(l, nullptr);
  ops::bias_rmsnorm(xr, l > 0 ? lw[size_t(l) - 1].bd : nullptr, w.attn_norm, h.data(), T, d, c.rms_eps, stream);
  linear(h.data(), w.wqkv, qkvl, T, d, qkv_dim, 0.0f);
  ops::qkv_post({qkvl, w.bqkv, w.q_norm, w.k_norm, c.rms_eps, rope_cos.data(), rope_sin.data(), L, ql, kc(l),
                 vc(l), max_context, T, n_heads, n_kv, hd},
                stream);
  mark(l, "student: norm, QKV, RoPE");
  const int n_cols = L + T, ld = int(round_up(size_t(n_cols), 4));
  float* S = tuning.store_logits ? s_store.data() + size_t(l) * n_heads * max_targets * ld_max : s_buf.data();
  float* W = s_buf.data();  // in place over S unless S is kept
  per_head(l, true, true, T, n_cols, hd, ql, q_dim, hd, S, ld, (long long)T * ld);
  mark(l, "student: S = QKᵀ (GEMM)");
  const float* zl = z_dev.data() + size_t(l) * n_kv;
  ops::AttnForwardArgs fa{};
  fa.s = S, fa.w = W, fa.stats = stats.data() + size_t(l) * n_heads * max_targets;
  fa.mask_in = l >= 1 ? mask(l) : nullptr;
  fa.mask_out = l + 1 < n_layers ? mask(l + 1) : nullptr;
  fa.mask_words = mask_words, fa.z = zl;
  fa.select_z = opt.propagate_only_retrieval && l >= 1 ? zl : nullptr;
  fa.select_keys = keys_in_global ? select_keys.data() : nullptr;
  fa.keep_ratio = opt.keep_ratio, fa.scale = scale;
  fa.n = T, fa.n_cols = n_cols, fa.ld = ld, fa.pos0 = L, fa.n_heads = n_heads, fa.n_kv_heads = n_kv;
  const bool separate =
      fa.mask_out != nullptr &&
      select_separately(tuning.separate_selection, ops::attention_forward_smem_bytes(n_cols, mask_words, true),
                        device_info().smem_per_sm);
  if (separate) {
    // The keys q̄_h · k_j into the G buffer (the backward's; free until then), q̄ in dq's.
    float* qbar = dq.data();
    float* keys = g_buf.data();
    ops::group_sum_queries(ql, q_dim, qbar, T, n_kv, group, hd, stream);
    gemm(false, true, T, n_cols, hd, qbar, n_kv * hd, hd, kc(l), hd, (long long)max_context * hd, 0.0f, keys, ld,
         (long long)T * ld, n_kv);
    ops::SelectRowsArgs sa{};
    sa.keys = keys, sa.mask_in = fa.mask_in, sa.mask_out = fa.mask_out, sa.mask_words = mask_words;
    sa.select_z = fa.select_z, sa.keep_ratio = opt.keep_ratio;
    sa.n = T, sa.n_cols = n_cols, sa.ld = ld, sa.pos0 = L, sa.n_kv_heads = n_kv;
    sa.keys_mode = tuning.select_keys;
    ops::select_rows(sa, stream);
    mark(l, "student: select (q̄·Kᵀ GEMM, top-k)");
    fa.mask_out = nullptr, fa.select_z = nullptr, fa.select_keys = nullptr;  // the rows alone
    ops::attention_forward_rows(fa, stream);
    mark(l, "student: softmax, mix");
  } else {
    ops::attention_forward_rows(fa, stream);
    mark(l, "student: softmax, select, mix");
  }
  per_head(l, false, false, T, hd, n_cols, W, ld, (long long)T * ld, att.data(), q_dim, hd);
  mark(l, "student: W·V (GEMM)");
  LY_CUDA_CHECK(cudaMemcpyAsync(x2, xr, size_t(T) * d * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  linear(att.data(), w.wo, x2, T, q_dim, d, 1.0f);
  ops::bias_rmsnorm(x2, w.bo, w.ffn_norm, h.data(), T, d, c.rms_eps, stream);
  linear(h.data(), w.wgu, gul, T, d, 2 * ff, 0.0f);
  ops::silu_mul(gul, w.bgu, m.data(), T, ff, stream);
  float* x_next = layer_rows(xs, l + 1, d);
  LY_CUDA_CHECK(cudaMemcpyAsync(x_next, x2, size_t(T) * d * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  linear(m.data(), w.wd, x_next, T, ff, d, 1.0f);
  mark(l, "student: O, norm, MLP");
}

// dx: in, d loss / d (layer l's output); out, d loss / d (layer l's input) when input_grad.
// Without it the pass stops once dz of layer l is known (layer 1: no gate below it).
void GpuStudent::Impl::student_layer_backward(int l, bool input_grad) {
  const LayerWeights& w = lw[size_t(l)];
  float* qkvl = layer_rows(qkvs, l, qkv_dim);
  float* ql = layer_rows(qs, l, q_dim);
  mark(l, nullptr);
  linear_backward(dx.data(), w.wd, dm.data(), T, ff, d);
  ops::silu_mul_backward(layer_rows(gus, l, 2 * ff), dm.data(), dgu.data(), T, ff, stream);
  linear_backward(dgu.data(), w.wgu, dh.data(), T, d, 2 * ff);
  ops::rmsnorm_backward(layer_rows(x2s, l, d), w.ffn_norm, dh.data(), dx.data(), T, d, c.rms_eps, stream);
  linear_backward(dx.data(), w.wo, da.data(), T, q_dim, d);
  mark(l, "backward: MLP, O");

  const int n_cols = L + T, ld = int(round_up(size_t(n_cols), 4));
  float* G = g_buf.data();
  per_head(l, false, true, T, n_cols, hd, da.data(), q_dim, hd, G, ld, (long long)T * ld);
  mark(l, "backward: G = dO·Vᵀ (GEMM)");
  float* S = s_buf.data();
  if (tuning.store_logits) {
    S = s_store.data() + size_t(l) * n_heads * max_targets * ld_max;
  } else {
    per_head(l, true, true, T, n_cols, hd, ql, q_dim, hd, S, ld, (long long)T * ld);
    mark(l, "backward: S recomputed (GEMM)");
  }
  ops::AttnBackwardArgs ba{};
  ba.s = S, ba.g = G, ba.w_tail = w_tail.data(), ba.stats = stats.data() + size_t(l) * n_heads * max_targets;
  ba.mask_in = l >= 1 ? mask(l) : nullptr, ba.mask_words = mask_words;
  ba.z = z_dev.data() + size_t(l) * n_kv, ba.dz_part = dz_part.data(), ba.scale = scale;
  ba.n = T, ba.n_cols = n_cols, ba.ld = ld, ba.pos0 = L, ba.n_heads = n_heads, ba.n_kv_heads = n_kv;
  ops::attention_backward_rows(ba, stream);
  if (l >= 1) ops::reduce_rows(dz_part.data(), dz_dev.data() + size_t(l) * n_kv, n_kv, T, stream);
  mark(l, "backward: attention rows, dz");
  if (!input_grad) return;
  // dq_b = dS_b · K_h; dK_h = Σ_g dS_b[:, L:]ᵀ · q_b; dV_h = Σ_g W_b[:, L:]ᵀ · dout_b.
  per_head(l, true, false, T, hd, n_cols, G, ld, (long long)T * ld, dq.data(), q_dim, hd);
  for (int g = 0; g < group; ++g) {
    const float beta = g == 0 ? 0.0f : 1.0f;
    gemm(true, false, T, hd, T, G + size_t(g) * T * ld + L, ld, (long long)group * T * ld, ql + g * hd, q_dim,
         group * hd, beta, dk.data(), hd, (long long)T * hd, n_kv);
    gemm(true, false, T, hd, T, w_tail.data() + size_t(g) * T * T, T, (long long)group * T * T,
         da.data() + g * hd, q_dim, group * hd, beta, dv.data(), hd, (long long)T * hd, n_kv);
  }
  mark(l, "backward: dQ, dK, dV (GEMMs)");
  ops::qkv_post_backward({qkvl, w.q_norm, w.k_norm, c.rms_eps, rope_cos.data(), rope_sin.data(), L, dq.data(),
                          dk.data(), dv.data(), dqkv.data(), T, n_heads, n_kv, hd},
                         stream);
  linear_backward(dqkv.data(), w.wqkv, dh.data(), T, d, qkv_dim);
  ops::rmsnorm_backward(layer_rows(xs, l, d), w.attn_norm, dh.data(), dx.data(), T, d, c.rms_eps, stream);
  mark(l, "backward: RoPE, norms, QKV");
}

const train::StudentOptions& GpuStudent::options() const { return impl_->opt; }

void GpuStudent::set_context(std::span<const int32_t> tokens) {
  Impl& s = *impl_;
  s.use_device();
  const int n = int(tokens.size());  // may be 0: the targets then start at position 0
  LY_CHECK(int64_t(tokens.size()) < s.max_context, ErrorCode::kCapacity,
           "GpuStudent: a context of {} tokens leaves no room for a target in max_context {}", tokens.size(),
           s.max_context);
  s.check_tokens(tokens, "context");
  LY_CUDA_CHECK(cudaStreamSynchronize(s.stream));  // the pinned buffer may still feed an earlier copy
  s.have_context = s.have_teacher = s.have_student = false;
  std::memcpy(s.ctx_pinned.data(), tokens.data(), size_t(n) * sizeof(int32_t));
  LY_CUDA_CHECK(cudaEventRecord(s.ev[0], s.stream));
  if (n > 0)
    LY_CUDA_CHECK(cudaMemcpyAsync(s.ctx_tokens.data(), s.ctx_pinned.data(), size_t(n) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, s.stream));
  const int chunk = s.long_chunks ? s.act_rows : s.rows_mat;
  s.in_prefill = true;
  try {
    for (int c0 = 0; c0 < n; c0 += chunk) {
      const int rows = std::min(chunk, n - c0);
      ops::embed(s.ctx_tokens.data() + c0, s.embed, s.x.data(), rows, s.d, s.stream);
      for (int l = 0; l < s.n_layers; ++l) s.dense_layer(l, s.x.data(), rows, c0, l + 1 < s.n_layers);
    }
  } catch (...) {
    s.in_prefill = false;
    throw;
  }
  s.in_prefill = false;
  LY_CUDA_CHECK(cudaEventRecord(s.ev[1], s.stream));
  s.L = n;
  s.have_context = true;
}

void GpuStudent::teacher(std::span<const int32_t> targets) {
  Impl& s = *impl_;
  s.use_device();
  LY_CHECK(s.have_context, ErrorCode::kInvalidArgument, "GpuStudent: teacher() before set_context()");
  LY_CHECK(!targets.empty(), ErrorCode::kInvalidArgument, "GpuStudent: teacher() needs at least one target token");
  LY_CHECK(int64_t(targets.size()) <= s.max_targets && int64_t(s.L) + int64_t(targets.size()) <= s.max_context,
           ErrorCode::kCapacity, "GpuStudent: context of {} + {} target tokens exceeds max_context {} or max_targets {}",
           s.L, targets.size(), s.max_context, s.max_targets);
  const int n = int(targets.size());
  s.check_tokens(targets, "target");
  LY_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  s.have_teacher = s.have_student = false;
  std::memcpy(s.tgt_pinned.data(), targets.data(), size_t(n) * sizeof(int32_t));
  LY_CUDA_CHECK(cudaEventRecord(s.ev[2], s.stream));
  LY_CUDA_CHECK(cudaMemcpyAsync(s.tgt_tokens.data(), s.tgt_pinned.data(), size_t(n) * sizeof(int32_t),
                                cudaMemcpyHostToDevice, s.stream));
  ops::embed(s.tgt_tokens.data(), s.embed, s.x.data(), n, s.d, s.stream);
  s.n_marks = 0;
  for (int l = 0; l < s.n_layers; ++l) s.dense_layer(l, s.x.data(), n, s.L, true, true);
  const bool logits = s.opt.loss == train::DistillLoss::kLogits;
  float* hidden = logits ? s.hfin.data() : s.teacher_out.data();
  ops::bias_rmsnorm(s.x.data(), s.lw.back().bd, s.out_norm, hidden, n, s.d, s.c.rms_eps, s.stream);
  if (logits) s.linear(hidden, s.output, s.teacher_out.data(), n, s.d, s.vocab, 0.0f);
  LY_CUDA_CHECK(cudaEventRecord(s.ev[3], s.stream));
  s.T = n;
  s.have_teacher = true;
}

double GpuStudent::student(std::span<const float> z, std::span<float> dz) {
  Impl& s = *impl_;
  s.use_device();
  LY_CHECK(s.have_teacher, ErrorCode::kInvalidArgument, "GpuStudent: student() before teacher()");
  const size_t n_gates = size_t(s.n_layers) * s.n_kv;
  LY_CHECK(z.size() == n_gates, ErrorCode::kInvalidArgument,
           "GpuStudent: z has {} values, expected n_layers * n_kv_heads = {}", z.size(), n_gates);
  LY_CHECK(dz.empty() || dz.size() == n_gates, ErrorCode::kInvalidArgument,
           "GpuStudent: dz has {} values, expected {} (or 0 for the forward only)", dz.size(), n_gates);
  for (size_t i = 0; i < n_gates; ++i)
    LY_CHECK(std::isfinite(z[i]) && z[i] >= 0.0f && z[i] <= 1.0f, ErrorCode::kInvalidArgument,
             "GpuStudent: z[{}] (layer {}, KV head {}) = {} is outside [0, 1]", i, i / s.n_kv, i % s.n_kv, z[i]);
  const int T = s.T;
  std::memcpy(s.z_pinned.data(), z.data(), n_gates * sizeof(float));
  LY_CUDA_CHECK(cudaEventRecord(s.ev[4], s.stream));
  LY_CUDA_CHECK(cudaMemcpyAsync(s.z_dev.data(), s.z_pinned.data(), n_gates * sizeof(float), cudaMemcpyHostToDevice,
                                s.stream));
  LY_CUDA_CHECK(cudaMemsetAsync(s.dz_dev.data(), 0, n_gates * sizeof(float), s.stream));
  ops::embed(s.tgt_tokens.data(), s.embed, s.xs.data(), T, s.d, s.stream);
  for (int l = 0; l < s.n_layers; ++l) s.student_layer_forward(l);
  float* x_final = s.layer_rows(s.xs, s.n_layers, s.d);
  ops::bias_rmsnorm(x_final, s.lw.back().bd, s.out_norm, s.hfin.data(), T, s.d, s.c.rms_eps, s.stream);
  LY_CUDA_CHECK(cudaEventRecord(s.ev[5], s.stream));

  // Layer 0 has no gate: the backward stops at layer 1's attention (nothing at all with one layer).
  const bool backward = !dz.empty() && s.n_layers >= 2;
  const float* dh_final = s.hfin.data();
  if (s.opt.loss == train::DistillLoss::kLogits) {
    s.linear(s.hfin.data(), s.output, s.logits.data(), T, s.d, s.vocab, 0.0f);
    ops::squared_difference(s.logits.data(), s.teacher_out.data(), size_t(T) * s.vocab, 2.0f / float(T),
                            1.0 / double(T), s.loss_partials.data(), s.loss_dev.data(), s.stream);
    if (backward) s.linear_backward(s.logits.data(), s.output, s.dh.data(), T, s.d, s.vocab);
    dh_final = s.dh.data();
  } else {
    const double td = double(T) * s.d;
    ops::squared_difference(s.hfin.data(), s.teacher_out.data(), size_t(T) * s.d, float(2.0 / td), 1.0 / td,
                            s.loss_partials.data(), s.loss_dev.data(), s.stream);
  }
  if (backward) {
    LY_CUDA_CHECK(cudaMemsetAsync(s.dx.data(), 0, size_t(T) * s.d * sizeof(float), s.stream));
    ops::rmsnorm_backward(x_final, s.out_norm, dh_final, s.dx.data(), T, s.d, s.c.rms_eps, s.stream);
  }
  LY_CUDA_CHECK(cudaEventRecord(s.ev[6], s.stream));
  for (int l = s.n_layers - 1; l >= 1 && backward; --l) s.student_layer_backward(l, l >= 2);
  LY_CUDA_CHECK(cudaEventRecord(s.ev[7], s.stream));
  LY_CUDA_CHECK(cudaMemcpyAsync(s.dz_pinned.data(), s.dz_dev.data(), n_gates * sizeof(float), cudaMemcpyDeviceToHost,
                                s.stream));
  LY_CUDA_CHECK(cudaMemcpyAsync(s.loss_pinned.data(), s.loss_dev.data(), sizeof(double), cudaMemcpyDeviceToHost,
                                s.stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  if (!dz.empty()) std::memcpy(dz.data(), s.dz_pinned.data(), n_gates * sizeof(float));
  s.have_student = true;
  return s.loss_pinned[0];
}

std::vector<float> GpuStudent::teacher_outputs() const {
  const Impl& s = *impl_;
  s.use_device();
  LY_CHECK(s.have_teacher, ErrorCode::kInvalidArgument, "GpuStudent: no teacher outputs yet");
  const size_t width = s.opt.loss == train::DistillLoss::kLogits ? size_t(s.vocab) : size_t(s.d);
  std::vector<float> out(size_t(s.T) * width);
  LY_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  LY_CUDA_CHECK(cudaMemcpy(out.data(), s.teacher_out.data(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

std::vector<std::vector<int32_t>> GpuStudent::selected_sets(int layer) const {
  Impl& s = *impl_;
  s.use_device();
  LY_CHECK(s.have_student, ErrorCode::kInvalidArgument, "GpuStudent: no student pass yet");
  LY_CHECK(layer >= 1 && layer < s.n_layers, ErrorCode::kInvalidArgument,
           "GpuStudent: layer {} has no sparse part (layers 1 to {})", layer, s.n_layers - 1);
  std::vector<uint32_t> words(size_t(s.n_kv) * s.max_targets * s.mask_words);
  LY_CUDA_CHECK(cudaMemcpy(words.data(), s.mask(layer), words.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  std::vector<std::vector<int32_t>> sets(size_t(s.n_kv) * s.T);
  for (int h = 0; h < s.n_kv; ++h)
    for (int t = 0; t < s.T; ++t) {
      const uint32_t* row = words.data() + (size_t(h) * s.T + t) * s.mask_words;
      for (int j = 0; j <= s.L + t; ++j)
        if ((row[j >> 5] >> (j & 31)) & 1u) sets[size_t(h) * s.T + t].push_back(j);
    }
  return sets;
}

std::string GpuStudent::sdpa_backend() const { return impl_->sdpa_backend_name(); }

std::vector<float> GpuStudent::context_kv(int layer) const {
  Impl& s = *impl_;
  s.use_device();
  LY_CHECK(s.have_context, ErrorCode::kInvalidArgument, "GpuStudent: context_kv() before set_context()");
  LY_CHECK(layer >= 0 && layer < s.n_layers, ErrorCode::kInvalidArgument, "GpuStudent: layer {} of {}", layer,
           s.n_layers);
  const size_t row = size_t(s.L) * s.hd;  // one KV head's context rows
  std::vector<float> out(2 * size_t(s.n_kv) * row);
  LY_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  if (row > 0)
    LY_CUDA_CHECK(cudaMemcpy2D(out.data(), row * sizeof(float), s.kc(layer), size_t(s.max_context) * s.hd * sizeof(float),
                               row * sizeof(float), 2 * size_t(s.n_kv), cudaMemcpyDeviceToHost));
  return out;
}

GpuStudentTimes GpuStudent::last_times() const {
  const Impl& s = *impl_;
  s.use_device();
  LY_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  auto ms = [&](int a, int b, bool valid) {
    float t = 0.0f;
    if (valid && cudaEventElapsedTime(&t, s.ev[a], s.ev[b]) != cudaSuccess) {
      cudaGetLastError();  // not sticky; keep it from surfacing at the next launch check
      t = 0.0f;
    }
    return double(t);
  };
  GpuStudentTimes r;
  r.context_ms = ms(0, 1, s.have_context);
  r.teacher_ms = ms(2, 3, s.have_teacher);
  r.student_forward_ms = ms(4, 5, s.have_student);
  r.student_loss_ms = ms(5, 6, s.have_student);
  r.student_backward_ms = ms(6, 7, s.have_student);
  for (int i = 1; i < s.n_marks; ++i) {
    if (s.mark_names[i] == nullptr) continue;
    float t = 0.0f;
    LY_CUDA_CHECK(cudaEventElapsedTime(&t, s.marks[i - 1], s.marks[i]));
    r.layer_ops.emplace_back(s.mark_names[i], double(t));
  }
  return r;
}

void GpuStudent::synchronize() const {
  impl_->use_device();
  LY_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}

}  // namespace lychee::cuda
