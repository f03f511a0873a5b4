// GpuRunner's state, shared by its files: gpu_runner.cpp (construction, prefill, decode, policy
// setting, pages), forward.cpp (the layers and the decode-time selections), sampling.cpp and
// graph_cache.cpp. Private to the runner.
#pragma once

#include <map>
#include <memory>
#include <optional>

#include "cuda/common/common.h"
#include "cuda/common/device_buffer.h"
#include "cuda/kernels/gemm.h"
#include "cuda/kernels/prefill_attention.h"
#include "cuda/runner/gpu_runner.h"
#include "cuda/runner/gpu_weights.h"
#include "cuda/runner/kv_pool.h"
#include "cuda/runner/policy_plan.h"
#include "cuda/runner/step_meta.h"

namespace lychee::cuda {

// One CUDA graph per key (batch size x policy on/off): the first step of a key runs eagerly
// (kernels set their attributes then) and is captured for later ones, which replay it. Every
// kernel reads its per-step data from the metadata block, so a replay needs no re-capture.
class GraphCache {
 public:
  GraphCache() = default;
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;
  ~GraphCache() { clear(); }
  template <typename Record>
  void run(int key, cudaStream_t stream, Record&& record) {
    auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      LY_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
      return;
    }
    record();
    graphs_.emplace(key, capture(stream, record));
  }
  void clear();  // after anything a graph baked in (buffers, kernel arguments) changes

 private:
  template <typename Record>
  cudaGraphExec_t capture(cudaStream_t stream, Record& record) {
    cudaGraph_t graph = nullptr;
    LY_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    record();
    LY_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    return instantiate(graph);
  }
  static cudaGraphExec_t instantiate(cudaGraph_t graph);
  std::map<int, cudaGraphExec_t> graphs_;
};

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
  GraphCache graphs;
  StepPlanner planner;

  // The policy as the kernels run it (none set: dense decode steps, reads not counted).
  std::optional<GpuPolicyPlan> policy;
  int policy_epoch = 0;      // set_policy count: page-bound metadata is rebuilt per setting
  uint64_t n_forwards = 0;   // forward passes run (GpuRunner::forwards)
  bool step_policy = false;  // the step being recorded uses the policy
  DeviceBuffer<float> scores, unit_scores;
  DeviceBuffer<int32_t> lists, list_counts, sel_heads;
  DeviceBuffer<bf16> quest_min, quest_max;
  size_t quest_layer_elems = 0;
  DeviceBuffer<unsigned long long> token_reads;

  Impl(std::shared_ptr<const GpuWeights> weights, const RunnerOptions& opt);
  ~Impl();
  template <typename T> T* meta_host(size_t off) { return reinterpret_cast<T*>(meta_h.data() + off); }
  template <typename T> T* meta_dev(size_t off) { return reinterpret_cast<T*>(meta_d.data() + off); }
  // The host writes meta_h for the next step only once the device has copied the last one.
  void wait_meta() { LY_CUDA_CHECK(cudaEventSynchronize(meta_consumed)); }
  void upload_meta(size_t bytes);
  void ensure_pages(GpuSeq& seq, int new_length);
  void allocate_policy_buffers();

  // forward.cpp: n tokens through every layer; decode steps run the policy when step_policy.
  void forward(int n, bool decode, int batch, int q_len, int max_kv_len);
  void attention(int layer, bool decode, int batch, int q_len, int max_kv_len);
  void decode_attention_layer(int layer, int batch);
  void select_before(int layer, int batch);
  void select_after(int layer, int batch);
  void run_selection(int layer, int batch);
  int pattern_of(int layer) const { return step_policy ? policy->layers[size_t(layer)].pattern : 0; }
};

}  // namespace lychee::cuda
