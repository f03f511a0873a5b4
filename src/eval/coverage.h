// How much of full attention's probability mass a policy's reads hold (`lychee eval --coverage`,
// CPU backend). In every decode step, layer and query head, the probe computes the head's full
// softmax over every cached token (what dense attention would give), then
//   covered = the mass on the tokens the policy read (1 for a dense head), and
//   best    = the mass on the |read| tokens with the most mass (no selection of that many tokens
//             holds more, whatever its unit).
// covered / best says how well a policy picks for the bytes it reads; 1 - covered bounds how far
// its attention output can move from full attention's (as a share of the weights). With the
// needle's token positions set (retrieval tasks), the probe also sums full attention's mass on the
// needle and the part of it on needle tokens the policy read: their ratio (needle recall) is the
// share of the attention full attention pays the needle that the policy keeps, weighted toward the
// heads that look at the needle most. The policy's own decisions are untouched: the probe only
// wraps it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attention/policy.h"

namespace lychee {

// Sums over the measured (step, query head) pairs of each layer.
struct CoverageStats {
  std::vector<double> covered, best;
  std::vector<uint64_t> heads;  // (step, query head) pairs measured per layer
  double needle_full = 0, needle_read = 0;  // sums over steps, layers and heads (set_needle)
  void clear();
  double needle_recall() const;  // needle_read / needle_full; -1 when no needle mass was measured
  double mean_covered() const;  // over layers and heads (0 when nothing was measured)
  double mean_best() const;
  std::vector<double> covered_by_layer() const;  // per layer (0 where nothing was measured)
};

// p = softmax(q · k_t · scale) over the first p.size() rows of one KV head (q: [hd]; k: [*, hd];
// double sums): the head's attention under full attention.
void head_softmax(const float* q, const float* k, int hd, float scale, std::span<double> p);

// covered and best (above) for one query head: q: [hd]; k: [n_ctx, hd] rows of its KV head;
// needle: ascending token positions (may be empty); needle_full / needle_read: full attention's
// mass on them / on those the head read.
struct HeadMass {
  double covered = 0, best = 0, needle_full = 0, needle_read = 0;
};
HeadMass read_mass(const float* q, const float* k, int hd, int n_ctx, const HeadRead& read, float scale,
                   std::span<const int32_t> needle = {});

class CoverageProbe final : public AttentionPolicy {
 public:
  explicit CoverageProbe(AttentionPolicy& inner);
  std::string name() const override { return inner_.name(); }
  const DecodeSpec& spec() const override { return inner_.spec(); }
  void reset() override { inner_.reset(); }
  void begin_step(int n_ctx) override { inner_.begin_step(n_ctx); }
  void plan_layer(int layer, const float* q, const LayerKvView& kv, std::span<HeadRead> reads) override;
  uint64_t metadata_bytes(int layer, int n_ctx) const override { return inner_.metadata_bytes(layer, n_ctx); }

  const CoverageStats& stats() const { return stats_; }
  void clear_stats() { stats_.clear(); }
  // Token positions of the needle of the sample being decoded (ascending; empty = none).
  void set_needle(std::vector<int32_t> tokens) { needle_ = std::move(tokens); }

 private:
  AttentionPolicy& inner_;
  CoverageStats stats_;
  std::vector<HeadMass> per_head_;
  std::vector<int32_t> needle_;
};

}  // namespace lychee
