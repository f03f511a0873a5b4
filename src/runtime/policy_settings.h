// The attention-policy settings a user gives by name (the CLI's --policy, --budget, ... flags
// and the server's per-request "lychee" object), turned into PolicyOptions for one model.
// One place for that mapping, so the CLI and the server cannot drift apart.
#pragma once

#include <string>
#include <vector>

#include "attention/policies.h"
#include "model/config.h"

namespace lychee {

inline constexpr int kLycheeDefaultSink = 64;
inline constexpr int kLycheeDefaultRecent = 256;

struct PolicySettings {
  std::string policy = "full";
  int budget = 4096;
  int block_size = 16;
  std::string select = "topk";
  double select_value = 0.0;
  // Tokens every selection keeps at the start and the end; -1: the policy's own default, which is
  // 64 and 256 for LycheeDecode (issue 14's GPU strategy sweep: +7 points at 8K for the same bytes,
  // docs/results/strategies_gpu) and 0 for TidalDecode and Quest (their published selections).
  int sink = -1;
  int recent = -1;
  std::string heads;  // head-role file (lychee, duo); "" = the stand-in
  std::vector<int> tidal_layers;
  int quest_page = 16;
  int duo_sink = 64;
  int duo_recent = 256;
  int correct_every = 0;
  // Self-speculative decoding with this policy as the draft (runtime/speculative.h): "off", a
  // count of drafted tokens per cycle, or "auto".
  std::string speculate = "off";

  // The options for `kind`, with the head-role file (if any) loaded and checked against the
  // model; Error(kInvalidArgument) naming the option when a value does not fit the model.
  PolicyOptions options(const ModelConfig& c, PolicyKind kind) const;
  // The options of this->policy.
  PolicyOptions options(const ModelConfig& c) const { return options(c, parse_policy_kind(policy)); }
};

}  // namespace lychee
