#include "model/tokenizer_pipeline.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lychee {

using nlohmann::json;

namespace {

SplitPattern parse_pattern(const json& j, const std::string& where) {
  const json& pat = json_field(j, "pattern", where);
  if (pat.is_object() && pat.contains("Regex"))
    return SplitPattern::regex(json_string(pat, "Regex", where + ".pattern"), where + ".pattern.Regex");
  LY_CHECK(pat.is_object() && pat.contains("String"), ErrorCode::kInvalidFile,
           "{}.pattern: expected an object with 'Regex' or 'String', got {}", where, pat.dump());
  return SplitPattern::literal(json_string(pat, "String", where + ".pattern"));
}

// s with every match of p replaced by `with` (HF's NormalizedString::replace, decoders::Replace).
std::string replace_all(std::string_view s, const SplitPattern& p, std::string_view with) {
  std::vector<Span> matches;
  p.find_matches(s, matches);
  if (matches.empty()) return std::string(s);
  std::string out;
  size_t done = 0;
  for (const Span& m : matches) {
    out.append(s.substr(done, m.first - done)).append(with);
    done = m.second;
  }
  return out.append(s.substr(done));
}

// The first code point of a one-character string (Metaspace's replacement, Strip's content).
std::string one_char(const json& j, const char* key, const std::string& where) {
  const std::string s = json_string(j, key, where);
  uint32_t cp;
  LY_CHECK(!s.empty() && unicode::utf8_decode(s, 0, &cp) == int(s.size()), ErrorCode::kInvalidFile,
           "{}.{}: expected one character, got '{}'", where, key, s);
  return s;
}

size_t json_size(const json& j, const char* key, const std::string& where) {
  const json& v = json_field(j, key, where);
  LY_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
           ErrorCode::kInvalidFile, "{}.{}: expected a count, got {}", where, key, v.dump());
  return size_t(v.get<int64_t>());
}

// Strips up to n leading (or trailing) copies of the character c from s.
void strip_char(std::string& s, std::string_view c, size_t n_start, size_t n_stop) {
  size_t b = 0, e = s.size();
  for (size_t k = 0; k < n_start && std::string_view(s).substr(b).starts_with(c); ++k) b += c.size();
  for (size_t k = 0; k < n_stop && e >= b + c.size() && std::string_view(s).substr(0, e).ends_with(c);
       ++k)
    e -= c.size();
  s = s.substr(b, e - b);
}

bool is_white_space_at(std::string_view s, size_t i, size_t* n) {
  uint32_t cp;
  const int len = unicode::utf8_decode(s, i, &cp);
  *n = size_t(len);
  return len > 0 && unicode::is_white_space(cp);
}

std::string strip_white_space(std::string_view s, bool left, bool right) {
  size_t b = 0, e = s.size(), n = 0;
  if (left)
    while (b < e && is_white_space_at(s, b, &n)) b += n;
  if (right) {
    while (e > b) {
      size_t start = e - 1;
      while (start > b && e - start < 4 && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
      if (!is_white_space_at(s, start, &n) || start + n != e) break;
      e = start;
    }
  }
  return std::string(s.substr(b, e - b));
}

}  // namespace

MetaspacePrepend parse_prepend_scheme(const json& j, std::string_view where) {
  const std::string at(where);
  if (j.contains("prepend_scheme")) {
    const std::string s = json_string(j, "prepend_scheme", at);
    if (s == "always") return MetaspacePrepend::kAlways;
    if (s == "first") return MetaspacePrepend::kFirst;
    if (s == "never") return MetaspacePrepend::kNever;
    fail(ErrorCode::kInvalidFile, "{}.prepend_scheme: '{}' is not always, first or never", at, s);
  }
  // Files written before prepend_scheme existed say add_prefix_space.
  return json_bool_or(j, "add_prefix_space", true, at) ? MetaspacePrepend::kAlways
                                                       : MetaspacePrepend::kNever;
}

Normalizer Normalizer::from_json(const json& j, std::string_view where) {
  Normalizer n;
  if (!j.is_null()) n.parse(j, std::string(where));
  return n;
}

void Normalizer::add_unicode(unicode::NormalForm form) {
  Step s;
  s.form = form;
  steps_.push_back(std::move(s));
}

void Normalizer::parse(const json& j, const std::string& where) {
  LY_CHECK(j.is_object(), ErrorCode::kInvalidFile, "{}: expected an object, got {}", where, j.dump());
  const std::string type = json_string(j, "type", where);
  if (type == "Sequence") {
    const json& list = json_field(j, "normalizers", where);
    LY_CHECK(list.is_array(), ErrorCode::kInvalidFile, "{}.normalizers: expected an array", where);
    for (size_t k = 0; k < list.size(); ++k) parse(list[k], fmt::format("{}.normalizers[{}]", where, k));
    return;
  }
  using unicode::NormalForm;
  for (NormalForm f : {NormalForm::kNFC, NormalForm::kNFD, NormalForm::kNFKC, NormalForm::kNFKD}) {
    if (type == unicode::normal_form_name(f)) return add_unicode(f);
  }
  Step s;
  if (type == "Prepend") {
    s.kind = Step::Kind::kPrepend;
    s.text = json_string(j, "prepend", where);
  } else if (type == "Replace") {
    s.kind = Step::Kind::kReplace;
    s.pattern = parse_pattern(j, where);
    s.text = json_string(j, "content", where);
  } else if (type == "Strip") {
    s.kind = Step::Kind::kStrip;
    s.left = json_bool_or(j, "strip_left", false, where);
    s.right = json_bool_or(j, "strip_right", false, where);
  } else {
    fail(ErrorCode::kUnsupported,
         "{}: normalizer type '{}' is not supported (lychee reads NFC, NFD, NFKC, NFKD, Prepend, "
         "Replace, Strip, Sequence)", where, type);
  }
  steps_.push_back(std::move(s));
}

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kUnicode: s = unicode::normalize(s, step.form); break;
      case Step::Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.text);  // HF prepends to non-empty text only
        break;
      case Step::Kind::kReplace: s = replace_all(s, *step.pattern, step.text); break;
      case Step::Kind::kStrip: s = strip_white_space(s, step.left, step.right); break;
    }
  }
  return s;
}

Decoder Decoder::from_json(const json& j, std::string_view where) {
  Decoder d;
  bool fused = false;
  if (!j.is_null()) d.parse(j, std::string(where), fused);
  else d.join_with_spaces_ = true;
  return d;
}

Decoder Decoder::byte_level() {
  Decoder d;
  Step s;
  s.kind = Step::Kind::kByteLevel;
  d.per_token_.push_back(std::move(s));
  return d;
}

Decoder Decoder::sentencepiece(bool strip_prefix_space) {
  Decoder d;
  d.per_token_.push_back({Step::Kind::kReplace, SplitPattern::literal("\u2581"), " "});
  d.per_token_.push_back({Step::Kind::kByteFallback, std::nullopt, "", false, 0, 0});
  if (strip_prefix_space) d.on_text_.push_back({Step::Kind::kStrip, std::nullopt, " ", false, 1, 0});
  return d;
}

void Decoder::parse(const json& j, const std::string& where, bool& fused) {
  LY_CHECK(j.is_object(), ErrorCode::kInvalidFile, "{}: expected an object, got {}", where, j.dump());
  const std::string type = json_string(j, "type", where);
  Step s;
  if (type == "Sequence") {
    const json& list = json_field(j, "decoders", where);
    LY_CHECK(list.is_array(), ErrorCode::kInvalidFile, "{}.decoders: expected an array", where);
    for (size_t k = 0; k < list.size(); ++k)
      parse(list[k], fmt::format("{}.decoders[{}]", where, k), fused);
    return;
  } else if (type == "Fuse") {
    fused = true;  // lychee's pieces are joined anyway; Fuse only moves a later Strip to the text
    return;
  } else if (type == "ByteLevel") {
    s.kind = Step::Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    s.kind = Step::Kind::kByteFallback;
  } else if (type == "Replace") {
    s.kind = Step::Kind::kReplace;
    s.pattern = parse_pattern(j, where);
    s.text = json_string(j, "content", where);
  } else if (type == "Metaspace") {
    s.kind = Step::Kind::kMetaspace;
    s.text = one_char(j, "replacement", where);
    s.drop_first = parse_prepend_scheme(j, where) != MetaspacePrepend::kNever;
  } else if (type == "Strip") {
    s.kind = Step::Kind::kStrip;
    s.text = one_char(j, "content", where);
    s.start = json_size(j, "start", where);
    s.stop = json_size(j, "stop", where);
    if (fused) {
      on_text_.push_back(std::move(s));
      return;
    }
  } else {
    fail(ErrorCode::kUnsupported,
         "{}: decoder type '{}' is not supported (lychee reads ByteLevel, ByteFallback, Fuse, "
         "Metaspace, Replace, Strip, Sequence)", where, type);
  }
  per_token_.push_back(std::move(s));
}

bool Decoder::has_byte_level() const {
  return std::any_of(per_token_.begin(), per_token_.end(),
                     [](const Step& s) { return s.kind == Step::Kind::kByteLevel; });
}

bool Decoder::first_differs() const {
  return join_with_spaces_ || std::any_of(per_token_.begin(), per_token_.end(), [](const Step& s) {
    return s.kind == Step::Kind::kMetaspace && s.drop_first;
  });
}

std::string Decoder::run(std::string_view token, bool first) const {
  std::string t(token);
  for (const Step& s : per_token_) {
    switch (s.kind) {
      case Step::Kind::kByteLevel: {
        // Every character back to its byte, or the text unchanged when one is not a symbol.
        std::string bytes;
        bool all = true;
        for (size_t i = 0; i < t.size() && all;) {
          uint32_t cp;
          const int n = unicode::utf8_decode(t, i, &cp);
          const int b = n > 0 ? unicode::code_point_to_byte(cp) : -1;
          all = b >= 0;
          bytes += char(b);
          i += size_t(std::max(n, 1));
        }
        if (all) t = std::move(bytes);
        break;
      }
      case Step::Kind::kReplace: t = replace_all(t, *s.pattern, s.text); break;
      case Step::Kind::kByteFallback: {
        // "<0xHH>" is the byte HH (HF also reads lowercase hex digits).
        const auto hex = [](char c) {
          return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        };
        if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && hex(t[3]) >= 0 && hex(t[4]) >= 0)
          t = std::string(1, char(hex(t[3]) * 16 + hex(t[4])));
        break;
      }
      case Step::Kind::kMetaspace: {
        // HF drops every replacement character of the first token, not only a leading one.
        std::string out;
        for (size_t at = 0;;) {
          const size_t hit = t.find(s.text, at);
          out.append(t, at, hit == std::string::npos ? std::string::npos : hit - at);
          if (hit == std::string::npos) break;
          if (!(first && s.drop_first)) out += ' ';
          at = hit + s.text.size();
        }
        t = std::move(out);
        break;
      }
      case Step::Kind::kStrip: strip_char(t, s.text, s.start, s.stop); break;
    }
  }
  if (join_with_spaces_ && !first) t.insert(0, 1, ' ');
  return t;
}

void Decoder::finish(std::string& text) const {
  for (const Step& s : on_text_) strip_char(text, s.text, s.start, s.stop);
}

}  // namespace lychee
