// GpuRunner's decode steps (gpu_runner.cpp holds construction, prefill, pages and policies):
// staging a step's metadata (tokens, positions, K/V destinations, lengths, block-table deltas),
// its plans, and the forward pass, eagerly or from the CUDA graph of its key; a verification step
// (GpuRunner::verify) is the same step with rows_per_seq positions per sequence.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "cuda/kernels/decode_attention.h"
#include "cuda/runner/runner_impl.h"

namespace lychee::cuda {

void GpuRunner::decode(std::span<GpuSeq* const> seqs, std::span<const int32_t> tokens, bool use_policy,
                       bool batch_invariant) {
  impl_->decode(seqs, tokens, use_policy, impl_->o.cuda_graphs, batch_invariant);
}

bool verify_step_rows_fit(const RunnerOptions& o, int fused_rows, int batch, int rows_per_seq) {
  const int rows = batch * rows_per_seq;
  const bool fused = fused_rows > 0 && (rows <= fused_rows || (rows_per_seq > 1 && o.fused_verify_chunks));
  return batch >= 1 && batch <= o.max_batch && rows_per_seq >= 1 && rows_per_seq <= kDecodeMaxVerifyRows && fused &&
         rows <= logit_rows(o);
}

bool GpuRunner::verify_step_fits(int batch, int rows_per_seq) const {
  const Impl& im = *impl_;
  const Shard& m = *im.shards[0];
  const int rows = batch * rows_per_seq;
  const int per_item = decode_positions_per_item(im.c.group_size(), std::max(rows_per_seq, 1));
  const int items = batch * im.c.n_kv_heads * ((rows_per_seq + per_item - 1) / per_item);  // at least
  // The batch's rows through the fused decode layers: their products give each row what a one-row
  // step gives it, so the rows equal Full's decode steps bit for bit (H200: R = 1..8 in one call).
  // Past their rows (8) a verification step (R > 1) runs each product in chunks of them
  // (RunnerOptions::fused_verify_chunks; GpuRunner::Impl::forward): batch 4 x R = 3 is 12 rows in
  // two calls per product. Compiled, not yet verified on a GPU. Without the chunks the products
  // would run through cuBLASLt, whose rounding is another's (R = 9: 1.2e-2 relative from the
  // prefill pass's rows, past the tests' 1e-2), and the prefill pass verifies instead.
  const int fr = im.fused_rows();
  return im.size() == 1 && !m.pool->fp8() && verify_step_rows_fit(im.o, fr, batch, rows_per_seq) &&
         rows <= m.max_tokens && (rows <= fr || rows <= m.fused_buffer_rows()) && items <= m.max_items;
}

void GpuRunner::verify(std::span<GpuSeq* const> seqs, std::span<const int32_t> tokens, int rows_per_seq) {
  const int batch = int(seqs.size());
  LY_CHECK(verify_step_fits(batch, rows_per_seq), ErrorCode::kUnsupported,
           "GPU verification step: {} sequences x {} rows ({} KV pages, {} GPUs) does not fit the decode kernel "
           "(rows per sequence <= {}, bf16 KV, one GPU, batch <= {}, rows <= {})",
           batch, rows_per_seq, kv_cache_dtype_name(impl_->lead().pool->dtype()), impl_->size(),
           kDecodeMaxVerifyRows, impl_->o.max_batch, logit_rows(impl_->o));
  LY_CHECK(int(tokens.size()) == batch * rows_per_seq, ErrorCode::kInvalidArgument,
           "GPU verification step: {} tokens for {} sequences x {} rows", tokens.size(), batch, rows_per_seq);
  impl_->decode(seqs, tokens, false, impl_->o.cuda_graphs, false, rows_per_seq);
}

void GpuRunner::Impl::decode(std::span<GpuSeq* const> seqs, std::span<const int32_t> tokens, bool use_policy,
                             bool use_graphs, bool invariant, int rows) {
  before_forward();  // before the logits rows are overwritten
  Shard& lead_shard = lead();
  const int batch = int(seqs.size());
  LY_CHECK(batch >= 1 && batch <= o.max_batch, ErrorCode::kInvalidArgument,
           "decode batch of {} sequences (1..{} supported)", batch, o.max_batch);
  LY_CHECK(!invariant || batch <= batch_invariant_rows(o), ErrorCode::kInvalidArgument,
           "a batch-invariant decode step of {} sequences (at most {})", batch, batch_invariant_rows(o));
  LY_CHECK(tokens.empty() ? rows == 1 : int(tokens.size()) == batch * rows, ErrorCode::kInvalidArgument,
           "decode got {} tokens for {} sequences x {} rows", tokens.size(), batch, rows);
  for (int b = 0; b < batch; ++b) {  // every check and page before any state changes
    GpuSeq& s = *seqs[size_t(b)];
    LY_CHECK(s.length > 0, ErrorCode::kInvalidArgument, "decode of an empty sequence (prefill first)");
    for (int r = 0; r < (tokens.empty() ? 0 : rows); ++r) {
      const int32_t t = tokens[size_t(b * rows + r)];
      LY_CHECK(t >= 0 && t < c.vocab_size, ErrorCode::kInvalidArgument,
               "token id {} is outside the vocabulary (size {})", t, c.vocab_size);
    }
    lead_shard.ensure_pages(s, s.length + rows);
  }
  for (int b = 0; b < batch; ++b)
    if (seqs[size_t(b)]->table_id == 0) seqs[size_t(b)]->table_id = ++next_table_id;
  std::vector<int> lens(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) lens[size_t(b)] = seqs[size_t(b)]->length + rows;
  // The step's section, written once (on rank 0) for every rank. The block table lives on the
  // devices; a step sends only the pages a row's device copy lacks (a sequence new to its row:
  // all of them; otherwise the pages added since).
  Shard& m = lead_shard;
  m.use();
  m.begin_step();
  auto* deltas = m.meta_host<int32_t>(m.meta.deltas);
  int n_deltas = 0;
  for (int b = 0; b < batch; ++b) {
    GpuSeq& s = *seqs[size_t(b)];
    if (row_table_id[size_t(b)] != s.table_id || row_synced[size_t(b)] > int(s.pages.size())) {
      row_table_id[size_t(b)] = s.table_id;
      row_synced[size_t(b)] = 0;
    }
    for (int i = row_synced[size_t(b)]; i < int(s.pages.size()); ++i) {
      deltas[2 * n_deltas] = b * m.max_pages + i;
      deltas[2 * n_deltas + 1] = s.pages[size_t(i)];
      ++n_deltas;
    }
    row_synced[size_t(b)] = int(s.pages.size());
    for (int r = 0; r < rows; ++r) {  // token row i = b rows + r at position length + r
      const int i = b * rows + r, pos = s.length + r;
      if (!tokens.empty()) m.meta_host<int32_t>(m.meta.tokens)[i] = tokens[size_t(i)];
      m.meta_host<int32_t>(m.meta.positions)[i] = pos;
      m.meta_host<int32_t>(m.meta.kv_page)[i] = s.pages[size_t(pos / m.o.page_size)];
      m.meta_host<int32_t>(m.meta.kv_row)[i] = pos % m.o.page_size;
    }
    m.meta_host<int32_t>(m.meta.seq_lens)[b] = s.length + rows;
    m.meta_host<int32_t>(m.meta.quest_from)[b] = s.quest_epoch == m.policy_epoch ? std::min(s.quest_from, s.length) : 0;
  }
  m.meta_host<int32_t>(m.meta.n_deltas)[0] = n_deltas;
  upload_step_everywhere(m.meta.deltas + size_t(n_deltas) * 8);
  if (tokens.empty() && size() > 1) {  // ranks > 0 copy rank 0's sampled tokens after its sampling
    lead_shard.use();
    LY_CUDA_CHECK(cudaEventRecord(sampled_ready, lead_shard.stream));
  }
  // Each rank's plans (its own heads' work) and, without tokens, the tokens sampled on the device
  // by the previous step.
  const bool step_policy = use_policy && lead_shard.policy.has_value();
  for (auto& sp : shards) {
    Shard& r = *sp;
    r.use();
    r.step_policy = step_policy;
    r.invariant = invariant;
    r.plan_and_upload(step_policy ? &*r.policy : nullptr, lens, rows);
    if (!tokens.empty()) continue;
    if (r.rank == 0) {
      LY_CUDA_CHECK(cudaMemcpyAsync(r.meta_dev<int32_t>(r.meta.tokens), r.sampled.data(), size_t(batch) * 4,
                                    cudaMemcpyDeviceToDevice, r.stream));
    } else {
      LY_CUDA_CHECK(cudaStreamWaitEvent(r.stream, sampled_ready));
      LY_CUDA_CHECK(cudaMemcpyPeerAsync(r.meta_dev<int32_t>(r.meta.tokens), r.device, lead_shard.sampled.data(),
                                        lead_shard.device, size_t(batch) * 4, r.stream));
    }
  }
  ++n_forwards;
  // Decode steps (rows 1) and verification steps (rows > 1: keys past every decode step's) each
  // have their graph; forward's q_len is the decode attention's rows_per_seq. Whether a
  // verification step's products run chunked depends on its rows and the runner's options alone
  // (fixed at construction), so the (batch, rows) key determines its launches.
  const int n = batch * rows;
  if (use_graphs) {
    const std::vector<cudaStream_t> st = streams();
    const int key = rows == 1 ? batch * 4 + (invariant ? 2 : 0) + (step_policy ? 1 : 0)
                              : (1 << 20) + batch * (kDecodeMaxTileRows + 1) + rows;
    graphs.run(key, devices, st, [&] { forward(n, true, batch, rows, 0, n); });
  } else {
    forward(n, true, batch, rows, 0, n);
  }
  count_reduces(n, n);
  lead_shard.use();
  for (GpuSeq* s : seqs) {
    s->length += rows;
    if (step_policy && lead_shard.policy->spec.has(lychee::ScoreKind::kPageBound)) {
      s->quest_from = s->length;
      s->quest_epoch = lead_shard.policy_epoch;
    }
  }
}

std::vector<std::vector<float>> GpuRunner::profile_decode(std::span<GpuSeq* const> seqs,
                                                          std::span<const int32_t> tokens, bool use_policy) {
  Impl& im = *impl_;
  const int L = im.c.n_layers;
  for (auto& sp : im.shards) {
    sp->use();
    if (sp->attn_events.empty()) {
      sp->attn_events.resize(size_t(2 * L));
      for (cudaEvent_t& e : sp->attn_events) LY_CUDA_CHECK(cudaEventCreate(&e));
    }
  }
  try {
    im.decode(seqs, tokens, use_policy, false);
  } catch (...) {
    for (auto& sp : im.shards) {
      sp->use();
      for (cudaEvent_t e : sp->attn_events) cudaEventDestroy(e);
      sp->attn_events.clear();
    }
    throw;
  }
  std::vector<std::vector<float>> ms(size_t(im.size()), std::vector<float>(size_t(L)));
  for (auto& sp : im.shards) {
    sp->use();
    LY_CUDA_CHECK(cudaStreamSynchronize(sp->stream));
    for (int l = 0; l < L; ++l)
      LY_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(sp->rank)][size_t(l)], sp->attn_events[size_t(2 * l)],
                                         sp->attn_events[size_t(2 * l + 1)]));
    for (cudaEvent_t e : sp->attn_events) cudaEventDestroy(e);
    sp->attn_events.clear();
  }
  return ms;
}

}  // namespace lychee::cuda
