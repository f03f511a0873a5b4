// The one description of a decode-attention policy: per layer and KV head, what the head reads,
// what it scores and how the scores become a selection. A policy (Full, LycheeDecode, its
// baselines) is compiled into a DecodeSpec once, by a pure function in its own file beside this
// one; the CPU reference (spec_policy.h) and the GPU runner both execute the spec and know no
// policy by name. The kernel sees only list kinds and score kinds derived from it.
//
// Semantics of one decode step (n_ctx tokens cached, the current one included):
//   - selected sets live in slots: one per KV-head index (SetScope::kKvHead, LycheeDecode) or one
//     per query head (kQueryHead: TidalDecode, Quest); every slot is empty at the step's start.
//   - layer l uses patterns[layer_pattern[l]], one HeadSpec per KV head. Per KV head h:
//       1. score kPageBound: before the attention, each query head of h ranks the pages of
//          `unit` tokens by Quest's bound and selects into its slot (which step 2 reads).
//       2. read kDense: every token; kWindow: the first window_sink and last window_recent
//          tokens; kSet: the units in the slot(s) of h (per query head with kQueryHead), plus
//          the last unit (the current token reads itself).
//       3. score kGroupMean / kPerQuery (read must be kDense): after the layer's reads are
//          planned, the head scores every token (q̄·k with q̄ the mean of the group's queries, or
//          q·k per query head), a unit scores the max over its tokens, and `select` writes the
//          slot(s) that later layers read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/selection.h"
#include "model/config.h"

namespace lychee {

enum class ReadKind : uint8_t {
  kDense,   // every cached token
  kSet,     // the units selected into this head's slot(s)
  kWindow,  // sink + recent window (DuoAttention's streaming heads)
};

enum class ScoreKind : uint8_t {
  kNone,
  kGroupMean,  // raw logit of the GQA group's mean query, per token (LycheeDecode's retrieval heads)
  kPerQuery,   // raw logit per token and query head (TidalDecode's selection layers)
  kPageBound,  // Quest's upper bound sum_i max(q_i M_i, q_i m_i) per page of channel-wise key min/max
};

enum class SetScope : uint8_t { kKvHead, kQueryHead };

struct HeadSpec {
  ReadKind read = ReadKind::kDense;
  ScoreKind score = ScoreKind::kNone;
  bool operator==(const HeadSpec&) const = default;
};

struct DecodeSpec {
  std::string name = "full";        // the policy, for messages
  std::string unit_option;          // the option that set `unit` (e.g. "--block-size"), for messages
  SetScope scope = SetScope::kKvHead;
  int unit = 1;                     // tokens per selection unit (1: tokens; a block; Quest's page)
  SelectParams select;              // strategy, budget, value, forced sink/recent
  float prob_scale = 1.0f;          // softmax scale of top-p / threshold probabilities
  int window_sink = 0, window_recent = 0;
  int n_kv_heads = 0, group = 1, head_dim = 0;
  std::vector<std::vector<HeadSpec>> patterns;  // [n_patterns][n_kv_heads]; pattern 0 is all dense
  std::vector<int> layer_pattern;               // [n_layers]

  // Equal specs run as one batch on the GPU (the server's sessions with the same policy settings).
  bool operator==(const DecodeSpec&) const = default;

  int n_layers() const { return int(layer_pattern.size()); }
  const std::vector<HeadSpec>& layer(int l) const { return patterns[size_t(layer_pattern[size_t(l)])]; }
  // Whether any head of the spec does anything but read densely (Full has none).
  bool sparse() const;
  bool layer_has(int l, ScoreKind s) const;
  bool layer_has(int l, ReadKind r) const;
  bool has(ScoreKind s) const;
  bool has(ReadKind r) const;
  // Side data the policy reads in `layer` beyond K/V (Quest's page min/max, bf16), bytes.
  uint64_t metadata_bytes(int layer, int n_ctx) const;
  // Error(kInvalidArgument) when the spec is not well formed for model c (shapes, a score on a
  // head that does not read densely, kPageBound without kSet, parameters out of range).
  void validate(const ModelConfig& c) const;
};

// Builds a spec: every layer starts dense (pattern 0); set_layer interns a layer's pattern.
class DecodeSpecBuilder {
 public:
  DecodeSpecBuilder(const ModelConfig& c, std::string name);
  DecodeSpec& spec() { return spec_; }
  void set_layer(int layer, const std::vector<HeadSpec>& pattern);
  DecodeSpec finish();  // validates

 private:
  ModelConfig c_;
  DecodeSpec spec_;
};

// Units a selection keeps for a sequence of n_tokens: exactly that for top-k and ratio (the
// forced units, sink/recent/last, plus the best others up to the budget; select_units keeps the
// same count), and all units for top-p and threshold (the count is known only from the scores).
int selected_units(const SelectParams& params, int unit, int n_tokens);

}  // namespace lychee
