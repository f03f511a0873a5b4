// The forward pass of the GPU runner: per layer the fused QKV product, bias/q-k norm/RoPE/KV
// append, attention (cuDNN prefill, or the hybrid-head decode kernel with the policy's plans and
// selections), the output product and the SwiGLU MLP.
#include <algorithm>
#include <cmath>

#include "attention/tp_assign.h"
#include "cuda/kernels/bf16_gemv.h"
#include "cuda/kernels/decode_attention.h"
#include "cuda/kernels/fp8_gemv.h"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/select.h"
#include "cuda/runner/runner_impl.h"

namespace lychee::cuda {

void Shard::decode_attention_layer(int layer, int batch, int rows) {
  const int pat = pattern_of(layer);
  const bool window = step_policy && policy->spec.window_recent > 0;
  const bool verify = rows > 1;  // dense items only: no policy field (check_decode_args)
  DecodeAttentionArgs a{};
  a.q = q.data();
  a.k_pool = pool->k(layer);  // bf16 KV, or the FP8 codes and scales (the others null)
  a.v_pool = pool->v(layer);
  a.k8_pool = pool->k8(layer);
  a.v8_pool = pool->v8(layer);
  a.k_scale = pool->k_scale(layer);
  a.v_scale = pool->v_scale(layer);
  a.block_table = decode_table.data();
  a.max_pages = max_pages;
  a.unit_lists = verify ? nullptr : lists.data();
  a.list_counts = verify ? nullptr : list_counts.data();
  a.seq_lens = meta_dev<int32_t>(meta.seq_lens);
  a.items = meta_dev<DecodeWorkItem>(meta.items);
  a.item_offset = meta_dev<int32_t>(meta.item_offset) + pat;
  a.n_items = meta_dev<int32_t>(meta.n_items) + pat;
  a.merge_begin = meta_dev<int32_t>(meta.merge_begin) + size_t(pat) * meta.merge_stride;
  a.merge_count = meta_dev<int32_t>(meta.merge_count) + size_t(pat) * meta.merge_stride;
  a.scores = verify ? nullptr : scores.data();
  a.score_stride = policy ? policy->score_stride : 1;
  a.token_reads = step_policy ? token_reads.data() : nullptr;
  a.window_sink = window ? policy->spec.window_sink : 0;
  a.window_recent = window ? policy->spec.window_recent : 0;
  a.partial_o = partial_o.data();
  a.partial_lse = partial_lse.data();
  a.out = att.data();
  a.batch = batch;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.page_size = o.page_size;
  a.max_items = max_items;
  a.invariant_merge = invariant;
  a.scale = 1.0f / std::sqrt(float(c.head_dim));
  a.rows_per_seq = rows;
  decode_attention(a, stream);
}

void Shard::attention(int layer, bool decode, int batch, int q_len, int max_kv_len) {
  if (decode) return decode_attention_layer(layer, batch, q_len);
  PrefillAttentionArgs a{};
  a.q = q.data();
  a.k_pool = pool->k(layer);
  a.v_pool = pool->v(layer);
  a.k8_pool = pool->k8(layer);
  a.v8_pool = pool->v8(layer);
  a.k_scale = pool->k_scale(layer);
  a.v_scale = pool->v_scale(layer);
  a.page_table = meta_dev<int32_t>(meta.block_table);
  a.q_lens = meta_dev<int32_t>(meta.q_lens);
  a.kv_lens = meta_dev<int32_t>(meta.seq_lens);
  a.out = att.data();
  a.batch = 1;
  a.q_len_max = q_len;
  a.max_kv_len = max_kv_len;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.page_size = o.page_size;
  a.n_pages = pool->n_pages();
  a.max_pages = max_pages;
  a.scale = 1.0f / std::sqrt(float(c.head_dim));
  const std::vector<int> parts = prefill_attention_parts(q_len, o.prefill_attn_pow2_tail);
  if (parts.size() == 1) return prefill_attn->run(a, stream);
  // In parts (GpuRunner::prefill wrote each part's lengths): part j's queries are rows [off, off +
  // p_j) of the pass and see the cache up to their own end, as in one run over the whole pass.
  const size_t row = size_t(c.n_heads) * c.head_dim;
  const int prefix = max_kv_len - q_len;
  int off = 0;
  for (size_t j = 0; j < parts.size(); ++j) {
    PrefillAttentionArgs b = a;
    b.q = q.data() + size_t(off) * row;
    b.out = att.data() + size_t(off) * row;
    b.q_lens = meta_dev<int32_t>(meta.attn_parts) + 2 * j;
    b.kv_lens = meta_dev<int32_t>(meta.attn_parts) + 2 * j + 1;
    b.q_len_max = parts[j];
    b.max_kv_len = prefix + off + parts[j];
    prefill_attn->run(b, stream);
    off += parts[j];
  }
}

// y[n][w.rows] = x[n][w.cols] · wᵀ, bf16 in and out, f32 sums. bf16 weights: cuBLASLt. FP8
// weights (fp8_gemv_launches): decode-sized products through the FP8 GEMV, groups of up to 8 rows
// (each row's sums are the same whatever the group: fp8_gemv.h), exact code x bf16 products
// scaled once per output; larger ones (prefill chunks, large batches) widen the matrix to bf16
// (bf16(code · scale): one rounding per weight, as bf16 weights have) into `dequant` and use
// cuBLASLt, in stream order, so one scratch serves every matrix. With fp8_prefill_gemm those take
// cuBLASLt's FP8 GEMM instead: the activation rows quantised to e4m3 with a scale per row into
// `act8` (one more rounding of every input row), both operands' scales applied by cuBLASLt (outer
// vectors), no widening; the widening stays the fallback where cuBLASLt has no such product.
namespace {

// The FP8 GEMV's launches over n rows: f(first row, rows) per group of up to kFp8GemvMaxRows.
template <typename F>
void fp8_row_groups(int n, F&& f) {
  for (int i = 0; i < n; i += kFp8GemvMaxRows) f(i, std::min(kFp8GemvMaxRows, n - i));
}

}  // namespace

void Shard::linear(const GpuMatrix& w, const bf16* x, bf16* y, int n) {
  // A chunked verification step (fused, n past the fused rows; only the first layer's QKV without
  // the RoPE epilogue comes here): groups of the rows a one-row step's product takes the same
  // path for (the bf16 GEMV's rows, the FP8 GEMV's, or one row for cuBLASLt), so each row gets
  // that step's bits.
  if (fused && n > o.fused_decode_max_rows) {
    const int g = w.fp8() ? kFp8GemvMaxRows
                          : (gemv_fits(w, x, 1) ? std::min(o.bf16_gemv_max_rows, kBf16GemvMaxRows) : 1);
    if (n > g) {
      for (int i = 0; i < n; i += g)
        linear(w, x + size_t(i) * size_t(w.cols), y + size_t(i) * size_t(w.rows), std::min(g, n - i));
      return;
    }
  }
  if (!w.fp8() && gemv_fits(w, x, n))
    return fused_product(w, x, false, GemvOut::kBf16, y, nullptr, n);
  if (!w.fp8()) return gemm->bf16_out(x, w.values, y, n, w.cols, w.rows);
  if (o.fp8_gemv && fp8_gemv_launches(n) > 0) {
    fp8_row_groups(n, [&](int i, int rows) {
      fp8_gemv(x + size_t(i) * size_t(w.cols), w.codes, w.scales, y + size_t(i) * size_t(w.rows), rows, w.cols,
               w.rows, stream);
    });
    return;
  }
  if (o.fp8_prefill_gemm && act8.size() >= size_t(n) * size_t(w.cols)) {
    quantize_activations_e4m3(x, act8.data(), act8_scales.data(), n, w.cols, stream);
    if (gemm->fp8_bf16_out(act8.data(), act8_scales.data(), w.codes, w.scales, y, n, w.cols, w.rows)) return;
  }
  dequantize_e4m3(w.codes, w.scales, dequant.data(), w.rows, w.cols, stream);
  gemm->bf16_out(x, dequant.data(), y, n, w.cols, w.rows);
}

bool Shard::gemv_weights_fit(const GpuMatrix& m) const {
  return m.fp8() ? o.fp8_gemv && m.scales != nullptr && bf16_gemv_weights_fit(m.codes, m.cols, true)
                 : bf16_gemv_weights_fit(m.values, m.cols, false);
}

bool Shard::gemv_fits(const GpuMatrix& w, const bf16* x, int n) const {
  const void* weights = w.fp8() ? static_cast<const void*>(w.codes) : w.values;
  return (w.fp8() || n <= o.bf16_gemv_max_rows) && gemv_weights_fit(w) && bf16_gemv_fits(x, weights, n, w.cols, w.fp8());
}

bool Shard::gemv_epilogue(const GpuMatrix& w, const bf16* x, int n, int bit) const {
  return (o.gemv_epilogues & bit) != 0 && gemv_fits(w, x, n);
}

void Shard::fused_product(const GpuMatrix& w, const bf16* x, bool normed, GemvOut out, void* y, const float* bias,
                          int n, const float* next_norm, int pdl_bit, const Bf16GemvRope* rope) {
  // A verification step past the kernel's rows (GpuRunner::Impl::forward's chunked case): one
  // call per chunk of up to fused_decode_max_rows rows, each reading and writing only its own rows
  // of every buffer (x, x_lo, ss, y, xn, xn_lo, ss_out, the RoPE rows' positions and K/V slots),
  // so no chunk reads what another wrote. A row's bits depend only on k (bf16_gemv.h), so each
  // row gets what a one-row decode step gives it. Products the kernel takes whole stay one call.
  const int chunk = n <= kBf16GemvMaxRows ? n : std::clamp(o.fused_decode_max_rows, 1, kBf16GemvMaxRows);
  const size_t ss_in = size_t(bf16_gemv_ss_count(c.d_model)), ss_next = size_t(bf16_gemv_ss_count(w.rows));
  // y's row: bf16 [m] (kBf16), f32 [m] (kF32, kAddF32), bf16 [m / 2] (kSwiGlu), bf16 q
  // [n_heads][head_dim] (kQkvRope).
  const size_t y_row_bytes = out == GemvOut::kF32 || out == GemvOut::kAddF32 ? size_t(w.rows) * 4
                             : out == GemvOut::kSwiGlu                     ? size_t(w.rows / 2) * 2
                             : out == GemvOut::kQkvRope && rope != nullptr
                                 ? size_t(rope->n_heads) * size_t(rope->head_dim) * 2
                                 : size_t(w.rows) * 2;
  for (int i = 0; i < n; i += chunk) {
    const size_t r = size_t(i);
    Bf16GemvArgs a;
    a.x = x + r * size_t(w.cols);
    if (normed) {  // x is h [n][d_model]: its residues and sums of squares have its rows
      // FP8 products take the rounded input alone (bf16_gemv.h).
      a.x_lo = w.fp8() ? nullptr : h_lo.data() + r * size_t(c.d_model);
      a.ss = ss_part.data() + r * ss_in;
      a.ss_count = int(ss_in);
      a.eps = c.rms_eps;
    }
    if (w.fp8())
      a.w8 = w.codes, a.w_scale = w.scales;
    else
      a.w = w.values;
    a.out = out;
    a.y = static_cast<uint8_t*>(y) + r * y_row_bytes;
    a.bias = bias;
    if (next_norm != nullptr) {  // the residual add: xn is h [n][m], m = d_model
      a.next_norm = next_norm;
      a.xn = h.data() + r * size_t(w.rows);
      a.xn_lo = h_lo.data() + r * size_t(w.rows);
      a.ss_out = ss_part.data() + r * ss_next;
    }
    if (rope != nullptr) {
      a.rope = *rope;
      a.rope.positions += i;
      a.rope.kv_page += i;
      a.rope.kv_row += i;
    }
    a.n = std::min(chunk, n - i);
    a.k = w.cols;
    a.m = w.rows;
    if ((o.fused_pdl_products & pdl_bit) != 0) a.pdl = 1;
    bf16_gemv(a, stream);
  }
}

// The phases of a forward pass on this shard. A decode step first applies the step's
// block-table changes; with the policy, a layer's selections run on a side stream (a parallel
// branch of the graph) beside the next layer's projections and MLP, and the next layer's
// attention waits for them (it reads their lists and rewrites the scores).
void Shard::join() {
  if (!forked) return;
  LY_CUDA_CHECK(cudaEventRecord(join_event, side));
  LY_CUDA_CHECK(cudaStreamWaitEvent(stream, join_event));
  forked = false;
}

void Shard::forward_begin(int n, bool decode) {
  use();
  if (decode)
    scatter_pairs(decode_table.data(), meta_dev<int32_t>(meta.deltas), meta_dev<int32_t>(meta.n_deltas),
                  o.max_batch * max_pages, stream);
  forked = false;
  embed(meta_dev<int32_t>(meta.tokens), w->embed, x.data(), n, c.d_model, stream);
  add_rmsnorm(x.data(), nullptr, nullptr, w->layers[0].attn_norm, h.data(), n, c.d_model, c.rms_eps, stream);
}

void Shard::attention_block(int l, int n, bool decode, int batch, int q_len, int max_kv_len) {
  use();
  const GpuLayerWeights& L = w->layers[size_t(l)];
  // h: the embedding's norm (layer 0) or the last residual add's bf16(attn_norm · x) with its sums
  // of squares. The fused layers without q/k norms append K/V in the QKV product's epilogue, and so
  // does the plain bf16 GEMV where the layers are not fused (h: add_rmsnorm's output). FP8 pages
  // take qkv_rope_append: a token's scale needs the whole head's values, which the epilogue's
  // blocks (16 of them each) do not hold.
  const bool rope_epilogue = !pool->fp8() && L.q_norm == nullptr && L.k_norm == nullptr && c.head_dim % 16 == 0 &&
                             (fused ? o.fused_qkv_rope : gemv_epilogue(L.wqkv, h.data(), n, RunnerOptions::kEpilogueRope));
  if (rope_epilogue) {
    Bf16GemvRope rope;
    rope.positions = meta_dev<int32_t>(meta.positions);
    rope.kv_page = meta_dev<int32_t>(meta.kv_page);
    rope.kv_row = meta_dev<int32_t>(meta.kv_row);
    rope.inv_freq = w->inv_freq;
    rope.k_pool = pool->k(l);
    rope.v_pool = pool->v(l);
    rope.n_heads = c.n_heads, rope.n_kv_heads = c.n_kv_heads, rope.head_dim = c.head_dim;
    rope.page_size = o.page_size;
    fused_product(L.wqkv, h.data(), fused && l > 0, GemvOut::kQkvRope, q.data(), L.bqkv, n, nullptr,
                  fused ? RunnerOptions::kPdlQkv : 0, &rope);
  } else {
    if (fused && l > 0)
      fused_product(L.wqkv, h.data(), true, GemvOut::kBf16, qkv.data(), nullptr, n, nullptr, RunnerOptions::kPdlQkv);
    else
      linear(L.wqkv, h.data(), qkv.data(), n);
    QkvArgs qa{qkv.data(), L.bqkv, L.q_norm, L.k_norm, c.rms_eps, meta_dev<int32_t>(meta.positions),
               meta_dev<int32_t>(meta.kv_page), meta_dev<int32_t>(meta.kv_row), w->inv_freq, q.data(),
               pool->k(l), pool->v(l), n, c.n_heads, c.n_kv_heads, c.head_dim, o.page_size,
               pool->k8(l), pool->v8(l), pool->k_scale(l), pool->v_scale(l)};
    qkv_rope_append(qa, stream);
  }
  join();
  const bool timed = !attn_events.empty();
  if (timed) LY_CUDA_CHECK(cudaEventRecord(attn_events[size_t(2 * l)], stream));
  if (decode && step_policy) select_before(l, batch);
  attention(l, decode, batch, q_len, max_kv_len);
  if (timed) LY_CUDA_CHECK(cudaEventRecord(attn_events[size_t(2 * l + 1)], stream));
  if (decode && step_policy && select_after_needed(l)) {
    LY_CUDA_CHECK(cudaEventRecord(fork_event, stream));
    LY_CUDA_CHECK(cudaStreamWaitEvent(side, fork_event));
    select_after(l, batch, side);
    forked = true;
  }
  if (fused)  // x += att · woᵀ + bo; h = bf16(ffn_norm · x) and its sums of squares
    fused_product(L.wo, att.data(), false, GemvOut::kAddF32, x.data(), L.bo, n, L.ffn_norm, RunnerOptions::kPdlOutput);
  else
    linear(L.wo, att.data(), o_buf.data(), n);
}

void Shard::mlp_block(int l, int n) {
  use();
  const GpuLayerWeights& L = w->layers[size_t(l)];
  if (fused) {  // act = SwiGLU(RMSNorm(x) · w_gate_upᵀ + b_gate_up); x += act · w_downᵀ + b_down
    fused_product(L.w_gate_up, h.data(), true, GemvOut::kSwiGlu, act.data(), L.b_gate_up, n, nullptr,
                  RunnerOptions::kPdlGateUp);
    fused_product(L.w_down, act.data(), false, GemvOut::kAddF32, x.data(), L.b_down, n, norm_after(l),
                  RunnerOptions::kPdlDown);
    return;
  }
  add_rmsnorm(x.data(), o_buf.data(), L.bo, L.ffn_norm, h.data(), n, c.d_model, c.rms_eps, stream);
  if (gemv_epilogue(L.w_gate_up, h.data(), n, RunnerOptions::kEpilogueSwiGlu)) {
    fused_product(L.w_gate_up, h.data(), false, GemvOut::kSwiGlu, act.data(), L.b_gate_up, n);
  } else {
    linear(L.w_gate_up, h.data(), gu.data(), n);
    silu_mul(gu.data(), L.b_gate_up, act.data(), n, c.d_ff, stream);
  }
  linear(L.w_down, act.data(), o_buf.data(), n);
}

void Shard::residual(int l, int n) {
  use();
  if (fused) return;  // the down product added its output to x
  const GpuLayerWeights& L = w->layers[size_t(l)];
  add_rmsnorm(x.data(), o_buf.data(), L.b_down, norm_after(l), h.data(), n, c.d_model, c.rms_eps, stream);
}

// The logits of the last `rows` rows (with `logits`: rank 0 alone computes them).
void Shard::forward_end(int n, bool decode, bool logits_wanted, int rows) {
  use();
  join();
  if (!logits_wanted) return;
  const int d = c.d_model;
  (void)decode;
  if (fused)  // h: the last residual add's bf16(out_norm · x) (decode: rows = n)
    return fused_product(lm_head(), h.data(), true, GemvOut::kF32, logits.data(), nullptr, rows);
  const bf16* last = h.data() + size_t(n - rows) * d;
  if (w->output8.fp8() && o.fp8_gemv && fp8_gemv_launches(rows) > 0) {
    fp8_row_groups(rows, [&](int i, int k) {
      fp8_gemv_f32_out(last + size_t(i) * d, w->output8.codes, w->output8.scales,
                       logits.data() + size_t(i) * c.vocab_size, k, d, c.vocab_size, stream);
    });
    return;
  }
  gemm->f32_out(last, w->output, logits.data(), rows, d, c.vocab_size);
}

// n tokens through every layer, every shard's phases in turn; under tensor parallelism each
// attention's and each MLP's o_buf (a partial sum over the rank's heads or MLP slice) is summed
// over the ranks by an in-place NCCL all-reduce before the residual add, so x stays the same on
// every rank. Biases of the output and down products are added once, after the sum.
void GpuRunner::Impl::forward(int n, bool decode, int batch, int q_len, int max_kv_len, int rows) {
  // The fused decode layers: one GPU (the residual adds sit where the all-reduces would go). A
  // verification step (q_len > 1) past their rows runs them too, every product over chunks of
  // those rows (Shard::fused_product), so that each row equals a one-row decode step's bit for
  // bit (RunnerOptions::fused_verify_chunks); a plain decode step past them keeps cuBLASLt (one
  // pass over the weights). The choice is fixed for a (batch, rows) graph key: the options do not
  // change after construction.
  const int fr = fused_rows();
  const bool fused = decode && fr > 0 && (n <= fr || (q_len > 1 && o.fused_verify_chunks));
  for (auto& s : shards) s->fused = fused;
  for (auto& s : shards) s->forward_begin(n, decode);
  for (int l = 0; l < c.n_layers; ++l) {
    for (auto& s : shards) s->attention_block(l, n, decode, batch, q_len, max_kv_len);
    all_reduce(n);
    for (auto& s : shards) s->mlp_block(l, n);
    all_reduce(n);
    for (auto& s : shards) s->residual(l, n);
  }
  const bool split = vocab_part > 0;
  for (auto& s : shards) s->forward_end(n, decode, s->rank == 0 && !split, rows);
  if (split) split_lm_head(n, rows);
}

// Rank r: logits of vocabulary rows [r V', r V' + count_r) for the last `rows` rows of h, into
// lm_local [rows][count_r]; gathered (NCCL, or on one device rank 0 reads the others' buffers)
// and laid out in rank 0's logits [rows][V].
void GpuRunner::Impl::split_lm_head(int n, int rows) {
  const int d = c.d_model, V = c.vocab_size, Vp = vocab_part;
  auto count_of = [&](int r) { return tp_vocab_rows(V, size(), r).count; };
  for (auto& sp : shards) {
    Shard& s = *sp;
    s.use();
    const int cnt = count_of(s.rank);
    if (cnt > 0)
      s.gemm->f32_out(s.h.data() + size_t(n - rows) * d, s.w->output + size_t(s.rank) * Vp * d, s.lm_local.data(), rows,
                      d, cnt);
  }
  Shard& s0 = lead();
  if (comm) {
    std::vector<const void*> send;
    std::vector<void*> recv;
    for (auto& sp : shards) {
      send.push_back(sp->lm_local.data());
      recv.push_back(sp->lm_gathered.data());
    }
    const std::vector<cudaStream_t> st = streams();
    comm->all_gather(send, recv, size_t(rows) * size_t(Vp), ReduceType::kF32, st);
  }
  s0.use();
  for (auto& sp : shards) {
    Shard& s = *sp;
    const int cnt = count_of(s.rank);
    if (cnt == 0) continue;
    const float* src = comm ? s0.lm_gathered.data() + size_t(s.rank) * size_t(rows) * Vp : s.lm_local.data();
    if (!comm && s.rank != 0) {  // one device: rank 0 reads rank r's buffer once it is written
      LY_CUDA_CHECK(cudaEventRecord(s.reduce_event, s.stream));
      LY_CUDA_CHECK(cudaStreamWaitEvent(s0.stream, s.reduce_event));
    }
    LY_CUDA_CHECK(cudaMemcpy2DAsync(s0.logits.data() + size_t(s.rank) * Vp, size_t(V) * 4, src, size_t(cnt) * 4,
                                    size_t(cnt) * 4, size_t(rows), cudaMemcpyDeviceToDevice, s0.stream));
  }
}

void GpuRunner::Impl::all_reduce(int n) {
  if (o.tp_one_device) return one_device_sum(n);
  if (!comm) return;
  std::vector<void*> bufs;
  for (auto& s : shards) bufs.push_back(s->o_buf.data());
  const std::vector<cudaStream_t> st = streams();
  comm->all_reduce_sum_in_place(bufs, size_t(n) * size_t(c.d_model), ReduceType::kBf16, st);
}

// Page bounds (Quest): the page metadata of the chunks that changed, the bound scores, and the
// per-query-head selection this layer reads.
void Shard::select_before(int layer, int batch) {
  if (!policy->layers[size_t(layer)].page_bound) return;
  QuestArgs qa{};
  qa.k_pool = pool->k(layer);
  qa.k8_pool = pool->k8(layer);
  qa.k_scale = pool->k_scale(layer);
  qa.kmin = quest_min.data() + size_t(layer) * quest_layer_elems;
  qa.kmax = quest_max.data() + size_t(layer) * quest_layer_elems;
  qa.block_table = decode_table.data();
  qa.max_pages = max_pages;
  qa.seq_lens = meta_dev<int32_t>(meta.seq_lens);
  qa.from = meta_dev<int32_t>(meta.quest_from);
  qa.q = q.data();
  qa.scores = scores.data();
  qa.score_stride = policy->score_stride;
  qa.n_heads = c.n_heads;
  qa.n_kv_heads = c.n_kv_heads;
  qa.head_dim = c.head_dim;
  qa.page_size = o.page_size;
  qa.qpage = policy->spec.unit;
  quest_update(qa, batch, stream);
  quest_scores(qa, batch, stream);
  run_selection(layer, batch, stream);
}

// After the layer's attention: the selections of its selector heads (from the scores the
// attention kernel just wrote), and the union count of per-query-head reads.
bool Shard::select_after_needed(int layer) const {
  const KernelLayer& kl = policy->layers[size_t(layer)];
  return (!kl.page_bound && kl.n_sel > 0) || kl.union_count;
}

void Shard::select_after(int layer, int batch, cudaStream_t s) {
  const KernelLayer& kl = policy->layers[size_t(layer)];
  if (!kl.page_bound) run_selection(layer, batch, s);
  if (!kl.union_count) return;
  UnionReadsArgs ua{};
  ua.lists = lists.data();
  ua.counts = list_counts.data();
  ua.list_stride = policy->list_stride;
  ua.unit = policy->spec.unit;
  ua.max_units = policy->list_stride;
  ua.seq_lens = meta_dev<int32_t>(meta.seq_lens);
  ua.n_heads = c.n_heads;
  ua.n_kv_heads = c.n_kv_heads;
  ua.token_reads = token_reads.data();
  count_union_reads(ua, batch, s);
}

void Shard::run_selection(int layer, int batch, cudaStream_t s) {
  const KernelLayer& kl = policy->layers[size_t(layer)];
  if (kl.n_sel == 0) return;
  const SelectParams& p = policy->spec.select;
  SelectArgs sa{};
  sa.scores = scores.data();
  sa.score_stride = policy->score_stride;
  sa.score_unit = policy->score_unit;
  sa.unit = policy->spec.unit;
  sa.seq_lens = meta_dev<int32_t>(meta.seq_lens);
  sa.heads = sel_heads.data() + kl.sel_offset;
  sa.n_select = kl.n_sel;
  sa.row_heads = policy->row_heads;
  sa.lists = lists.data();
  sa.counts = list_counts.data();
  sa.unit_scores = unit_scores.data();
  sa.list_stride = policy->list_stride;
  sa.strategy = p.strategy;
  sa.budget = p.budget;
  sa.value = p.value;
  sa.sink = p.sink;
  sa.recent = p.recent;
  sa.scale = policy->spec.prob_scale;
  select_units(sa, batch, s);
}

// Every rank's o_buf on one device: rank 0 adds the others' in rank order, then every rank
// copies the sum, and rank 0 goes on once they have (events order the streams).
void GpuRunner::Impl::one_device_sum(int n) {
  const size_t count = size_t(n) * size_t(c.d_model);
  Shard& s0 = lead();
  s0.use();
  for (size_t r = 1; r < shards.size(); ++r) {
    Shard& s = *shards[r];
    LY_CUDA_CHECK(cudaEventRecord(s.reduce_event, s.stream));
    LY_CUDA_CHECK(cudaStreamWaitEvent(s0.stream, s.reduce_event));
    add_bf16(s0.o_buf.data(), s.o_buf.data(), count, s0.stream);
  }
  LY_CUDA_CHECK(cudaEventRecord(s0.reduce_event, s0.stream));
  for (size_t r = 1; r < shards.size(); ++r) {
    Shard& s = *shards[r];
    LY_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s0.reduce_event));
    LY_CUDA_CHECK(cudaMemcpyAsync(s.o_buf.data(), s0.o_buf.data(), count * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                  s.stream));
    // Rank 0 writes its o_buf again only after this copy has read it.
    LY_CUDA_CHECK(cudaEventRecord(s.reduce_event, s.stream));
    LY_CUDA_CHECK(cudaStreamWaitEvent(s0.stream, s.reduce_event));
  }
}

}  // namespace lychee::cuda
