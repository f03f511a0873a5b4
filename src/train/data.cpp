// Training data: multi-passkey samples and jsonl question answering (see data.h for the
// prompt formats). Prompt and needle texts are lychee's own.
#include "train/data.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"
#include "eval/length_fit.h"
#include "eval/rng.h"
#include "model/tokenizer.h"

namespace lychee::train {
namespace {

using nlohmann::json;

// Sub-streams of the seed: one for the epoch orders, one for the samples.
constexpr uint64_t kOrderStream = 1;
constexpr uint64_t kSampleStream = 2;

// A model reads raw text with BOS exactly when its tokenizer adds one (as `lychee generate`).
bool adds_bos(const Tokenizer& tok) { return tok.add_bos_default() && tok.bos_id() >= 0; }

struct Encoded {
  std::vector<int32_t> context;
  std::vector<int32_t> targets;
  int total() const { return int(context.size() + targets.size()); }
};

// Both texts as one string, split at the token boundary where the context text ends; the texts
// are data, so special-token text stays plain text.
Encoded encode_pair(const Tokenizer& tok, bool add_bos, const std::string& context_text,
                    const std::string& target_text) {
  std::vector<int32_t> ids = tok.encode(context_text + target_text, add_bos, false);
  size_t split = add_bos ? 1 : 0;
  size_t bytes = 0;
  while (split < ids.size() && bytes < context_text.size())
    bytes += tok.token_piece(ids[split++]).size();
  Encoded e;
  if (bytes == context_text.size() && split < ids.size()) {
    e.context.assign(ids.begin(), ids.begin() + ptrdiff_t(split));
    e.targets.assign(ids.begin() + ptrdiff_t(split), ids.end());
  } else {  // a token spans the boundary (or a normalizer changed the bytes)
    e.context = tok.encode(context_text, add_bos, false);
    e.targets = tok.encode(target_text, false, false);
  }
  return e;
}

// A shuffle of 0 … n−1, fixed by (seed, epoch).
std::vector<size_t> epoch_order(uint64_t seed, size_t n, uint64_t epoch) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  SampleRng rng(mix_seed(mix_seed(seed, kOrderStream), epoch));
  rng.shuffle(order);
  return order;
}

size_t epoch_pick(uint64_t seed, size_t n, uint64_t index) {
  return epoch_order(seed, n, index / n)[index % n];
}

// numpy.linspace(a, b, n)[k]; n == 1 gives a.
double linspace_at(double a, double b, int n, int k) {
  return n <= 1 ? a : a + (b - a) * double(k) / double(n - 1);
}

// ---------------------------------------------------------------------------------------------
// Passkey prompt texts

constexpr std::string_view kClosing =
    "The text ends here. Answer the questions about the passkeys.";

std::string plural(int n, std::string_view word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

std::string passkey_intro(int n_passkeys, int words_per_key) {
  if (n_passkeys == 1)
    return fmt::format(
        "Below is a long text. Hidden in it is a passkey to a vault, a sequence of {}. Read the "
        "text carefully and remember the passkey.",
        plural(words_per_key, "word"));
  return fmt::format(
      "Below is a long text. Hidden in it are {} to a vault, each a sequence of {}. Read the "
      "text carefully and remember every passkey.",
      plural(n_passkeys, "passkey"), plural(words_per_key, "word"));
}

std::string passkey_needle(int i, const std::string& words) {
  return fmt::format("The {} passkey to the vault is this sequence of words: {}.",
                     ordinal_word(i + 1), words);
}

std::string passkey_targets(const std::vector<std::string>& passkeys) {
  std::string out;
  for (size_t i = 0; i < passkeys.size(); ++i)
    out += fmt::format("What is the {} passkey to the vault in the text above?\nPasskey: {}\n\n",
                       ordinal_word(int(i) + 1), passkeys[i]);
  return out;
}

std::string passkey_context(const std::string& intro, const std::string& woven) {
  return intro + "\n\n" + woven + "\n\n" + std::string(kClosing) + "\n\n";
}

std::string repeat_word(std::string_view word, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i ? " " : "") + std::string(word);
  return out;
}

// The largest haystack word count whose context fits: context <= limit and context + targets
// <= max_len, limit = min(max(length, the context without haystack), max_len − targets). Unlike
// fit_to_length (nearest on either side) it never overshoots, because the totals must stay
// within the model's context. Interpolation, with a bisection every fourth step.
struct PasskeyFit {
  Encoded best;
  int limit = 0;
};

PasskeyFit fit_passkey(const std::function<Encoded(int64_t)>& build, int length, int max_len,
                       uint64_t index) {
  struct Probe {
    int64_t n;
    int ctx;
    bool fits;
  };
  PasskeyFit fit;
  fit.best = build(0);
  const int n_targets = int(fit.best.targets.size());
  const Probe origin{0, int(fit.best.context.size()), true};
  // A passkey of costly words may not leave the shortest lengths room for any haystack.
  fit.limit = std::min(std::max(length, origin.ctx), max_len - n_targets);
  LY_CHECK(origin.ctx <= fit.limit, ErrorCode::kInvalidArgument,
           "passkey sample {}: the intro, needles and closing line take {} tokens and the targets "
           "{}, more than max_len {}",
           index, origin.ctx, n_targets, max_len);
  const int limit = fit.limit;
  auto probe = [&](int64_t n) {
    Encoded e = build(n);
    const int ctx = int(e.context.size());
    const bool fits = ctx <= limit && e.total() <= max_len;
    if (fits && ctx > int(fit.best.context.size())) fit.best = std::move(e);
    return Probe{n, ctx, fits};
  };
  const int close_enough = std::max(2, limit / 1000);
  Probe lo = origin, hi{0, 0, false};
  bool have_hi = false;
  int64_t n = std::max<int64_t>(1, std::llround(0.75 * double(limit - origin.ctx)));
  for (int step = 0; step < 64 && limit - int(fit.best.context.size()) > close_enough; ++step) {
    const Probe p = probe(n);
    if (p.fits)
      lo = p;
    else
      hi = p, have_hi = true;
    if (have_hi && hi.n - lo.n <= 1) break;
    if (have_hi && step % 4 == 3) {
      n = (lo.n + hi.n) / 2;
    } else if (have_hi) {
      const double rate = double(hi.n - lo.n) / double(std::max(1, hi.ctx - lo.ctx));
      n = std::clamp<int64_t>(lo.n + std::llround(double(limit - lo.ctx) * rate), lo.n + 1,
                              hi.n - 1);
    } else {
      const double rate = double(lo.n) / double(std::max(1, lo.ctx - origin.ctx));
      n = lo.n + std::max<int64_t>(1, std::llround(double(limit - lo.ctx) * rate));
    }
  }
  const int got = int(fit.best.context.size());
  LY_CHECK(limit - got <= length_tolerance(limit), ErrorCode::kInternal,
           "passkey sample {}: no haystack length gives a context within {} tokens below {}: "
           "closest has {} tokens",
           index, length_tolerance(limit), limit, got);
  return fit;
}

// Token counts of passkey prompts that bound the samples: passkeys made of the NATO word that
// costs the most tokens bound the targets and the needles; passkeys cycling through all 26 words
// give the typical cost. "Bare": the context without haystack, BOS included.
struct PasskeyCosts {
  int typical_bare = 0;
  int worst_bare = 0;
  int worst_targets = 0;
};

PasskeyCosts passkey_costs(const Tokenizer& tok, const PasskeyOptions& o, bool add_bos) {
  std::string worst;
  int worst_tokens = -1;
  for (const std::string& w : nato_words()) {
    const int t = count_tokens(tok, " " + w);
    if (t > worst_tokens) worst = w, worst_tokens = t;
  }
  const std::vector<std::string> worst_keys(size_t(o.n_passkeys),
                                            repeat_word(worst, o.words_per_key));
  std::vector<std::string> typical_keys;
  for (int i = 0; i < o.n_passkeys; ++i) {
    std::string key;
    for (int k = 0; k < o.words_per_key; ++k)
      key += (k ? " " : "") + nato_words()[size_t(i * o.words_per_key + k) % 26];
    typical_keys.push_back(std::move(key));
  }
  const std::string intro = passkey_intro(o.n_passkeys, o.words_per_key);
  auto bare = [&](const std::vector<std::string>& keys) {
    std::string needles;
    for (int i = 0; i < o.n_passkeys; ++i) needles += (i ? " " : "") + passkey_needle(i, keys[i]);
    return count_tokens(tok, passkey_context(intro, needles)) + (add_bos ? 1 : 0);
  };
  return PasskeyCosts{bare(typical_keys), bare(worst_keys),
                      count_tokens(tok, passkey_targets(worst_keys))};
}

}  // namespace

const std::vector<std::string>& nato_words() {
  static const std::vector<std::string> words = {
      "alpha",  "bravo", "charlie", "delta",  "echo",     "foxtrot", "golf",   "hotel",  "india",
      "juliet", "kilo",  "lima",    "mike",   "november", "oscar",   "papa",   "quebec", "romeo",
      "sierra", "tango", "uniform", "victor", "whiskey",  "xray",    "yankee", "zulu"};
  return words;
}

std::string ordinal_word(int n) {
  static constexpr std::string_view kWords[] = {
      "first",     "second",      "third",      "fourth",     "fifth",
      "sixth",     "seventh",     "eighth",     "ninth",      "tenth",
      "eleventh",  "twelfth",     "thirteenth", "fourteenth", "fifteenth",
      "sixteenth", "seventeenth", "eighteenth", "nineteenth", "twentieth"};
  LY_CHECK(n >= 1, ErrorCode::kInvalidArgument, "ordinal_word: n must be >= 1, got {}", n);
  if (n <= 20) return std::string(kWords[n - 1]);
  const int tens = n % 100, ones = n % 10;
  const char* suffix = tens >= 11 && tens <= 13 ? "th"
                       : ones == 1              ? "st"
                       : ones == 2              ? "nd"
                       : ones == 3              ? "rd"
                                                : "th";
  return fmt::format("{}{}", n, suffix);
}

// ---------------------------------------------------------------------------------------------
// PasskeyDataset

PasskeyDataset::PasskeyDataset(const Tokenizer& tokenizer, Haystack haystack,
                               PasskeyOptions options)
    : tokenizer_(tokenizer), haystack_(std::move(haystack)), options_(options) {
  const PasskeyOptions& o = options_;
  LY_CHECK(o.n_passkeys >= 1, ErrorCode::kInvalidArgument,
           "passkey data: n_passkeys must be >= 1, got {}", o.n_passkeys);
  LY_CHECK(o.words_per_key >= 1, ErrorCode::kInvalidArgument,
           "passkey data: words_per_key must be >= 1, got {}", o.words_per_key);
  LY_CHECK(o.n_lengths >= 1, ErrorCode::kInvalidArgument,
           "passkey data: n_lengths must be >= 1, got {}", o.n_lengths);
  LY_CHECK(o.min_len >= 1 && o.max_len >= 1, ErrorCode::kInvalidArgument,
           "passkey data: min_len and max_len must be >= 1, got {} and {}", o.min_len, o.max_len);
  LY_CHECK(o.min_depth >= 0.0 && o.min_depth <= o.max_depth && o.max_depth <= 1.0,
           ErrorCode::kInvalidArgument,
           "passkey data: depths must satisfy 0 <= min_depth <= max_depth <= 1, got {} and {}",
           o.min_depth, o.max_depth);
  LY_CHECK(o.n_depths >= o.n_passkeys, ErrorCode::kInvalidArgument,
           "passkey data: {} passkeys need {} distinct depths, but n_depths is {}", o.n_passkeys,
           o.n_passkeys, o.n_depths);
  LY_CHECK(o.n_passkeys == 1 || o.min_depth < o.max_depth, ErrorCode::kInvalidArgument,
           "passkey data: {} passkeys need distinct depths, but min_depth = max_depth = {}",
           o.n_passkeys, o.min_depth);
  add_bos_ = adds_bos(tokenizer_);

  const PasskeyCosts costs = passkey_costs(tokenizer_, o, add_bos_);
  bare_context_tokens_ = costs.typical_bare;
  target_room_ = costs.worst_targets;
  const int typical = costs.typical_bare, worst_case = costs.worst_bare;
  LY_CHECK(o.min_len >= typical, ErrorCode::kInvalidArgument,
           "passkey data: min_len {} is below the {} tokens that the intro, the {} needles and "
           "the closing line typically take",
           o.min_len, typical, o.n_passkeys);
  const int top = o.max_len - target_room_;
  LY_CHECK(top >= o.min_len, ErrorCode::kInvalidArgument,
           "passkey data: max_len {} leaves {} tokens for the context after up to {} target "
           "tokens ({} × {} words), less than min_len {}",
           o.max_len, top, target_room_, plural(o.n_passkeys, "passkey"), o.words_per_key,
           o.min_len);
  LY_CHECK(top >= worst_case, ErrorCode::kInvalidArgument,
           "passkey data: max_len {} leaves {} tokens for the context after up to {} target "
           "tokens, less than the {} tokens that the intro, the {} needles and the closing line "
           "can take",
           o.max_len, top, target_room_, worst_case, o.n_passkeys);
  for (int k = 0; k < o.n_lengths; ++k)
    lengths_.push_back(int(std::llround(linspace_at(o.min_len, top, o.n_lengths, k))));
}

size_t PasskeyDataset::length_index(uint64_t index) const {
  return epoch_pick(options_.seed, lengths_.size(), index);
}

TrainSample PasskeyDataset::sample(uint64_t index) const {
  const PasskeyOptions& o = options_;
  SampleRng rng(mix_seed(mix_seed(o.seed, kSampleStream), index));
  TrainSample s;
  s.source = "passkey";
  s.index = index;
  const int length = lengths_[length_index(index)];
  const std::vector<std::string>& nato = nato_words();
  for (int i = 0; i < o.n_passkeys; ++i) {
    std::string key;
    for (int w = 0; w < o.words_per_key; ++w) key += (w ? " " : "") + nato[rng.below(nato.size())];
    s.answers.push_back(std::move(key));
  }
  std::vector<size_t> grid = rng.distinct(size_t(o.n_passkeys), size_t(o.n_depths));
  std::sort(grid.begin(), grid.end());
  std::vector<Insertion> inserts;
  for (int i = 0; i < o.n_passkeys; ++i) {
    s.depths.push_back(linspace_at(o.min_depth, o.max_depth, o.n_depths, int(grid[i])));
    inserts.push_back({s.depths.back(), passkey_needle(i, s.answers[i])});
  }
  const size_t first = haystack_.sentence_start(rng.below(haystack_.n_sentences()));
  const std::string intro = passkey_intro(o.n_passkeys, o.words_per_key);
  const std::string targets = passkey_targets(s.answers);
  auto build = [&](int64_t n_words) {
    return encode_pair(tokenizer_, add_bos_,
                       passkey_context(intro, haystack_.weave(first, size_t(n_words), inserts)),
                       targets);
  };
  PasskeyFit fit = fit_passkey(build, length, o.max_len, index);
  LY_CHECK(int(fit.best.targets.size()) <= target_room_, ErrorCode::kInternal,
           "passkey sample {}: {} target tokens, more than the bound of {}", index,
           fit.best.targets.size(), target_room_);
  s.context = std::move(fit.best.context);
  s.targets = std::move(fit.best.targets);
  s.target_length = fit.limit;
  std::string depths;
  for (double d : s.depths) depths += fmt::format(" {:.3f}", d);
  s.description =
      fmt::format("passkey sample {}: context {} tokens (length {}), {} target tokens, depths{}",
                  index, s.context.size(), length, s.targets.size(), depths);
  return s;
}

std::string PasskeyDataset::describe() const {
  const PasskeyOptions& o = options_;
  return fmt::format(
      "passkey: {} of {} NATO words in the {} haystack ({} words); context lengths {}..{} tokens "
      "in {} steps, up to {} target tokens, max_len {}, depths {}..{} on a grid of {}, seed {}",
      plural(o.n_passkeys, "passkey"), o.words_per_key, haystack_.name(), haystack_.n_words(),
      lengths_.front(), lengths_.back(), o.n_lengths, target_room_, o.max_len, o.min_depth,
      o.max_depth, o.n_depths, o.seed);
}

// ---------------------------------------------------------------------------------------------
// jsonl question answering

namespace {

constexpr std::string_view kQaInstruction =
    "Read the documents below, then answer the question after them. Reply with the answer alone, "
    "as briefly as possible.";

// "PATH:LINE" for error messages.
struct LineRef {
  const std::string& path;
  size_t line;
};

// obj[key]; field names it in the error ("answer", "documents[2].text").
const json& need_field(const json& obj, const char* key, const std::string& field,
                       const LineRef& at) {
  const auto it = obj.find(key);
  if (it == obj.end())
    fail(ErrorCode::kInvalidFile, "{}:{}: field '{}' is missing", at.path, at.line, field);
  return *it;
}

std::string need_string(const json& v, const std::string& field, const LineRef& at) {
  LY_CHECK(v.is_string(), ErrorCode::kInvalidFile, "{}:{}: field '{}' should be a string, got {}",
           at.path, at.line, field, v.type_name());
  return v.get<std::string>();
}

std::vector<QaDocument> read_documents(const json& docs, const LineRef& at) {
  LY_CHECK(docs.is_array(), ErrorCode::kInvalidFile,
           "{}:{}: field 'documents' should be an array, got {}", at.path, at.line,
           docs.type_name());
  std::vector<QaDocument> out;
  for (size_t i = 0; i < docs.size(); ++i) {
    const json& d = docs[i];
    const std::string field = fmt::format("documents[{}]", i);
    if (d.is_string()) {
      out.push_back({"", d.get<std::string>()});
      continue;
    }
    LY_CHECK(d.is_object(), ErrorCode::kInvalidFile,
             "{}:{}: field '{}' should be a string or an object with \"text\", got {}", at.path,
             at.line, field, d.type_name());
    QaDocument doc;
    doc.text = need_string(need_field(d, "text", field + ".text", at), field + ".text", at);
    if (d.contains("title")) doc.title = need_string(d["title"], field + ".title", at);
    out.push_back(std::move(doc));
  }
  return out;
}

// HotpotQA: [[title, [sentence, ...]], ...]; a document's text is its sentences concatenated.
std::vector<QaDocument> read_hotpot_context(const json& ctx, const LineRef& at) {
  LY_CHECK(ctx.is_array(), ErrorCode::kInvalidFile,
           "{}:{}: field 'context' should be an array of [title, sentences] pairs, got {}", at.path,
           at.line, ctx.type_name());
  std::vector<QaDocument> out;
  for (size_t i = 0; i < ctx.size(); ++i) {
    const json& pair = ctx[i];
    LY_CHECK(pair.is_array() && pair.size() == 2 && pair[1].is_array(), ErrorCode::kInvalidFile,
             "{}:{}: field 'context[{}]' should be a [title, [sentence, ...]] pair, got {}",
             at.path, at.line, i, pair.dump().substr(0, 80));
    QaDocument doc;
    doc.title = need_string(pair[0], fmt::format("context[{}][0]", i), at);
    for (size_t k = 0; k < pair[1].size(); ++k)
      doc.text += need_string(pair[1][k], fmt::format("context[{}][1][{}]", i, k), at);
    out.push_back(std::move(doc));
  }
  return out;
}

QaRecord read_qa_line(std::string_view line, const LineRef& at) {
  const size_t start = line.find_first_not_of(" \t");
  LY_CHECK(line[start] != '[', ErrorCode::kInvalidFile,
           "{}:{}: a JSON array, but the file must hold one JSON object per line (for a JSON "
           "array file: jq -c '.[]' FILE)",
           at.path, at.line);
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    fail(ErrorCode::kInvalidFile, "{}:{}: not valid JSON ({})", at.path, at.line, e.what());
  }
  LY_CHECK(j.is_object(), ErrorCode::kInvalidFile, "{}:{}: should be a JSON object, got {}",
           at.path, at.line, j.type_name());
  QaRecord r;
  r.line = at.line;
  r.question = need_string(need_field(j, "question", "question", at), "question", at);
  r.answer = need_string(need_field(j, "answer", "answer", at), "answer", at);
  LY_CHECK(!r.question.empty(), ErrorCode::kInvalidFile, "{}:{}: field 'question' is empty",
           at.path, at.line);
  LY_CHECK(!r.answer.empty(), ErrorCode::kInvalidFile, "{}:{}: field 'answer' is empty", at.path,
           at.line);
  for (const char* key : {"_id", "id"}) {
    const auto it = j.find(key);
    if (it == j.end() || !r.id.empty()) continue;
    if (it->is_string()) r.id = it->get<std::string>();
    if (it->is_number_integer()) r.id = it->dump();
  }
  const bool has_docs = j.contains("documents"), has_ctx = j.contains("context");
  LY_CHECK(has_docs || has_ctx, ErrorCode::kInvalidFile,
           "{}:{}: field 'documents' (or HotpotQA's 'context') is missing", at.path, at.line);
  LY_CHECK(!(has_docs && has_ctx), ErrorCode::kInvalidFile,
           "{}:{}: has both 'documents' and 'context'; give one", at.path, at.line);
  r.documents =
      has_docs ? read_documents(j["documents"], at) : read_hotpot_context(j["context"], at);
  return r;
}

std::string qa_context(const QaRecord& r, size_t n_docs) {
  std::string out = std::string(kQaInstruction) + "\n\n";
  for (size_t i = 0; i < n_docs; ++i) {
    const QaDocument& d = r.documents[i];
    out += d.title.empty() ? fmt::format("Document {}:\n", i + 1)
                           : fmt::format("Document {}: {}\n", i + 1, d.title);
    out += d.text + "\n\n";
  }
  return out + "Question: " + r.question + "\nAnswer:";
}

}  // namespace

std::vector<QaRecord> read_qa_jsonl(const std::string& path) {
  const std::string text = read_text_file(path);
  std::vector<QaRecord> records;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    records.push_back(read_qa_line(line, LineRef{path, line_no}));
  }
  LY_CHECK(!records.empty(), ErrorCode::kInvalidFile,
           "{}: no records (the file is empty or holds only blank lines)", path);
  return records;
}

QaDataset::QaDataset(const Tokenizer& tokenizer, const std::string& path, QaOptions options)
    : tokenizer_(tokenizer), path_(path), options_(options) {
  LY_CHECK(options_.max_len >= 1, ErrorCode::kInvalidArgument,
           "qa data {}: max_len must be >= 1, got {}", path, options_.max_len);
  LY_CHECK(!options_.append_eos || tokenizer_.eos_id() >= 0, ErrorCode::kInvalidArgument,
           "qa data {}: append_eos is set but the tokenizer has no EOS token", path);
  add_bos_ = adds_bos(tokenizer_);
  records_ = read_qa_jsonl(path);
  for (const QaRecord& r : records_)
    max_target_tokens_ = std::max(max_target_tokens_, count_tokens(tokenizer_, " " + r.answer));
  max_target_tokens_ += options_.append_eos ? 1 : 0;
}

TrainSample QaDataset::record_sample(size_t record) const {
  LY_CHECK(record < records_.size(), ErrorCode::kInvalidArgument,
           "qa data {}: record {} out of range, the file has {}", path_, record, records_.size());
  const QaRecord& r = records_[record];
  const std::string target_text = " " + r.answer;
  auto build = [&](size_t n_docs) {
    Encoded e = encode_pair(tokenizer_, add_bos_, qa_context(r, n_docs), target_text);
    if (options_.append_eos) e.targets.push_back(tokenizer_.eos_id());
    return e;
  };
  const size_t n = r.documents.size();
  Encoded e = build(n);
  size_t kept = n;
  if (e.total() > options_.max_len) {
    // Largest k < n whose first k documents fit: the total grows with k.
    Encoded lo = build(0);
    LY_CHECK(lo.total() <= options_.max_len, ErrorCode::kCapacity,
             "{}:{}: the question and answer alone take {} tokens, more than max_len {}", path_,
             r.line, lo.total(), options_.max_len);
    size_t lo_k = 0, hi_k = n;
    while (hi_k - lo_k > 1) {
      const size_t mid = (lo_k + hi_k) / 2;
      Encoded m = build(mid);
      if (m.total() <= options_.max_len)
        lo_k = mid, lo = std::move(m);
      else
        hi_k = mid;
    }
    e = std::move(lo);
    kept = lo_k;
  }
  LY_CHECK(e.targets.size() <= size_t(max_target_tokens_), ErrorCode::kInternal,
           "{}:{}: {} target tokens, more than the bound of {}", path_, r.line, e.targets.size(),
           max_target_tokens_);
  TrainSample s;
  s.source = "qa";
  s.context = std::move(e.context);
  s.targets = std::move(e.targets);
  s.answers = {r.answer};
  s.description = fmt::format("qa {}:{}{}: context {} tokens, {} of {} documents, {} target tokens",
                              path_, r.line, r.id.empty() ? "" : " (" + r.id + ")",
                              s.context.size(), kept, n, s.targets.size());
  return s;
}

TrainSample QaDataset::sample(uint64_t index) const {
  const size_t n = records_.size();
  const size_t record = options_.shuffle ? epoch_pick(options_.seed, n, index) : size_t(index % n);
  TrainSample s = record_sample(record);
  s.index = index;
  return s;
}

std::string QaDataset::describe() const {
  return fmt::format("jsonl {}: {} records, max_len {}, EOS {}, {}", path_, records_.size(),
                     options_.max_len, options_.append_eos ? "appended" : "not appended",
                     options_.shuffle ? fmt::format("shuffled per epoch (seed {})", options_.seed)
                                      : std::string("in file order"));
}

std::unique_ptr<TrainData> make_train_data(const std::string& spec, const Tokenizer& tokenizer,
                                           const std::string& haystack_dir,
                                           const TrainDataOptions& options) {
  LY_CHECK(options.max_len >= 1, ErrorCode::kInvalidArgument,
           "training data '{}': max_len must be >= 1 (the model's context), got {}", spec,
           options.max_len);
  if (spec == "passkey") {
    PasskeyOptions o = options.passkey;
    o.max_len = options.max_len;
    o.seed = options.seed;
    Haystack hay =
        options.synthetic_haystack ? Haystack::synthetic() : Haystack::essays(haystack_dir);
    return std::make_unique<PasskeyDataset>(tokenizer, std::move(hay), o);
  }
  constexpr std::string_view kJsonl = "jsonl:";
  if (spec.starts_with(kJsonl) && spec.size() > kJsonl.size()) {
    QaOptions o = options.qa;
    o.max_len = options.max_len;
    o.seed = options.seed;
    return std::make_unique<QaDataset>(tokenizer, spec.substr(kJsonl.size()), o);
  }
  fail(ErrorCode::kInvalidArgument,
       "unknown training data '{}': expected 'passkey' or 'jsonl:PATH'", spec);
}

}  // namespace lychee::train
