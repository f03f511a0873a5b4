// The CPU reference's executor of a DecodeSpec (decode_spec.h): plain loops, scores accumulated
// in double, selections by select_units. It decides which tokens each query head reads; the CPU
// model does the attention. The GPU runner executes the same spec with kernels, and the tests
// compare the two (selections bit-exact for top-k on equal scores).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "attention/decode_spec.h"
#include "attention/policy.h"

namespace lychee {

class SpecPolicy final : public AttentionPolicy {
 public:
  explicit SpecPolicy(DecodeSpec spec);
  std::string name() const override { return spec_.name; }
  const DecodeSpec& spec() const override { return spec_; }
  void reset() override;
  void begin_step(int n_ctx) override;
  void plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) override;
  uint64_t metadata_bytes(int layer, int n_ctx) const override { return spec_.metadata_bytes(layer, n_ctx); }
  // The units currently selected in a slot: a KV-head index (SetScope::kKvHead) or a query head.
  const std::vector<int32_t>& selection(int slot) const { return sets_[size_t(slot)]; }

 private:
  void rank_pages(int layer, int kv_head, const float* q, const LayerKvView& kv);
  void plan_reads(int layer, int kv_head, const HeadSpec& h, int n, std::span<HeadRead> reads);
  void select_group_mean(int kv_head, const float* q, const LayerKvView& kv);
  void select_per_query(int kv_head, const float* q, const LayerKvView& kv);
  void update_page_metadata(int layer, const LayerKvView& kv);
  std::vector<int32_t> select(int n_tokens);

  DecodeSpec spec_;
  std::vector<std::vector<int32_t>> sets_;  // [slot] ascending unit ids
  // Quest's page metadata per layer: [n_pages][n_kv_heads][head_dim] min and max keys, and the
  // tokens folded in so far.
  std::vector<std::vector<float>> kmin_, kmax_;
  std::vector<int> n_seen_;
  std::vector<float> qbar_, token_scores_, unit_scores_;
};

}  // namespace lychee
