// The attention policies lychee compares, each compiled into one DecodeSpec (decode_spec.h):
//   full    every head reads every token
//   lychee  LycheeDecode: retrieval heads read everything and select the critical set with the
//           GQA group's mean query; sparse heads read the set last written at their KV-head index
//   tidal   TidalDecode: dense layers, token-selection layers, sparse layers sharing the set
//   quest   Quest: page min/max keys, upper-bound page scores, top pages per query head
//   duo     DuoAttention: retrieval heads dense, streaming heads sink + recent window
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/head_roles.h"
#include "attention/policy.h"
#include "attention/spec_policy.h"
#include "attention/selection.h"
#include "model/config.h"

namespace lychee {

enum class PolicyKind { kFull, kLychee, kTidal, kQuest, kDuo };

const char* policy_kind_name(PolicyKind k);
PolicyKind parse_policy_kind(const std::string& name);  // Error(kInvalidArgument) listing valid names

struct PolicyOptions {
  PolicyKind kind = PolicyKind::kFull;
  // Lychee: granularity (1 = tokens, else block = page of this many tokens) and selection
  // (select.budget is also TidalDecode's and Quest's token budget per head).
  int block_size = 16;
  SelectParams select;
  std::optional<HeadRoles> roles;  // Lychee and Duo; the TidalDecode-matched stand-in if absent
  std::vector<int> tidal_layers;   // selection layers; default {2, round(13/32 * n_layers)}
  int tidal_dense_layers = 2;
  int quest_page = 16;
  int quest_dense_layers = 2;
  int duo_sink = 64;
  int duo_recent = 256;

  void validate(const ModelConfig& c) const;  // Error(kInvalidArgument) naming the option
  std::string label() const;                  // e.g. "lychee topk 256 block 64"
};

// The policy's description (a pure function of the options and the model's shape; validates).
DecodeSpec compile_policy(const PolicyOptions& options, const ModelConfig& c);
// The CPU reference's executor of compile_policy(options, c).
std::unique_ptr<AttentionPolicy> make_policy(const PolicyOptions& options, const ModelConfig& c);

// One compiler per method, each in its own file (lychee.cpp, tidal.cpp, quest.cpp, duo.cpp).
DecodeSpec full_spec(const ModelConfig& c);
// LycheeDecode: layer 0 and the retrieval heads of `roles` read densely and select with the
// group-mean query into the set of their KV-head index; the other heads read that set. The
// last layer's retrieval heads do not score (no later layer reads their sets).
DecodeSpec lychee_spec(const ModelConfig& c, const HeadRoles& roles, int block_size, const SelectParams& select);
// TidalDecode: layers [0, dense_layers) dense; selection layers (>= dense_layers) dense plus a
// per-query-head token top-k; later layers read the latest selection; layers between the dense
// ones and the first selection layer stay dense.
DecodeSpec tidal_spec(const ModelConfig& c, int budget, const std::vector<int>& selection_layers, int dense_layers);
// Quest: layers [0, dense_layers) dense; the others rank pages of `page` tokens per query head
// by the bound and read the top pages (the last page always).
DecodeSpec quest_spec(const ModelConfig& c, int budget, int page, int dense_layers);
// DuoAttention: retrieval heads dense, streaming heads read sink + recent.
DecodeSpec duo_spec(const ModelConfig& c, const HeadRoles& roles, int sink, int recent);

// Quest's upper bound of q·k over a page from its channel-wise min/max keys:
// sum_i max(q_i M_i, q_i m_i), accumulated in double.
float quest_page_bound(const float* q, const float* kmin, const float* kmax, int head_dim);

// The default selection layers of TidalDecode for a model of n_layers (2 and the re-selection
// layer, 13 of 32 in the paper's Llama-3-8B setup, scaled).
std::vector<int> default_tidal_layers(int n_layers);

}  // namespace lychee
