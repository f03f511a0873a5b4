#include "cuda/runner/gpu_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "attention/policies.h"
#include "core/error.h"
#include "core/log.h"
#include "cuda/kernels/decode_attention.h"
#include "cuda/kernels/kernels.h"
#include "cuda/runner/runner_impl.h"

namespace lychee::cuda {

std::shared_ptr<const GpuWeights> upload_weights(const Checkpoint& ck, GpuWeightFormat format, const Fp8Keep& keep) {
  return std::make_shared<const GpuWeights>(GpuWeights::from_checkpoint(ck, format, keep));
}
std::shared_ptr<const GpuWeights> random_weights(const ModelConfig& c, uint64_t seed, GpuWeightFormat format,
                                                 const Fp8Keep& keep) {
  return std::make_shared<const GpuWeights>(GpuWeights::random(c, seed, format, keep));
}
uint64_t weight_bytes_per_step(const GpuWeights& w, int batch) { return w.bytes_read_per_step(batch); }
size_t weight_bytes(const GpuWeights& w) { return w.bytes(); }

namespace {

size_t auto_kv_bytes(const ModelConfig& c, const RunnerOptions& o, int max_context) {
  const size_t per_token = size_t(2) * c.n_layers * c.kv_dim() * 2;
  const size_t want = per_token * size_t(max_context + o.page_size) * size_t(o.max_batch);
  size_t free_b = 0, total_b = 0;
  LY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t reserve = size_t(2) << 30;  // activations, workspaces, cuBLAS, cuDNN
  const size_t avail = free_b > reserve ? free_b - reserve : 0;
  return std::min(want, avail);
}

PlannerShape planner_shape(const ModelConfig& c, const RunnerOptions& o, int max_items, int max_pages) {
  PlannerShape s;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.page_size = o.page_size;
  s.sm_count = device_info().sm_count;
  s.ctas_per_sm = decode_attention_ctas_per_sm(c.head_dim, o.page_size);
  s.max_items = max_items;
  s.max_pages = max_pages;
  return s;
}

// Elements of the largest linear matrix (every layer has the same shapes).
size_t largest_matrix(const GpuWeights& w) {
  const GpuLayerWeights& L = w.layers[0];
  size_t n = 0;
  for (const GpuMatrix* m : {&L.wqkv, &L.wo, &L.w_gate_up, &L.w_down}) n = std::max(n, size_t(m->rows) * size_t(m->cols));
  return n;
}

}  // namespace

GpuRunner::Impl::Impl(std::shared_ptr<const GpuWeights> weights, const RunnerOptions& opt)
    : w(std::move(weights)), c(w->config()), o(opt),
      max_context(opt.max_context > 0 ? std::min(opt.max_context, c.max_context) : c.max_context),
      max_pages((max_context + opt.page_size - 1) / opt.page_size + 1),
      max_tokens(std::max(opt.max_prefill_tokens, opt.max_batch)),
      max_items(std::max(2 * device_info().sm_count * 4, opt.max_batch * c.n_kv_heads)),
      max_slots(max_items),
      meta(max_tokens, opt.max_batch, max_pages, max_items, c.n_heads, c.n_layers + 1),
      tokens_ring(size_t(opt.max_batch)),
      reads_ring(size_t(opt.max_batch)),
      planner(planner_shape(c, opt, max_items, max_pages), meta) {
  LY_CHECK(opt.max_batch >= 1 && opt.max_prefill_tokens >= 1, ErrorCode::kInvalidArgument,
           "max_batch and max_prefill_tokens must be >= 1");
  const std::string why = gpu_unsupported(full_spec(c), c, opt.page_size);
  LY_CHECK(why.empty(), ErrorCode::kUnsupported, "{}", why);
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  LY_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event, cudaEventDisableTiming));
  LY_CUDA_CHECK(cudaEventCreateWithFlags(&join_event, cudaEventDisableTiming));
  for (cudaEvent_t& e : step_consumed) LY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  LY_CUDA_CHECK(cudaEventCreateWithFlags(&plan_consumed, cudaEventDisableTiming));
  gemm = std::make_unique<Gemm>(stream);
  const size_t kv_bytes = o.kv_memory_gib > 0 ? size_t(o.kv_memory_gib * double(size_t(1) << 30))
                                              : auto_kv_bytes(c, o, max_context);
  pool = std::make_unique<KvPool>(c, o.page_size, kv_bytes);
  prefill_attn = std::make_unique<PrefillAttention>();
  const size_t d = size_t(c.d_model), mt = size_t(max_tokens);
  x = DeviceBuffer<float>(mt * d);
  h = DeviceBuffer<bf16>(mt * d);
  qkv = DeviceBuffer<bf16>(mt * size_t(c.q_dim() + 2 * c.kv_dim()));
  q = DeviceBuffer<bf16>(mt * size_t(c.q_dim()));
  att = DeviceBuffer<bf16>(mt * size_t(c.q_dim()));
  o_buf = DeviceBuffer<bf16>(mt * d);
  gu = DeviceBuffer<bf16>(mt * 2 * size_t(c.d_ff));
  act = DeviceBuffer<bf16>(mt * size_t(c.d_ff));
  if (w->format() == GpuWeightFormat::kFp8 && (!o.fp8_gemv || fp8_gemv_launches(max_tokens) == 0))
    dequant = DeviceBuffer<bf16>(largest_matrix(*w));
  logits = DeviceBuffer<float>(size_t(o.max_batch) * c.vocab_size);
  partial_o = DeviceBuffer<float>(size_t(max_slots) * c.group_size() * c.head_dim);
  partial_lse = DeviceBuffer<float>(size_t(max_slots) * c.group_size());
  sampled = DeviceBuffer<int32_t>(size_t(o.max_batch));
  meta_h = PinnedBuffer<uint8_t>(meta.total + meta.step_bytes());
  std::memset(meta_h.data(), 0, meta_h.size());
  meta_d = DeviceBuffer<uint8_t>(meta.total);
  LY_CUDA_CHECK(cudaMemset(meta_d.data(), 0, meta.total));
  decode_table = DeviceBuffer<int32_t>(size_t(o.max_batch) * max_pages);
  LY_CUDA_CHECK(cudaMemset(decode_table.data(), 0, decode_table.size() * 4));
  row_table_id.assign(size_t(o.max_batch), 0);
  row_synced.assign(size_t(o.max_batch), 0);
  token_reads = DeviceBuffer<unsigned long long>(size_t(o.max_batch));
  LY_CUDA_CHECK(cudaMemset(token_reads.data(), 0, size_t(o.max_batch) * 8));
  LY_LOG_INFO("GPU runner: {} KV pages of {} tokens ({:.2f} GiB), max context {}, max batch {}",
              pool->n_pages(), o.page_size, double(pool->bytes_per_page()) * pool->n_pages() / (1 << 30),
              max_context, o.max_batch);
}

GpuRunner::Impl::~Impl() {
  graphs.clear();
  for (cudaEvent_t e : step_consumed)
    if (e != nullptr) cudaEventDestroy(e);
  if (plan_consumed != nullptr) cudaEventDestroy(plan_consumed);
  if (fork_event != nullptr) cudaEventDestroy(fork_event);
  if (join_event != nullptr) cudaEventDestroy(join_event);
  if (side != nullptr) cudaStreamDestroy(side);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

void GpuRunner::Impl::wait_event(cudaEvent_t e) {
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaSuccess) return;
  LY_CHECK(q == cudaErrorNotReady, ErrorCode::kInternal, "CUDA error: {}", cudaGetErrorString(q));
  ++stalls;
  LY_CUDA_CHECK(cudaEventSynchronize(e));
}

void GpuRunner::Impl::begin_step() {
  staging ^= 1;
  wait_event(step_consumed[staging]);
}

void GpuRunner::Impl::upload_step(size_t bytes) {
  LY_CUDA_CHECK(cudaMemcpyAsync(meta_d.data(), meta_host<uint8_t>(0), bytes, cudaMemcpyHostToDevice, stream));
  LY_CUDA_CHECK(cudaEventRecord(step_consumed[staging], stream));
}

void GpuRunner::Impl::plan_and_upload(const GpuPolicyPlan* plan, std::span<const int> lens) {
  const size_t end = planner.plan(plan, lens, meta_h.data(), [&] { wait_event(plan_consumed); });
  if (end == 0) return;  // the plans on the device are still right
  LY_CUDA_CHECK(cudaMemcpyAsync(meta_d.data() + meta.n_items, meta_h.data() + meta.n_items, end - meta.n_items,
                                cudaMemcpyHostToDevice, stream));
  LY_CUDA_CHECK(cudaEventRecord(plan_consumed, stream));
}

void GpuRunner::Impl::ensure_pages(GpuSeq& seq, int new_length) {
  LY_CHECK(new_length <= max_context, ErrorCode::kCapacity,
           "sequence of {} tokens exceeds the GPU context limit of {} tokens (--max-context)", new_length,
           max_context);
  while (int(seq.pages.size()) * o.page_size < new_length) seq.pages.push_back(pool->alloc());
}

GpuRunner::GpuRunner(std::shared_ptr<const GpuWeights> weights, const RunnerOptions& options)
    : impl_(std::make_unique<Impl>(std::move(weights), options)) {}

GpuRunner::~GpuRunner() = default;

const ModelConfig& GpuRunner::config() const { return impl_->c; }
const RunnerOptions& GpuRunner::options() const { return impl_->o; }
int GpuRunner::max_context() const { return impl_->max_context; }

void GpuRunner::prefill(GpuSeq& seq, std::span<const int32_t> tokens) {
  Impl& m = *impl_;
  LY_CHECK(!tokens.empty(), ErrorCode::kInvalidArgument, "prefill needs at least one token");
  for (size_t start = 0; start < tokens.size(); start += size_t(m.o.max_prefill_tokens)) {
    const int n = int(std::min(tokens.size() - start, size_t(m.o.max_prefill_tokens)));
    m.ensure_pages(seq, seq.length + n);
    m.begin_step();
    for (int t = 0; t < n; ++t) {
      const int32_t tok = tokens[start + size_t(t)];
      LY_CHECK(tok >= 0 && tok < m.c.vocab_size, ErrorCode::kInvalidArgument,
               "token id {} is outside the vocabulary (size {})", tok, m.c.vocab_size);
      const int pos = seq.length + t;
      m.meta_host<int32_t>(m.meta.tokens)[t] = tok;
      m.meta_host<int32_t>(m.meta.positions)[t] = pos;
      m.meta_host<int32_t>(m.meta.kv_page)[t] = seq.pages[size_t(pos / m.o.page_size)];
      m.meta_host<int32_t>(m.meta.kv_row)[t] = pos % m.o.page_size;
    }
    m.meta_host<int32_t>(m.meta.q_lens)[0] = n;
    m.meta_host<int32_t>(m.meta.seq_lens)[0] = seq.length + n;
    std::copy(seq.pages.begin(), seq.pages.end(), m.meta_host<int32_t>(m.meta.block_table));
    m.meta_host<int32_t>(m.meta.n_deltas)[0] = 0;
    m.upload_step(m.meta.deltas);
    ++m.n_forwards;
    m.forward(n, false, 1, n, seq.length + n);
    seq.length += n;
  }
}

void GpuRunner::decode(std::span<GpuSeq* const> seqs, std::span<const int32_t> tokens, bool use_policy) {
  Impl& m = *impl_;
  const int batch = int(seqs.size());
  LY_CHECK(batch >= 1 && batch <= m.o.max_batch, ErrorCode::kInvalidArgument,
           "decode batch of {} sequences (1..{} supported)", batch, m.o.max_batch);
  LY_CHECK(tokens.empty() || int(tokens.size()) == batch, ErrorCode::kInvalidArgument,
           "decode got {} tokens for {} sequences", tokens.size(), batch);
  for (int b = 0; b < batch; ++b) {  // every check and page before any state changes
    GpuSeq& s = *seqs[size_t(b)];
    LY_CHECK(s.length > 0, ErrorCode::kInvalidArgument, "decode of an empty sequence (prefill first)");
    if (!tokens.empty())
      LY_CHECK(tokens[size_t(b)] >= 0 && tokens[size_t(b)] < m.c.vocab_size, ErrorCode::kInvalidArgument,
               "token id {} is outside the vocabulary (size {})", tokens[size_t(b)], m.c.vocab_size);
    m.ensure_pages(s, s.length + 1);
  }
  m.begin_step();
  // The block table lives on the device; a step sends only the pages a row's device copy lacks
  // (a sequence new to its row: all of them; otherwise the pages added since).
  auto* deltas = m.meta_host<int32_t>(m.meta.deltas);
  int n_deltas = 0;
  for (int b = 0; b < batch; ++b) {
    GpuSeq& s = *seqs[size_t(b)];
    if (s.table_id == 0) s.table_id = ++m.next_table_id;
    if (m.row_table_id[size_t(b)] != s.table_id || m.row_synced[size_t(b)] > int(s.pages.size())) {
      m.row_table_id[size_t(b)] = s.table_id;
      m.row_synced[size_t(b)] = 0;
    }
    for (int i = m.row_synced[size_t(b)]; i < int(s.pages.size()); ++i) {
      deltas[2 * n_deltas] = b * m.max_pages + i;
      deltas[2 * n_deltas + 1] = s.pages[size_t(i)];
      ++n_deltas;
    }
    m.row_synced[size_t(b)] = int(s.pages.size());
    if (!tokens.empty()) m.meta_host<int32_t>(m.meta.tokens)[b] = tokens[size_t(b)];
    m.meta_host<int32_t>(m.meta.positions)[b] = s.length;
    m.meta_host<int32_t>(m.meta.kv_page)[b] = s.pages[size_t(s.length / m.o.page_size)];
    m.meta_host<int32_t>(m.meta.kv_row)[b] = s.length % m.o.page_size;
    m.meta_host<int32_t>(m.meta.seq_lens)[b] = s.length + 1;
    m.meta_host<int32_t>(m.meta.quest_from)[b] = s.quest_epoch == m.policy_epoch ? std::min(s.quest_from, s.length) : 0;
  }
  m.meta_host<int32_t>(m.meta.n_deltas)[0] = n_deltas;
  m.upload_step(m.meta.deltas + size_t(n_deltas) * 8);
  m.step_policy = use_policy && m.policy.has_value();
  std::vector<int> lens(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) lens[size_t(b)] = seqs[size_t(b)]->length + 1;
  m.plan_and_upload(m.step_policy ? &*m.policy : nullptr, lens);
  if (tokens.empty())  // feed the tokens sampled on the device by the previous step
    LY_CUDA_CHECK(cudaMemcpyAsync(m.meta_dev<int32_t>(m.meta.tokens), m.sampled.data(), size_t(batch) * 4,
                                  cudaMemcpyDeviceToDevice, m.stream));
  ++m.n_forwards;
  if (m.o.cuda_graphs)
    m.graphs.run(batch * 2 + (m.step_policy ? 1 : 0), m.stream, [&] { m.forward(batch, true, batch, 1, 0); });
  else
    m.forward(batch, true, batch, 1, 0);
  for (GpuSeq* s : seqs) {
    s->length += 1;
    if (m.step_policy && m.policy->spec.has(lychee::ScoreKind::kPageBound)) {
      s->quest_from = s->length;
      s->quest_epoch = m.policy_epoch;
    }
  }
}

void GpuRunner::assume_filled(GpuSeq& seq, int length) {
  impl_->ensure_pages(seq, length);
  seq.length = length;
}

void GpuRunner::fill_kv_random(uint64_t seed) {
  Impl& m = *impl_;
  const size_t per_layer = size_t(m.pool->n_pages()) * m.c.n_kv_heads * size_t(m.o.page_size) * m.c.head_dim;
  for (int l = 0; l < m.c.n_layers; ++l) {
    fill_normal_bf16(m.pool->k(l), per_layer, seed + 2 * uint64_t(l), 1.0f, m.stream);
    fill_normal_bf16(m.pool->v(l), per_layer, seed + 2 * uint64_t(l) + 1, 1.0f, m.stream);
  }
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
}

void GpuRunner::release(GpuSeq& seq) {
  impl_->pool->release(seq.pages);
  seq.pages.clear();
  seq.table_id = 0;
  seq.length = 0;
  seq.quest_from = 0;
}

void GpuRunner::truncate(GpuSeq& seq, int n) {
  LY_CHECK(n >= 0 && n <= seq.length, ErrorCode::kInvalidArgument, "cannot truncate a sequence of {} tokens to {}",
           seq.length, n);
  const size_t keep = std::min(seq.pages.size(), size_t((n + impl_->o.page_size - 1) / impl_->o.page_size));
  if (keep < seq.pages.size()) seq.table_id = 0;  // pages past `keep` will differ: send the row again
  impl_->pool->release(std::span<const int32_t>(seq.pages).subspan(keep));
  seq.pages.resize(keep);
  seq.length = n;
  seq.quest_from = std::min(seq.quest_from, n);
}

int GpuRunner::n_pages() const { return impl_->pool->n_pages(); }
int GpuRunner::free_pages() const { return impl_->pool->n_free(); }

void GpuRunner::share_prefix(const GpuSeq& from, GpuSeq& to, int n) {
  Impl& m = *impl_;
  LY_CHECK(to.length == 0 && to.pages.empty(), ErrorCode::kInvalidArgument,
           "share_prefix: the receiving sequence must be empty (it holds {} tokens)", to.length);
  LY_CHECK(n >= 0 && n <= from.length, ErrorCode::kInvalidArgument,
           "share_prefix: {} tokens asked of a sequence of {}", n, from.length);
  const int P = m.o.page_size, full = n / P;
  std::vector<int32_t> pages(from.pages.begin(), from.pages.begin() + full);
  if (n % P != 0) {
    const int32_t own = m.pool->alloc();  // may throw kCapacity: nothing taken yet
    m.pool->copy_page(from.pages[size_t(full)], own, m.stream);
    pages.push_back(own);
  }
  for (int i = 0; i < full; ++i) m.pool->retain(pages[size_t(i)]);
  to.pages = std::move(pages);
  to.length = n;
  to.table_id = 0;
  to.quest_from = 0;
  to.quest_epoch = -1;
}
int GpuRunner::replans() const { return impl_->planner.replans(); }
uint64_t GpuRunner::host_stalls() const { return impl_->stalls; }
int GpuRunner::policy_epoch() const { return impl_->policy_epoch; }
uint64_t GpuRunner::forwards() const { return impl_->n_forwards; }

void GpuRunner::set_policy(const DecodeSpec& spec) {
  Impl& m = *impl_;
  GpuPolicyPlan plan = plan_gpu_policy(spec, m.c, m.o.page_size, m.max_context);
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));  // the buffers below may be in use
  m.policy = std::move(plan);
  m.allocate_policy_buffers();
  ++m.policy_epoch;
  m.planner.invalidate();
  m.graphs.clear();  // the graphs baked in the old buffers and patterns
}

// Rows for every (batch row, query head) serve KV-head rows too.
void GpuRunner::Impl::allocate_policy_buffers() {
  const GpuPolicyPlan& p = *policy;
  const size_t rows = size_t(o.max_batch) * size_t(c.n_heads);
  const bool sets = p.has_sets();
  scores = sets ? DeviceBuffer<float>(rows * size_t(p.score_stride)) : DeviceBuffer<float>();
  unit_scores = sets ? DeviceBuffer<float>(rows * size_t(p.list_stride)) : DeviceBuffer<float>();
  lists = sets ? DeviceBuffer<int32_t>(rows * size_t(p.list_stride)) : DeviceBuffer<int32_t>();
  list_counts = sets ? DeviceBuffer<int32_t>(rows) : DeviceBuffer<int32_t>();
  sel_heads = DeviceBuffer<int32_t>(std::max<size_t>(1, p.selectors.size()));
  if (sets)
    LY_CUDA_CHECK(cudaMemcpy(sel_heads.data(), p.selectors.data(), p.selectors.size() * 4, cudaMemcpyHostToDevice));
  const bool bounds = p.spec.has(lychee::ScoreKind::kPageBound);
  quest_layer_elems = bounds ? size_t(pool->n_pages()) * c.n_kv_heads * size_t(o.page_size / p.spec.unit) * c.head_dim : 0;
  quest_min = bounds ? DeviceBuffer<bf16>(quest_layer_elems * c.n_layers) : DeviceBuffer<bf16>();
  quest_max = bounds ? DeviceBuffer<bf16>(quest_layer_elems * c.n_layers) : DeviceBuffer<bf16>();
}

std::vector<uint64_t> GpuRunner::take_token_reads() { return token_reads(take_token_reads_async()); }

Ticket GpuRunner::take_token_reads_async() {
  Impl& m = *impl_;
  const Ticket t = m.reads_ring.push(m.token_reads.data(), m.o.max_batch, m.stream);
  LY_CUDA_CHECK(cudaMemsetAsync(m.token_reads.data(), 0, size_t(m.o.max_batch) * 8, m.stream));
  return t;
}

std::vector<uint64_t> GpuRunner::token_reads(const Ticket& t) {
  const std::span<const unsigned long long> v = impl_->reads_ring.read(t);
  return std::vector<uint64_t>(v.begin(), v.end());
}

}  // namespace lychee::cuda
