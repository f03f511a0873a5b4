// The Unigram model of HF `tokenizers` (SentencePiece's unigram language model): the pieces of a
// pre-token are the Viterbi path through the vocabulary by summed log-probability scores, with
// HF's unknown-character penalty, unk fusing and byte fallback.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/bpe.h"

namespace lychee {

class UnigramModel {
 public:
  UnigramModel() = default;
  // pieces[i] = (text, score) of id i. unk_id is required whenever a character can be unknown,
  // as in HF: encoding such a character without one throws Error(kInvalidArgument).
  static UnigramModel build(std::vector<std::string> pieces, std::vector<double> scores,
                            int32_t unk_id, bool byte_fallback, std::string_view where);
  // From the "model" object of tokenizer.json with type "Unigram": vocab [[piece, score], ...],
  // unk_id, byte_fallback.
  static UnigramModel from_json(const nlohmann::json& model, std::string_view where);

  // Appends the ids of one pre-token (UTF-8 text; an invalid byte counts as one character).
  void encode_word(std::string_view text, std::vector<int32_t>& out) const;

  std::optional<int32_t> find(std::string_view piece) const;
  const std::vector<std::string>& tokens() const { return pieces_; }
  int32_t size() const { return int32_t(pieces_.size()); }

 private:
  // A byte trie over the pieces: children of node n are edges_[(n << 8) | byte].
  int32_t child(int32_t node, uint8_t byte) const;

  std::vector<std::string> pieces_;  // [n_vocab]
  std::vector<double> scores_;       // [n_vocab]
  TokenIndex index_;
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> node
  std::vector<int32_t> node_piece_;              // [n_nodes] piece ending here, -1 if none
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  double unk_score_ = 0;  // min score - 10, HF's K_UNK_PENALTY
  std::string where_;
};

}  // namespace lychee
