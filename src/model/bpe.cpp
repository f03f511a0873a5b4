#include "model/bpe.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/pretokenizer.h"
#include "model/unicode.h"

namespace lychee {

namespace {

constexpr int64_t kMaxVocab = int64_t(1) << 24;  // bounds allocations from a malformed file

std::vector<std::string> parse_vocab(const nlohmann::json& vocab, const std::string& at) {
  LY_CHECK(vocab.is_object(), ErrorCode::kInvalidFile,
           "{}.vocab: expected an object of token -> id", at);
  int64_t max_id = -1;
  for (const auto& [text, id] : vocab.items()) {
    LY_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < kMaxVocab,
             ErrorCode::kInvalidFile, "{}.vocab['{}']: expected an id in [0, {}), got {}", at,
             text, kMaxVocab, id.dump());
    max_id = std::max(max_id, id.get<int64_t>());
  }
  std::vector<std::string> tokens(size_t(max_id + 1));
  std::vector<bool> used(tokens.size(), false);
  for (const auto& [text, id] : vocab.items()) {
    const auto i = size_t(id.get<int64_t>());
    LY_CHECK(!used[i], ErrorCode::kInvalidFile, "{}.vocab: id {} is given to both '{}' and '{}'",
             at, i, tokens[i], text);
    used[i] = true;
    tokens[i] = text;
  }
  return tokens;
}

std::vector<std::pair<std::string, std::string>> parse_merges(const nlohmann::json& merges,
                                                              const std::string& at) {
  LY_CHECK(merges.is_array(), ErrorCode::kInvalidFile, "{}.merges: expected an array", at);
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (size_t k = 0; k < merges.size(); ++k) {
    const nlohmann::json& m = merges[k];
    if (m.is_string()) {
      // The legacy form "a b": exactly one space (byte-level tokens never contain one).
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      LY_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
               ErrorCode::kInvalidFile, "{}.merges[{}]: expected \"a b\" with one space, got '{}'",
               at, k, s);
      out.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      LY_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
               ErrorCode::kInvalidFile, "{}.merges[{}]: expected \"a b\" or [\"a\", \"b\"], got {}",
               at, k, m.dump());
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
  return out;
}

}  // namespace

BpeModel BpeModel::from_json(const nlohmann::json& m, bool byte_level, std::string_view where) {
  const std::string at = fmt::format("{}: model", where);
  LY_CHECK(m.is_object(), ErrorCode::kInvalidFile, "{}: expected an object, got {}", at,
           m.is_null() ? "null" : m.type_name());
  // HF accepts an untagged model; one with merges can only be BPE.
  const std::string type = m.contains("type") ? json_string(m, "type", at)
                           : m.contains("merges") ? "BPE" : "(untagged)";
  LY_CHECK(type == "BPE", ErrorCode::kUnsupported,
           "{}.type: '{}' is not supported here (lychee reads BPE and Unigram)", at, type);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = m.find(key);
    LY_CHECK(it == m.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()),
             ErrorCode::kUnsupported, "{}.{}: {} is not supported (lychee's BPE has no word affixes)", at, key,
             it->dump());
  }
  std::vector<std::string> tokens = parse_vocab(json_field(m, "vocab", at), at);
  const auto merges = parse_merges(json_field(m, "merges", at), at);

  BpeOptions options;
  options.byte_level = byte_level;
  options.ignore_merges = json_bool_or(m, "ignore_merges", false, at);
  options.byte_fallback = json_bool_or(m, "byte_fallback", false, at);
  options.fuse_unk = json_bool_or(m, "fuse_unk", false, at);
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    const std::string unk = json_string(m, "unk_token", at);
    const auto it = std::find(tokens.begin(), tokens.end(), unk);
    LY_CHECK(it != tokens.end(), ErrorCode::kInvalidFile,
             "{}.unk_token: '{}' is not in the vocabulary", at, unk);
    options.unk_id = int32_t(it - tokens.begin());
  }
  return build(std::move(tokens), merges, options, at);
}

BpeModel BpeModel::build(std::vector<std::string> tokens,
                         const std::vector<std::pair<std::string, std::string>>& merges,
                         BpeOptions options, std::string_view where) {
  BpeModel b;
  b.options_ = options;
  b.tokens_ = std::move(tokens);
  b.index_.reserve(b.tokens_.size());
  for (size_t i = 0; i < b.tokens_.size(); ++i)
    if (!b.tokens_[i].empty()) b.index_.emplace(b.tokens_[i], int32_t(i));  // first id wins

  b.merges_.reserve(merges.size());
  std::string joined;
  for (size_t k = 0; k < merges.size(); ++k) {
    const auto& [left, right] = merges[k];
    const auto a = b.find(left), c = b.find(right);
    LY_CHECK(a && c, ErrorCode::kInvalidFile,
             "{}: merges[{}] ('{} {}'): token '{}' is not in the vocabulary", where, k, left,
             right, a ? right : left);
    joined.assign(left).append(right);
    const auto merged = b.find(joined);
    LY_CHECK(merged.has_value(), ErrorCode::kInvalidFile,
             "{}: merges[{}] ('{} {}'): the merged token '{}' is not in the vocabulary", where, k,
             left, right, joined);
    b.merges_[pair_key(*a, *c)] = Merge{int32_t(k), *merged};  // a repeated pair: the last wins
  }
  for (int v = 0; v < 256; ++v) {
    b.byte_ids_[v] = b.find(unicode::byte_symbols()[v]).value_or(-1);
    b.fallback_ids_[v] = b.find(fmt::format("<0x{:02X}>", v)).value_or(-1);
  }
  return b;
}

BpeModel BpeModel::from_scores(std::vector<std::string> tokens, const std::vector<double>& scores,
                               BpeOptions options, std::string_view where) {
  LY_CHECK(scores.size() == tokens.size(), ErrorCode::kInvalidFile,
           "{}: {} scores for {} tokens (expected one per token)", where, scores.size(),
           tokens.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    LY_CHECK(std::isfinite(scores[i]), ErrorCode::kInvalidFile, "{}: scores[{}] ('{}') is {}",
             where, i, tokens[i], scores[i]);
  }
  TokenIndex index;
  index.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) index.emplace(tokens[i], int32_t(i));  // first wins
  struct Candidate {
    double score;
    int32_t left_chars, right_chars, order;
    int32_t left, right;
  };
  std::vector<Candidate> found;
  std::vector<size_t> cuts;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& text = tokens[t];
    if (index.find(text)->second != int32_t(t)) continue;  // a repeated token: its first id only
    cuts.clear();
    for (size_t i = 0; i < text.size(); i += unicode::utf8_step(text, i)) cuts.push_back(i);
    const size_t first = found.size();
    for (size_t k = 1; k < cuts.size(); ++k) {
      const auto l = index.find(std::string_view(text).substr(0, cuts[k]));
      const auto r = index.find(std::string_view(text).substr(cuts[k]));
      if (l == index.end() || r == index.end()) continue;
      found.push_back({scores[t], int32_t(k), int32_t(cuts.size() - k), 0, l->second, r->second});
    }
    // Within a token, by the ids of the left and then the right part.
    std::sort(found.begin() + first, found.end(), [](const Candidate& a, const Candidate& b) {
      return a.left != b.left ? a.left < b.left : a.right < b.right;
    });
  }
  for (size_t k = 0; k < found.size(); ++k) found[k].order = int32_t(k);
  std::sort(found.begin(), found.end(), [](const Candidate& a, const Candidate& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.left_chars != b.left_chars) return a.left_chars > b.left_chars;
    if (a.right_chars != b.right_chars) return a.right_chars > b.right_chars;
    return a.order < b.order;  // Python's sort is stable, also with reverse=True
  });
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(found.size());
  for (const Candidate& c : found) merges.emplace_back(tokens[c.left], tokens[c.right]);
  options.byte_level = false;
  return build(std::move(tokens), merges, options, where);
}

std::optional<int32_t> BpeModel::find(std::string_view token_text) const {
  const auto it = index_.find(token_text);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::initial_symbols(std::string_view bytes, BpeScratch& scratch) const {
  auto& sym = scratch.symbols;
  sym.clear();
  bool last_was_unk = false;
  for (char ch : bytes) {
    const auto v = uint8_t(ch);
    int32_t id = byte_ids_[v];
    bool unk = false;
    if (id < 0 && options_.byte_fallback) id = fallback_ids_[v];
    if (id < 0) {
      if (options_.unk_id < 0) continue;  // no symbol and no unk: the byte is dropped
      if (options_.fuse_unk && last_was_unk) continue;
      id = options_.unk_id;
      unk = true;
    }
    last_was_unk = unk;
    const auto n = int32_t(sym.size());
    sym.push_back({id, n - 1, n + 1, true});
  }
  if (!sym.empty()) sym.back().next = -1;
}

// HF's BPE::merge_word on characters: each character is its token, or else its bytes' <0xHH>
// tokens (byte_fallback, when all exist), or else unk. A pending unk is emitted when the next
// known character comes (not before byte-fallback tokens: HF's order).
void BpeModel::initial_char_symbols(std::string_view text, BpeScratch& scratch) const {
  auto& sym = scratch.symbols;
  sym.clear();
  const auto push = [&](int32_t id) {
    const auto n = int32_t(sym.size());
    sym.push_back({id, n - 1, n + 1, true});
  };
  bool unk_pending = false;
  for (size_t i = 0; i < text.size();) {
    const size_t n = unicode::utf8_step(text, i);
    const std::string_view ch = text.substr(i, n);
    i += n;
    if (const auto id = find(ch)) {
      if (unk_pending) push(options_.unk_id);
      unk_pending = false;
      push(*id);
      continue;
    }
    if (options_.byte_fallback &&
        std::all_of(ch.begin(), ch.end(), [&](char b) { return fallback_ids_[uint8_t(b)] >= 0; })) {
      for (char b : ch) push(fallback_ids_[uint8_t(b)]);
      continue;
    }
    if (options_.unk_id < 0) continue;  // no symbol and no unk: the character is dropped
    if (unk_pending && !options_.fuse_unk) push(options_.unk_id);
    unk_pending = true;
  }
  if (unk_pending) push(options_.unk_id);
  if (!sym.empty()) sym.back().next = -1;
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& out,
                           BpeScratch& scratch) const {
  if (options_.ignore_merges) {
    if (const auto id = options_.byte_level ? find(unicode::bytes_to_symbols(bytes)) : find(bytes)) {
      out.push_back(*id);
      return;
    }
  }
  if (options_.byte_level) initial_symbols(bytes, scratch);
  else initial_char_symbols(bytes, scratch);
  auto& sym = scratch.symbols;
  auto& heap = scratch.heap;
  heap.clear();
  // Min-heap on (rank, position): the lowest rank first, the leftmost among equal ranks.
  const auto later = [](const BpeScratch::Candidate& x, const BpeScratch::Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  const auto push_pair = [&](int32_t left) {
    if (left < 0 || sym[left].next < 0) return;
    const auto it = merges_.find(pair_key(sym[left].id, sym[sym[left].next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, it->second.id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < int32_t(sym.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    // A stale candidate: one of its symbols has merged since it was queued.
    const auto it = merges_.find(pair_key(left.id, sym[left.next].id));
    if (it == merges_.end() || it->second.id != top.new_id) continue;
    BpeScratch::Symbol& right = sym[left.next];
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    push_pair(left.prev);
    push_pair(top.pos);
  }
  for (size_t i = 0; i < sym.size(); ++i)
    if (sym[i].alive) out.push_back(sym[i].id);
}

}  // namespace lychee
