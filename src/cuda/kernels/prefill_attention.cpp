// Prefill attention through cuDNN's fused SDPA (cudnn-frontend graph API), with the graph cache,
// the workspace and the fall back to our kernel (prefill_attention_fallback.cu).
//
// The cuDNN graph, per cache key:
//   Q, O   [batch][q_bucket][n_heads][head_dim] logical, token-major (BSHD) strides, and a ragged
//          offset per sequence (b * q_len_max * n_heads * head_dim elements) that places sequence
//          b where the caller's padded buffer has it. So one graph serves every q_len_max of a
//          bucket, and cuDNN touches only rows < q_lens[b] of each sequence.
//   K, V   the page pools as cuDNN's paged "containers" [n_pages][n_kv_heads][page_size][head_dim],
//          one page table [batch][1][max_pages][1] for both, max_seq_len_kv = kv_bucket.
//   mask   padding (seq_len_q = q_lens, seq_len_kv = kv_lens) + causal aligned bottom-right per
//          sequence: query i sees keys <= kv_len - q_len + i.
// cuDNN features used and the versions that bring them: paged caches 9.5, bottom-right causal at
// lengths that are not multiples of 64 9.6, paged caches with ragged Q 9.7 (9.8 in NVIDIA's
// sample), hence kMinCudnnVersion = 9.8.0; the frontend itself refuses 9.10.0 and 9.10.1 (known
// SDPA bugs), which then fall back.
#include "cuda/kernels/prefill_attention.h"

#include <cudnn.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cmath>
#include <map>
#include <unordered_map>
#include <vector>

#include <cudnn_frontend.h>

#include "core/error.h"
#include "core/log.h"
#include "cuda/common/device_buffer.h"

namespace lychee::cuda {
namespace fe = cudnn_frontend;

namespace {
// The most the split-KV partial results may take (prefill_kv_splits keeps the count within it).
constexpr size_t kSplitWorkspaceBytes = size_t(64) << 20;
}  // namespace

void validate_prefill_args(const PrefillAttentionArgs& a) {
  auto need = [](bool ok, const char* field, int value, const char* expected) {
    if (!ok) fail(ErrorCode::kInvalidArgument, "prefill attention: {} = {}, expected {}", field, value, expected);
  };
  need(a.batch >= 1, "batch", a.batch, ">= 1");
  need(a.q_len_max >= 1, "q_len_max", a.q_len_max, ">= 1");
  need(a.n_kv_heads >= 1, "n_kv_heads", a.n_kv_heads, ">= 1");
  need(a.n_heads >= 1 && a.n_heads % a.n_kv_heads == 0, "n_heads", a.n_heads, "a multiple of n_kv_heads");
  need(a.head_dim >= 8 && a.head_dim <= 256 && a.head_dim % 8 == 0, "head_dim", a.head_dim,
       "a multiple of 8 in [8, 256]");
  need(a.page_size >= 1, "page_size", a.page_size, ">= 1");
  need(a.n_pages >= 1, "n_pages", a.n_pages, ">= 1");
  need(a.max_pages >= 1, "max_pages", a.max_pages, ">= 1");
  need(a.max_kv_len >= 1 && int64_t(a.max_kv_len) <= int64_t(a.max_pages) * a.page_size, "max_kv_len",
       a.max_kv_len, "in [1, max_pages * page_size]");
  LY_CHECK(a.scale > 0.0f && std::isfinite(a.scale), ErrorCode::kInvalidArgument,
           "prefill attention: scale = {}, expected a finite value > 0", a.scale);
  const bool bf16_kv = a.k_pool && a.v_pool, fp8_kv = a.k8_pool && a.v8_pool && a.k_scale && a.v_scale;
  LY_CHECK(bf16_kv != fp8_kv, ErrorCode::kInvalidArgument,
           "prefill attention: set either k_pool and v_pool (bf16 KV) or k8_pool, v8_pool, k_scale and v_scale (FP8 "
           "KV), not {}", bf16_kv ? "both" : "neither");
  LY_CHECK(a.q && a.page_table && a.q_lens && a.kv_lens && a.out,
           ErrorCode::kInvalidArgument, "prefill attention: a null device pointer in the arguments");
  LY_CHECK(!a.kv_contiguous || (bf16_kv && a.max_pages == 1 && a.n_pages >= a.batch), ErrorCode::kInvalidArgument,
           "prefill attention: kv_contiguous needs bf16 pools of one page per sequence (max_pages {} and n_pages {} "
           "for batch {})", a.max_pages, a.n_pages, a.batch);
}

void prefill_attention_fallback(const PrefillAttentionArgs& a, cudaStream_t stream) {
  validate_prefill_args(a);
  LY_CHECK(detail::launch_prefill_fallback(a, stream), ErrorCode::kUnsupported,
           "prefill attention fallback: unsupported head_dim: {} (64 or 128)", a.head_dim);
}

size_t prefill_split_workspace_bytes(int n_splits, int batch, int q_len_max, int n_heads, int head_dim) {
  return size_t(n_splits) * size_t(batch) * size_t(q_len_max) * size_t(n_heads) * size_t(head_dim + 1) * 4;
}

int prefill_kv_splits(int batch, int q_len_max, int n_heads, int head_dim, int max_kv_len, int sm_count,
                      size_t max_workspace_bytes) {
  constexpr int kTile = 64, kMinTilesPerSplit = 8, kMaxSplits = 64;
  const int64_t blocks = int64_t((q_len_max + kTile - 1) / kTile) * n_heads * batch;
  const int kv_tiles = (max_kv_len + kTile - 1) / kTile;
  // cuDNN's kernel does about 2.8x the work of ours per block (wgmma against mma.sync; on an H100
  // at 32K: 128 blocks of 64 queries, cuDNN 0.57 ms, the split fallback 1.07 ms; 32 blocks, cuDNN
  // 0.57 ms, the split 0.34 ms): splitting pays only while cuDNN would leave 2/3 of the SMs idle.
  if (blocks <= 0 || 3 * blocks > sm_count) return 1;
  int n = int((2 * int64_t(sm_count) + blocks - 1) / blocks);
  n = std::min({n, kv_tiles / kMinTilesPerSplit, kMaxSplits});
  const size_t per_split = prefill_split_workspace_bytes(1, batch, q_len_max, n_heads, head_dim);
  n = int(std::min<size_t>(size_t(std::max(n, 0)), max_workspace_bytes / std::max<size_t>(per_split, 1)));
  return n >= 2 ? n : 1;
}

int prefill_kv_bucket(int max_kv_len, int page_size, int max_pages) {
  const int pages = (max_kv_len + page_size - 1) / page_size;
  const int64_t rounded = int64_t(std::bit_ceil(unsigned(std::max(pages, 1)))) * page_size;
  return int(std::min<int64_t>(rounded, int64_t(max_pages) * page_size));
}

int prefill_q_bucket(int q_len_max, int kv_bucket) {
  const int rounded = int(std::bit_ceil(unsigned(std::max(q_len_max, 64))));
  return std::min(rounded, kv_bucket);
}

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kSeqQ, kSeqKv, kTableK, kTableV, kRaggedQ, kRaggedO };

struct GraphKey {
  int batch, q_bucket, kv_bucket, n_heads, n_kv_heads, head_dim, page_size, n_pages, max_pages;
  uint32_t scale_bits;  // the scale is baked into the graph
  // K/V gathered into contiguous buffers (default) or read through the page table; Q/O with
  // ragged offsets (batches of several sequences) or plain strides (one sequence).
  bool contiguous = true, ragged = true;
  auto operator<=>(const GraphKey&) const = default;
};

struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;  // null when cuDNN rejected the shape
  std::string error;                        // why
  bool tuned = false;                       // autotune: its plans timed on a first run (Impl::execute)
};

// Lab knob LYCHEE_PREFILL_AUTOTUNE=1: every plan heuristics modes A and FALLBACK offer is built,
// and a graph's first run times them all on its inputs (cudnn-frontend's autotune) and keeps the
// fastest, logged by name; default: heuristics' first choice (mode A), built alone.
bool autotune_from_env() {
  const char* v = std::getenv("LYCHEE_PREFILL_AUTOTUNE");
  if (v == nullptr || *v == 0 || std::string(v) == "0") return false;
  LY_CHECK(std::string(v) == "1", ErrorCode::kInvalidArgument, "LYCHEE_PREFILL_AUTOTUNE={}: expected 0 or 1", v);
  return true;
}

std::string fe_error(const char* step, fe::error_t e) {
  return fmt::format("{} failed: cudnn-frontend error {} ({})", step, int(e.get_code()), e.get_message());
}

std::shared_ptr<fe::graph::Graph> make_graph(const GraphKey& k, float scale) {
  using fe::graph::Tensor_attributes;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t b = k.batch, h = k.n_heads, hk = k.n_kv_heads, d = k.head_dim, sq = k.q_bucket;
  const int64_t page = k.page_size, n_pages = k.n_pages, max_pages = k.max_pages;
  auto int_tensor = [&](const char* name, int64_t uid, std::vector<int64_t> dim, std::vector<int64_t> stride) {
    return g->tensor(Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride).set_data_type(
        fe::DataType_t::INT32));
  };
  auto ragged_q = int_tensor("ragged_q", kRaggedQ, {b + 1, 1, 1, 1}, {1, 1, 1, 1});
  auto ragged_o = int_tensor("ragged_o", kRaggedO, {b + 1, 1, 1, 1}, {1, 1, 1, 1});
  auto q_attr = Tensor_attributes().set_name("q").set_uid(kQ).set_dim({b, h, sq, d});
  if (k.ragged) q_attr.set_stride({h * d, d, h * d, 1}).set_ragged_offset(ragged_q);
  else q_attr.set_stride({sq * h * d, d, h * d, 1});
  auto q = g->tensor(q_attr);
  const int64_t skv = k.kv_bucket;
  auto pool = [&](const char* name, int64_t uid) {
    if (k.contiguous)  // [b][hk][kv_bucket][d], gathered from the pages before the call
      return g->tensor(Tensor_attributes().set_name(name).set_uid(uid).set_dim({b, hk, skv, d}).set_stride(
          {hk * skv * d, skv * d, d, 1}));
    return g->tensor(Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_dim({n_pages, hk, page, d})
                         .set_stride({hk * page * d, page * d, d, 1}));
  };
  auto kc = pool("k_pool", kK);
  auto vc = pool("v_pool", kV);
  auto seq_q = int_tensor("q_lens", kSeqQ, {b, 1, 1, 1}, {1, 1, 1, 1});
  auto seq_kv = int_tensor("kv_lens", kSeqKv, {b, 1, 1, 1}, {1, 1, 1, 1});
  // cuDNN wants the table's page dimension to be exactly ceil(max_seq_len_kv / page); our rows are
  // max_pages long, so the row stride stays max_pages.
  const int64_t table_pages = (int64_t(k.kv_bucket) + page - 1) / page;
  auto table_k = int_tensor("page_table_k", kTableK, {b, 1, table_pages, 1}, {max_pages, max_pages, 1, 1});
  auto table_v = int_tensor("page_table_v", kTableV, {b, 1, table_pages, 1}, {max_pages, max_pages, 1, 1});

  auto opts = fe::graph::SDPA_attributes()
                  .set_name("prefill_sdpa")
                  .set_generate_stats(false)
                  .set_attn_scale(scale)
                  .set_causal_mask_bottom_right(true);
  opts.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
  if (!k.contiguous)
    opts.set_paged_attention_k_table(table_k)
        .set_paged_attention_v_table(table_v)
        .set_paged_attention_max_seq_len_kv(k.kv_bucket);
  auto outs = g->sdpa(q, kc, vc, opts);
  outs[0]->set_output(true).set_uid(kO).set_data_type(fe::DataType_t::BFLOAT16).set_dim({b, h, sq, d});
  if (k.ragged) outs[0]->set_stride({h * d, d, h * d, 1}).set_ragged_offset(ragged_o);
  else outs[0]->set_stride({sq * h * d, d, h * d, 1});
  return g;
}

}  // namespace

struct PrefillAttention::Impl {
  cudnnHandle_t handle = nullptr;
  const bool autotune = autotune_from_env();
  bool tried_init = false;
  std::string init_error;  // non-empty: the cuDNN path is unusable in this process
  std::map<GraphKey, CachedGraph> graphs;
  DeviceBuffer<uint8_t> workspace;
  DeviceBuffer<int32_t> ragged;  // [batch + 1] offsets, shared by Q and O
  DeviceBuffer<bf16> k_contig, v_contig;  // [batch][n_kv_heads][kv_bucket][head_dim] (contiguous variant)
  DeviceBuffer<float> split_part;          // split-KV partial outputs, then their log-sum-exps
  DeviceBuffer<int32_t> widened_table;     // FP8 KV: [batch] one page per sequence (b -> b)
  bool widened = false;                    // this run's K/V are contiguous already (k_contig / v_contig, or kv_contiguous)

  ~Impl() {
    if (handle != nullptr) cudnnDestroy(handle);
  }

  // Checks the library version and creates the handle, once.
  bool ready() {
    if (tried_init) return init_error.empty();
    tried_init = true;
    const int v = cudnn_version();
    if (v / 10000 != CUDNN_MAJOR) {
      init_error = fmt::format("cuDNN {} loaded at run time, but lychee was compiled against cuDNN {}.{}.{}", v,
                               CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
    } else if (v < kMinCudnnVersion) {
      init_error = fmt::format("cuDNN {} is too old: paged prefill SDPA with ragged Q needs >= {}", v,
                               kMinCudnnVersion);
    } else if (cudnnStatus_t st = cudnnCreate(&handle); st != CUDNN_STATUS_SUCCESS) {
      handle = nullptr;
      init_error = fmt::format("cudnnCreate failed with status {} ({}); cuDNN {}", int(st),
                               cudnnGetErrorString(st), v);
    }
    return init_error.empty();
  }

  CachedGraph& graph_for(const GraphKey& key, float scale, cudaStream_t stream) {
    if (auto it = graphs.find(key); it != graphs.end()) return it->second;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    LY_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    LY_CHECK(capture == cudaStreamCaptureStatusNone, ErrorCode::kInvalidArgument,
             "prefill attention: a new cuDNN graph (batch {}, q bucket {}, kv bucket {}, heads {}/{}, d {}) would "
             "be built during CUDA graph capture; run this shape once before capturing",
             key.batch, key.q_bucket, key.kv_bucket, key.n_heads, key.n_kv_heads, key.head_dim);
    CachedGraph entry = build(key, scale);
    if (entry.graph) {
      int64_t ws = 0;
      if (autotune) ws = entry.graph->get_autotune_workspace_size();  // the largest plan's
      if (auto e = autotune ? fe::error_t{} : entry.graph->get_workspace_size(ws); e.is_bad()) {
        entry.error = fe_error("get_workspace_size", e);
        entry.graph.reset();
      } else {
        grow(ws, key.batch + 1);
      }
    }
    return graphs.emplace(key, std::move(entry)).first->second;
  }

  CachedGraph build(const GraphKey& key, float scale) {
    CachedGraph c;
    auto g = make_graph(key, scale);
    if (auto e = g->validate(); e.is_bad()) c.error = fe_error("validate", e);
    else if (auto e2 = g->build_operation_graph(handle); e2.is_bad()) c.error = fe_error("build_operation_graph", e2);
    else if (auto e3 = autotune ? g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK})
                                : g->create_execution_plans({fe::HeurMode_t::A});
             e3.is_bad())
      c.error = fe_error("create_execution_plans", e3);
    else if (auto e4 = g->check_support(handle); e4.is_bad()) c.error = fe_error("check_support", e4);
    else if (auto e5 = g->build_plans(handle, autotune ? fe::BuildPlanPolicy_t::ALL
                                                       : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
             e5.is_bad())
      c.error = fe_error("build_plans", e5);
    else c.graph = std::move(g);
    if (!c.error.empty())
      c.error = fmt::format("{} [cuDNN {}, batch {}, q bucket {}, kv bucket {}, heads {}/{}, d {}, page {}]", c.error,
                            cudnn_version(), key.batch, key.q_bucket, key.kv_bucket, key.n_heads, key.n_kv_heads,
                            key.head_dim, key.page_size);
    return c;
  }

  // Only on a graph build (never in the steady state): the old buffers may still be in use by
  // queued work, so wait for the device before freeing them.
  void grow(int64_t workspace_bytes, int n_offsets) {
    const bool ws = size_t(workspace_bytes) > workspace.size();
    const bool off = size_t(n_offsets) > ragged.size();
    if (!ws && !off) return;
    LY_CUDA_CHECK(cudaDeviceSynchronize());
    if (ws) workspace = DeviceBuffer<uint8_t>(size_t(workspace_bytes));
    if (off) ragged = DeviceBuffer<int32_t>(size_t(n_offsets));
  }

  void execute(CachedGraph& c, const GraphKey& key, const PrefillAttentionArgs& a, int32_t q_stride,
               cudaStream_t stream) {
    detail::fill_ragged_offsets(ragged.data(), a.batch + 1, q_stride, stream);
    const bf16* k_src = a.k_pool;
    const bf16* v_src = a.v_pool;
    if (key.contiguous && !widened) {
      const size_t n = size_t(a.batch) * a.n_kv_heads * size_t(key.kv_bucket) * a.head_dim;
      if (k_contig.size() < n) {
        LY_CUDA_CHECK(cudaDeviceSynchronize());
        k_contig = DeviceBuffer<bf16>(n);
        v_contig = DeviceBuffer<bf16>(n);
      }
      detail::gather_pages(a, key.kv_bucket, k_contig.data(), v_contig.data(), stream);
      k_src = k_contig.data();
      v_src = v_contig.data();
    }
    if (cudnnStatus_t st = cudnnSetStream(handle, stream); st != CUDNN_STATUS_SUCCESS)
      fail_cuda_msg("cudnnSetStream", int(st), __FILE__, __LINE__);
    std::unordered_map<int64_t, void*> pack = {
        {kQ, const_cast<bf16*>(a.q)},
        {kK, const_cast<bf16*>(k_src)},
        {kV, const_cast<bf16*>(v_src)},
        {kO, a.out},
    };
    pack[kSeqQ] = const_cast<int32_t*>(a.q_lens);
    pack[kSeqKv] = const_cast<int32_t*>(a.kv_lens);
    if (!key.contiguous) {
      pack[kTableK] = const_cast<int32_t*>(a.page_table);
      pack[kTableV] = const_cast<int32_t*>(a.page_table);
    }
    if (key.ragged) {
      pack[kRaggedQ] = ragged.data();
      pack[kRaggedO] = ragged.data();
    }
    if (autotune && !c.tuned) {
      // Once per graph, outside any capture (graph_for checked): every built plan timed here.
      c.tuned = true;
      std::string before, after;
      (void)c.graph->get_plan_name(before);
      if (auto e = c.graph->autotune(handle, pack, workspace.data()); e.is_bad())
        LY_LOG_WARN("prefill attention: cuDNN autotune failed ({}); keeping plan {}", e.get_message(), before);
      (void)c.graph->get_plan_name(after);
      LY_LOG_INFO("prefill attention: autotuned q bucket {}, kv bucket {} over {} plans: {} (heuristics: {})",
                  key.q_bucket, key.kv_bucket, c.graph->get_execution_plan_count(), after, before);
    }
    if (auto e = c.graph->execute(handle, pack, workspace.data()); e.is_bad())
      fail(ErrorCode::kCuda, "prefill attention: cuDNN execute failed: cudnn-frontend error {} ({}) [cuDNN {}]",
           int(e.get_code()), e.get_message(), cudnn_version());
  }
};

PrefillAttention::PrefillAttention() : impl_(std::make_unique<Impl>()) {}
PrefillAttention::~PrefillAttention() = default;

int PrefillAttention::cudnn_version() { return int(cudnnGetVersion()); }

int PrefillAttention::n_graphs() const {
  int n = 0;
  for (const auto& [key, c] : impl_->graphs) n += c.graph != nullptr;
  return n;
}

void PrefillAttention::set_backend(Backend b) {
  LY_CHECK(b != Backend::kSplitKv, ErrorCode::kInvalidArgument,
           "prefill attention: split-KV is chosen per chunk (set_kv_splits), not a backend to set");
  backend_ = b;
}

void PrefillAttention::use_fallback(const PrefillAttentionArgs& a, cudaStream_t stream, std::string reason) {
  if (!warned_) {
    LY_LOG_WARN("prefill attention: cuDNN not used, running the fallback kernel: {}", reason);
    warned_ = true;
  }
  fallback_reason_ = std::move(reason);
  last_backend_ = Backend::kFallback;
  prefill_attention_fallback(a, stream);
}

void PrefillAttention::run(const PrefillAttentionArgs& a, cudaStream_t stream) {
  validate_prefill_args(a);
  if (a.k8_pool != nullptr) return run_widened(a, stream);
  impl_->widened = a.kv_contiguous;  // the caller's pools are the contiguous layout already
  run_bf16(a, stream);
}

// FP8 pages: widened into k_contig / v_contig ([batch][n_kv_heads][kv_bucket][head_dim], grown
// outside the steady state), which every backend then reads as one page of kv_bucket tokens per
// sequence; cuDNN's contiguous variant reads them as they are (no second gather).
void PrefillAttention::run_widened(const PrefillAttentionArgs& a, cudaStream_t stream) {
  const int kv_bucket = prefill_kv_bucket(a.max_kv_len, a.page_size, a.max_pages);
  LY_CHECK(a.head_dim % 16 == 0 && kv_bucket % a.page_size == 0, ErrorCode::kUnsupported,
           "prefill attention: FP8 pages need head_dim a multiple of 16 (got {}) and whole pages (kv bucket {}, "
           "page {})", a.head_dim, kv_bucket, a.page_size);
  const size_t n = size_t(a.batch) * a.n_kv_heads * size_t(kv_bucket) * a.head_dim;
  Impl& im = *impl_;
  if (im.k_contig.size() < n || im.widened_table.size() < size_t(a.batch)) {
    LY_CUDA_CHECK(cudaDeviceSynchronize());  // queued work may still read the old buffers
    if (im.k_contig.size() < n) {
      im.k_contig = DeviceBuffer<bf16>();
      im.v_contig = DeviceBuffer<bf16>();
      im.k_contig = DeviceBuffer<bf16>(n);
      im.v_contig = DeviceBuffer<bf16>(n);
    }
    if (im.widened_table.size() < size_t(a.batch)) im.widened_table = DeviceBuffer<int32_t>(size_t(a.batch));
  }
  detail::widen_fp8_pages(a, kv_bucket, im.k_contig.data(), im.v_contig.data(), im.widened_table.data(), stream);
  PrefillAttentionArgs w = a;
  w.k8_pool = w.v8_pool = nullptr;
  w.k_scale = w.v_scale = nullptr;
  w.k_pool = im.k_contig.data();
  w.v_pool = im.v_contig.data();
  w.page_table = im.widened_table.data();
  w.page_size = kv_bucket;
  w.max_pages = 1;
  w.n_pages = a.batch;
  im.widened = true;
  run_bf16(w, stream);
}

void PrefillAttention::run_bf16(const PrefillAttentionArgs& a, cudaStream_t stream) {
  last_kv_splits_ = 1;
  const int splits = kv_splits_ < 0   ? 1
                     : kv_splits_ > 0 ? kv_splits_
                                      : prefill_kv_splits(a.batch, a.q_len_max, a.n_heads, a.head_dim, a.max_kv_len,
                                                          device_info().sm_count, kSplitWorkspaceBytes);
  if (splits > 1 && (a.head_dim == 64 || a.head_dim == 128)) {
    // [splits][rows][head_dim] partial outputs, then [splits][rows] log-sum-exps.
    const size_t floats = prefill_split_workspace_bytes(splits, a.batch, a.q_len_max, a.n_heads, a.head_dim) / 4;
    const size_t rows = size_t(a.batch) * size_t(a.q_len_max) * size_t(a.n_heads);
    if (impl_->split_part.size() < floats) {  // grows (a synchronising cudaMalloc) outside steady state
      impl_->split_part = DeviceBuffer<float>();  // the old buffer freed first
      impl_->split_part = DeviceBuffer<float>(floats);
    }
    float* part_o = impl_->split_part.data();
    detail::launch_prefill_split(a, splits, part_o, part_o + size_t(splits) * rows * size_t(a.head_dim), stream);
    last_backend_ = Backend::kSplitKv;
    last_kv_splits_ = splits;
    fallback_reason_.clear();
    return;
  }
  if (backend_ == Backend::kFallback) {
    fallback_reason_ = "fallback backend selected";
    last_backend_ = Backend::kFallback;
    prefill_attention_fallback(a, stream);
    return;
  }
  if (!impl_->ready()) return use_fallback(a, stream, impl_->init_error);
  const int64_t q_stride = int64_t(a.q_len_max) * a.n_heads * a.head_dim;
  if (q_stride * a.batch > INT32_MAX)
    return use_fallback(a, stream,
                        fmt::format("batch {} x q_len_max {} x {} heads x d {} overflows cuDNN's int32 ragged offsets",
                                    a.batch, a.q_len_max, a.n_heads, a.head_dim));
  GraphKey key{};
  key.batch = a.batch;
  key.kv_bucket = prefill_kv_bucket(a.max_kv_len, a.page_size, a.max_pages);
  key.q_bucket = prefill_q_bucket(a.q_len_max, key.kv_bucket);
  key.n_heads = a.n_heads;
  key.n_kv_heads = a.n_kv_heads;
  key.head_dim = a.head_dim;
  key.page_size = a.page_size;
  key.n_pages = a.n_pages;
  key.max_pages = a.max_pages;
  key.scale_bits = std::bit_cast<uint32_t>(a.scale);
  // Measured on an H100 with cuDNN 9.14 (docs/kernels/prefill-attention.md): reading K/V through
  // the page table ran at ~290 TFLOP/s, gathering the pages into contiguous buffers first (a copy
  // of ~1/500 of the time) at ~600, and dropping the ragged offsets for one sequence a few percent
  // more. LYCHEE_PREFILL_PAGED=1 keeps the paged read (cuDNN >= 9.19 runs it as fast).
  const char* paged = std::getenv("LYCHEE_PREFILL_PAGED");
  key.contiguous = a.kv_contiguous || paged == nullptr || *paged == '\0' || *paged == '0';
  key.ragged = a.batch > 1;
  CachedGraph& c = impl_->graph_for(key, a.scale, stream);
  if (!c.graph) return use_fallback(a, stream, c.error);
  impl_->execute(c, key, a, int32_t(q_stride), stream);
  fallback_reason_.clear();
  last_backend_ = Backend::kCudnn;
}

}  // namespace lychee::cuda
