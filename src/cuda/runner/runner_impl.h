// GpuRunner's state, shared by its files: gpu_runner.cpp (construction, prefill, policy setting,
// pages), decode_step.cpp (decode and verification steps), forward.cpp (the layers and the decode-time selections), sampling.cpp and
// graph_cache.cpp. Private to the runner. The runner is one Shard per GPU (one without tensor
// parallelism) driven by one host thread.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/error.h"
#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "cuda/common/nccl_comm.h"
#include "cuda/kernels/bf16_gemv.h"
#include "cuda/kernels/gemm.h"
#include "cuda/kernels/prefill_attention.h"
#include "cuda/runner/gpu_runner.h"
#include "cuda/runner/gpu_weights.h"
#include "cuda/runner/kv_pool.h"
#include "cuda/runner/policy_plan.h"
#include "cuda/runner/step_meta.h"

namespace lychee::cuda {

// One CUDA graph per key (batch size x policy on/off) and shard: the first step of a key runs
// eagerly (kernels set their attributes then) and is captured for later ones, which replay it.
// Every kernel reads its per-step data from the metadata block, so a replay needs no re-capture.
// With several shards (tensor parallelism) one thread records every device's stream at once
// (their NCCL all-reduces are captured as group calls) and each device replays its own graph.
class GraphCache {
 public:
  GraphCache() = default;
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;
  ~GraphCache() { clear(); }
  // streams[r] belongs to devices[r].
  template <typename Record>
  void run(int key, std::span<const int> devices, std::span<const cudaStream_t> streams, Record&& record) {
    auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      for (size_t r = 0; r < streams.size(); ++r) {
        LY_CUDA_CHECK(cudaSetDevice(devices[r]));
        LY_CUDA_CHECK(cudaGraphLaunch(it->second[r], streams[r]));
      }
      return;
    }
    record();
    std::vector<cudaGraphExec_t> execs(streams.size(), nullptr);
    // One device: thread-local (a stray synchronising call of ours fails the capture). Several:
    // relaxed, since NCCL's group call over them makes calls of its own on streams it does not
    // capture while the other devices' captures are open in this thread (with thread-local mode
    // on the 2xH200 of 2026-11-26: "operation not permitted when stream is capturing").
    const cudaStreamCaptureMode mode = streams.size() > 1 ? cudaStreamCaptureModeRelaxed : cudaStreamCaptureModeThreadLocal;
    for (size_t r = 0; r < streams.size(); ++r) {
      LY_CUDA_CHECK(cudaSetDevice(devices[r]));
      LY_CUDA_CHECK(cudaStreamBeginCapture(streams[r], mode));
    }
    try {
      record();
    } catch (...) {  // close every capture (the streams stay usable), then report
      for (size_t r = 0; r < streams.size(); ++r) {
        cudaGraph_t graph = nullptr;
        cudaSetDevice(devices[r]);
        if (cudaStreamEndCapture(streams[r], &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
      }
      cudaGetLastError();
      throw;
    }
    for (size_t r = 0; r < streams.size(); ++r) {
      cudaGraph_t graph = nullptr;
      LY_CUDA_CHECK(cudaSetDevice(devices[r]));
      LY_CUDA_CHECK(cudaStreamEndCapture(streams[r], &graph));
      execs[r] = instantiate(graph);
    }
    graphs_.emplace(key, std::move(execs));
  }
  void clear();  // after anything a graph baked in (buffers, kernel arguments) changes

 private:
  static cudaGraphExec_t instantiate(cudaGraph_t graph);
  std::map<int, std::vector<cudaGraphExec_t>> graphs_;
};

// Device-to-host results queued on the stream: kTicketRing pinned slots of `width` values and an
// event per slot. A ticket stays readable until kTicketRing later pushes reuse its slot.
template <typename T>
class HostRing {
 public:
  HostRing() = default;
  explicit HostRing(size_t width) : width_(width), buf_(width * kTicketRing) {
    for (cudaEvent_t& e : done_) LY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  HostRing(const HostRing&) = delete;
  HostRing& operator=(const HostRing&) = delete;
  ~HostRing() {
    for (cudaEvent_t e : done_)
      if (e != nullptr) cudaEventDestroy(e);
  }
  Ticket push(const T* src, int n, cudaStream_t stream) {
    const uint64_t id = ++issued_;
    const size_t slot = size_t(id % kTicketRing);
    LY_CUDA_CHECK(cudaMemcpyAsync(buf_.data() + slot * width_, src, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost, stream));
    LY_CUDA_CHECK(cudaEventRecord(done_[slot], stream));
    return {id, n};
  }
  // Waits for the ticket's copy; throws kInvalidArgument for a ticket never issued or reused.
  std::span<const T> read(const Ticket& t) {
    LY_CHECK(t.id != 0 && t.id <= issued_ && t.id + kTicketRing > issued_, ErrorCode::kInvalidArgument,
             "GPU runner: ticket {} is not readable (last issued {}, {} kept)", t.id, issued_, kTicketRing);
    const size_t slot = size_t(t.id % kTicketRing);
    LY_CUDA_CHECK(cudaEventSynchronize(done_[slot]));
    return {buf_.data() + slot * width_, size_t(t.batch)};
  }

 private:
  size_t width_ = 0;
  PinnedBuffer<T> buf_;
  cudaEvent_t done_[kTicketRing] = {};
  uint64_t issued_ = 0;
};

// One GPU's part of the runner: with one GPU the whole model; under tensor parallelism (rank r
// of N) the weights of its KV heads (their query heads with them) and its slice of the MLP, its
// KV pool (the same page ids on every rank: rank 0's pool allocates), its buffers, streams,
// policy plan and planner. Every method first makes its device current (use()).
struct Shard {
  std::shared_ptr<const GpuWeights> w;
  ModelConfig c;  // the shard's shape (heads, KV heads, MLP width of this rank)
  int rank = 0, device = 0;
  RunnerOptions o;
  int max_context, max_pages, max_tokens, max_items, max_slots;
  cudaStream_t stream = nullptr;
  cudaStream_t side = nullptr;  // decode-time selections, forked from and joined to `stream`
  cudaEvent_t fork_event = nullptr, join_event = nullptr;
  std::unique_ptr<Gemm> gemm;
  std::unique_ptr<KvPool> pool;
  std::unique_ptr<PrefillAttention> prefill_attn;
  DeviceBuffer<float> x, logits, partial_o, partial_lse;
  // Split LM head (RunnerOptions::tp_split_lm_head): this rank's logits [max_batch][V'] and every
  // rank's gathered [N][max_batch V'] (empty otherwise).
  DeviceBuffer<float> lm_local, lm_gathered;
  DeviceBuffer<bf16> h, qkv, q, att, o_buf, gu, act;
  // FP8 weights: the matrix of a product too large for the FP8 GEMV, widened to bf16 ([rows][cols]
  // of the largest linear matrix; empty with bf16 weights).
  DeviceBuffer<bf16> dequant;
  DeviceBuffer<uint8_t> act8;  // fp8_prefill_gemm: the activation rows' e4m3 codes [max_tokens][widest input]
  DeviceBuffer<float> act8_scales;  // and their scales [max_tokens]
  DeviceBuffer<int32_t> sampled;
  MetaLayout meta;
  // Host staging of the metadata block: the plan section once (rewritten only on a replan, after
  // its last upload was consumed), the per-step section twice (steps alternate between them, so
  // the host writes step t+1 while step t's copy may still be queued).
  PinnedBuffer<uint8_t> meta_h;
  DeviceBuffer<uint8_t> meta_d;
  cudaEvent_t step_consumed[2] = {};    // the upload from per-step staging k has run
  cudaEvent_t plan_consumed = nullptr;  // the last plan upload has run
  int staging = 0;                      // the per-step staging the step being prepared writes
  uint64_t stalls = 0;                  // host waits that found the device still busy
  // The decode steps' block table [max_batch][max_pages] on the device (what it holds is tracked
  // once for every rank: GpuRunner::Impl::row_table_id).
  DeviceBuffer<int32_t> decode_table;
  HostRing<int32_t> tokens_ring;
  HostRing<unsigned long long> reads_ring;
  StepPlanner planner;

  // The policy as the kernels run it (none set: dense decode steps, reads not counted).
  std::optional<GpuPolicyPlan> policy;
  int policy_epoch = 0;      // set_policy count: page-bound metadata is rebuilt per setting
  bool step_policy = false;  // the step being recorded uses the policy
  bool invariant = false;    // the step being recorded is batch-invariant (GpuRunner::decode)
  DeviceBuffer<float> scores, unit_scores;
  DeviceBuffer<int32_t> lists, list_counts, sel_heads;
  DeviceBuffer<bf16> quest_min, quest_max;
  size_t quest_layer_elems = 0;
  DeviceBuffer<unsigned long long> token_reads;

  bool forked = false;       // selections queued on the side stream and not yet joined
  // RunnerOptions::fused_decode_max_rows: whether this shard's weights allow the fused decode
  // layers (every product's input width a multiple of 8, 16 for FP8 matrices; FP8 ones with the
  // FP8 GEMV on), and whether the forward pass
  // being recorded uses them (set by GpuRunner::Impl::forward).
  bool fusable = false;
  bool fused = false;
  DeviceBuffer<float> ss_part;  // fused: [fused_buffer_rows()][bf16_gemv_ss_count(d_model)] (bf16_gemv.h)
  DeviceBuffer<bf16> h_lo;      // fused: [fused_buffer_rows()][d_model], the residues of the normed inputs in h
  // The rows ss_part and h_lo hold: a fused decode step's (kBf16GemvMaxRows), or with
  // fused_verify_chunks a chunked verification step's (GpuRunner::verify_step_fits: at most the
  // logits rows and max_tokens).
  int fused_buffer_rows() const {
    return o.fused_verify_chunks ? std::max(kBf16GemvMaxRows, std::min(logit_rows(o), max_tokens)) : kBf16GemvMaxRows;
  }
  cudaEvent_t reduce_event = nullptr;  // RunnerOptions::tp_one_device: this rank's o_buf is ready
  // Attention timing (GpuRunner::profile_decode): events around each layer's attention.
  std::vector<cudaEvent_t> attn_events;  // [2 n_layers] when profiling, else empty

  // kv_bytes: the KV pool's size (the same page count on every rank).
  Shard(std::shared_ptr<const GpuWeights> weights, const RunnerOptions& opt, size_t kv_bytes);
  ~Shard();
  void use() const { LY_CUDA_CHECK(cudaSetDevice(device)); }
  // The per-step field at `off` in the staging of the step being prepared (begin_step).
  template <typename T> T* meta_host(size_t off) {
    return reinterpret_cast<T*>(meta_h.data() + (staging == 0 ? 0 : meta.total) + off);
  }
  template <typename T> T* meta_dev(size_t off) { return reinterpret_cast<T*>(meta_d.data() + off); }
  void wait_event(cudaEvent_t e);  // counts a stall when the event has not completed
  // Switches to the other per-step staging (waiting only if its last copy is still queued).
  void begin_step();
  // Queues the copy of the first `bytes` of the per-step staging to the device.
  void upload_step(size_t bytes);
  // Plans the decode step's patterns; on a replan, waits for the last plan upload, rewrites the
  // plan section and queues its copy.
  void plan_and_upload(const GpuPolicyPlan* policy, std::span<const int> lens, int rows_per_seq = 1);
  void ensure_pages(GpuSeq& seq, int new_length);
  void allocate_policy_buffers();

  // forward.cpp, the phases of a forward pass of n tokens (a decode step's q_len: its rows per
  // sequence, n = batch x q_len) (GpuRunner::Impl::forward runs them on
  // every shard in turn and all-reduces o_buf between them); decode steps run the policy when
  // step_policy. begin: block-table changes, embedding, first norm. attention_block: layer l's
  // QKV through the output product into o_buf (a partial sum under tensor parallelism).
  // mlp_block: the residual add of o_buf, the MLP into o_buf. residual: the add of o_buf and the
  // next norm. end: the joined selections and (logits: rank 0) the LM head.
  void forward_begin(int n, bool decode);
  void attention_block(int l, int n, bool decode, int batch, int q_len, int max_kv_len);
  void mlp_block(int l, int n);
  void residual(int l, int n);
  // The RMSNorm weights after layer l's MLP: layer l + 1's attention norm, or the final norm.
  const float* norm_after(int l) const {
    return l + 1 < c.n_layers ? w->layers[size_t(l + 1)].attn_norm : w->out_norm;
  }
  void forward_end(int n, bool decode, bool logits, int rows);
  void join();
  void linear(const GpuMatrix& w, const bf16* x, bf16* y, int n);  // y[n][w.rows] = x[n][w.cols] · wᵀ
  // The LM head as the fused layers' product reads it: its FP8 codes where it has them, else bf16.
  GpuMatrix lm_head() const {
    return w->output8.fp8() ? w->output8 : GpuMatrix{w->output, nullptr, nullptr, c.vocab_size, c.d_model};
  }
  // Whether the bf16 GEMV (bf16_gemv.h) takes matrix m's weights: bf16_gemv_weights_fit, FP8 codes
  // (with their scales) only with RunnerOptions::fp8_gemv on. The fused layers need it of every
  // matrix.
  bool gemv_weights_fit(const GpuMatrix& m) const;
  // Whether it takes w's product of n rows of x: those weights, bf16_gemv_fits, and for bf16
  // weights n within bf16_gemv_max_rows.
  bool gemv_fits(const GpuMatrix& w, const bf16* x, int n) const;
  // Outside the fused layers: gemv_fits with the epilogue `bit` of RunnerOptions::gemv_epilogues on.
  bool gemv_epilogue(const GpuMatrix& w, const bf16* x, int n, int bit) const;
  // The fused decode layers' products (bf16_gemv.h): x bf16 rows; with `normed`, x is the
  // norm-weighted residual that the last residual add wrote into h (its residues in h_lo, its sums
  // of squares in ss_part), and the products are RMSNorm's. A residual add (kAddF32) with next_norm writes them.
  // `pdl_bit`: the product's RunnerOptions::kPdl* bit (launched with PDL when fused_pdl_products
  // has it; by size otherwise).
  // `rope`: kQkvRope's epilogue arguments.
  void fused_product(const GpuMatrix& w, const bf16* x, bool normed, GemvOut out, void* y, const float* bias, int n,
                     const float* next_norm = nullptr, int pdl_bit = 0, const Bf16GemvRope* rope = nullptr);
  void attention(int layer, bool decode, int batch, int q_len, int max_kv_len);
  // rows: query positions per sequence (a verification step's R; 1 for a decode step).
  void decode_attention_layer(int layer, int batch, int rows = 1);
  void select_before(int layer, int batch);
  bool select_after_needed(int layer) const;
  void select_after(int layer, int batch, cudaStream_t s);
  void run_selection(int layer, int batch, cudaStream_t s);
  int pattern_of(int layer) const { return step_policy ? policy->layers[size_t(layer)].pattern : 0; }
};

struct GpuRunner::Impl {
  ModelConfig c;  // the whole model
  RunnerOptions o;
  std::vector<std::unique_ptr<Shard>> shards;  // [N] rank r on shards[r]->device
  std::vector<int> devices;                    // [N]
  std::vector<std::vector<int>> kv_heads;      // [N] the global KV heads rank r owns, ascending
  std::unique_ptr<NcclComm> comm;              // tensor parallelism (or RunnerOptions::nccl at N = 1)
  GraphCache graphs;
  cudaEvent_t sampled_ready = nullptr;         // on rank 0's stream after its last sampling (ranks > 0 copy)
  uint64_t reduce_calls = 0, reduce_bytes = 0; // all-reduces run (replays included) and payload per rank
  uint64_t gather_calls = 0, gather_bytes = 0; // split LM head's all-gathers, the same way
  int vocab_part = 0;                          // split LM head: V' = ceil(V / N) rows per rank
  uint64_t n_forwards = 0;                     // forward passes run (GpuRunner::forwards)
  // GpuRunner::call_before_next_forward's functions, by owner; run (and cleared) by
  // before_forward() at the start of prefill and decode.
  std::vector<std::pair<const void*, std::function<void()>>> before_next;
  void before_forward() {
    if (before_next.empty()) return;
    auto calls = std::move(before_next);
    before_next.clear();
    for (auto& [owner, f] : calls) f();
  }
  // What every rank's device block table holds (the same on each): per batch row, the sequence
  // (GpuSeq::table_id) and how many of its pages were sent.
  std::vector<uint64_t> row_table_id;
  std::vector<int> row_synced;
  uint64_t next_table_id = 0;

  Impl(std::vector<std::shared_ptr<const GpuWeights>> weights, const RunnerOptions& opt);
  ~Impl();
  Shard& lead() { return *shards[0]; }
  int size() const { return int(shards.size()); }
  std::vector<cudaStream_t> streams() const;
  // n tokens through every layer on every shard, o_buf all-reduced after each attention and MLP.
  // rows: the last rows of the n whose logits are computed (decode: n; prefill: 1; a
  // verification pass: n, at most logit_rows).
  void forward(int n, bool decode, int batch, int q_len, int max_kv_len, int rows);
  int fused_rows() const;  // GpuRunner::fused_decode_rows
  void all_reduce(int n);
  void one_device_sum(int n);  // RunnerOptions::tp_one_device's all-reduce
  // The split LM head: every rank's vocabulary rows for the last `rows` rows of h, gathered into
  // rank 0's logits.
  void split_lm_head(int n, int rows);
  // The per-step section (the first `bytes` of the metadata block) of the step being prepared:
  // begun and written on rank 0 by the caller, then copied into every other rank's staging;
  // each rank queues its upload.
  void upload_step_everywhere(size_t bytes);
  // A forward pass of n tokens ran (eagerly or replayed): its all-reduces (and the split LM head's
  // gather of `rows` logits rows), counted.
  void count_reduces(int n, int rows);
  // Stages and runs one decode step (GpuRunner::decode; `graphs` false: eagerly).
  // rows > 1: a verification step (GpuRunner::verify), tokens [batch][rows], dense attention.
  void decode(std::span<GpuSeq* const> seqs, std::span<const int32_t> tokens, bool use_policy, bool graphs,
              bool invariant = false, int rows = 1);
};

}  // namespace lychee::cuda
