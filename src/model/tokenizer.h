// Tokenizer matching HF `tokenizers` token for token: added tokens split out first
// (leftmost-longest), then the normalizer, the pre-tokenizer and the model: byte-level BPE
// (GPT-2's byte-to-unicode mapping, merges by rank), SentencePiece-style BPE on characters with
// byte fallback (Metaspace or Prepend/Replace), or Unigram (Viterbi over scored pieces). Reads
// tokenizer.json (+ tokenizer_config.json) or GGUF metadata (tokenizer.ggml.model = "gpt2" or
// "llama"). See docs/tokenizer.md.
//
// Thread safety: a Tokenizer is immutable after loading; encode/decode may run concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/bpe.h"
#include "model/pretokenizer.h"
#include "model/tokenizer_pipeline.h"
#include "model/unicode.h"
#include "model/unigram.h"

namespace lychee {

class GgufFile;

// An entry of tokenizer.json's "added_tokens" (or a GGUF control / user-defined token).
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;      // a control token: dropped by decode(skip_special)
  bool lstrip = false;       // the match takes the whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // matches only between non-word characters
  bool normalized = false;   // matched in the normalised text, not the raw text
};

class Tokenizer {
 public:
  // tokenizer.json plus tokenizer_config.json beside it when present (bos/eos, add_bos_token,
  // chat_template; chat_template.jinja is read when the config has none).
  static Tokenizer from_hf_dir(const std::string& dir);
  // tokenizer_config_path may be "". Throws Error naming the file and the field.
  static Tokenizer from_hf_json(const std::string& tokenizer_json_path,
                                const std::string& tokenizer_config_path);
  // GGUF metadata; tokenizer.ggml.model must be "gpt2" or "llama" (else Error(kUnsupported)).
  static Tokenizer from_gguf(const GgufFile& gguf);

  // parse_special: added tokens marked special that appear in the text (e.g. "<|im_start|>")
  // become their ids, as HF does by default; with false they are tokenized as plain text.
  // add_bos prepends bos_id() when the tokenizer has one.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = true) const;
  // As encode(text, add_bos, true), except that a special token overlapping one of the byte
  // ranges in plain ([begin, end), sorted) stays text: a chat's message content (chat_template.h).
  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              std::span<const std::pair<size_t, size_t>> plain) const;
  // Exact bytes: the concatenation of token_piece over the ids (skipping special tokens when
  // asked), except at the start, where a SentencePiece decoder drops the dummy-prefix space of
  // the first token (HF's Metaspace decoder, or Strip after Fuse). The result may be invalid
  // UTF-8 when the ids end inside a character. Throws Error(kInvalidArgument) for an id outside
  // [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The decoded bytes of one token anywhere but at the start of a text ("" for an unused id);
  // "▁the" gives " the", "<0x0A>" gives "\n". Throws like decode.
  std::string token_piece(int32_t id) const;
  // The piece of the first token of a text, as decode() gives it on its own: without the
  // dummy-prefix space ("▁The" gives "The"). For streaming a reply whose first token is `id`.
  std::string token_piece_at_start(int32_t id) const;

  int32_t vocab_size() const { return int32_t(pieces_.size()); }
  int32_t bos_id() const { return bos_id_; }  // -1 if none
  int32_t eos_id() const { return eos_id_; }  // -1 if none
  // eos plus the end-of-turn tokens present: <|im_end|>, <|eot_id|>, <|end_of_text|>,
  // <|endoftext|>.
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  bool add_bos_default() const { return add_bos_; }
  // The model asks for EOS after the text (GGUF tokenizer.ggml.add_eos_token, tokenizer_config's
  // add_eos_token). encode() never appends it; callers that want HF's add_special_tokens do.
  bool add_eos_default() const { return add_eos_; }
  // The id of a token given by its text in the vocabulary ("<|im_end|>", "Ġthe", "▁the"), or
  // else by its decoded bytes (" the").
  std::optional<int32_t> find_token(std::string_view piece) const;
  const std::string& chat_template_source() const { return chat_template_; }
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  // Where added tokens match: one trie-less table per first byte, longest first.
  struct AddedMatcher {
    std::vector<std::vector<int32_t>> by_first_byte;  // [256] indices into added_
    std::vector<std::string> patterns;                // [n_added] matched text ("" = never)
  };
  struct Segment {
    size_t begin, end;
    int32_t added = -1;  // index into added_, or -1 for text
  };

  void finish(std::string_view where);
  void build_matchers();
  void set_stop_ids();
  void split_added(std::string_view text, const AddedMatcher& m, bool parse_special,
                   std::vector<Segment>& out,
                   std::span<const std::pair<size_t, size_t>> plain = {}) const;
  std::vector<int32_t> encode_impl(std::string_view text, bool add_bos, bool parse_special,
                                   std::span<const std::pair<size_t, size_t>> plain) const;
  std::string normalize(std::string_view text) const { return normalizer_.apply(text); }
  struct EncodeCache;
  void encode_text(std::string_view text, bool at_text_start, std::vector<int32_t>& out,
                   EncodeCache& cache) const;
  void encode_word(std::string_view piece, std::vector<int32_t>& out, EncodeCache& cache) const;
  void check_id(int32_t id, std::string_view what) const;
  const std::vector<std::string>& model_tokens() const;
  std::optional<int32_t> model_find(std::string_view text) const;

  bool unigram_model_ = false;  // else BPE
  BpeModel bpe_;
  UnigramModel unigram_;
  PreTokenizer pre_;
  Normalizer normalizer_;
  Decoder decoder_;
  std::vector<AddedToken> added_;
  TokenIndex added_index_;  // content -> index into added_
  AddedMatcher raw_matcher_, normalized_matcher_;
  std::vector<std::string> pieces_;        // [vocab_size] decoded bytes per id
  std::vector<std::string> first_pieces_;  // [vocab_size] ... at the start; empty if the same
  std::vector<uint8_t> special_;     // [vocab_size] 1 for special added tokens
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  std::vector<int32_t> stop_ids_;
  std::string chat_template_;
};

}  // namespace lychee
