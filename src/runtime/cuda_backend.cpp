// The CUDA backend: bf16 or FP8 weights and the paged runner (src/cuda/runner), sessions over it, and
// the trainer's GPU student. Compiled only with CUDA (src/CMakeLists.txt); backends.cpp is the
// one file that decides whether it exists.
#include "runtime/cuda_backend.h"

#include <cstdlib>
#include <cstring>

#include <vector>

#include "attention/policies.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "cuda/common/common.h"
#include "cuda/common/nccl_comm.h"
#include "cuda/kernels/prefill_attention.h"
#include "cuda/runner/gpu_runner.h"
#include "cuda/runner/policy_plan.h"
#include "cuda/train/student.h"
#include "runtime/build_info.h"
#include "runtime/cuda_session.h"

namespace lychee {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Checkpoint& ck, const BackendOptions& o) {
    if (o.tp_kv_heads.size() > 1) {  // tensor parallelism: rank r on device r
      cuda::TpPlan plan;
      plan.kv_heads = o.tp_kv_heads;
      for (size_t r = 0; r < o.tp_kv_heads.size(); ++r) plan.devices.push_back(int(r));
      shards_ = cuda::shard_weights(o.random_shape != nullptr ? nullptr : &ck,
                                    o.random_shape != nullptr ? *o.random_shape : ck.config(), o.random_seed,
                                    o.gpu_weights, o.fp8_keep, plan);
    } else {
      shards_.push_back(o.random_shape != nullptr
                            ? cuda::random_weights(*o.random_shape, o.random_seed, o.gpu_weights, o.fp8_keep)
                            : cuda::upload_weights(ck, o.gpu_weights, o.fp8_keep));
    }
    cuda::RunnerOptions ro;
    ro.kv_memory_gib = o.kv_memory_gib;
    ro.kv_cache_dtype = o.kv_cache_dtype;
    ro.max_context = o.max_context;
    ro.max_batch = o.max_batch;
    ro.page_size = o.page_size;
    // Lab knob (RunnerOptions::fp8_prefill_gemm): FP8 weights' prefill products through cuBLASLt's
    // FP8 GEMM, for measuring its quality and speed against the bf16 widening.
    const char* fp8_gemm = std::getenv("LYCHEE_FP8_PREFILL_GEMM");
    ro.fp8_prefill_gemm = fp8_gemm != nullptr && std::strcmp(fp8_gemm, "1") == 0;
    runner_ = std::make_unique<cuda::GpuRunner>(shards_, ro);
  }
  const char* name() const override { return "cuda"; }
  std::unique_ptr<Session> new_session(int capacity) override {
    return std::make_unique<GpuSession>(*runner_, capacity);
  }
  // The slowest GPU's (rank 0's: its part of the layers and the whole LM head).
  uint64_t weight_bytes_per_token() const override { return cuda::weight_bytes_per_step(*shards_[0], 1); }
  double measure_bandwidth_gbps() const override { return cuda::device_copy_bandwidth_gbps(); }
  double time_batched_decode(int batch, std::span<const int32_t> prompt, int steps, const DecodeSpec* spec) override;
  std::string unsupported(const DecodeSpec& spec) const override {
    return cuda::gpu_unsupported(spec, runner_->config(), runner_->options().page_size);
  }
  int kv_page_tokens() const override { return runner_->options().page_size; }
  int64_t kv_pool_pages() const override { return runner_->n_pages(); }

 private:
  cuda::ShardedWeights shards_;  // one per GPU (one without tensor parallelism)
  std::unique_ptr<cuda::GpuRunner> runner_;
};

double CudaBackend::time_batched_decode(int batch, std::span<const int32_t> prompt, int steps, const DecodeSpec* spec) {
  cuda::GpuRunner& r = *runner_;
  r.set_policy(spec != nullptr ? *spec : full_spec(r.config()));
  LY_CHECK(batch >= 1 && batch <= r.options().max_batch, ErrorCode::kInvalidArgument,
           "--batch: must be 1 to {} (the runner's maximum batch), got {}", r.options().max_batch, batch);
  std::vector<cuda::GpuSeq> seqs(static_cast<size_t>(batch));
  std::vector<cuda::GpuSeq*> ptrs;
  for (auto& s : seqs) {
    r.prefill(s, prompt);
    ptrs.push_back(&s);
  }
  std::vector<int32_t> out(static_cast<size_t>(batch));
  std::vector<int32_t> first(static_cast<size_t>(batch), prompt.back());
  r.decode(ptrs, first);  // captures the CUDA graph for this batch size
  r.greedy(batch, out);
  // Pipelined like generate: step i+1 is queued before step i's tokens reach the host.
  Timer t;
  cuda::Ticket last = r.greedy_async(batch);
  for (int i = 0; i < steps; ++i) {
    r.decode(ptrs, {});
    const cuda::Ticket next = r.greedy_async(batch);
    r.wait_tokens(last, out);
    last = next;
  }
  r.wait_tokens(last, out);
  const double seconds = t.seconds();
  for (auto& s : seqs) r.release(s);
  return seconds;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Checkpoint& ck, const BackendOptions& o) {
  return std::make_unique<CudaBackend>(ck, o);
}

std::string cuda_backend_unsupported(const DecodeSpec& spec, const ModelConfig& c, int page_size) {
  return cuda::gpu_unsupported(spec, c, page_size);
}

std::string cuda_backend_device_status() { return cuda::cuda_device_status(); }

std::string cuda_backend_arch_status() {
  const cuda::DeviceInfo& d = cuda::device_info();
  const std::string why = cuda_arch_mismatch(cuda_architectures(), d.cc_major, d.cc_minor);
  return why.empty() ? why : fmt::format("GPU {} ({}): {}", d.device, d.name, why);
}

std::vector<std::pair<std::string, std::string>> cuda_backend_library_versions() {
  // Versions are encoded as major * 1000 + minor * 10 (CUDA), major * 10000 + minor * 100 + patch
  // (cuDNN 9); 0 where the library is absent (no driver).
  auto cuda_version = [](int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); };
  int runtime = 0, driver = 0;
  const bool have_runtime = cudaRuntimeGetVersion(&runtime) == cudaSuccess;
  const bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  const int cudnn = cuda::PrefillAttention::cudnn_version();
  const std::string nccl = cuda::nccl_version();
  return {
      {"CUDA runtime", fmt::format("{} (built with {})", have_runtime ? cuda_version(runtime) : "unavailable",
                                   cuda_version(CUDART_VERSION))},
      {"CUDA driver", have_driver ? cuda_version(driver) : "none (no NVIDIA driver loaded)"},
      {"cuDNN", fmt::format("{}.{}.{}", cudnn / 10000, cudnn % 10000 / 100, cudnn % 100)},
      {"NCCL", nccl.empty() ? "not linked (no tensor parallelism)" : nccl},
  };
}

std::unique_ptr<train::Student> make_cuda_student(const ModelConfig& c, const HostWeights& w,
                                                  const train::StudentOptions& options, int max_context,
                                                  int max_targets) {
  return std::make_unique<cuda::GpuStudent>(c, w, options, max_context, max_targets);
}

}  // namespace lychee
