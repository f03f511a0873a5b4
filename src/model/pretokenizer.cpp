#include "model/pretokenizer.h"

#include <algorithm>

#include <nlohmann/json.hpp>
#include <pcre2.h>

#include "core/error.h"
#include "model/tokenizer_pipeline.h"

namespace lychee {

namespace {

// Oniguruma's \s in Unicode mode is the White_Space property (see unicode::is_white_space).
constexpr std::string_view kWhiteSpaceItems =
    R"(\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Letters and numbers assigned in Unicode 15.0-16.0, which HF's Oniguruma knows and PCRE2 10.42
// (Unicode 14) does not; added to \p{L} and \p{N} so that splits agree on every code point.
// A newer PCRE2 has them already; the union is then a no-op.
constexpr std::string_view kNewLetters =
    R"(\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65})"
    R"(\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{1123F}-\x{11240}\x{11380}-\x{11389}\x{1138B})"
    R"(\x{1138E}\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{11F02})"
    R"(\x{11F04}-\x{11F10}\x{11F12}-\x{11F33}\x{1342F}\x{13441}-\x{13446}\x{13460}-\x{143FA})"
    R"(\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF}\x{1B132}\x{1B155}\x{1DF25}-\x{1DF2A})"
    R"(\x{1E030}-\x{1E06D}\x{1E4D0}-\x{1E4EB}\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2B739})"
    R"(\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";
constexpr std::string_view kNewNumbers =
    R"(\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{11F50}-\x{11F59})"
    R"(\x{16130}-\x{16139}\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1D2C0}-\x{1D2D3})"
    R"(\x{1E4F0}-\x{1E4F9}\x{1E5F1}-\x{1E5FA})";
// HF's Digits pre-tokenizer tests Rust's char::is_numeric (Unicode 17 in current Rust), which
// also knows these.
constexpr std::string_view kRustNumeric = R"([\p{N}\x{11DE0}-\x{11DE9}\x{16FF4}-\x{16FF6}])";

// The class members an Oniguruma escape stands for, when it needs rewriting; "" otherwise.
std::string class_items(std::string_view escape) {
  if (escape == "\\s") return std::string(kWhiteSpaceItems);
  if (escape == "\\p{L}") return fmt::format("\\p{{L}}{}", kNewLetters);
  if (escape == "\\p{N}") return fmt::format("\\p{{N}}{}", kNewNumbers);
  return "";
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? fmt::format("PCRE2 error {}", code) : std::string(reinterpret_cast<char*>(buf));
}

// Per-thread match scratch: PCRE2 match data and a JIT stack large enough for long runs of
// whitespace or punctuation (the default 32 KiB is not).
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
  MatchScratch() {
    LY_CHECK(data != nullptr && context != nullptr && stack != nullptr, ErrorCode::kInternal,
             "PCRE2: cannot allocate match data or JIT stack");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& match_scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

}  // namespace

const nlohmann::json& json_field(const nlohmann::json& j, std::string_view key,
                                 std::string_view where) {
  LY_CHECK(j.is_object(), ErrorCode::kInvalidFile, "{}: expected an object with field '{}'",
           where, key);
  const auto it = j.find(std::string(key));
  LY_CHECK(it != j.end(), ErrorCode::kInvalidFile, "{}: missing field '{}'", where, key);
  return *it;
}

std::string json_string(const nlohmann::json& j, std::string_view key, std::string_view where) {
  const nlohmann::json& v = json_field(j, key, where);
  LY_CHECK(v.is_string(), ErrorCode::kInvalidFile, "{}.{}: expected a string, got {}", where, key,
           v.dump());
  return v.get<std::string>();
}

bool json_bool_or(const nlohmann::json& j, std::string_view key, bool fallback,
                  std::string_view where) {
  if (!j.is_object()) return fallback;
  const auto it = j.find(std::string(key));
  if (it == j.end() || it->is_null()) return fallback;
  LY_CHECK(it->is_boolean(), ErrorCode::kInvalidFile, "{}.{}: expected a bool, got {}", where,
           key, it->dump());
  return it->get<bool>();
}

std::string translate_onig_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      // \s, \p{L}, \p{N}: Oniguruma's sets; \S: the complement of \s (outside classes).
      const size_t len = p[i + 1] == 'p' && p.substr(i + 2, 3).size() == 3 && p[i + 4] == '}' ? 5 : 2;
      const std::string_view escape = p.substr(i, len);
      if (const std::string items = class_items(escape); !items.empty()) {
        out += in_class ? items : fmt::format("[{}]", items);
      } else if (escape == "\\S" && !in_class) {
        out += fmt::format("[^{}]", kWhiteSpaceItems);
      } else {
        out += escape.substr(0, 2);
        i += 1;
        continue;
      }
      i += len - 1;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t end = p.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (end != std::string_view::npos) {
        out += p.substr(i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct SplitPattern::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

SplitPattern SplitPattern::regex(std::string_view onig_pattern, std::string_view where) {
  const std::string pattern = translate_onig_pattern(onig_pattern);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err,
                                   &err_offset, nullptr);
  LY_CHECK(code != nullptr, ErrorCode::kInvalidFile,
           "{}: regex '{}' does not compile: {} (at offset {} of the PCRE2 form '{}')", where,
           onig_pattern, pcre2_message(err), err_offset, pattern);
  auto owned = std::make_shared<Code>();
  owned->code = code;
  // JIT is an optimisation: when unavailable, pcre2_match interprets the pattern.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  SplitPattern sp;
  sp.code_ = std::move(owned);
  return sp;
}

SplitPattern SplitPattern::literal(std::string_view text) {
  SplitPattern sp;
  sp.literal_ = std::string(text);
  return sp;
}

void SplitPattern::find_matches(std::string_view s, std::vector<Span>& out) const {
  if (s.empty()) return;
  if (!code_) {
    if (literal_.empty()) return;
    for (size_t at = s.find(literal_); at != std::string_view::npos;
         at = s.find(literal_, at + literal_.size()))
      out.emplace_back(at, at + literal_.size());
    return;
  }
  MatchScratch& scratch = match_scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  // Oniguruma's find_iter: an empty match counts (it splits), except one at the end of the
  // previous match; after an empty match the search resumes one code point later.
  size_t start = 0;
  std::optional<size_t> last_end;
  while (start <= s.size()) {
    const int rc = pcre2_match(code_->code, subject, s.size(), start, 0, scratch.data,
                               scratch.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    LY_CHECK(rc >= 0, ErrorCode::kInternal, "PCRE2 match failed at byte {} of a {}-byte text: {}",
             start, s.size(), pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
    const size_t b = ov[0], e = ov[1];
    if (b == e && last_end == e) {
      start = start < s.size() ? start + unicode::utf8_step(s, start) : s.size() + 1;
      continue;
    }
    out.emplace_back(b, e);
    last_end = e;
    start = e;
  }
}

namespace {

struct Part {
  Span span;
  bool is_match;
};

// The parts of s (matches and the gaps between them), then HF's behaviour on them.
void split_parts(std::string_view s, const PreTokenizeStep& step, std::vector<Span>& matches,
                 std::vector<Part>& parts, std::vector<Span>& result) {
  matches.clear();
  parts.clear();
  result.clear();
  step.pattern->find_matches(s, matches);
  size_t prev = 0;
  for (const Span& m : matches) {
    if (m.first > prev) parts.push_back({{prev, m.first}, step.invert});
    parts.push_back({m, !step.invert});
    prev = m.second;
  }
  if (prev < s.size()) parts.push_back({{prev, s.size()}, step.invert});

  bool prev_match = false;
  switch (step.behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& p : parts)
        if (!p.is_match) result.push_back(p.span);
      break;
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) result.push_back(p.span);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !prev_match && !result.empty()) result.back().second = p.span.second;
        else result.push_back(p.span);
        prev_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = parts.size(); k-- > 0;) {
        const Part& p = parts[k];
        if (p.is_match && !prev_match && !result.empty()) result.back().first = p.span.first;
        else result.push_back(p.span);
        prev_match = p.is_match;
      }
      std::reverse(result.begin(), result.end());
      break;
    case SplitBehavior::kContiguous:
      for (const Part& p : parts) {
        if (p.is_match == prev_match && !result.empty()) result.back().second = p.span.second;
        else result.push_back(p.span);
        prev_match = p.is_match;
      }
      break;
  }
}

// HF's Metaspace on one piece: ' ' becomes the replacement, which is then prepended as the
// scheme says (at_start: the piece begins at offset 0 of the input text).
void metaspace_piece(std::string_view piece, const PreTokenizeStep& step, bool at_start,
                     std::string& out) {
  out.clear();
  const bool prepend = step.prepend == MetaspacePrepend::kAlways ||
                       (step.prepend == MetaspacePrepend::kFirst && at_start);
  const bool starts_with_replacement =
      piece.starts_with(step.replacement) || piece.starts_with(' ');
  if (prepend && !starts_with_replacement) out += step.replacement;
  for (char c : piece) {
    if (c == ' ') out += step.replacement;
    else out += c;
  }
}

}  // namespace

bool PreTokenizer::byte_level() const {
  return !steps_.empty() && steps_.back().kind == PreTokenizeStep::Kind::kByteLevel;
}

void PreTokenizer::split(std::string_view text, Pieces& out, bool at_text_start) const {
  if (text.empty()) return;
  Pieces cur, next;
  cur.buf.assign(text);
  cur.spans.emplace_back(0, text.size());
  bool first_at_start = at_text_start;  // cur's first piece begins the input text
  std::vector<Span> matches, result;
  std::vector<Part> parts;
  std::string prefixed;
  for (const PreTokenizeStep& step : steps_) {
    next.clear();
    next.buf.reserve(cur.buf.size() + cur.spans.size());
    bool next_first_at_start = false;
    for (size_t k = 0; k < cur.spans.size(); ++k) {
      std::string_view piece = cur.at(k);
      if (step.kind == PreTokenizeStep::Kind::kByteLevel && step.add_prefix_space &&
          !piece.starts_with(' ')) {
        prefixed.assign(" ").append(piece);
        piece = prefixed;
      } else if (step.kind == PreTokenizeStep::Kind::kMetaspace) {
        metaspace_piece(piece, step, k == 0 && first_at_start, prefixed);
        piece = prefixed;
      }
      if (!step.pattern) {
        result.assign(1, Span{0, piece.size()});
      } else {
        split_parts(piece, step, matches, parts, result);
      }
      for (const Span& r : result) {
        if (r.second == r.first) continue;
        if (k == 0 && next.spans.empty()) next_first_at_start = first_at_start && r.first == 0;
        next.spans.emplace_back(next.buf.size(), next.buf.size() + r.second - r.first);
        next.buf.append(piece.substr(r.first, r.second - r.first));
      }
    }
    std::swap(cur, next);
    first_at_start = next_first_at_start;
  }
  for (size_t k = 0; k < cur.spans.size(); ++k) {
    const std::string_view piece = cur.at(k);
    out.spans.emplace_back(out.buf.size(), out.buf.size() + piece.size());
    out.buf.append(piece);
  }
}

PreTokenizer PreTokenizer::gpt2(bool split_digits) {
  PreTokenizer p;
  if (split_digits) {
    p.steps_.push_back({PreTokenizeStep::Kind::kSplit, SplitPattern::regex(kRustNumeric, "digits"),
                        SplitBehavior::kIsolated, false, false, {}, MetaspacePrepend::kAlways});
  }
  p.steps_.push_back({PreTokenizeStep::Kind::kByteLevel,
                      SplitPattern::regex(kGpt2Pattern, "GPT-2 pattern"), SplitBehavior::kIsolated,
                      false, false, {}, MetaspacePrepend::kAlways});
  return p;
}

PreTokenizer PreTokenizer::metaspace(MetaspacePrepend prepend, bool split) {
  PreTokenizer p;
  PreTokenizeStep step;
  step.kind = PreTokenizeStep::Kind::kMetaspace;
  step.replacement = "\u2581";
  step.prepend = prepend;
  if (split) {
    step.pattern = SplitPattern::literal(step.replacement);
    step.behavior = SplitBehavior::kMergedWithNext;
  }
  p.steps_.push_back(std::move(step));
  return p;
}

PreTokenizer PreTokenizer::split_then_bytes(std::string_view pattern) {
  PreTokenizer p;
  p.steps_.push_back({PreTokenizeStep::Kind::kSplit, SplitPattern::regex(pattern, "preset"),
                      SplitBehavior::kIsolated, false, false, {}, MetaspacePrepend::kAlways});
  p.steps_.push_back({PreTokenizeStep::Kind::kByteLevel, std::nullopt, SplitBehavior::kIsolated,
                      false, false, {}, MetaspacePrepend::kAlways});
  return p;
}

namespace {

SplitBehavior parse_behavior(const std::string& name, std::string_view where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail(ErrorCode::kInvalidFile,
       "{}.behavior: unknown value '{}' (expected Removed, Isolated, MergedWithPrevious, "
       "MergedWithNext or Contiguous)", where, name);
}

PreTokenizeStep parse_split(const nlohmann::json& j, const std::string& where) {
  const nlohmann::json& pat = json_field(j, "pattern", where);
  PreTokenizeStep step;
  if (pat.is_object() && pat.contains("Regex")) {
    step.pattern = SplitPattern::regex(json_string(pat, "Regex", where + ".pattern"),
                                       where + ".pattern.Regex");
  } else if (pat.is_object() && pat.contains("String")) {
    step.pattern = SplitPattern::literal(json_string(pat, "String", where + ".pattern"));
  } else {
    fail(ErrorCode::kInvalidFile, "{}.pattern: expected an object with 'Regex' or 'String', got {}",
         where, pat.dump());
  }
  step.behavior = parse_behavior(json_string(j, "behavior", where), where);
  step.invert = json_bool_or(j, "invert", false, where);
  return step;
}

void parse_step(const nlohmann::json& j, const std::string& where,
                std::vector<PreTokenizeStep>& steps) {
  LY_CHECK(j.is_object(), ErrorCode::kInvalidFile, "{}: expected an object, got {}", where,
           j.dump());
  const std::string type = json_string(j, "type", where);
  if (type == "Sequence") {
    const nlohmann::json& list = json_field(j, "pretokenizers", where);
    LY_CHECK(list.is_array(), ErrorCode::kInvalidFile, "{}.pretokenizers: expected an array",
             where);
    for (size_t k = 0; k < list.size(); ++k)
      parse_step(list[k], fmt::format("{}.pretokenizers[{}]", where, k), steps);
  } else if (type == "Split") {
    steps.push_back(parse_split(j, where));
  } else if (type == "Digits") {
    const bool individual = json_bool_or(j, "individual_digits", false, where);
    // HF splits on char::is_numeric (Nd, Nl, No): one piece per digit, or per run of digits.
    steps.push_back({PreTokenizeStep::Kind::kSplit,
                     SplitPattern::regex(individual ? std::string(kRustNumeric)
                                                    : std::string(kRustNumeric) + "+", where),
                     SplitBehavior::kIsolated, false, false, {}, MetaspacePrepend::kAlways});
  } else if (type == "ByteLevel") {
    PreTokenizeStep step;
    step.kind = PreTokenizeStep::Kind::kByteLevel;
    step.add_prefix_space = json_bool_or(j, "add_prefix_space", true, where);
    if (json_bool_or(j, "use_regex", true, where)) step.pattern = SplitPattern::regex(kGpt2Pattern, where);
    steps.push_back(std::move(step));
  } else if (type == "Metaspace") {
    PreTokenizeStep step;
    step.kind = PreTokenizeStep::Kind::kMetaspace;
    step.replacement = json_string(j, "replacement", where);
    uint32_t cp;
    LY_CHECK(!step.replacement.empty() &&
                 unicode::utf8_decode(step.replacement, 0, &cp) == int(step.replacement.size()),
             ErrorCode::kInvalidFile, "{}.replacement: expected one character, got '{}'", where,
             step.replacement);
    step.prepend = parse_prepend_scheme(j, where);
    if (json_bool_or(j, "split", true, where)) {
      // HF splits on the replacement and keeps it with the piece that follows.
      step.pattern = SplitPattern::literal(step.replacement);
      step.behavior = SplitBehavior::kMergedWithNext;
    }
    steps.push_back(std::move(step));
  } else {
    fail(ErrorCode::kUnsupported,
         "{}: pre-tokenizer type '{}' is not supported (lychee reads ByteLevel, Metaspace, Split, "
         "Digits and Sequence)", where, type);
  }
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, std::string_view where) {
  const std::string at = fmt::format("{}: pre_tokenizer", where);
  PreTokenizer p;
  if (j.is_null()) return p;
  parse_step(j, at, p.steps_);
  size_t n_byte_level = 0;
  for (const PreTokenizeStep& s : p.steps_) n_byte_level += s.kind == PreTokenizeStep::Kind::kByteLevel;
  LY_CHECK(n_byte_level == 0 || (n_byte_level == 1 && p.byte_level()), ErrorCode::kUnsupported,
           "{}: a ByteLevel step must be the last pre-tokenizer, and the only one (found {} "
           "ByteLevel steps among {})", at, n_byte_level, p.steps_.size());
  return p;
}

PreTokenizerPreset preset_for_gguf_pre(std::string_view pre, std::string_view where,
                                       std::string_view key) {
  if (pre == "default" || pre == "gpt-2") return {PreTokenizer::gpt2(false), std::nullopt, false};
  if (pre == "smollm" || pre == "starcoder") return {PreTokenizer::gpt2(true), std::nullopt, false};
  if (pre == "llama-bpe" || pre == "llama3")
    return {PreTokenizer::split_then_bytes(kLlama3Pattern), std::nullopt, true};
  // Qwen2's tokenizer.json normalises to NFC before splitting.
  if (pre == "qwen2")
    return {PreTokenizer::split_then_bytes(kQwen2Pattern), unicode::NormalForm::kNFC, false};
  fail(ErrorCode::kUnsupported,
       "{}: {} = '{}' is not supported (lychee knows: default, gpt-2, llama-bpe, llama3, qwen2, "
       "smollm, starcoder)", where, key, pre);
}

}  // namespace lychee
