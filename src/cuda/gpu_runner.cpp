#include "cuda/gpu_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "cuda/attention_generic.h"
#include "cuda/decode_attention.h"
#include "cuda/device_buffer.h"
#include "cuda/gemm.h"
#include "cuda/gpu_weights.h"
#include "cuda/kernels.h"
#include "cuda/kv_pool.h"
#include "cuda/prefill_attention.h"
#include "cuda/select.h"

namespace lychee::cuda {

std::shared_ptr<const GpuWeights> upload_weights(const Checkpoint& ck) {
  return std::make_shared<const GpuWeights>(GpuWeights::from_checkpoint(ck));
}
std::shared_ptr<const GpuWeights> random_weights(const ModelConfig& c, uint64_t seed) {
  return std::make_shared<const GpuWeights>(GpuWeights::random(c, seed));
}
uint64_t weight_bytes_per_step(const GpuWeights& w, int batch) { return w.bytes_read_per_step(batch); }
size_t weight_bytes(const GpuWeights& w) { return w.bytes(); }

namespace {

// Per-step metadata, one contiguous block copied host -> device before each forward. The
// decode plans of the step's layer patterns come last, packed, so the upload stops at the last
// item in use.
struct MetaLayout {
  size_t tokens, positions, kv_page, kv_row, seq_lens, q_lens, quest_from, block_table, n_items, item_offset,
      merge_begin, merge_count, items, total;
  int merge_stride;  // ints per pattern in merge_begin / merge_count
  MetaLayout(int max_tokens, int max_batch, int max_pages, int max_items, int n_heads, int n_patterns)
      : merge_stride(max_batch * n_heads) {
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t o = off;
      off += (bytes + 15) / 16 * 16;
      return o;
    };
    tokens = take(size_t(max_tokens) * 4);
    positions = take(size_t(max_tokens) * 4);
    kv_page = take(size_t(max_tokens) * 4);
    kv_row = take(size_t(max_tokens) * 4);
    seq_lens = take(size_t(max_batch) * 4);
    q_lens = take(size_t(max_batch) * 4);
    quest_from = take(size_t(max_batch) * 4);
    block_table = take(size_t(max_batch) * max_pages * 4);
    n_items = take(size_t(n_patterns) * 4);
    item_offset = take(size_t(n_patterns) * 4);
    merge_begin = take(size_t(n_patterns) * merge_stride * 4);
    merge_count = take(size_t(n_patterns) * merge_stride * 4);
    items = take(size_t(n_patterns) * max_items * sizeof(DecodeWorkItem));
    total = off;
  }
};

size_t auto_kv_bytes(const ModelConfig& c, const RunnerOptions& o, int max_context) {
  const size_t per_token = size_t(2) * c.n_layers * c.kv_dim() * 2;
  const size_t want = per_token * size_t(max_context + o.page_size) * size_t(o.max_batch);
  size_t free_b = 0, total_b = 0;
  LY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t reserve = size_t(2) << 30;  // activations, workspaces, cuBLAS, cuDNN
  const size_t avail = free_b > reserve ? free_b - reserve : 0;
  return std::min(want, avail);
}

}  // namespace

struct GpuRunner::Impl {
  std::shared_ptr<const GpuWeights> w;
  ModelConfig c;
  RunnerOptions o;
  int max_context, max_pages, max_tokens, max_items, max_slots;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Gemm> gemm;
  std::unique_ptr<KvPool> pool;
  std::unique_ptr<PrefillAttention> prefill_attn;
  DeviceBuffer<float> x, logits, partial_o, partial_lse;
  DeviceBuffer<bf16> h, qkv, q, att, o_buf, gu, act;
  DeviceBuffer<int32_t> sampled;
  DeviceBuffer<uint64_t> rng_step;
  MetaLayout meta;
  PinnedBuffer<uint8_t> meta_h;
  DeviceBuffer<uint8_t> meta_d;
  PinnedBuffer<int32_t> tokens_h;
  cudaEvent_t meta_consumed = nullptr;  // the last metadata upload has been executed
  std::map<int, cudaGraphExec_t> graphs;  // key: batch * 2 + use_policy

  // The policy, compiled into per-layer patterns (what each KV head of a layer reads and scores;
  // layers with the same pattern share a plan) and selections.
  struct HeadSpec {
    ListKind kind = ListKind::kDense;
    ScoreKind score = ScoreKind::kNone;
    int unit = 0;        // 0: the page size
    bool per_q = false;  // one item group per query head (per-head selections)
    bool operator==(const HeadSpec&) const = default;
  };
  struct LayerPlan {
    int pattern = 0;
    int sel_offset = 0, n_sel = 0;  // selectors after the attention (sel_heads[sel_offset ...])
    bool quest = false;              // Quest's bound scores and selection before the attention
    bool union_count = false;        // per-query-head lists: count the union of what they read
  };
  GpuPolicy pol;
  bool policy_set = false;
  int policy_epoch = 0;      // set_policy count: Quest's metadata is rebuilt per setting
  bool step_policy = false;  // the step being recorded uses the policy
  std::vector<std::vector<HeadSpec>> patterns;  // [pattern][kv head]; pattern 0 is dense
  std::vector<LayerPlan> layer_plans;
  int sel_unit = 1, score_unit = 1, row_heads = 1, list_stride = 1, score_stride = 1, n_used_patterns = 1;
  DeviceBuffer<float> scores, unit_scores;
  DeviceBuffer<int32_t> lists, list_counts, sel_heads;
  DeviceBuffer<bf16> quest_min, quest_max;
  size_t quest_layer_elems = 0;
  DeviceBuffer<unsigned long long> token_reads;

  Impl(std::shared_ptr<const GpuWeights> weights, const RunnerOptions& opt);
  ~Impl();
  template <typename T> T* meta_host(size_t off) { return reinterpret_cast<T*>(meta_h.data() + off); }
  template <typename T> T* meta_dev(size_t off) { return reinterpret_cast<T*>(meta_d.data() + off); }
  void ensure_pages(GpuSeq& seq, int new_length);
  // The host writes meta_h for the next step only once the device has copied the last one.
  void wait_meta() { LY_CUDA_CHECK(cudaEventSynchronize(meta_consumed)); }
  void upload_meta(size_t bytes = 0) {
    LY_CUDA_CHECK(cudaMemcpyAsync(meta_d.data(), meta_h.data(), bytes > 0 ? bytes : meta.total,
                                  cudaMemcpyHostToDevice, stream));
    LY_CUDA_CHECK(cudaEventRecord(meta_consumed, stream));
  }
  void forward(int n, bool decode, int batch, int q_len, int max_kv_len);
  void attention(int layer, bool decode, int batch, int q_len, int max_kv_len);
  void select_before(int layer, int batch);
  void select_after(int layer, int batch);
  void run_selection(int layer, int batch);
  void decode_forward(int batch);
  int pattern_of(int layer) const { return step_policy ? layer_plans[size_t(layer)].pattern : 0; }
  // Entries of one head's list as the host knows them (an upper bound for top-p / threshold).
  int host_entries(const HeadSpec& h, int len) const;
  void plan_step(std::span<GpuSeq* const> seqs, int batch);
};

GpuRunner::Impl::Impl(std::shared_ptr<const GpuWeights> weights, const RunnerOptions& opt)
    : w(std::move(weights)), c(w->config()), o(opt),
      max_context(opt.max_context > 0 ? std::min(opt.max_context, c.max_context) : c.max_context),
      max_pages((max_context + opt.page_size - 1) / opt.page_size + 1),
      max_tokens(std::max(opt.max_prefill_tokens, opt.max_batch)),
      max_items(std::max(2 * device_info().sm_count * 4, opt.max_batch * c.n_kv_heads)),
      max_slots(max_items),
      meta(max_tokens, opt.max_batch, max_pages, max_items, c.n_heads, c.n_layers + 1) {
  LY_CHECK(opt.max_batch >= 1 && opt.max_prefill_tokens >= 1, ErrorCode::kInvalidArgument,
           "max_batch and max_prefill_tokens must be >= 1");
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LY_CUDA_CHECK(cudaEventCreateWithFlags(&meta_consumed, cudaEventDisableTiming));
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
  logits = DeviceBuffer<float>(size_t(o.max_batch) * c.vocab_size);
  partial_o = DeviceBuffer<float>(size_t(max_slots) * c.group_size() * c.head_dim);
  partial_lse = DeviceBuffer<float>(size_t(max_slots) * c.group_size());
  sampled = DeviceBuffer<int32_t>(size_t(o.max_batch));
  rng_step = DeviceBuffer<uint64_t>(1);
  LY_CUDA_CHECK(cudaMemset(rng_step.data(), 0, 8));
  meta_h = PinnedBuffer<uint8_t>(meta.total);
  std::memset(meta_h.data(), 0, meta.total);
  meta_d = DeviceBuffer<uint8_t>(meta.total);
  tokens_h = PinnedBuffer<int32_t>(size_t(o.max_batch));
  token_reads = DeviceBuffer<unsigned long long>(size_t(o.max_batch));
  LY_CUDA_CHECK(cudaMemset(token_reads.data(), 0, size_t(o.max_batch) * 8));
  patterns.assign(1, std::vector<HeadSpec>(size_t(c.n_kv_heads)));
  layer_plans.assign(size_t(c.n_layers), LayerPlan{});
  LY_LOG_INFO("GPU runner: {} KV pages of {} tokens ({:.2f} GiB), max context {}, max batch {}",
              pool->n_pages(), o.page_size, double(pool->bytes_per_page()) * pool->n_pages() / (1 << 30),
              max_context, o.max_batch);
}

GpuRunner::Impl::~Impl() {
  for (auto& [b, g] : graphs) cudaGraphExecDestroy(g);
  if (meta_consumed != nullptr) cudaEventDestroy(meta_consumed);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

void GpuRunner::Impl::ensure_pages(GpuSeq& seq, int new_length) {
  LY_CHECK(new_length <= max_context, ErrorCode::kCapacity,
           "sequence of {} tokens exceeds the GPU context limit of {} tokens (--ctx)", new_length, max_context);
  while (int(seq.pages.size()) * o.page_size < new_length) seq.pages.push_back(pool->alloc());
}

void GpuRunner::Impl::attention(int layer, bool decode, int batch, int q_len, int max_kv_len) {
  bf16* kp = pool->k(layer);
  bf16* vp = pool->v(layer);
  if (c.head_dim != 64 && c.head_dim != 128) {  // the tensor-core kernels cover 64 and 128
    GenericAttentionArgs g{q.data(), kp, vp, meta_dev<int32_t>(meta.block_table),
                           decode ? nullptr : meta_dev<int32_t>(meta.q_lens), meta_dev<int32_t>(meta.seq_lens),
                           att.data(), batch, decode ? 1 : q_len, c.n_heads, c.n_kv_heads, c.head_dim,
                           o.page_size, max_pages, 1.0f / std::sqrt(float(c.head_dim))};
    attention_generic(g, stream);
    return;
  }
  if (decode) {
    const int pat = pattern_of(layer);
    DecodeAttentionArgs a{};
    a.q = q.data();
    a.k_pool = kp;
    a.v_pool = vp;
    a.block_table = meta_dev<int32_t>(meta.block_table);
    a.max_pages = max_pages;
    a.unit_lists = lists.data();
    a.list_counts = list_counts.data();
    a.seq_lens = meta_dev<int32_t>(meta.seq_lens);
    a.items = meta_dev<DecodeWorkItem>(meta.items);
    a.item_offset = meta_dev<int32_t>(meta.item_offset) + pat;
    a.n_items = meta_dev<int32_t>(meta.n_items) + pat;
    a.merge_begin = meta_dev<int32_t>(meta.merge_begin) + size_t(pat) * meta.merge_stride;
    a.merge_count = meta_dev<int32_t>(meta.merge_count) + size_t(pat) * meta.merge_stride;
    a.scores = scores.data();
    a.score_stride = score_stride;
    a.token_reads = step_policy ? token_reads.data() : nullptr;
    a.window_sink = pol.kind == GpuPolicy::Kind::kDuo ? pol.window_sink : 0;
    a.window_recent = pol.kind == GpuPolicy::Kind::kDuo ? pol.window_recent : 0;
    a.partial_o = partial_o.data();
    a.partial_lse = partial_lse.data();
    a.out = att.data();
    a.batch = batch;
    a.n_heads = c.n_heads;
    a.n_kv_heads = c.n_kv_heads;
    a.head_dim = c.head_dim;
    a.page_size = o.page_size;
    a.max_items = max_items;
    a.scale = 1.0f / std::sqrt(float(c.head_dim));
    decode_attention(a, stream);
    return;
  }
  PrefillAttentionArgs a{};
  a.q = q.data();
  a.k_pool = kp;
  a.v_pool = vp;
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
  prefill_attn->run(a, stream);
}

// n tokens through every layer; the logits of the last `decode ? n : 1` rows.
void GpuRunner::Impl::forward(int n, bool decode, int batch, int q_len, int max_kv_len) {
  const int d = c.d_model, qkv_dim = c.q_dim() + 2 * c.kv_dim(), ff = c.d_ff;
  embed(meta_dev<int32_t>(meta.tokens), w->embed, x.data(), n, d, stream);
  add_rmsnorm(x.data(), nullptr, nullptr, w->layers[0].attn_norm, h.data(), n, d, c.rms_eps, stream);
  for (int l = 0; l < c.n_layers; ++l) {
    const GpuLayerWeights& L = w->layers[size_t(l)];
    gemm->bf16_out(h.data(), L.wqkv, qkv.data(), n, d, qkv_dim);
    QkvArgs qa{qkv.data(), L.bqkv, L.q_norm, L.k_norm, c.rms_eps, meta_dev<int32_t>(meta.positions),
               meta_dev<int32_t>(meta.kv_page), meta_dev<int32_t>(meta.kv_row), w->inv_freq, q.data(),
               pool->k(l), pool->v(l), n, c.n_heads, c.n_kv_heads, c.head_dim, o.page_size};
    qkv_rope_append(qa, stream);
    if (decode && step_policy) select_before(l, batch);
    attention(l, decode, batch, q_len, max_kv_len);
    if (decode && step_policy) select_after(l, batch);
    gemm->bf16_out(att.data(), L.wo, o_buf.data(), n, c.q_dim(), d);
    add_rmsnorm(x.data(), o_buf.data(), L.bo, L.ffn_norm, h.data(), n, d, c.rms_eps, stream);
    gemm->bf16_out(h.data(), L.w_gate_up, gu.data(), n, d, 2 * ff);
    silu_mul(gu.data(), L.b_gate_up, act.data(), n, ff, stream);
    gemm->bf16_out(act.data(), L.w_down, o_buf.data(), n, ff, d);
    const float* next_norm = l + 1 < c.n_layers ? w->layers[size_t(l + 1)].attn_norm : w->out_norm;
    add_rmsnorm(x.data(), o_buf.data(), L.b_down, next_norm, h.data(), n, d, c.rms_eps, stream);
  }
  const int rows = decode ? n : 1;
  gemm->f32_out(h.data() + size_t(n - rows) * d, w->output, logits.data(), rows, d, c.vocab_size);
}

void GpuRunner::Impl::decode_forward(int batch) {
  if (!o.cuda_graphs) {
    forward(batch, true, batch, 1, 0);
    return;
  }
  const int key = batch * 2 + (step_policy ? 1 : 0);
  auto it = graphs.find(key);
  if (it == graphs.end()) {
    // The first step of a batch size runs eagerly (kernels set their attributes then), and is
    // captured for the later ones; every kernel reads its per-step data from meta_d.
    forward(batch, true, batch, 1, 0);
    cudaGraph_t graph = nullptr;
    LY_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    forward(batch, true, batch, 1, 0);
    LY_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    LY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    LY_CUDA_CHECK(cudaGraphDestroy(graph));
    graphs.emplace(key, exec);
    return;
  }
  LY_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
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
    m.wait_meta();
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
    m.upload_meta();
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
  m.wait_meta();
  for (int b = 0; b < batch; ++b) {
    GpuSeq& s = *seqs[size_t(b)];
    LY_CHECK(s.length > 0, ErrorCode::kInvalidArgument, "decode of an empty sequence (prefill first)");
    m.ensure_pages(s, s.length + 1);
    if (!tokens.empty()) {
      LY_CHECK(tokens[size_t(b)] >= 0 && tokens[size_t(b)] < m.c.vocab_size, ErrorCode::kInvalidArgument,
               "token id {} is outside the vocabulary (size {})", tokens[size_t(b)], m.c.vocab_size);
      m.meta_host<int32_t>(m.meta.tokens)[b] = tokens[size_t(b)];
    }
    m.meta_host<int32_t>(m.meta.positions)[b] = s.length;
    m.meta_host<int32_t>(m.meta.kv_page)[b] = s.pages[size_t(s.length / m.o.page_size)];
    m.meta_host<int32_t>(m.meta.kv_row)[b] = s.length % m.o.page_size;
    m.meta_host<int32_t>(m.meta.seq_lens)[b] = s.length + 1;
    m.meta_host<int32_t>(m.meta.quest_from)[b] = s.quest_epoch == m.policy_epoch ? std::min(s.quest_from, s.length) : 0;
    std::copy(s.pages.begin(), s.pages.end(), m.meta_host<int32_t>(m.meta.block_table) + size_t(b) * m.max_pages);
  }
  m.step_policy = use_policy && m.policy_set;
  m.plan_step(seqs, batch);
  if (tokens.empty())  // feed the tokens sampled on the device by the previous step
    LY_CUDA_CHECK(cudaMemcpyAsync(m.meta_dev<int32_t>(m.meta.tokens), m.sampled.data(), size_t(batch) * 4,
                                  cudaMemcpyDeviceToDevice, m.stream));
  m.decode_forward(batch);
  for (GpuSeq* s : seqs) {
    s->length += 1;
    if (m.step_policy && m.pol.kind == GpuPolicy::Kind::kQuest) {
      s->quest_from = s->length;
      s->quest_epoch = m.policy_epoch;
    }
  }
}

void GpuRunner::greedy(int batch, std::span<int32_t> out) {
  Impl& m = *impl_;
  argmax(m.logits.data(), m.sampled.data(), batch, m.c.vocab_size, m.stream);
  LY_CUDA_CHECK(cudaMemcpyAsync(m.tokens_h.data(), m.sampled.data(), size_t(batch) * 4, cudaMemcpyDeviceToHost, m.stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  std::copy_n(m.tokens_h.data(), std::min(out.size(), size_t(batch)), out.begin());
}

void GpuRunner::sample(int batch, float temperature, int top_k, float top_p, uint64_t seed, std::span<int32_t> out) {
  Impl& m = *impl_;
  if (temperature <= 0.0f) return greedy(batch, out);
  lychee::cuda::sample(m.logits.data(), m.sampled.data(), batch, m.c.vocab_size, temperature, top_k, top_p,
                       seed, m.rng_step.data(), m.stream);
  LY_CUDA_CHECK(cudaMemcpyAsync(m.tokens_h.data(), m.sampled.data(), size_t(batch) * 4, cudaMemcpyDeviceToHost, m.stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  std::copy_n(m.tokens_h.data(), std::min(out.size(), size_t(batch)), out.begin());
}

void GpuRunner::copy_logits(int row, std::span<float> out) {
  Impl& m = *impl_;
  LY_CHECK(row >= 0 && row < m.o.max_batch && out.size() == size_t(m.c.vocab_size), ErrorCode::kInvalidArgument,
           "copy_logits: bad row {} or size {}", row, out.size());
  LY_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.logits.data() + size_t(row) * m.c.vocab_size, out.size() * 4,
                                cudaMemcpyDeviceToHost, m.stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
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
  seq.length = 0;
  seq.quest_from = 0;
}

void GpuRunner::truncate(GpuSeq& seq, int n) {
  LY_CHECK(n >= 0 && n <= seq.length, ErrorCode::kInvalidArgument, "cannot truncate a sequence of {} tokens to {}",
           seq.length, n);
  const size_t keep = size_t((n + impl_->o.page_size - 1) / impl_->o.page_size);
  impl_->pool->release(std::span<const int32_t>(seq.pages).subspan(keep));
  seq.pages.resize(keep);
  seq.length = n;
  seq.quest_from = std::min(seq.quest_from, n);
}

void GpuRunner::synchronize() { LY_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }
int GpuRunner::n_free_pages() const { return impl_->pool->n_free(); }
int GpuRunner::n_pages() const { return impl_->pool->n_pages(); }
int GpuRunner::page_size() const { return impl_->o.page_size; }
double GpuRunner::kv_pool_gib() const {
  return double(impl_->pool->bytes_per_page()) * impl_->pool->n_pages() / double(size_t(1) << 30);
}

// ------------------------------------------------------------------------------ policies

namespace {

int ceil_div_int(int a, int b) { return (a + b - 1) / b; }
bool is_pow2(int x) { return x >= 1 && (x & (x - 1)) == 0; }

// Units a top-k (or ratio) selection keeps for a sequence of len tokens: the forced units (sink,
// recent, last) plus the best others up to the budget (attention/selection.cpp's rule).
int topk_count(int strategy, int budget, double value, int sink, int recent, int unit, int len) {
  const int n_units = ceil_div_int(len, unit);
  const double tokens = strategy == 3 ? std::ceil(value * len) : double(budget);
  const int k_units = std::max(1, int(tokens) / unit);
  const int sink_units = ceil_div_int(std::min(sink, len), unit);
  const int b0 = std::min(std::max(0, len - recent) / unit, n_units - 1);
  const int n_forced = std::min(n_units, sink_units + n_units - b0);
  return std::min(n_units, std::max(k_units, n_forced));
}

}  // namespace

int GpuRunner::Impl::host_entries(const HeadSpec& h, int len) const {
  const int unit = h.unit > 0 ? h.unit : o.page_size;
  switch (h.kind) {
    case ListKind::kDense: return ceil_div_int(len, unit);
    case ListKind::kWindow: {
      const int sink = std::min(pol.window_sink, len);
      return sink + std::min(pol.window_recent, len - sink);
    }
    case ListKind::kUnits: break;
  }
  switch (pol.kind) {
    case GpuPolicy::Kind::kLychee:
      if (pol.strategy == 1 || pol.strategy == 2) return ceil_div_int(len, unit);  // known on the device only
      return topk_count(pol.strategy, pol.budget, pol.value, pol.sink, pol.recent, unit, len);
    case GpuPolicy::Kind::kTidal:
    case GpuPolicy::Kind::kQuest: return topk_count(0, pol.budget, 0.0, 0, 0, unit, len);
    default: fail(ErrorCode::kInternal, "unit lists under policy kind {}", int(pol.kind));
  }
}

// Plans every pattern the step's layers use, packed into the metadata block, and uploads it.
void GpuRunner::Impl::plan_step(std::span<GpuSeq* const> seqs, int batch) {
  const int n_kv = c.n_kv_heads, group = c.group_size(), P = o.page_size;
  const bool tc = c.head_dim == 64 || c.head_dim == 128;
  const int ctas = tc ? decode_attention_ctas_per_sm(c.head_dim, P) : 2;
  const int n_pat = step_policy ? n_used_patterns : 1;
  int32_t* n_items = meta_host<int32_t>(meta.n_items);
  int32_t* item_offset = meta_host<int32_t>(meta.item_offset);
  DecodeWorkItem* items = meta_host<DecodeWorkItem>(meta.items);
  int used = 0;
  std::vector<DecodeHeadWork> heads;
  for (int p = 0; p < n_pat; ++p) {
    heads.clear();
    for (int b = 0; b < batch; ++b) {
      const int len = seqs[size_t(b)]->length + 1;
      for (int h = 0; h < n_kv; ++h) {
        const HeadSpec& spec = patterns[size_t(p)][size_t(h)];
        DecodeHeadWork w;
        w.seq = b;
        w.kv_head = h;
        w.unit = spec.unit > 0 ? spec.unit : P;
        w.kind = spec.kind;
        w.score = spec.score;
        w.n_entries = host_entries(spec, len);
        if (!spec.per_q) {
          w.row_begin = 0;
          w.n_rows = group;
          const int row = b * n_kv + h;
          w.list = row * list_stride;
          w.count = row;
          heads.push_back(w);
          continue;
        }
        for (int g = 0; g < group; ++g) {
          const int row = b * c.n_heads + h * group + g;
          w.row_begin = g;
          w.n_rows = 1;
          w.list = row * list_stride;
          w.count = row;
          heads.push_back(w);
        }
      }
    }
    const DecodePlan plan = plan_decode(heads, batch, c.n_heads, n_kv, device_info().sm_count, ctas, 2 * P, max_items);
    item_offset[p] = used;
    n_items[p] = int32_t(plan.items.size());
    std::copy(plan.items.begin(), plan.items.end(), items + used);
    used += int(plan.items.size());
    std::copy(plan.merge_begin.begin(), plan.merge_begin.end(),
              meta_host<int32_t>(meta.merge_begin) + size_t(p) * meta.merge_stride);
    std::copy(plan.merge_count.begin(), plan.merge_count.end(),
              meta_host<int32_t>(meta.merge_count) + size_t(p) * meta.merge_stride);
  }
  upload_meta(meta.items + size_t(used) * sizeof(DecodeWorkItem));
}

void GpuRunner::Impl::select_before(int layer, int batch) {
  const LayerPlan& lp = layer_plans[size_t(layer)];
  if (!lp.quest) return;
  QuestArgs qa{};
  qa.k_pool = pool->k(layer);
  qa.kmin = quest_min.data() + size_t(layer) * quest_layer_elems;
  qa.kmax = quest_max.data() + size_t(layer) * quest_layer_elems;
  qa.block_table = meta_dev<int32_t>(meta.block_table);
  qa.max_pages = max_pages;
  qa.seq_lens = meta_dev<int32_t>(meta.seq_lens);
  qa.from = meta_dev<int32_t>(meta.quest_from);
  qa.q = q.data();
  qa.scores = scores.data();
  qa.score_stride = score_stride;
  qa.n_heads = c.n_heads;
  qa.n_kv_heads = c.n_kv_heads;
  qa.head_dim = c.head_dim;
  qa.page_size = o.page_size;
  qa.qpage = pol.quest_page;
  quest_update(qa, batch, stream);
  quest_scores(qa, batch, stream);
  run_selection(layer, batch);  // the per-query-head top-k over the bounds
}

// After the layer's attention: the selections of its selector heads (from the scores the
// attention kernel just wrote), and the union count of per-query-head reads.
void GpuRunner::Impl::select_after(int layer, int batch) {
  const LayerPlan& lp = layer_plans[size_t(layer)];
  if (!lp.quest) run_selection(layer, batch);
  if (lp.union_count) {
    UnionReadsArgs ua{};
    ua.lists = lists.data();
    ua.counts = list_counts.data();
    ua.list_stride = list_stride;
    ua.unit = sel_unit;
    ua.max_units = list_stride;
    ua.seq_lens = meta_dev<int32_t>(meta.seq_lens);
    ua.n_heads = c.n_heads;
    ua.n_kv_heads = c.n_kv_heads;
    ua.token_reads = token_reads.data();
    count_union_reads(ua, batch, stream);
  }
}

void GpuRunner::Impl::run_selection(int layer, int batch) {
  const LayerPlan& lp = layer_plans[size_t(layer)];
  if (lp.n_sel == 0) return;
  SelectArgs sa{};
  sa.scores = scores.data();
  sa.score_stride = score_stride;
  sa.score_unit = score_unit;
  sa.unit = sel_unit;
  sa.seq_lens = meta_dev<int32_t>(meta.seq_lens);
  sa.heads = sel_heads.data() + lp.sel_offset;
  sa.n_select = lp.n_sel;
  sa.row_heads = row_heads;
  sa.lists = lists.data();
  sa.counts = list_counts.data();
  sa.unit_scores = unit_scores.data();
  sa.list_stride = list_stride;
  const bool lychee = pol.kind == GpuPolicy::Kind::kLychee;
  sa.strategy = lychee ? GpuSelect(pol.strategy) : GpuSelect::kTopK;
  sa.budget = pol.budget;
  sa.value = pol.value;
  sa.sink = lychee ? pol.sink : 0;
  sa.recent = lychee ? pol.recent : 0;
  sa.scale = 1.0f / std::sqrt(float(c.head_dim));
  select_units(sa, batch, stream);
}

void GpuRunner::set_policy(const GpuPolicy& p) {
  Impl& m = *impl_;
  const ModelConfig& c = m.c;
  const int P = m.o.page_size, L = c.n_layers, KV = c.n_kv_heads;
  using Kind = GpuPolicy::Kind;
  using HeadSpec = Impl::HeadSpec;
  LY_CHECK(p.kind == Kind::kFull || c.head_dim == 64 || c.head_dim == 128, ErrorCode::kUnsupported,
           "sparse attention policies on the GPU need head_dim 64 or 128 (the hybrid-head kernel); this model "
           "has {} (use --device cpu)", c.head_dim);
  const size_t roles_size = size_t(L) * size_t(KV);
  if (p.kind == Kind::kLychee || p.kind == Kind::kDuo)
    LY_CHECK(p.retrieval.size() == roles_size, ErrorCode::kInvalidArgument,
             "GPU policy: {} head roles for a model of {} layers x {} KV heads", p.retrieval.size(), L, KV);

  std::vector<std::vector<HeadSpec>> patterns(1, std::vector<HeadSpec>(size_t(KV)));
  std::vector<Impl::LayerPlan> plans(static_cast<size_t>(L));
  std::vector<int32_t> sel;  // selector heads of every layer, concatenated
  auto pattern_index = [&](const std::vector<HeadSpec>& pat) {
    for (size_t i = 0; i < patterns.size(); ++i)
      if (patterns[i] == pat) return int(i);
    patterns.push_back(pat);
    return int(patterns.size() - 1);
  };
  auto add_selectors = [&](Impl::LayerPlan& lp, const std::vector<int>& heads) {
    lp.sel_offset = int(sel.size());
    lp.n_sel = int(heads.size());
    sel.insert(sel.end(), heads.begin(), heads.end());
  };
  int sel_unit = 1, score_unit = 1, row_heads = KV, list_units = 1, score_entries = 1;
  const int max_ctx = m.max_context;

  switch (p.kind) {
    case Kind::kFull: break;
    case Kind::kLychee: {
      const int U = p.unit;
      LY_CHECK(is_pow2(U) && U <= P && (U == 1 || U >= 16), ErrorCode::kUnsupported,
               "--block-size {}: LycheeDecode on the GPU selects tokens (1) or blocks of a power of two from 16 "
               "to the KV page size ({}); use one of those or --device cpu", U, P);
      LY_CHECK(p.strategy >= 0 && p.strategy <= 3, ErrorCode::kInvalidArgument, "GPU policy: strategy {}", p.strategy);
      const ScoreKind score = U == 1 ? ScoreKind::kGroupToken : ScoreKind::kGroupChunk16;
      sel_unit = U;
      score_unit = U == 1 ? 1 : 16;
      list_units = ceil_div_int(max_ctx, U) + 1;
      score_entries = ceil_div_int(max_ctx, score_unit) + 1;
      for (int l = 0; l < L; ++l) {
        std::vector<HeadSpec> pat(static_cast<size_t>(KV));
        std::vector<int> retrieval;
        for (int h = 0; h < KV; ++h) {
          if (l == 0 || p.retrieval[size_t(l) * KV + h]) {
            pat[size_t(h)].score = l + 1 < L ? score : ScoreKind::kNone;  // the last layer's sets are never read
            retrieval.push_back(h);
          } else {
            pat[size_t(h)] = {ListKind::kUnits, ScoreKind::kNone, U, false};
          }
        }
        plans[size_t(l)].pattern = pattern_index(pat);
        if (l + 1 < L) add_selectors(plans[size_t(l)], retrieval);
      }
      break;
    }
    case Kind::kTidal: {
      std::vector<int> layers;
      for (int l : p.select_layers) {
        LY_CHECK(l >= 0 && l < L, ErrorCode::kInvalidArgument, "tidal: selection layer {} is outside 0..{}", l, L - 1);
        if (l >= p.dense_layers) layers.push_back(l);  // the reference ignores selections in dense layers
      }
      std::sort(layers.begin(), layers.end());
      const int first = layers.empty() ? L : layers[0];
      row_heads = c.n_heads;
      list_units = max_ctx + 1;
      score_entries = max_ctx + 1;
      std::vector<int> all_heads(static_cast<size_t>(c.n_heads));
      std::iota(all_heads.begin(), all_heads.end(), 0);
      for (int l = p.dense_layers; l < L; ++l) {
        std::vector<HeadSpec> pat(static_cast<size_t>(KV));
        if (std::binary_search(layers.begin(), layers.end(), l)) {
          for (auto& h : pat) h.score = ScoreKind::kRowToken;
          add_selectors(plans[size_t(l)], all_heads);
        } else if (l > first) {
          for (auto& h : pat) h = {ListKind::kUnits, ScoreKind::kNone, 1, true};
          plans[size_t(l)].union_count = true;
        }
        plans[size_t(l)].pattern = pattern_index(pat);
      }
      break;
    }
    case Kind::kQuest: {
      const int qp = p.quest_page;
      LY_CHECK(is_pow2(qp) && qp <= P, ErrorCode::kUnsupported,
               "quest page {}: Quest on the GPU needs a power of two that divides the KV page size ({}); use "
               "--device cpu", qp, P);
      row_heads = c.n_heads;
      sel_unit = score_unit = qp;
      list_units = score_entries = ceil_div_int(max_ctx, qp) + 1;
      std::vector<int> all_heads(static_cast<size_t>(c.n_heads));
      std::iota(all_heads.begin(), all_heads.end(), 0);
      std::vector<HeadSpec> pat(size_t(KV), HeadSpec{ListKind::kUnits, ScoreKind::kNone, qp, true});
      for (int l = p.dense_layers; l < L; ++l) {
        plans[size_t(l)].pattern = pattern_index(pat);
        plans[size_t(l)].quest = true;
        plans[size_t(l)].union_count = true;
        add_selectors(plans[size_t(l)], all_heads);
      }
      break;
    }
    case Kind::kDuo: {
      LY_CHECK(p.window_sink >= 0 && p.window_recent >= 1, ErrorCode::kInvalidArgument,
               "duo: sink {} and recent {}", p.window_sink, p.window_recent);
      for (int l = 0; l < L; ++l) {
        std::vector<HeadSpec> pat(static_cast<size_t>(KV));
        for (int h = 0; h < KV; ++h)
          if (!p.retrieval[size_t(l) * KV + h]) pat[size_t(h)] = {ListKind::kWindow, ScoreKind::kNone, 1, false};
        plans[size_t(l)].pattern = pattern_index(pat);
      }
      break;
    }
  }
  LY_ASSERT(int(patterns.size()) <= L + 1);

  // Buffers: rows for every (batch row, query head) serve KV-head rows too.
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  const size_t rows = size_t(m.o.max_batch) * size_t(c.n_heads);
  const bool selects = !sel.empty() || p.kind == Kind::kQuest;
  m.scores = selects ? DeviceBuffer<float>(rows * size_t(score_entries)) : DeviceBuffer<float>();
  m.unit_scores = selects ? DeviceBuffer<float>(rows * size_t(list_units)) : DeviceBuffer<float>();
  m.lists = selects ? DeviceBuffer<int32_t>(rows * size_t(list_units)) : DeviceBuffer<int32_t>();
  m.list_counts = selects ? DeviceBuffer<int32_t>(rows) : DeviceBuffer<int32_t>();
  m.sel_heads = DeviceBuffer<int32_t>(std::max<size_t>(1, sel.size()));
  if (!sel.empty())
    LY_CUDA_CHECK(cudaMemcpy(m.sel_heads.data(), sel.data(), sel.size() * 4, cudaMemcpyHostToDevice));
  if (p.kind == Kind::kQuest) {
    m.quest_layer_elems = size_t(m.pool->n_pages()) * KV * size_t(P / p.quest_page) * c.head_dim;
    m.quest_min = DeviceBuffer<bf16>(m.quest_layer_elems * L);
    m.quest_max = DeviceBuffer<bf16>(m.quest_layer_elems * L);
  } else {
    m.quest_layer_elems = 0;
    m.quest_min = DeviceBuffer<bf16>();
    m.quest_max = DeviceBuffer<bf16>();
  }
  m.pol = p;
  m.policy_set = true;
  ++m.policy_epoch;
  m.patterns = std::move(patterns);
  m.n_used_patterns = int(m.patterns.size());
  m.layer_plans = std::move(plans);
  m.sel_unit = sel_unit;
  m.score_unit = score_unit;
  m.row_heads = row_heads;
  m.list_stride = list_units;
  m.score_stride = score_entries;
  for (auto& [key, g] : m.graphs) cudaGraphExecDestroy(g);
  m.graphs.clear();
}

const GpuPolicy& GpuRunner::policy() const { return impl_->pol; }

std::vector<uint64_t> GpuRunner::take_token_reads() {
  Impl& m = *impl_;
  std::vector<unsigned long long> v(size_t(m.o.max_batch));
  LY_CUDA_CHECK(cudaMemcpyAsync(v.data(), m.token_reads.data(), v.size() * 8, cudaMemcpyDeviceToHost, m.stream));
  LY_CUDA_CHECK(cudaMemsetAsync(m.token_reads.data(), 0, v.size() * 8, m.stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return std::vector<uint64_t>(v.begin(), v.end());
}

}  // namespace lychee::cuda
