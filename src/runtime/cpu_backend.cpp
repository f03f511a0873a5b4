// The CPU backend: one sequence per session (batch 1). Weights in f32 (the reference) or, by
// default, with GGUF block-quantised matrices kept in their blocks (WeightFormat::kNative).
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
  CpuBackend(const Checkpoint& ck, WeightFormat format, const Fp8Keep& keep)
      : model_(ck.config(), HostWeights::load(ck, format, keep)) {
    LY_LOG_INFO("CPU weights: {} MiB ({}; quantised products: {})", model_.weights().n_bytes() >> 20,
                weight_format_name(format), quant_isa_name(model_.quant_isa()));
  }
  const char* name() const override { return "cpu"; }
  std::unique_ptr<Session> new_session(int capacity) override {
    return std::make_unique<CpuSession>(model_, capacity);
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
};

double CpuBackend::time_batched_decode(int batch, std::span<const int32_t> prompt, int steps, const DecodeSpec* spec) {
  LY_CHECK(batch == 1, ErrorCode::kInvalidArgument,
           "--batch {}: the CPU reference decodes one sequence at a time (use --device cuda)", batch);
  CpuSession s(model_, int(prompt.size()) + steps + 1);
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

std::unique_ptr<Backend> make_cpu_backend(const Checkpoint& ck, WeightFormat weights, const Fp8Keep& keep) {
  return std::make_unique<CpuBackend>(ck, weights, keep);
}

}  // namespace lychee
