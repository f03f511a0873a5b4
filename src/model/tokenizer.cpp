#include "model/tokenizer.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"
#include "model/gguf.h"

namespace lychee {

using nlohmann::json;

namespace {

constexpr int64_t kMaxTokenId = int64_t(1) << 24;
constexpr size_t kMaxCachedPiece = 128;  // longer pre-tokens are rarely repeated

json parse_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(ErrorCode::kInvalidFile, "{}: not valid JSON: {}", path, e.what());
  }
}

const json& field_or_null(const json& j, const char* key) {
  static const json kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

std::vector<AddedToken> parse_added_tokens(const json& list, const std::string& where) {
  std::vector<AddedToken> out;
  if (list.is_null()) return out;
  LY_CHECK(list.is_array(), ErrorCode::kInvalidFile, "{}: expected an array", where);
  for (size_t k = 0; k < list.size(); ++k) {
    const std::string at = fmt::format("{}[{}]", where, k);
    const json& e = list[k];
    AddedToken t;
    t.content = json_string(e, "content", at);
    const json& id = json_field(e, "id", at);
    LY_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < kMaxTokenId,
             ErrorCode::kInvalidFile, "{}.id: expected an id in [0, {}), got {}", at, kMaxTokenId,
             id.dump());
    t.id = int32_t(id.get<int64_t>());
    t.special = json_bool_or(e, "special", false, at);
    t.lstrip = json_bool_or(e, "lstrip", false, at);
    t.rstrip = json_bool_or(e, "rstrip", false, at);
    t.single_word = json_bool_or(e, "single_word", false, at);
    t.normalized = json_bool_or(e, "normalized", !t.special, at);
    out.push_back(std::move(t));
  }
  return out;
}

// What the post-processor adds in front of a single sequence.
struct PostProcessor {
  bool has_template = false;  // a TemplateProcessing decides add_bos
  std::string bos_content;    // its leading special token, "" if none
  int32_t bos_id = -1;
};

void parse_post_processor(const json& p, const std::string& where, PostProcessor& out) {
  if (p.is_null()) return;
  const std::string type = json_string(p, "type", where);
  if (type == "Sequence") {
    const json& list = json_field(p, "processors", where);
    LY_CHECK(list.is_array(), ErrorCode::kInvalidFile, "{}.processors: expected an array", where);
    for (size_t k = 0; k < list.size(); ++k)
      parse_post_processor(list[k], fmt::format("{}.processors[{}]", where, k), out);
    return;
  }
  if (type == "ByteLevel") return;  // offsets only
  LY_CHECK(type == "TemplateProcessing", ErrorCode::kUnsupported,
           "{}: post-processor type '{}' is not supported (lychee reads TemplateProcessing, "
           "ByteLevel, Sequence)", where, type);
  out.has_template = true;
  const json& single = json_field(p, "single", where);
  LY_CHECK(single.is_array(), ErrorCode::kInvalidFile, "{}.single: expected an array", where);
  if (single.empty() || !single[0].contains("SpecialToken")) return;
  out.bos_content = json_string(single[0]["SpecialToken"], "id", where + ".single[0].SpecialToken");
  const json& specials = field_or_null(p, "special_tokens");
  const json& entry = specials.is_object() ? field_or_null(specials, out.bos_content.c_str()) : json();
  const json& ids = entry.is_object() ? field_or_null(entry, "ids") : json();
  if (ids.is_array() && !ids.empty() && ids[0].is_number_integer())
    out.bos_id = int32_t(ids[0].get<int64_t>());
}

// The fields lychee reads from tokenizer_config.json.
struct HfConfig {
  std::optional<std::string> bos, eos;
  std::optional<bool> add_bos, add_eos;
  std::string chat_template;
};

std::optional<std::string> config_token(const json& c, const char* key, const std::string& path) {
  const json& v = field_or_null(c, key);
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) return v.get<std::string>();
  LY_CHECK(v.is_object(), ErrorCode::kInvalidFile,
           "{}: field '{}' should be a string or an object with 'content', got {}", path, key,
           v.dump());
  return json_string(v, "content", fmt::format("{}: {}", path, key));
}

std::string config_chat_template(const json& c, const std::string& path) {
  const json& t = field_or_null(c, "chat_template");
  if (t.is_null()) return "";
  if (t.is_string()) return t.get<std::string>();
  // A list of named templates: the one named "default".
  LY_CHECK(t.is_array(), ErrorCode::kInvalidFile,
           "{}: field 'chat_template' should be a string or a list of {{name, template}}", path);
  for (const json& e : t)
    if (e.is_object() && e.value("name", "") == "default")
      return json_string(e, "template", path + ": chat_template[default]");
  fail(ErrorCode::kInvalidFile, "{}: chat_template lists no template named 'default'", path);
}

HfConfig read_config(const std::string& path) {
  HfConfig cfg;
  if (path.empty()) return cfg;
  const json c = parse_json_file(path);
  LY_CHECK(c.is_object(), ErrorCode::kInvalidFile, "{}: expected a JSON object", path);
  cfg.bos = config_token(c, "bos_token", path);
  cfg.eos = config_token(c, "eos_token", path);
  for (auto [key, flag] : {std::pair{"add_bos_token", &cfg.add_bos}, {"add_eos_token", &cfg.add_eos}}) {
    const json& add = field_or_null(c, key);
    LY_CHECK(add.is_null() || add.is_boolean(), ErrorCode::kInvalidFile,
             "{}: field '{}' should be a bool, got {}", path, key, add.dump());
    if (add.is_boolean()) *flag = add.get<bool>();
  }
  cfg.chat_template = config_chat_template(c, path);
  return cfg;
}

}  // namespace

Tokenizer Tokenizer::from_hf_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  const fs::path config = root / "tokenizer_config.json";
  Tokenizer t = from_hf_json((root / "tokenizer.json").string(),
                             fs::exists(config) ? config.string() : std::string());
  const fs::path jinja = root / "chat_template.jinja";
  if (t.chat_template_.empty() && fs::exists(jinja)) t.chat_template_ = read_text_file(jinja.string());
  return t;
}

Tokenizer Tokenizer::from_hf_json(const std::string& tokenizer_json_path,
                                  const std::string& tokenizer_config_path) {
  const std::string& path = tokenizer_json_path;
  const json j = parse_json_file(path);
  LY_CHECK(j.is_object(), ErrorCode::kInvalidFile, "{}: expected a JSON object", path);
  LY_CHECK(j.contains("model"), ErrorCode::kInvalidFile, "{}: missing field 'model'", path);
  Tokenizer t;
  t.pre_ = PreTokenizer::from_json(field_or_null(j, "pre_tokenizer"), path);
  const json& model = j["model"];
  t.unigram_model_ = model.is_object() && model.value("type", "") == "Unigram";
  if (t.unigram_model_) t.unigram_ = UnigramModel::from_json(model, path);
  else t.bpe_ = BpeModel::from_json(model, t.pre_.byte_level(), path);
  t.normalizer_ = Normalizer::from_json(field_or_null(j, "normalizer"), path + ": normalizer");
  t.decoder_ = Decoder::from_json(field_or_null(j, "decoder"), path + ": decoder");
  LY_CHECK(!t.pre_.byte_level() || t.decoder_.has_byte_level(), ErrorCode::kUnsupported,
           "{}: a ByteLevel pre-tokenizer needs a ByteLevel decoder (or a Sequence holding one), "
           "got {}", path, field_or_null(j, "decoder").dump());
  t.added_ = parse_added_tokens(field_or_null(j, "added_tokens"), path + ": added_tokens");
  PostProcessor post;
  parse_post_processor(field_or_null(j, "post_processor"), path + ": post_processor", post);
  t.finish(path);

  const HfConfig cfg = read_config(tokenizer_config_path);
  const auto resolve = [&](const std::optional<std::string>& content, const char* field) {
    if (!content) return int32_t(-1);
    const auto id = t.find_token(*content);
    LY_CHECK(id.has_value(), ErrorCode::kInvalidFile, "{}: {} '{}' is not a token of {}",
             tokenizer_config_path, field, *content, path);
    return *id;
  };
  t.bos_id_ = resolve(cfg.bos, "bos_token");
  if (t.bos_id_ < 0 && !post.bos_content.empty())
    t.bos_id_ = post.bos_id >= 0 ? post.bos_id : t.find_token(post.bos_content).value_or(-1);
  t.eos_id_ = resolve(cfg.eos, "eos_token");
  t.add_bos_ = post.has_template ? !post.bos_content.empty() : cfg.add_bos.value_or(false);
  t.add_eos_ = cfg.add_eos.value_or(false);
  t.chat_template_ = cfg.chat_template;
  t.set_stop_ids();
  return t;
}

const std::vector<std::string>& Tokenizer::model_tokens() const {
  return unigram_model_ ? unigram_.tokens() : bpe_.tokens();
}

std::optional<int32_t> Tokenizer::model_find(std::string_view text) const {
  return unigram_model_ ? unigram_.find(text) : bpe_.find(text);
}

// Builds the id tables and matchers from the model and added_, then the stop ids.
void Tokenizer::finish(std::string_view where) {
  const std::vector<std::string>& tokens = model_tokens();
  auto n = int32_t(tokens.size());
  for (const AddedToken& a : added_) n = std::max(n, a.id + 1);
  pieces_.assign(size_t(n), std::string());
  special_.assign(size_t(n), 0);
  first_pieces_.assign(decoder_.first_differs() ? size_t(n) : 0, std::string());
  const auto set_piece = [&](int32_t id, std::string_view text) {
    pieces_[id] = decoder_.piece(text);
    if (!first_pieces_.empty()) first_pieces_[id] = decoder_.first_piece(text);
  };
  for (size_t i = 0; i < tokens.size(); ++i) set_piece(int32_t(i), tokens[i]);
  added_index_.clear();
  for (size_t k = 0; k < added_.size(); ++k) {
    const AddedToken& a = added_[k];
    LY_CHECK(!a.content.empty(), ErrorCode::kInvalidFile, "{}: added token id {} is empty", where,
             a.id);
    set_piece(a.id, a.content);
    special_[a.id] = a.special;
    added_index_.emplace(a.content, int32_t(k));
  }
  build_matchers();
  set_stop_ids();
}

void Tokenizer::set_stop_ids() {
  stop_ids_.clear();
  if (eos_id_ >= 0) stop_ids_.push_back(eos_id_);
  for (const char* name : {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"}) {
    const auto it = added_index_.find(std::string_view(name));
    const auto id = it != added_index_.end() ? std::optional(added_[it->second].id) : model_find(name);
    if (id && std::find(stop_ids_.begin(), stop_ids_.end(), *id) == stop_ids_.end())
      stop_ids_.push_back(*id);
  }
}

void Tokenizer::build_matchers() {
  for (AddedMatcher* m : {&raw_matcher_, &normalized_matcher_}) {
    m->by_first_byte.assign(256, {});
    m->patterns.assign(added_.size(), std::string());
  }
  for (size_t k = 0; k < added_.size(); ++k) {
    const AddedToken& a = added_[k];
    AddedMatcher& m = a.normalized ? normalized_matcher_ : raw_matcher_;
    m.patterns[k] = a.normalized ? normalize(a.content) : a.content;
    if (!m.patterns[k].empty()) m.by_first_byte[uint8_t(m.patterns[k][0])].push_back(int32_t(k));
  }
  for (AddedMatcher* m : {&raw_matcher_, &normalized_matcher_}) {
    for (auto& list : m->by_first_byte) {
      // Longest first, so the first hit at a position is the leftmost-longest match.
      std::stable_sort(list.begin(), list.end(), [&](int32_t x, int32_t y) {
        return m->patterns[x].size() > m->patterns[y].size();
      });
    }
  }
}

namespace {

// Start of the whitespace run that ends at `end` (Rust char::is_whitespace).
size_t whitespace_start_before(std::string_view s, size_t end) {
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && end - start < 4 && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
    uint32_t cp;
    const int n = unicode::utf8_decode(s, start, &cp);
    if (n <= 0 || start + size_t(n) != end || !unicode::is_white_space(cp)) break;
    end = start;
  }
  return end;
}

size_t whitespace_end_after(std::string_view s, size_t begin) {
  uint32_t cp;
  for (int n; begin < s.size() && (n = unicode::utf8_decode(s, begin, &cp)) > 0 &&
              unicode::is_white_space(cp);)
    begin += size_t(n);
  return begin;
}

bool word_char_before(std::string_view s, size_t end) {
  if (end == 0) return false;
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
  uint32_t cp;
  return unicode::utf8_decode(s, start, &cp) > 0 && unicode::is_word_char(cp);
}

bool word_char_at(std::string_view s, size_t i) {
  uint32_t cp;
  return i < s.size() && unicode::utf8_decode(s, i, &cp) > 0 && unicode::is_word_char(cp);
}

// Whether [begin, end) meets one of the sorted ranges.
bool overlaps(std::span<const std::pair<size_t, size_t>> ranges, size_t begin, size_t end) {
  const auto it = std::upper_bound(ranges.begin(), ranges.end(), begin,
                                   [](size_t b, const std::pair<size_t, size_t>& r) { return b < r.second; });
  return it != ranges.end() && it->first < end;
}

}  // namespace

// HF's added-vocabulary split: leftmost-longest matches; a special token is skipped (left as
// text) without parse_special; lstrip/rstrip widen the match over whitespace.
void Tokenizer::split_added(std::string_view text, const AddedMatcher& m, bool parse_special,
                            std::vector<Segment>& out,
                            std::span<const std::pair<size_t, size_t>> plain) const {
  out.clear();
  size_t done = 0;  // end of the last segment emitted
  for (size_t i = 0; i < text.size();) {
    int32_t hit = -1;
    for (int32_t k : m.by_first_byte[uint8_t(text[i])]) {
      if (text.substr(i).starts_with(m.patterns[k])) {
        hit = k;
        break;
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    const AddedToken& a = added_[hit];
    size_t begin = i, end = i + m.patterns[hit].size();
    i = end;
    if (a.special && !parse_special) continue;
    if (a.special && overlaps(plain, begin, end)) {  // user text: look on from the next byte
      i = begin + 1;
      continue;
    }
    if (a.single_word && (word_char_before(text, begin) || word_char_at(text, end))) continue;
    if (a.lstrip) begin = std::max(whitespace_start_before(text, begin), done);
    if (a.rstrip) end = whitespace_end_after(text, end);
    begin = std::max(begin, done);
    if (begin > done) out.push_back({done, begin, -1});
    out.push_back({begin, end, hit});
    done = end;
    i = std::max(i, done);
  }
  if (done < text.size()) out.push_back({done, text.size(), -1});
}

struct Tokenizer::EncodeCache {
  // pre-token bytes -> (offset into ids << 32 | count)
  std::unordered_map<std::string, uint64_t, StringHash, std::equal_to<>> where;
  std::vector<int32_t> ids;
  BpeScratch scratch;
  Pieces pieces;
  std::vector<Segment> segments;
};

void Tokenizer::encode_word(std::string_view piece, std::vector<int32_t>& out,
                            EncodeCache& cache) const {
  if (unigram_model_) unigram_.encode_word(piece, out);
  else bpe_.encode_word(piece, out, cache.scratch);
}

void Tokenizer::encode_text(std::string_view text, bool at_text_start, std::vector<int32_t>& out,
                            EncodeCache& cache) const {
  cache.pieces.clear();
  pre_.split(text, cache.pieces, at_text_start);
  for (size_t k = 0; k < cache.pieces.spans.size(); ++k) {
    const std::string_view piece = cache.pieces.at(k);
    if (piece.size() > kMaxCachedPiece) {
      encode_word(piece, out, cache);
      continue;
    }
    if (const auto it = cache.where.find(piece); it != cache.where.end()) {
      const auto offset = size_t(it->second >> 32), count = size_t(it->second & 0xFFFFFFFFu);
      out.insert(out.end(), cache.ids.begin() + offset, cache.ids.begin() + offset + count);
      continue;
    }
    const size_t before = out.size();
    encode_word(piece, out, cache);
    const uint64_t offset = cache.ids.size(), count = out.size() - before;
    cache.ids.insert(cache.ids.end(), out.begin() + before, out.end());
    cache.where.emplace(std::string(piece), (offset << 32) | count);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  return encode_impl(text, add_bos, parse_special, {});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       std::span<const std::pair<size_t, size_t>> plain) const {
  return encode_impl(text, add_bos, true, plain);
}

std::vector<int32_t> Tokenizer::encode_impl(std::string_view text, bool add_bos, bool parse_special,
                                            std::span<const std::pair<size_t, size_t>> plain) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  EncodeCache cache;
  std::vector<Segment> raw;
  split_added(text, raw_matcher_, parse_special, raw, plain);
  for (const Segment& seg : raw) {
    if (seg.added >= 0) {
      out.push_back(added_[seg.added].id);
      continue;
    }
    std::string_view part = text.substr(seg.begin, seg.end - seg.begin);
    std::string normalized;
    if (!normalizer_.empty()) part = normalized = normalize(part);
    // Added tokens marked `normalized` match in the normalised text.
    // Offsets move under normalisation: a segment touching a plain range parses no special token.
    split_added(part, normalized_matcher_, parse_special && !overlaps(plain, seg.begin, seg.end),
                cache.segments);
    for (const Segment& s : cache.segments) {
      if (s.added >= 0) out.push_back(added_[s.added].id);
      // Metaspace's "first" scheme: only the text at offset 0 of the input gets the prefix.
      else encode_text(part.substr(s.begin, s.end - s.begin), seg.begin == 0 && s.begin == 0, out,
                       cache);
    }
  }
  return out;
}

void Tokenizer::check_id(int32_t id, std::string_view what) const {
  LY_CHECK(id >= 0 && id < vocab_size(), ErrorCode::kInvalidArgument,
           "{}: token id {} is outside the vocabulary [0, {})", what, id, vocab_size());
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (size_t k = 0; k < ids.size(); ++k) {
    check_id(ids[k], "decode");
    if (skip_special && special_[ids[k]]) continue;
    out += first && !first_pieces_.empty() ? first_pieces_[ids[k]] : pieces_[ids[k]];
    first = false;
  }
  decoder_.finish(out);
  return out;
}

std::string Tokenizer::token_piece(int32_t id) const {
  check_id(id, "token_piece");
  return pieces_[id];
}

std::string Tokenizer::token_piece_at_start(int32_t id) const {
  check_id(id, "token_piece_at_start");
  std::string piece = first_pieces_.empty() ? pieces_[id] : first_pieces_[id];
  decoder_.finish(piece);
  return piece;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id] != 0;
}

std::optional<int32_t> Tokenizer::find_token(std::string_view piece) const {
  if (const auto it = added_index_.find(piece); it != added_index_.end())
    return added_[it->second].id;
  if (const auto id = model_find(piece)) return id;
  if (pre_.byte_level()) return model_find(unicode::bytes_to_symbols(piece));
  std::string escaped;  // SentencePiece spells ' ' as U+2581
  for (char c : piece) escaped += c == ' ' ? std::string("\u2581") : std::string(1, c);
  return model_find(escaped);
}

}  // namespace lychee
