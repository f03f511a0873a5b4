// The BPE model of HF `tokenizers`: vocabulary, ranked merges, and the merge loop (lowest rank
// first, leftmost first among equal ranks) over one pre-token. Byte-level (GPT-2's byte symbols)
// or on characters with byte fallback (SentencePiece-style: Llama-2, Mistral).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace lychee {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIndex = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeOptions {
  bool byte_level = true;      // symbols are GPT-2's byte symbols; else UTF-8 characters
  bool ignore_merges = false;  // a pre-token that is itself in the vocabulary is emitted whole
  bool byte_fallback = false;  // a byte (character) without a symbol becomes <0xHH> tokens
  bool fuse_unk = false;       // consecutive unknown bytes (characters) become one unk
  int32_t unk_id = -1;         // else unknown bytes are dropped (as HF does without unk_token)
};

// Reused buffers of the merge loop (one per encode call).
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // neighbours in the list, -1 at the ends
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, new_id;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

class BpeModel {
 public:
  BpeModel() = default;
  // tokens: text per id ("" for an unused id); merges in rank order. Throws Error(kInvalidFile)
  // naming `where` for a merge whose parts or result are not in the vocabulary.
  static BpeModel build(std::vector<std::string> tokens,
                        const std::vector<std::pair<std::string, std::string>>& merges,
                        BpeOptions options, std::string_view where);
  // From the "model" object of tokenizer.json: type BPE (else Error(kUnsupported)); merges as
  // "a b" strings or ["a", "b"] pairs. byte_level says whether the pre-tokenizer is ByteLevel.
  static BpeModel from_json(const nlohmann::json& model, bool byte_level, std::string_view where);
  // SentencePiece BPE from its vocabulary and scores (a GGUF "llama" file): the merges are every
  // split of a token into two tokens, ranked the way transformers derives them
  // (tokenization_utils_base.generate_merges): higher score of the merged token first, then the
  // longer left part, the longer right part, and the order of the vocabulary.
  static BpeModel from_scores(std::vector<std::string> tokens, const std::vector<double>& scores,
                              BpeOptions options, std::string_view where);

  // Appends the ids of one pre-token, given as raw bytes (the byte-level mapping happens here).
  void encode_word(std::string_view bytes, std::vector<int32_t>& out, BpeScratch& scratch) const;

  std::optional<int32_t> find(std::string_view token_text) const;
  const std::vector<std::string>& tokens() const { return tokens_; }
  int32_t size() const { return int32_t(tokens_.size()); }
  const BpeOptions& options() const { return options_; }
  void set_ignore_merges(bool on) { options_.ignore_merges = on; }

 private:
  struct Merge {
    int32_t rank, id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  void initial_symbols(std::string_view bytes, BpeScratch& scratch) const;
  void initial_char_symbols(std::string_view text, BpeScratch& scratch) const;

  std::vector<std::string> tokens_;  // [n_vocab] token text
  TokenIndex index_;                 // text -> id
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};      // id of each byte's symbol, -1 if absent
  std::array<int32_t, 256> fallback_ids_{};  // id of <0xHH>, -1 if absent
  BpeOptions options_;
};

}  // namespace lychee
