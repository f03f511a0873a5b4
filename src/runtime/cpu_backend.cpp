// The CPU reference backend: f32 weights, one sequence per session (batch 1).
#include <memory>

#include "core/error.h"
#include "core/timer.h"
#include "cpu/model.h"
#include "attention/spec_policy.h"
#include "runtime/backend.h"
#include "runtime/membw.h"

namespace lychee {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const Checkpoint& ck) : model_(ck.config(), HostWeights::load(ck)) {}
  const char* name() const override { return "cpu"; }
  std::unique_ptr<Session> new_session(int capacity) override {
    return std::make_unique<CpuSession>(model_, capacity);
  }
  // f32 weights; the embedding table is read one row per token.
  uint64_t weight_bytes_per_token() const override {
    const ModelConfig& c = model_.config();
    const int64_t embed = int64_t(c.vocab_size) * c.d_model;
    return uint64_t(c.n_params() - (c.tie_embeddings ? 0 : embed) + c.d_model) * 4;
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

std::unique_ptr<Backend> make_cpu_backend(const Checkpoint& ck) { return std::make_unique<CpuBackend>(ck); }

}  // namespace lychee
