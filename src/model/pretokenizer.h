// Pre-tokenizers of HF `tokenizers`: Split (regex or string, five behaviours, invert), Digits,
// ByteLevel (optional prefix space, GPT-2 regex), Metaspace (SentencePiece's "▁" for spaces, a
// dummy prefix, optional split), and Sequence of these.
// Regexes are Oniguruma patterns in tokenizer.json; they run on PCRE2 (UTF + UCP, JIT), with \s
// and \S rewritten to Oniguruma's set (Unicode White_Space). Matching is by code points; bytes
// that are not valid UTF-8 never match and so end up in the gaps between matches.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/unicode.h"

namespace lychee {

// The patterns of the real models (facts of their tokenizer.json files).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A byte range [first, second) of a string.
using Span = std::pair<size_t, size_t>;

// Oniguruma pattern -> PCRE2 pattern: \s and \S become explicit White_Space classes (PCRE2's own
// \s also takes U+180E). Everything else is passed through.
std::string translate_onig_pattern(std::string_view pattern);

// A compiled Split pattern: a PCRE2 regex, or a literal string.
class SplitPattern {
 public:
  // Throws Error(kInvalidFile) naming `where`, the pattern and PCRE2's message when it does not
  // compile.
  static SplitPattern regex(std::string_view onig_pattern, std::string_view where);
  static SplitPattern literal(std::string_view text);

  // Appends the byte ranges of the non-overlapping matches in s, left to right, as Oniguruma's
  // find_iter yields them (empty matches included: they split the text too).
  void find_matches(std::string_view s, std::vector<Span>& out) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;  // null for a literal
  std::string literal_;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Text pieces kept in one buffer: spans index into buf.
struct Pieces {
  std::string buf;
  std::vector<Span> spans;
  std::string_view at(size_t k) const {
    return std::string_view(buf).substr(spans[k].first, spans[k].second - spans[k].first);
  }
  void clear() {
    buf.clear();
    spans.clear();
  }
};

// When Metaspace puts its replacement in front of a piece that does not start with one: always,
// only for the piece at the start of the input text (not after an added token), or never.
enum class MetaspacePrepend { kAlways, kFirst, kNever };

struct PreTokenizeStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  Kind kind = Kind::kSplit;
  std::optional<SplitPattern> pattern;  // kSplit, kByteLevel with use_regex, kMetaspace with split
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel: prepend ' ' to every piece not starting with one
  std::string replacement;        // kMetaspace: UTF-8 of the character that stands for ' '
  MetaspacePrepend prepend = MetaspacePrepend::kAlways;  // kMetaspace
};

class PreTokenizer {
 public:
  // From the "pre_tokenizer" object of tokenizer.json (null: the whole segment is one pre-token);
  // `where` names the file for errors. A ByteLevel step, if any, must be the last one (else
  // Error(kUnsupported)); it makes the tokenizer byte-level.
  static PreTokenizer from_json(const nlohmann::json& j, std::string_view where);
  // Metaspace alone (SentencePiece's dummy prefix, GGUF "llama").
  static PreTokenizer metaspace(MetaspacePrepend prepend, bool split);
  // GPT-2's ByteLevel pre-tokenizer, optionally after splitting off every \p{N} (SmolLM's).
  static PreTokenizer gpt2(bool split_digits);
  // Split(pattern, Isolated) then ByteLevel without regex (Llama-3, Qwen2).
  static PreTokenizer split_then_bytes(std::string_view pattern);

  // Splits one normalised segment into pre-tokens (raw bytes; the byte-level mapping comes later).
  // at_text_start: the segment starts the input text (Metaspace "first"). Appends to out.
  void split(std::string_view text, Pieces& out, bool at_text_start = true) const;
  // Ends in ByteLevel: the BPE model works on GPT-2's byte symbols, not on characters.
  bool byte_level() const;

 private:
  std::vector<PreTokenizeStep> steps_;
};

// Typed reads of tokenizer.json fields; errors name `where` and the field (kInvalidFile).
const nlohmann::json& json_field(const nlohmann::json& j, std::string_view key,
                                 std::string_view where);
std::string json_string(const nlohmann::json& j, std::string_view key, std::string_view where);
bool json_bool_or(const nlohmann::json& j, std::string_view key, bool fallback,
                  std::string_view where);

// What tokenizer.ggml.pre selects, the way llama.cpp reads it.
struct PreTokenizerPreset {
  PreTokenizer pre;
  std::optional<unicode::NormalForm> normal_form;
  bool ignore_merges = false;
};
// Throws Error(kUnsupported) naming `key`, the value and the supported names for anything else.
PreTokenizerPreset preset_for_gguf_pre(std::string_view pre, std::string_view where,
                                       std::string_view key);

}  // namespace lychee
