#include "model/unigram.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/pretokenizer.h"
#include "model/unicode.h"

namespace lychee {

namespace {

constexpr double kUnkPenalty = 10.0;  // HF's K_UNK_PENALTY: unk scores min_score - 10
constexpr int64_t kMaxVocab = int64_t(1) << 24;

}  // namespace

UnigramModel UnigramModel::build(std::vector<std::string> pieces, std::vector<double> scores,
                                 int32_t unk_id, bool byte_fallback, std::string_view where) {
  LY_CHECK(scores.size() == pieces.size(), ErrorCode::kInvalidFile,
           "{}: {} scores for {} pieces", where, scores.size(), pieces.size());
  LY_CHECK(unk_id < 0 || size_t(unk_id) < pieces.size(), ErrorCode::kInvalidFile,
           "{}: unk_id {} is outside the vocabulary ({} pieces)", where, unk_id, pieces.size());
  UnigramModel m;
  m.where_ = std::string(where);
  m.unk_id_ = unk_id;
  m.byte_fallback_ = byte_fallback;
  m.node_piece_.push_back(-1);  // the root
  double min_score = std::numeric_limits<double>::infinity();
  for (size_t id = 0; id < pieces.size(); ++id) {
    const std::string& p = pieces[id];
    LY_CHECK(std::isfinite(scores[id]), ErrorCode::kInvalidFile, "{}: piece {} ('{}') has score {}",
             where, id, p, scores[id]);
    min_score = std::min(min_score, scores[id]);
    m.index_.insert_or_assign(p, int32_t(id));  // HF's map: a repeated piece keeps its last id
    int32_t node = 0;
    for (char c : p) {
      const uint64_t key = (uint64_t(node) << 8) | uint8_t(c);
      auto it = m.edges_.find(key);
      if (it == m.edges_.end()) {
        it = m.edges_.emplace(key, int32_t(m.node_piece_.size())).first;
        m.node_piece_.push_back(-1);
      }
      node = it->second;
    }
    // HF looks a found piece up by its text: a repeated piece resolves to its last id.
    if (!p.empty()) m.node_piece_[node] = int32_t(id);
  }
  m.unk_score_ = min_score - kUnkPenalty;
  m.pieces_ = std::move(pieces);
  m.scores_ = std::move(scores);
  return m;
}

UnigramModel UnigramModel::from_json(const nlohmann::json& j, std::string_view where) {
  const std::string at = fmt::format("{}: model", where);
  const nlohmann::json& vocab = json_field(j, "vocab", at);
  LY_CHECK(vocab.is_array() && int64_t(vocab.size()) < kMaxVocab, ErrorCode::kInvalidFile,
           "{}.vocab: expected an array of [piece, score] (fewer than {})", at, kMaxVocab);
  std::vector<std::string> pieces;
  std::vector<double> scores;
  pieces.reserve(vocab.size());
  scores.reserve(vocab.size());
  for (size_t k = 0; k < vocab.size(); ++k) {
    const nlohmann::json& e = vocab[k];
    LY_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number(),
             ErrorCode::kInvalidFile, "{}.vocab[{}]: expected [piece, score], got {}", at, k,
             e.dump());
    pieces.push_back(e[0].get<std::string>());
    scores.push_back(e[1].get<double>());
  }
  int32_t unk_id = -1;
  const auto it = j.find("unk_id");
  if (it != j.end() && !it->is_null()) {
    LY_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0, ErrorCode::kInvalidFile,
             "{}.unk_id: expected a non-negative id, got {}", at, it->dump());
    unk_id = int32_t(std::min<int64_t>(it->get<int64_t>(), kMaxVocab));
  }
  return build(std::move(pieces), std::move(scores), unk_id,
               json_bool_or(j, "byte_fallback", false, at), at);
}

int32_t UnigramModel::child(int32_t node, uint8_t byte) const {
  const auto it = edges_.find((uint64_t(node) << 8) | byte);
  return it == edges_.end() ? -1 : it->second;
}

std::optional<int32_t> UnigramModel::find(std::string_view piece) const {
  const auto it = index_.find(piece);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

// HF's Unigram::encode_optimized (SentencePiece's Viterbi): best_score[e] is the best path
// ending at byte e; candidates at each start come from the trie, shortest first, and a strictly
// better score replaces the node. A character no piece covers alone gets an unk edge. Runs of
// unk are fused; each resulting string is then its piece, its <0xHH> bytes, or unk.
void UnigramModel::encode_word(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  struct Node {
    int32_t id = -1;
    double score = 0;
    int64_t start = -1;  // -1: not reached
  };
  std::vector<Node> best(text.size() + 1);
  for (size_t start = 0; start < text.size();) {
    const double here = best[start].score;
    const size_t char_len = unicode::utf8_step(text, start);
    bool has_single = false;
    int32_t node = 0;
    for (size_t end = start; end < text.size();) {
      node = child(node, uint8_t(text[end]));
      ++end;
      if (node < 0) break;
      const int32_t id = node_piece_[node];
      if (id < 0) continue;
      Node& target = best[end];
      const double candidate = scores_[id] + here;
      if (target.start < 0 || candidate > target.score) target = {id, candidate, int64_t(start)};
      if (end - start == char_len) has_single = true;
    }
    if (!has_single) {
      Node& target = best[start + char_len];
      const double candidate = unk_score_ + here;
      LY_CHECK(unk_id_ >= 0, ErrorCode::kInvalidArgument,
               "{}: the text has a character no piece covers and the model has no unk_id", where_);
      if (target.start < 0 || candidate > target.score) target = {unk_id_, candidate, int64_t(start)};
    }
    start += char_len;
  }
  // Back from the end: the pieces in reverse, unk runs fused.
  std::vector<std::pair<size_t, size_t>> spans;  // reversed
  size_t unk_end = 0;
  bool in_unk = false;
  for (size_t end = text.size(); end > 0;) {
    const Node& n = best[end];
    const auto start = size_t(n.start);
    if (unk_id_ >= 0 && n.id == unk_id_) {
      if (!in_unk) unk_end = end;
      in_unk = true;
    } else {
      if (in_unk) spans.emplace_back(end, unk_end);
      in_unk = false;
      spans.emplace_back(start, end);
    }
    end = start;
  }
  if (in_unk) spans.emplace_back(0, unk_end);
  for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
    const std::string_view s = text.substr(it->first, it->second - it->first);
    if (const auto id = find(s)) {
      out.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      const size_t before = out.size();
      bool all = true;
      for (char b : s) {
        const auto id = find(fmt::format("<0x{:02X}>", uint8_t(b)));
        if (!id) {
          all = false;
          break;
        }
        out.push_back(*id);
      }
      if (all) continue;
      out.resize(before);
    }
    out.push_back(unk_id_);
  }
}

}  // namespace lychee
