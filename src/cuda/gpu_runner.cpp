#include "cuda/gpu_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

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

// Per-step metadata, one contiguous block copied host -> device before each forward.
struct MetaLayout {
  size_t tokens, positions, kv_page, kv_row, seq_lens, q_lens, block_table, items, n_items,
      merge_begin, merge_count, total;
  MetaLayout(int max_tokens, int max_batch, int max_pages, int max_items, int n_kv) {
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
    block_table = take(size_t(max_batch) * max_pages * 4);
    items = take(size_t(max_items) * sizeof(DecodeWorkItem));
    n_items = take(4);
    merge_begin = take(size_t(max_batch) * n_kv * 4);
    merge_count = take(size_t(max_batch) * n_kv * 4);
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
  std::map<int, cudaGraphExec_t> graphs;

  Impl(std::shared_ptr<const GpuWeights> weights, const RunnerOptions& opt);
  ~Impl();
  template <typename T> T* meta_host(size_t off) { return reinterpret_cast<T*>(meta_h.data() + off); }
  template <typename T> T* meta_dev(size_t off) { return reinterpret_cast<T*>(meta_d.data() + off); }
  void ensure_pages(GpuSeq& seq, int new_length);
  // The host writes meta_h for the next step only once the device has copied the last one.
  void wait_meta() { LY_CUDA_CHECK(cudaEventSynchronize(meta_consumed)); }
  void upload_meta() {
    LY_CUDA_CHECK(cudaMemcpyAsync(meta_d.data(), meta_h.data(), meta.total, cudaMemcpyHostToDevice, stream));
    LY_CUDA_CHECK(cudaEventRecord(meta_consumed, stream));
  }
  void forward(int n, bool decode, int batch, int q_len, int max_kv_len);
  void attention(int layer, bool decode, int batch, int q_len, int max_kv_len);
  void decode_forward(int batch);
};

GpuRunner::Impl::Impl(std::shared_ptr<const GpuWeights> weights, const RunnerOptions& opt)
    : w(std::move(weights)), c(w->config()), o(opt),
      max_context(opt.max_context > 0 ? std::min(opt.max_context, c.max_context) : c.max_context),
      max_pages((max_context + opt.page_size - 1) / opt.page_size + 1),
      max_tokens(std::max(opt.max_prefill_tokens, opt.max_batch)),
      max_items(std::max(2 * device_info().sm_count * 4, opt.max_batch * c.n_kv_heads)),
      max_slots(max_items),
      meta(max_tokens, opt.max_batch, max_pages, max_items, c.n_kv_heads) {
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
    DecodeAttentionArgs a{};
    a.q = q.data();
    a.k_pool = kp;
    a.v_pool = vp;
    a.page_lists = meta_dev<int32_t>(meta.block_table);
    a.seq_lens = meta_dev<int32_t>(meta.seq_lens);
    a.items = meta_dev<DecodeWorkItem>(meta.items);
    a.n_items = meta_dev<int32_t>(meta.n_items);
    a.merge_begin = meta_dev<int32_t>(meta.merge_begin);
    a.merge_count = meta_dev<int32_t>(meta.merge_count);
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
    attention(l, decode, batch, q_len, max_kv_len);
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
  auto it = graphs.find(batch);
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
    graphs.emplace(batch, exec);
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

void GpuRunner::decode(std::span<GpuSeq* const> seqs, std::span<const int32_t> tokens) {
  Impl& m = *impl_;
  const int batch = int(seqs.size());
  LY_CHECK(batch >= 1 && batch <= m.o.max_batch, ErrorCode::kInvalidArgument,
           "decode batch of {} sequences (1..{} supported)", batch, m.o.max_batch);
  LY_CHECK(tokens.empty() || int(tokens.size()) == batch, ErrorCode::kInvalidArgument,
           "decode got {} tokens for {} sequences", tokens.size(), batch);
  std::vector<DecodeHeadWork> heads;
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
    std::copy(s.pages.begin(), s.pages.end(), m.meta_host<int32_t>(m.meta.block_table) + size_t(b) * m.max_pages);
    const int n_pages = (s.length + 1 + m.o.page_size - 1) / m.o.page_size;
    for (int h = 0; h < m.c.n_kv_heads; ++h) heads.push_back({b, h, b * m.max_pages, n_pages});
  }
  // The split plan only feeds the tensor-core kernel (head_dim 64/128); other head dims take the
  // generic attention, which ignores it.
  const bool tc = m.c.head_dim == 64 || m.c.head_dim == 128;
  const DecodePlan plan = plan_decode(heads, batch, m.c.n_kv_heads, device_info().sm_count,
                                      tc ? decode_attention_ctas_per_sm(m.c.head_dim, m.o.page_size) : 2, 2,
                                      m.max_items);
  std::copy(plan.items.begin(), plan.items.end(), m.meta_host<DecodeWorkItem>(m.meta.items));
  *m.meta_host<int32_t>(m.meta.n_items) = int32_t(plan.items.size());
  std::copy(plan.merge_begin.begin(), plan.merge_begin.end(), m.meta_host<int32_t>(m.meta.merge_begin));
  std::copy(plan.merge_count.begin(), plan.merge_count.end(), m.meta_host<int32_t>(m.meta.merge_count));
  m.upload_meta();
  if (tokens.empty())  // feed the tokens sampled on the device by the previous step
    LY_CUDA_CHECK(cudaMemcpyAsync(m.meta_dev<int32_t>(m.meta.tokens), m.sampled.data(), size_t(batch) * 4,
                                  cudaMemcpyDeviceToDevice, m.stream));
  m.decode_forward(batch);
  for (GpuSeq* s : seqs) s->length += 1;
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
}

void GpuRunner::truncate(GpuSeq& seq, int n) {
  LY_CHECK(n >= 0 && n <= seq.length, ErrorCode::kInvalidArgument, "cannot truncate a sequence of {} tokens to {}",
           seq.length, n);
  const size_t keep = size_t((n + impl_->o.page_size - 1) / impl_->o.page_size);
  impl_->pool->release(std::span<const int32_t>(seq.pages).subspan(keep));
  seq.pages.resize(keep);
  seq.length = n;
}

void GpuRunner::synchronize() { LY_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }
int GpuRunner::n_free_pages() const { return impl_->pool->n_free(); }
int GpuRunner::n_pages() const { return impl_->pool->n_pages(); }
int GpuRunner::page_size() const { return impl_->o.page_size; }
double GpuRunner::kv_pool_gib() const {
  return double(impl_->pool->bytes_per_page()) * impl_->pool->n_pages() / double(size_t(1) << 30);
}

}  // namespace lychee::cuda
