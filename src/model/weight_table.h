// The single declarative table of a model's weights: each entry's role, its name in a Hugging
// Face checkpoint and in a GGUF file, its shape as a function of the config, and when it is
// present. Loaders, validators and backends all walk this table; nothing else names weights.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"

namespace lychee {

enum class WeightId : uint8_t {
  // Global weights.
  kTokEmbd, kOutputNorm, kOutput, kRopeFreqs,
  // Per-layer weights.
  kAttnNorm, kWq, kWk, kWv, kWo, kBq, kBk, kBv, kBo, kQNorm, kKNorm,
  kFfnNorm, kWGate, kWUp, kWDown, kBGate, kBUp, kBDown,
  kCount,
};
constexpr int kNumWeightIds = int(WeightId::kCount);

struct WeightSpec {
  WeightId id;
  bool per_layer;
  const char* hf_name;    // fmt pattern; "{}" is the layer index; "" if HF files never hold it
  const char* gguf_name;  // fmt pattern; nullptr if GGUF files never hold it
  // Shape, outermost first ([out_features, in_features] for matrices).
  std::vector<int64_t> (*shape)(const ModelConfig&);
  // Whether a model with this config has the weight; nullptr means always.
  bool (*present)(const ModelConfig&);
  // Present but allowed to be absent from the file (e.g. GGUF's rope_freqs).
  bool optional;
};

std::span<const WeightSpec> weight_table();
const WeightSpec& weight_spec(WeightId id);
std::string weight_hf_name(const WeightSpec& spec, int layer);
std::string weight_gguf_name(const WeightSpec& spec, int layer);
int64_t weight_numel(const WeightSpec& spec, const ModelConfig& c);

}  // namespace lychee
