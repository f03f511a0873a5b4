// The attention policies lychee compares, all through one interface (policy.h):
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
  int block_size = 64;
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

std::unique_ptr<AttentionPolicy> make_policy(const PolicyOptions& options, const ModelConfig& c);

// The default selection layers of TidalDecode for a model of n_layers (2 and the re-selection
// layer, 13 of 32 in the paper's Llama-3-8B setup, scaled).
std::vector<int> default_tidal_layers(int n_layers);

class FullPolicy final : public AttentionPolicy {
 public:
  std::string name() const override { return "full"; }
  void reset() override {}
  void begin_step(int) override {}
  void plan_layer(int, const float*, const LayerKvView&, std::span<HeadRead>) override {}
};

class LycheePolicy final : public AttentionPolicy {
 public:
  LycheePolicy(const ModelConfig& c, HeadRoles roles, int block_size, SelectParams select);
  std::string name() const override { return "lychee"; }
  void reset() override;
  void begin_step(int n_ctx) override;
  void plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) override;
  // The set (unit ids) currently stored at a KV-head index.
  const std::vector<int32_t>& selection(int kv_head) const { return sets_[size_t(kv_head)]; }
  const HeadRoles& roles() const { return roles_; }
  int block_size() const { return block_; }
  const SelectParams& select() const { return select_; }

 private:
  void select_for_head(int kv_head, const float* q, const LayerKvView& kv);

  int n_heads_, n_kv_heads_, head_dim_;
  HeadRoles roles_;
  int block_;
  SelectParams select_;
  std::vector<std::vector<int32_t>> sets_;  // [n_kv_heads] selected units
  std::vector<float> qbar_, token_scores_, unit_scores_;
};

class TidalPolicy final : public AttentionPolicy {
 public:
  TidalPolicy(const ModelConfig& c, int budget, std::vector<int> selection_layers, int dense_layers);
  std::string name() const override { return "tidal"; }
  void reset() override;
  void begin_step(int n_ctx) override;
  void plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) override;
  const std::vector<int32_t>& selection(int q_head) const { return sets_[size_t(q_head)]; }
  int budget() const { return budget_; }
  const std::vector<int>& selection_layers() const { return selection_layers_; }
  int dense_layers() const { return dense_layers_; }

 private:
  int n_heads_, head_dim_, group_;
  int budget_;
  std::vector<int> selection_layers_;
  int dense_layers_;
  std::vector<std::vector<int32_t>> sets_;  // [n_heads] token positions
  std::vector<float> scores_;
};

class QuestPolicy final : public AttentionPolicy {
 public:
  QuestPolicy(const ModelConfig& c, int budget, int page_size, int dense_layers);
  std::string name() const override { return "quest"; }
  void reset() override;
  void begin_step(int) override {}
  void plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) override;
  uint64_t metadata_bytes(int layer, int n_ctx) const override;
  // Upper bound of q·k over a page from its channel-wise min/max keys: sum_i max(q_i M_i, q_i m_i).
  static float page_bound(const float* q, const float* kmin, const float* kmax, int head_dim);
  int budget() const { return budget_; }
  int page() const { return page_; }
  int dense_layers() const { return dense_layers_; }

 private:
  void update_metadata(int layer, const LayerKvView& kv);

  int n_heads_, n_kv_heads_, head_dim_, group_;
  int budget_, page_, dense_layers_;
  // Per layer: [n_pages][n_kv_heads][head_dim] min and max keys, and tokens folded in so far.
  std::vector<std::vector<float>> kmin_, kmax_;
  std::vector<int> n_seen_;
  std::vector<float> scores_;
};

class DuoPolicy final : public AttentionPolicy {
 public:
  DuoPolicy(const ModelConfig& c, HeadRoles roles, int sink, int recent);
  std::string name() const override { return "duo"; }
  void reset() override {}
  void begin_step(int) override {}
  void plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) override;
  const HeadRoles& roles() const { return roles_; }
  int sink() const { return sink_; }
  int recent() const { return recent_; }

 private:
  int n_kv_heads_, group_;
  HeadRoles roles_;
  int sink_, recent_;
};

}  // namespace lychee
