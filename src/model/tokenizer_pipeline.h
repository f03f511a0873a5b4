// The normalizers and decoders of HF `tokenizers` that lychee runs, for byte-level BPE and for
// SentencePiece-style tokenizers (Metaspace, byte fallback): parsed from tokenizer.json or built
// for a GGUF vocabulary. See docs/tokenizer.md for the supported types.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/pretokenizer.h"
#include "model/unicode.h"

namespace lychee {

// HF's normalizer pipeline on one text segment (after added tokens are split out).
class Normalizer {
 public:
  // From tokenizer.json's "normalizer" (null = identity): NFC, NFD, NFKC, NFKD, Prepend, Replace
  // (String or Regex pattern), Strip, Sequence. Anything else is Error(kUnsupported).
  static Normalizer from_json(const nlohmann::json& j, std::string_view where);
  void add_unicode(unicode::NormalForm form);

  bool empty() const { return steps_.empty(); }
  // Bytes that are not valid UTF-8 pass through the Unicode forms unchanged.
  std::string apply(std::string_view text) const;

 private:
  struct Step {
    enum class Kind { kUnicode, kPrepend, kReplace, kStrip };
    Kind kind = Kind::kUnicode;
    unicode::NormalForm form = unicode::NormalForm::kNFC;
    std::optional<SplitPattern> pattern;  // kReplace
    std::string text;                     // kPrepend: the prefix; kReplace: the replacement
    bool left = false, right = false;     // kStrip: which ends lose their whitespace
  };
  void parse(const nlohmann::json& j, const std::string& where);
  std::vector<Step> steps_;
};

// HF's decoder chain, split into what happens to each token on its own and what happens only at
// the start (and end) of the decoded text, so that streamed pieces join up:
//   decode(t0 t1 ... tn) == finish(first_piece(t0) + piece(t1) + ... + piece(tn)).
class Decoder {
 public:
  // From tokenizer.json's "decoder": ByteLevel, Replace (String or Regex), ByteFallback, Fuse,
  // Strip, Metaspace, Sequence. null joins the tokens' text with spaces, as HF does. Else
  // Error(kUnsupported).
  static Decoder from_json(const nlohmann::json& j, std::string_view where);
  // GPT-2's ByteLevel decoder (GGUF "gpt2").
  static Decoder byte_level();
  // Llama's SentencePiece chain Replace("▁", " "), ByteFallback, Fuse, and Strip(" ", 1, 0)
  // when the tokenizer adds a dummy prefix (GGUF "llama").
  static Decoder sentencepiece(bool strip_prefix_space);

  bool has_byte_level() const;
  // The decoded bytes of a token anywhere but first.
  std::string piece(std::string_view token) const { return run(token, false); }
  // ... and of the first token of a decoded text (Metaspace drops its "▁"s there).
  std::string first_piece(std::string_view token) const { return run(token, true); }
  bool first_differs() const;
  // Strip after Fuse: the start and end of the whole decoded text.
  void finish(std::string& text) const;

 private:
  struct Step {
    enum class Kind { kByteLevel, kReplace, kByteFallback, kMetaspace, kStrip };
    Kind kind = Kind::kByteFallback;
    std::optional<SplitPattern> pattern;  // kReplace
    std::string text;  // kReplace: the replacement; kMetaspace, kStrip: the character (UTF-8)
    bool drop_first = false;  // kMetaspace: prepend_scheme is not "never"
    size_t start = 0, stop = 0;  // kStrip: characters to strip at each end
  };
  void parse(const nlohmann::json& j, const std::string& where, bool& fused);
  std::string run(std::string_view token, bool first) const;

  std::vector<Step> per_token_;  // before any Fuse, or not affected by it
  std::vector<Step> on_text_;    // Strip steps after a Fuse
  bool join_with_spaces_ = false;  // no decoder: HF joins the tokens with ' ' 
};

// Metaspace's prepend_scheme ("always", "first", "never"), or the legacy add_prefix_space flag.
MetaspacePrepend parse_prepend_scheme(const nlohmann::json& j, std::string_view where);

}  // namespace lychee
