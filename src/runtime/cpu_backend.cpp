// The CPU backend: one sequence per session (batch 1). Weights in f32 (the reference) or, by
// default, with GGUF block-quantised matrices kept in their blocks (WeightFormat::kNative).
// Each session owns an f32 KV cache of its capacity (no shared pool); --kv-cache-dtype fp8 rounds
// what it holds through FP8 e4m3 (cpu/kv_cache.h), with every weight format, and saves no memory.
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "cpu/model.h"
#include "attention/spec_policy.h"
#include "runtime/backend.h"
#include "runtime/membw.h"

namespace lychee {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Checkpoint& ck, WeightFormat format, const Fp8Keep& keep, KvCacheDtype kv_dtype)
      : model_(ck.config(), HostWeights::load(ck, format, keep)), kv_dtype_(kv_dtype) {
    LY_LOG_INFO("CPU weights: {} MiB ({}; quantised products: {}); KV cache f32{}", model_.weights().n_bytes() >> 20,
                weight_format_name(format), quant_isa_name(model_.quant_isa()),
                kv_dtype == KvCacheDtype::kFp8 ? ", rounded through FP8 e4m3 (--kv-cache-dtype fp8)" : "");
  }
  const char* name() const override { return "cpu"; }
  std::unique_ptr<Session> new_session(int capacity) override {
    return std::make_unique<CpuSession>(model_, capacity, kv_dtype_);
  }
  // Every weight as held (f32 or blocks) but the embedding table, of which a step reads one row
  // (the LM head reads the whole table when it is tied).
  uint64_t weight_bytes_per_token() const override {
    const ModelConfig& c = model_.config();
    const HostWeights& w = model_.weights();
    uint64_t bytes = 0;
    for (const WeightSpec& spec : weight_table())
      for (int layer = 0; layer < (spec.per_layer ? c.n_layers : 1); ++layer) {
        if (spec.id == WeightId::kOutput && c.tie_embeddings) continue;  // the view of kTokEmbd
        const WeightView& v = w.view(spec.id, layer);
        if (v.data == nullptr) continue;
        bytes += uint64_t(spec.id == WeightId::kTokEmbd ? v.row_bytes : v.n_bytes());
      }
    if (c.tie_embeddings) bytes += uint64_t(w.view(WeightId::kTokEmbd).n_bytes());
    return bytes;
  }
  double measure_bandwidth_gbps() const override { return measure_memory_bandwidth().read_gbps; }
  double time_batched_decode(int batch, std::span<const int32_t> prompt, int steps, const DecodeSpec* spec) override;
  std::string unsupported(const DecodeSpec&) const override { return ""; }  // the reference runs every spec

 private:
  cpu::Model model_;
  KvCacheDtype kv_dtype_;
};

double CpuBackend::time_batched_decode(int batch, std::span<const int32_t> prompt, int steps, const DecodeSpec* spec) {
  LY_CHECK(batch == 1, ErrorCode::kInvalidArgument,
           "--batch {}: the CPU reference decodes one sequence at a time (use --device cuda)", batch);
  CpuSession s(model_, int(prompt.size()) + steps + 1, kv_dtype_);
  std::unique_ptr<SpecPolicy> policy = spec != nullptr ? std::make_unique<SpecPolicy>(*spec) : nullptr;
  s.set_policy(policy.get());
  s.feed(prompt);
  Sampler sampler(SamplingParams{});
  Timer t;
  for (int i = 0; i < steps; ++i) {
    const int32_t tok = s.sample(sampler);
    s.feed(std::span<const int32_t>(&tok, 1));
  }
  return t.seconds();
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Checkpoint& ck, WeightFormat weights, const Fp8Keep& keep,
                                          KvCacheDtype kv_dtype) {
  return std::make_unique<CpuBackend>(ck, weights, keep, kv_dtype);
}

}  // namespace lychee
