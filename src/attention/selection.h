// Selection strategies of LycheeDecode's ablation, over per-unit scores (a unit is a token, or a
// block of tokens in block mode): top-k, top-p, threshold, ratio. Pure functions, so tests and
// the GPU port can check them case by case.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace lychee {

enum class SelectStrategy { kTopK, kTopP, kThreshold, kRatio };

const char* select_strategy_name(SelectStrategy s);
SelectStrategy parse_select_strategy(const std::string& name);  // Error(kInvalidArgument) if unknown

struct SelectParams {
  SelectStrategy strategy = SelectStrategy::kTopK;
  int budget = 4096;     // top-k: tokens a sparse head reads, forced units included
  double value = 0.0;    // top-p: p in (0, 1]; threshold: probability in [0, 1); ratio: fraction in (0, 1]
  int sink = 0;          // tokens always kept at the start
  int recent = 0;        // tokens always kept at the end (the current token is always kept)
  void validate() const; // Error(kInvalidArgument) naming the bad field
  bool operator==(const SelectParams&) const = default;
};

// Chooses units 0 .. n_units-1 given their scores (raw logits q·k; for blocks the max over the
// block). unit_size is 1 (tokens) or the block size; n_tokens the sequence length (the last unit
// may be partial). Forced units: the sink and recent tokens' units and the last unit. For top-p
// and threshold, probabilities are softmax(scores * scale) over all units.
// Returns ascending unit ids. Ties in score go to the lower index.
std::vector<int32_t> select_units(std::span<const float> scores, int unit_size, int n_tokens,
                                  const SelectParams& params, float scale);

// How many units top-k keeps for a sequence of n_tokens (ratio turns into a budget here).
int topk_units(const SelectParams& params, int unit_size, int n_tokens);

// Expands ascending unit ids to ascending token positions (< n_tokens).
void units_to_tokens(std::span<const int32_t> units, int unit_size, int n_tokens,
                     std::vector<int32_t>& tokens);

}  // namespace lychee
