#include "cuda/runner/gpu_runner.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "attention/policies.h"
#include "attention/tp_assign.h"
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
ShardedWeights shard_weights(const Checkpoint* ck, const ModelConfig& c, uint64_t seed, GpuWeightFormat format,
                             const Fp8Keep& keep, const TpPlan& plan) {
  const int n = int(plan.devices.size());
  check_tensor_parallel(c, n);
  LY_CHECK(plan.kv_heads.size() == plan.devices.size(), ErrorCode::kInvalidArgument,
           "tensor parallel: {} devices but {} head lists", plan.devices.size(), plan.kv_heads.size());
  int n_devices = 0;
  LY_CUDA_CHECK(cudaGetDeviceCount(&n_devices));
  for (int d : plan.devices)
    LY_CHECK(d >= 0 && d < n_devices, ErrorCode::kInvalidArgument,
             "--tensor-parallel {}: CUDA device {} does not exist (this process sees {})", n, d, n_devices);
  int current = 0;
  LY_CUDA_CHECK(cudaGetDevice(&current));
  ShardedWeights out;
  for (int r = 0; r < n; ++r) {
    LY_CUDA_CHECK(cudaSetDevice(plan.devices[size_t(r)]));
    out.push_back(std::make_shared<const GpuWeights>(
        GpuWeights::shard(ck, c, seed, format, keep, plan.kv_heads[size_t(r)], r, n)));
  }
  LY_CUDA_CHECK(cudaSetDevice(current));
  return out;
}
uint64_t weight_bytes_per_step(const GpuWeights& w, int batch) { return w.bytes_read_per_step(batch); }
size_t weight_bytes(const GpuWeights& w) { return w.bytes(); }

namespace {

size_t auto_kv_bytes(const ModelConfig& c, const RunnerOptions& o, int max_context) {
  const size_t per_token =
      size_t(2) * c.n_layers * c.n_kv_heads * size_t(kv_bytes_per_token_head(o.kv_cache_dtype, c.head_dim));
  const size_t want = per_token * size_t(max_context + o.page_size) * size_t(o.max_batch);
  size_t free_b = 0, total_b = 0;
  LY_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t reserve = size_t(2) << 30;  // activations, workspaces, cuBLAS, cuDNN
  const size_t avail = free_b > reserve ? free_b - reserve : 0;
  return std::min(want, avail);
}

// The longest sequence the runner serves: RunnerOptions::max_context capped by the model's.
int runner_max_context(const RunnerOptions& o, const ModelConfig& c) {
  return o.max_context > 0 ? std::min(o.max_context, c.max_context) : c.max_context;
}

}  // namespace

// Rows whose decode products all take one path, each row's results independent of the others:
// the bf16 GEMV's (a row's bits do not depend on m: Bf16GemvDeterminism), fused or not as the
// options say for every m up to here. cuBLASLt beyond (its kernel, and so a row's sums, depends
// on m), and a single row where the GEMV is off.
int batch_invariant_rows(const RunnerOptions& o) {
  int rows = o.bf16_gemv_max_rows > 0 ? o.bf16_gemv_max_rows : 1;
  if (o.fused_decode_max_rows > 0) rows = std::min(rows, o.fused_decode_max_rows);
  return std::max(1, std::min(rows, o.max_batch));
}

namespace {

PlannerShape planner_shape(const ModelConfig& c, const RunnerOptions& o, int max_items, int max_pages) {
  PlannerShape s;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.page_size = o.page_size;
  s.sm_count = device_info().sm_count;
  s.ctas_per_sm = decode_attention_ctas_per_sm(c.head_dim, o.page_size);
  s.max_items = max_items;
  s.max_pages = max_pages;
  s.invariant_rows = batch_invariant_rows(o);
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

Shard::Shard(std::shared_ptr<const GpuWeights> weights, const RunnerOptions& opt, size_t kv_bytes)
    : w(std::move(weights)), c(w->config()), rank(w->tp_rank()), device(w->device()), o(opt),
      max_context(runner_max_context(opt, c)),
      max_pages((max_context + opt.page_size - 1) / opt.page_size + 1),
      max_tokens(std::max(opt.max_prefill_tokens, opt.max_batch)),
      max_items(std::max(2 * device_info().sm_count * 4, opt.max_batch * c.n_kv_heads)),
      max_slots(max_items),
      meta(max_tokens, opt.max_batch, max_pages, max_items, c.n_heads, c.n_layers + 1),
      tokens_ring((use(), size_t(opt.max_batch))),
      reads_ring(size_t(opt.max_batch)),
      planner(planner_shape(c, opt, max_items, max_pages), meta) {
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LY_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  LY_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event, cudaEventDisableTiming));
  LY_CUDA_CHECK(cudaEventCreateWithFlags(&join_event, cudaEventDisableTiming));
  for (cudaEvent_t& e : step_consumed) LY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  LY_CUDA_CHECK(cudaEventCreateWithFlags(&plan_consumed, cudaEventDisableTiming));
  LY_CUDA_CHECK(cudaEventCreateWithFlags(&reduce_event, cudaEventDisableTiming));
  gemm = std::make_unique<Gemm>(stream);
  pool = std::make_unique<KvPool>(c, o.page_size, kv_bytes, o.kv_cache_dtype);
  prefill_attn = std::make_unique<PrefillAttention>();
  const size_t d = size_t(c.d_model), mt = size_t(max_tokens);
  x = DeviceBuffer<float>(mt * d);
  h = DeviceBuffer<bf16>(mt * d);
  qkv = DeviceBuffer<bf16>(mt * size_t(c.q_dim() + 2 * c.kv_dim()));
  // The prefill attention's Q and output: cuDNN's graph is built for the query bucket (a power of
  // two at least 64, prefill_q_bucket), whose rows it may address past the chunk's own.
  const size_t q_rows = size_t(prefill_q_bucket(max_tokens, INT32_MAX));
  q = DeviceBuffer<bf16>(q_rows * size_t(c.q_dim()));
  att = DeviceBuffer<bf16>(q_rows * size_t(c.q_dim()));
  o_buf = DeviceBuffer<bf16>(mt * d);
  gu = DeviceBuffer<bf16>(mt * 2 * size_t(c.d_ff));
  act = DeviceBuffer<bf16>(mt * size_t(c.d_ff));
  if (w->format() == GpuWeightFormat::kFp8 && (!o.fp8_gemv || fp8_gemv_launches(max_tokens) == 0))
    dequant = DeviceBuffer<bf16>(largest_matrix(*w));
  if (w->format() == GpuWeightFormat::kFp8 && o.fp8_prefill_gemm && (!o.fp8_gemv || fp8_gemv_launches(max_tokens) == 0)) {
    const size_t widest = size_t(std::max({c.d_model, c.q_dim(), c.d_ff}));
    act8 = DeviceBuffer<uint8_t>(mt * widest);
    act8_scales = DeviceBuffer<float>(mt);
  }
  logits = DeviceBuffer<float>(rank == 0 ? size_t(logit_rows(o)) * c.vocab_size : 0);
  {  // the fused decode layers' requirements: every matrix as bf16_gemv_weights_fit asks (FP8 ones
     // only with the FP8 GEMV on), norm weights 16-byte aligned (the activation buffers are
     // cudaMalloc'ed: 256-byte aligned)
    const auto aligned = [](const void* p) { return p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    fusable = aligned(w->out_norm) && gemv_weights_fit(lm_head());
    for (const GpuLayerWeights& L : w->layers)
      fusable = fusable && gemv_weights_fit(L.wqkv) && gemv_weights_fit(L.wo) && gemv_weights_fit(L.w_gate_up) &&
                gemv_weights_fit(L.w_down) && aligned(L.attn_norm) && aligned(L.ffn_norm);
    if (fusable) {  // a decode step's rows, or a chunked verification step's (up to the logits rows)
      const size_t rows = size_t(fused_buffer_rows());
      ss_part = DeviceBuffer<float>(rows * size_t(bf16_gemv_ss_count(c.d_model)));
      h_lo = DeviceBuffer<bf16>(rows * size_t(c.d_model));
    }
  }
  // A slot's rows: the group, or a verification step's group x rows_per_seq (every position's
  // rows, also past one mma tile: up to kDecodeMaxVerifyRows positions).
  const size_t slot_rows = size_t(c.group_size()) * kDecodeMaxVerifyRows;
  partial_o = DeviceBuffer<float>(size_t(max_slots) * slot_rows * c.head_dim);
  partial_lse = DeviceBuffer<float>(size_t(max_slots) * slot_rows);
  sampled = DeviceBuffer<int32_t>(size_t(o.max_batch));
  meta_h = PinnedBuffer<uint8_t>(meta.total + meta.step_bytes());
  std::memset(meta_h.data(), 0, meta_h.size());
  meta_d = DeviceBuffer<uint8_t>(meta.total);
  LY_CUDA_CHECK(cudaMemset(meta_d.data(), 0, meta.total));
  decode_table = DeviceBuffer<int32_t>(size_t(o.max_batch) * max_pages);
  LY_CUDA_CHECK(cudaMemset(decode_table.data(), 0, decode_table.size() * 4));
  token_reads = DeviceBuffer<unsigned long long>(size_t(o.max_batch));
  LY_CUDA_CHECK(cudaMemset(token_reads.data(), 0, size_t(o.max_batch) * 8));
  // The memsets above run on the legacy stream, which `stream` (non-blocking) does not wait for.
  LY_CUDA_CHECK(cudaDeviceSynchronize());
}

Shard::~Shard() {
  cudaSetDevice(device);  // the members below are this device's
  for (cudaEvent_t e : attn_events) cudaEventDestroy(e);
  for (cudaEvent_t e : step_consumed)
    if (e != nullptr) cudaEventDestroy(e);
  if (plan_consumed != nullptr) cudaEventDestroy(plan_consumed);
  if (reduce_event != nullptr) cudaEventDestroy(reduce_event);
  if (fork_event != nullptr) cudaEventDestroy(fork_event);
  if (join_event != nullptr) cudaEventDestroy(join_event);
  if (side != nullptr) cudaStreamDestroy(side);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

GpuRunner::Impl::Impl(std::vector<std::shared_ptr<const GpuWeights>> weights, const RunnerOptions& opt) : o(opt) {
  LY_CHECK(!weights.empty() && weights[0] != nullptr, ErrorCode::kInvalidArgument, "GPU runner: no weights");
  LY_CHECK(opt.max_batch >= 1 && opt.max_prefill_tokens >= 1, ErrorCode::kInvalidArgument,
           "max_batch and max_prefill_tokens must be >= 1");
  c = weights[0]->full_config();
  // Lab knobs for A/B runs of the bf16 GEMV, the fused decode layers and the prefill (RunnerOptions).
  const auto int_from_env = [](const char* name, int& field, long lo, long hi, const char* what) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == 0) return;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    LY_CHECK(*end == 0 && r >= lo && r <= hi, ErrorCode::kInvalidArgument, "{}={}: expected {} to {}{}", name, v, lo,
             hi, what);
    field = int(r);
  };
  const auto flag_from_env = [](const char* name, bool& field) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == 0) return;
    LY_CHECK(std::string(v) == "0" || std::string(v) == "1", ErrorCode::kInvalidArgument, "{}={}: expected 0 or 1",
             name, v);
    field = std::string(v) == "1";
  };
  int_from_env("LYCHEE_BF16_GEMV_ROWS", o.bf16_gemv_max_rows, 0, kBf16GemvMaxRows, "");
  int_from_env("LYCHEE_FUSED_DECODE_ROWS", o.fused_decode_max_rows, 0, kBf16GemvMaxRows, "");
  if (const char* v = std::getenv("LYCHEE_FUSED_PDL"); v != nullptr && *v != 0)
    o.fused_pdl_products = RunnerOptions::parse_pdl_products(v);
  flag_from_env("LYCHEE_FUSED_ROPE", o.fused_qkv_rope);
  flag_from_env("LYCHEE_FUSED_VERIFY", o.fused_verify_chunks);
  int_from_env("LYCHEE_PREFILL_POW2", o.prefill_pow2_tail, 0, 65536, " tokens in the tail pass (0: off)");
  int_from_env("LYCHEE_PREFILL_ATTN_POW2", o.prefill_attn_pow2_tail, 0, 65536, " tokens in the tail part (0: off)");
  if (const char* v = std::getenv("LYCHEE_GEMV_EPILOGUES"); v != nullptr && *v != 0)
    o.gemv_epilogues = RunnerOptions::parse_gemv_epilogues(v);
  // Prompt tokens per prefill pass (a lab A/B of the pass size; the default is max_prefill_tokens).
  int_from_env("LYCHEE_PREFILL_TOKENS", o.max_prefill_tokens, 1, 65536, " tokens per prefill pass");
  row_table_id.assign(size_t(opt.max_batch), 0);
  row_synced.assign(size_t(opt.max_batch), 0);
  const int n = int(weights.size());
  for (int r = 0; r < n; ++r) {
    const GpuWeights& w = *weights[size_t(r)];
    LY_CHECK(w.tp_size() == n && w.tp_rank() == r, ErrorCode::kInvalidArgument,
             "GPU runner: shard {} of {} holds rank {} of {}", r, n, w.tp_rank(), w.tp_size());
    devices.push_back(w.device());
    std::vector<int> heads = w.kv_heads();
    if (heads.empty())
      for (int h = 0; h < c.n_kv_heads; ++h) heads.push_back(h);
    kv_heads.push_back(std::move(heads));
  }
  const std::string why = gpu_unsupported(full_spec(c), c, opt.page_size);
  LY_CHECK(why.empty(), ErrorCode::kUnsupported, "{}", why);
  int current = 0;
  LY_CUDA_CHECK(cudaGetDevice(&current));
  // Peer access between the ranks (rank 0's sampled tokens reach the others by a device copy).
  for (int a : devices)
    for (int b : devices) {
      int can = 0;
      if (a == b || cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) continue;
      LY_CUDA_CHECK(cudaSetDevice(a));
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else LY_CUDA_CHECK(e);
    }
  // The same page count on every rank: the smallest any rank's memory allows.
  const int max_ctx = runner_max_context(opt, c);
  size_t kv_bytes = SIZE_MAX;
  for (int r = 0; r < n; ++r) {
    LY_CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
    const ModelConfig& cr = weights[size_t(r)]->config();
    const size_t want = o.kv_memory_gib > 0 ? size_t(o.kv_memory_gib * double(size_t(1) << 30))
                                            : auto_kv_bytes(cr, o, max_ctx);
    kv_bytes = std::min(kv_bytes, want);
  }
  for (int r = 0; r < n; ++r) {
    LY_CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
    shards.push_back(std::make_unique<Shard>(weights[size_t(r)], o, kv_bytes));
  }
  for (int r = 1; r < n; ++r)
    LY_CHECK(shards[size_t(r)]->pool->n_pages() == lead().pool->n_pages(), ErrorCode::kInternal,
             "tensor parallel: rank {} has {} KV pages, rank 0 {}", r, shards[size_t(r)]->pool->n_pages(),
             lead().pool->n_pages());
  const bool shared = std::set<int>(devices.begin(), devices.end()).size() < devices.size();
  LY_CHECK(!shared || (o.tp_one_device && !o.cuda_graphs), ErrorCode::kInvalidArgument,
           "tensor parallel: two ranks on one CUDA device (devices {}) is a test mode (RunnerOptions::tp_one_device, "
           "without CUDA graphs)",
           fmt::join(devices, ","));
  LY_CHECK(!o.tp_one_device || shared, ErrorCode::kInvalidArgument,
           "RunnerOptions::tp_one_device: the ranks must share one device (devices {})", fmt::join(devices, ","));
  if ((n > 1 || o.nccl) && !o.tp_one_device) comm = std::make_unique<NcclComm>(devices);
  if (o.tp_split_lm_head && n > 1) {
    vocab_part = tp_vocab_rows(c.vocab_size, n, 0).part;
    for (auto& sp : shards) {
      sp->use();
      sp->lm_local = DeviceBuffer<float>(size_t(logit_rows(o)) * size_t(vocab_part));
      if (comm) sp->lm_gathered = DeviceBuffer<float>(size_t(n) * size_t(logit_rows(o)) * size_t(vocab_part));
    }
  }
  LY_CUDA_CHECK(cudaSetDevice(devices[0]));
  LY_CUDA_CHECK(cudaEventCreateWithFlags(&sampled_ready, cudaEventDisableTiming));
  LY_CUDA_CHECK(cudaSetDevice(current));
  const KvPool& p = *lead().pool;
  LY_LOG_INFO("GPU runner: {} KV pages of {} tokens ({:.2f} GiB{}, {}), max context {}, max batch {}{}", p.n_pages(),
              o.page_size, double(p.bytes_per_page()) * p.n_pages() / (1 << 30), n > 1 ? " per GPU" : "",
              kv_cache_dtype_name(p.dtype()),
              lead().max_context, o.max_batch,
              n > 1 ? fmt::format(", tensor parallel over {} GPUs", n) : std::string());
}

GpuRunner::Impl::~Impl() {
  graphs.clear();
  if (sampled_ready != nullptr) {
    cudaSetDevice(devices[0]);
    cudaEventDestroy(sampled_ready);
  }
}

std::vector<cudaStream_t> GpuRunner::Impl::streams() const {
  std::vector<cudaStream_t> v;
  for (const auto& s : shards) v.push_back(s->stream);
  return v;
}

void Shard::wait_event(cudaEvent_t e) {
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaSuccess) return;
  LY_CHECK(q == cudaErrorNotReady, ErrorCode::kInternal, "CUDA error: {}", cudaGetErrorString(q));
  ++stalls;
  LY_CUDA_CHECK(cudaEventSynchronize(e));
}

void Shard::begin_step() {
  staging ^= 1;
  wait_event(step_consumed[staging]);
}

void Shard::upload_step(size_t bytes) {
  LY_CUDA_CHECK(cudaMemcpyAsync(meta_d.data(), meta_host<uint8_t>(0), bytes, cudaMemcpyHostToDevice, stream));
  LY_CUDA_CHECK(cudaEventRecord(step_consumed[staging], stream));
}

void Shard::plan_and_upload(const GpuPolicyPlan* plan, std::span<const int> lens, int rows_per_seq) {
  const size_t end =
      planner.plan(plan, lens, meta_h.data(), [&] { wait_event(plan_consumed); }, invariant, rows_per_seq);
  if (end == 0) return;  // the plans on the device are still right
  LY_CUDA_CHECK(cudaMemcpyAsync(meta_d.data() + meta.n_items, meta_h.data() + meta.n_items, end - meta.n_items,
                                cudaMemcpyHostToDevice, stream));
  LY_CUDA_CHECK(cudaEventRecord(plan_consumed, stream));
}

void Shard::ensure_pages(GpuSeq& seq, int new_length) {
  LY_CHECK(new_length <= max_context, ErrorCode::kCapacity,
           "sequence of {} tokens exceeds the GPU context limit of {} tokens (--max-context)", new_length,
           max_context);
  while (int(seq.pages.size()) * o.page_size < new_length) seq.pages.push_back(pool->alloc());
}

GpuRunner::GpuRunner(std::shared_ptr<const GpuWeights> weights, const RunnerOptions& options)
    : GpuRunner(ShardedWeights{std::move(weights)}, options) {}

GpuRunner::GpuRunner(ShardedWeights shards, const RunnerOptions& options)
    : impl_(std::make_unique<Impl>(std::move(shards), options)) {}

GpuRunner::~GpuRunner() = default;

const ModelConfig& GpuRunner::config() const { return impl_->c; }
const RunnerOptions& GpuRunner::options() const { return impl_->o; }
int GpuRunner::max_context() const { return impl_->shards[0]->max_context; }
int GpuRunner::tensor_parallel() const { return impl_->size(); }

int GpuRunner::fused_decode_rows() const { return impl_->fused_rows(); }

namespace {

// The mask of a comma-separated list of `names` (or "none": 0); kInvalidArgument naming the bad
// entry and the choices.
int parse_mask(const std::string& list, std::initializer_list<std::pair<std::string_view, int>> names,
               std::string_view what) {
  int mask = 0;
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, end - at);
    int bit = 0;
    std::string choices;
    for (const auto& [n, b] : names) {
      if (n == name) bit = b;
      choices += std::string(n) + ", ";
    }
    LY_CHECK(bit != 0 || name == "none", ErrorCode::kInvalidArgument, "{} '{}': '{}' is none of {}none", what, list,
             name, choices);
    mask |= bit;
    at = end + 1;
  }
  return mask;
}

}  // namespace

int RunnerOptions::parse_pdl_products(const std::string& list) {
  return parse_mask(list, {{"qkv", kPdlQkv}, {"o", kPdlOutput}, {"gate_up", kPdlGateUp}, {"down", kPdlDown}},
                    "fused products under PDL");
}

int RunnerOptions::parse_gemv_epilogues(const std::string& list) {
  return parse_mask(list, {{"rope", kEpilogueRope}, {"swiglu", kEpilogueSwiGlu}}, "GEMV epilogues");
}

int GpuRunner::Impl::fused_rows() const {
  return size() == 1 && !comm && !o.tp_one_device && shards[0]->fusable ? o.fused_decode_max_rows : 0;
}

TpStats GpuRunner::tp_stats() const {
  const Impl& m = *impl_;
  return {m.size(), m.reduce_calls, m.reduce_bytes, all_reduce_wire_bytes(m.reduce_bytes, m.size()), 0,
          m.gather_calls, m.gather_bytes};
}

void GpuRunner::Impl::count_reduces(int n, int rows) {
  if (!comm && !o.tp_one_device) return;
  reduce_calls += 2 * uint64_t(c.n_layers);
  reduce_bytes += 2 * uint64_t(c.n_layers) * uint64_t(n) * uint64_t(c.d_model) * 2;
  if (vocab_part > 0) {
    gather_calls += 1;
    gather_bytes += uint64_t(rows) * uint64_t(vocab_part) * 4;
  }
}

void GpuRunner::Impl::upload_step_everywhere(size_t bytes) {
  Shard& s0 = lead();
  s0.upload_step(bytes);
  for (size_t r = 1; r < shards.size(); ++r) {
    Shard& m = *shards[r];
    m.use();
    m.begin_step();
    std::memcpy(m.meta_host<uint8_t>(0), s0.meta_host<uint8_t>(0), bytes);
    m.upload_step(bytes);
  }
}

int logit_rows(const RunnerOptions& o) {
  static_assert(kBf16GemvMaxRows <= kMaxVerifyRows, "a fused decode step's rows fit the logits rows");
  return std::max(o.max_batch, kMaxVerifyRows);
}

void GpuRunner::prefill(GpuSeq& seq, std::span<const int32_t> tokens, bool all_logits) {
  Impl& im = *impl_;
  Shard& lead = im.lead();
  LY_CHECK(!tokens.empty(), ErrorCode::kInvalidArgument, "prefill needs at least one token");
  LY_CHECK(!all_logits || (int(tokens.size()) <= kMaxVerifyRows && int(tokens.size()) <= im.o.max_prefill_tokens &&
                           seq.length > 0),
           ErrorCode::kInvalidArgument,
           "a verification pass takes 1..{} tokens after a prefix (max_prefill_tokens {}); got {} after {}",
           kMaxVerifyRows, im.o.max_prefill_tokens, tokens.size(), seq.length);
  im.before_forward();
  size_t start = 0;
  for (const int n : prefill_pass_sizes(int(tokens.size()), im.o.max_prefill_tokens, im.o.prefill_pow2_tail)) {
    for (int t = 0; t < n; ++t) {
      const int32_t tok = tokens[start + size_t(t)];
      LY_CHECK(tok >= 0 && tok < im.c.vocab_size, ErrorCode::kInvalidArgument,
               "token id {} is outside the vocabulary (size {})", tok, im.c.vocab_size);
    }
    lead.ensure_pages(seq, seq.length + n);
    Shard& m = lead;
    m.use();
    m.begin_step();
    for (int t = 0; t < n; ++t) {
      const int pos = seq.length + t;
      m.meta_host<int32_t>(m.meta.tokens)[t] = tokens[start + size_t(t)];
      m.meta_host<int32_t>(m.meta.positions)[t] = pos;
      m.meta_host<int32_t>(m.meta.kv_page)[t] = seq.pages[size_t(pos / m.o.page_size)];
      m.meta_host<int32_t>(m.meta.kv_row)[t] = pos % m.o.page_size;
    }
    m.meta_host<int32_t>(m.meta.q_lens)[0] = n;
    m.meta_host<int32_t>(m.meta.seq_lens)[0] = seq.length + n;
    if (im.o.prefill_attn_pow2_tail > 0) {  // Shard::attention's parts: (q_len, kv_len) each
      int32_t* parts = m.meta_host<int32_t>(m.meta.attn_parts);
      int end = 0, j = 0;
      for (const int p : prefill_attention_parts(n, im.o.prefill_attn_pow2_tail)) {
        end += p;
        parts[2 * j] = p;
        parts[2 * j + 1] = int32_t(seq.length + end);
        ++j;
      }
    }
    std::copy(seq.pages.begin(), seq.pages.end(), m.meta_host<int32_t>(m.meta.block_table));
    m.meta_host<int32_t>(m.meta.n_deltas)[0] = 0;
    im.upload_step_everywhere(m.meta.deltas);
    ++im.n_forwards;
    im.forward(n, false, 1, n, seq.length + n, all_logits ? n : 1);
    im.count_reduces(n, all_logits ? n : 1);
    seq.length += n;
    start += size_t(n);
  }
  im.lead().use();
}

std::vector<int> prefill_attention_parts(int n, int pow2_tail) {
  std::vector<int> parts = pow2_tail > 0 ? prefill_pass_sizes(n, std::max(n, 1), pow2_tail) : std::vector<int>{n};
  LY_ASSERT(int(parts.size()) <= kMaxAttnParts);
  return parts;
}

std::vector<int> prefill_pass_sizes(int n, int max_tokens, int pow2_tail) {
  LY_CHECK(n >= 0 && max_tokens >= 1 && pow2_tail >= 0, ErrorCode::kInvalidArgument,
           "prefill_pass_sizes: {} tokens in passes of at most {}, power-of-two tail {}; expected n >= 0, "
           "max_tokens >= 1 and tail >= 0", n, max_tokens, pow2_tail);
  std::vector<int> passes;
  for (int left = n; left > 0;) {
    int p = std::min(left, max_tokens);
    if (pow2_tail > 0 && p > pow2_tail) p = int(std::bit_floor(unsigned(p)));
    passes.push_back(p);
    left -= p;
  }
  return passes;
}

GpuRunner::SelectionProbe GpuRunner::selection(int row, int slot) {
  Impl& im = *impl_;
  Shard& lead = im.lead();
  LY_CHECK(row >= 0 && row < im.o.max_batch, ErrorCode::kInvalidArgument, "selection: row {} (0..{})", row,
           im.o.max_batch - 1);
  if (!lead.policy || !lead.policy->has_sets()) return {};
  const int per_kv = lead.policy->row_heads / lead.c.n_kv_heads;  // 1, or the group (per query head)
  const int kv = slot / per_kv;
  int rank = -1, local = -1;
  for (int r = 0; r < im.size(); ++r)
    for (size_t j = 0; j < im.kv_heads[size_t(r)].size(); ++j)
      if (im.kv_heads[size_t(r)][j] == kv) rank = r, local = int(j);
  LY_CHECK(rank >= 0, ErrorCode::kInvalidArgument, "selection: slot {} of a model with {} KV heads", slot,
           im.c.n_kv_heads);
  Shard& m = *im.shards[size_t(rank)];
  const GpuPolicyPlan& p = *m.policy;
  m.use();
  LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  LY_CUDA_CHECK(cudaStreamSynchronize(m.side));
  const size_t r = size_t(row) * size_t(p.row_heads) + size_t(local * per_kv + slot % per_kv);
  int32_t count = 0;
  LY_CUDA_CHECK(cudaMemcpy(&count, m.list_counts.data() + r, 4, cudaMemcpyDeviceToHost));
  count = std::clamp(count, 0, p.list_stride);
  SelectionProbe out;
  out.units.resize(size_t(count));
  if (count > 0)
    LY_CUDA_CHECK(cudaMemcpy(out.units.data(), m.lists.data() + r * size_t(p.list_stride), size_t(count) * 4,
                             cudaMemcpyDeviceToHost));
  std::sort(out.units.begin(), out.units.end());
  out.scores.resize(size_t(p.score_stride));
  LY_CUDA_CHECK(cudaMemcpy(out.scores.data(), m.scores.data() + r * size_t(p.score_stride),
                           size_t(p.score_stride) * 4, cudaMemcpyDeviceToHost));
  out.score_unit = p.score_unit;
  out.unit = p.spec.unit;
  lead.use();
  return out;
}

void GpuRunner::assume_filled(GpuSeq& seq, int length) {
  impl_->lead().ensure_pages(seq, length);
  seq.length = length;
}

void GpuRunner::fill_kv_random(uint64_t seed) {
  for (auto& sp : impl_->shards) {
    Shard& m = *sp;
    m.use();
    const size_t per_layer = size_t(m.pool->n_pages()) * m.c.n_kv_heads * size_t(m.o.page_size) * m.c.head_dim;
    for (int l = 0; l < m.c.n_layers; ++l) {
      if (m.pool->fp8()) {  // N(0, 1) values as FP8 pages hold them: codes of std 64 with scale 1/64
        const size_t rows = per_layer / size_t(m.c.head_dim);
        fill_normal_e4m3(m.pool->k8(l), per_layer, seed + 2 * uint64_t(l), 64.0f, m.stream);
        fill_normal_e4m3(m.pool->v8(l), per_layer, seed + 2 * uint64_t(l) + 1, 64.0f, m.stream);
        fill_const_f32(m.pool->k_scale(l), rows, 1.0f / 64.0f, m.stream);
        fill_const_f32(m.pool->v_scale(l), rows, 1.0f / 64.0f, m.stream);
        continue;
      }
      fill_normal_bf16(m.pool->k(l), per_layer, seed + 2 * uint64_t(l), 1.0f, m.stream);
      fill_normal_bf16(m.pool->v(l), per_layer, seed + 2 * uint64_t(l) + 1, 1.0f, m.stream);
    }
    LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  }
}

void GpuRunner::release(GpuSeq& seq) {
  impl_->lead().pool->release(seq.pages);
  seq.pages.clear();
  seq.table_id = 0;
  seq.length = 0;
  seq.quest_from = 0;
}

void GpuRunner::truncate(GpuSeq& seq, int n) {
  Shard& m = impl_->lead();
  LY_CHECK(n >= 0 && n <= seq.length, ErrorCode::kInvalidArgument, "cannot truncate a sequence of {} tokens to {}",
           seq.length, n);
  const size_t keep = std::min(seq.pages.size(), size_t((n + m.o.page_size - 1) / m.o.page_size));
  if (keep < seq.pages.size()) seq.table_id = 0;  // pages past `keep` will differ: send the row again
  m.pool->release(std::span<const int32_t>(seq.pages).subspan(keep));
  seq.pages.resize(keep);
  seq.length = n;
  seq.quest_from = std::min(seq.quest_from, n);
}

int GpuRunner::n_pages() const { return impl_->lead().pool->n_pages(); }
int GpuRunner::free_pages() const { return impl_->lead().pool->n_free(); }

void GpuRunner::share_prefix(const GpuSeq& from, GpuSeq& to, int n) {
  Impl& im = *impl_;
  Shard& lead = im.lead();
  LY_CHECK(to.length == 0 && to.pages.empty(), ErrorCode::kInvalidArgument,
           "share_prefix: the receiving sequence must be empty (it holds {} tokens)", to.length);
  LY_CHECK(n >= 0 && n <= from.length, ErrorCode::kInvalidArgument,
           "share_prefix: {} tokens asked of a sequence of {}", n, from.length);
  const int P = im.o.page_size, full = n / P;
  std::vector<int32_t> pages(from.pages.begin(), from.pages.begin() + full);
  if (n % P != 0) {
    const int32_t own = lead.pool->alloc();  // may throw kCapacity: nothing taken yet
    for (auto& sp : im.shards) {  // every rank's K/V of the page
      sp->use();
      sp->pool->copy_page(from.pages[size_t(full)], own, sp->stream);
    }
    pages.push_back(own);
  }
  for (int i = 0; i < full; ++i) lead.pool->retain(pages[size_t(i)]);
  to.pages = std::move(pages);
  to.length = n;
  to.table_id = 0;
  to.quest_from = 0;
  to.quest_epoch = -1;
}
int GpuRunner::replans() const { return impl_->shards[0]->planner.replans(); }
uint64_t GpuRunner::host_stalls() const {
  uint64_t n = 0;
  for (const auto& sp : impl_->shards) n += sp->stalls;
  return n;
}
int GpuRunner::policy_epoch() const { return impl_->shards[0]->policy_epoch; }
uint64_t GpuRunner::forwards() const { return impl_->n_forwards; }

void GpuRunner::call_before_next_forward(const void* owner, std::function<void()> f) {
  cancel_before_next_forward(owner);
  impl_->before_next.emplace_back(owner, std::move(f));
}

void GpuRunner::cancel_before_next_forward(const void* owner) {
  auto& v = impl_->before_next;
  v.erase(std::remove_if(v.begin(), v.end(), [owner](const auto& e) { return e.first == owner; }), v.end());
}

void GpuRunner::set_policy(const DecodeSpec& spec) {
  Impl& im = *impl_;
  std::vector<GpuPolicyPlan> plans;
  GpuPolicyPlan whole = plan_gpu_policy(spec, im.c, im.o.page_size, im.lead().max_context);  // checks the spec
  for (auto& sp : im.shards)
    plans.push_back(im.size() == 1 ? whole
                                   : plan_gpu_policy(tp_shard_spec(spec, im.kv_heads[size_t(sp->rank)]), sp->c,
                                                     im.o.page_size, sp->max_context));
  for (auto& sp : im.shards) {
    Shard& m = *sp;
    m.use();
    LY_CUDA_CHECK(cudaStreamSynchronize(m.stream));  // the buffers below may be in use
    m.policy = std::move(plans[size_t(m.rank)]);
    m.allocate_policy_buffers();
    ++m.policy_epoch;
    m.planner.invalidate();
  }
  im.graphs.clear();  // the graphs baked in the old buffers and patterns
}

// Rows for every (batch row, query head) serve KV-head rows too.
void Shard::allocate_policy_buffers() {
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

// Every rank's counters, on its stream; the tickets of one call are equal on every rank (each
// rank's ring issues in step).
Ticket GpuRunner::take_token_reads_async() {
  Ticket t;
  for (auto& sp : impl_->shards) {
    Shard& m = *sp;
    m.use();
    t = m.reads_ring.push(m.token_reads.data(), m.o.max_batch, m.stream);
    LY_CUDA_CHECK(cudaMemsetAsync(m.token_reads.data(), 0, size_t(m.o.max_batch) * 8, m.stream));
  }
  return t;
}

std::vector<uint64_t> GpuRunner::token_reads(const Ticket& t) {
  std::vector<uint64_t> sum;
  for (auto& sp : impl_->shards) {
    const std::span<const unsigned long long> v = sp->reads_ring.read(t);
    sum.resize(v.size(), 0);
    for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
  }
  return sum;
}

}  // namespace lychee::cuda
