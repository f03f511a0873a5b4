// The haystack-free tasks: common-words extraction (cwe) over a numbered list of English words,
// and frequent-words extraction (fwe) over a text of made-up coded words with Zipf-like counts.
// The list or text itself fills the target length. Prompt texts are lychee's own.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "eval/length_fit.h"
#include "eval/task_builders.h"
#include "eval/words.h"

namespace lychee {
namespace {

constexpr size_t kCommonWords = 10;    // cwe: the words to find
constexpr size_t kFrequentWords = 3;   // fwe: the words to find
constexpr size_t kCodedVocab = 400;    // fwe: distinct coded words available
constexpr double kZipfExponent = 1.5;  // fwe: the word of rank k appears floor(C / k^1.5) times

// cwe: how often each common and each rare word appears. The common count grows with the
// length (3 at ~100 items, 30 from ~1200 on); rare words repeat when the vocabulary would run
// out, and common words stay at least twice as frequent as rare ones, plus one.
struct CwePlan {
  int common_count = 3;
  int rare_count = 1;
};

CwePlan plan_common_words(double n_items, size_t n_rare_words) {
  CwePlan plan;
  plan.common_count = int(std::clamp(std::lround(n_items / 40.0), 3L, 30L));
  plan.rare_count = std::clamp(plan.common_count / 4, 1, 3);
  const double rare_items = std::max(0.0, n_items - double(kCommonWords * plan.common_count));
  const double usable = 0.9 * double(n_rare_words);
  plan.rare_count = std::max(plan.rare_count, int(std::ceil(rare_items / usable)));
  plan.common_count = std::max(plan.common_count, 2 * plan.rare_count + 1);
  return plan;
}

std::string numbered_list(const std::vector<std::string_view>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += fmt::format("{}{}. {}", i ? "\n" : "", i + 1, items[i]);
  return out;
}

// Tokens per list item, measured on a 40-item list of the rare words.
double cwe_item_tokens(const Tokenizer& tokenizer, const std::vector<std::string_view>& rare) {
  std::vector<std::string_view> probe(rare.begin(),
                                      rare.begin() + std::min<size_t>(40, rare.size()));
  return std::max(1.0,
                  double(count_tokens(tokenizer, numbered_list(probe))) / double(probe.size()));
}

// fwe: the count of each rank for top count c, longest-first, all positive.
std::vector<int64_t> zipf_counts(int64_t c) {
  std::vector<int64_t> counts;
  for (size_t k = 1; k <= kCodedVocab; ++k) {
    const auto n = int64_t(std::floor(double(c) / std::pow(double(k), kZipfExponent)));
    if (n <= 0) break;
    counts.push_back(n);
  }
  return counts;
}

}  // namespace

void build_common_words(const TaskContext& ctx, SampleRng& rng, EvalSample& sample) {
  const auto vocab = list_words();
  std::vector<std::string_view> words;
  for (size_t i : rng.distinct(vocab.size(), vocab.size())) words.push_back(vocab[i]);
  const std::vector<std::string_view> common(words.begin(), words.begin() + kCommonWords);
  const std::vector<std::string_view> rare(words.begin() + kCommonWords, words.end());
  const std::string intro =
      "Below is a numbered list of words. Some words appear in the list many times, and other "
      "words appear only a few times.";
  const std::string question =
      "Which 10 words appear most often in the list above? Answer with the 10 words.";
  const double item_tokens = cwe_item_tokens(ctx.tokenizer, rare);
  const int overhead = count_tokens(ctx.tokenizer, intro + "\n\n\n\n" + question);
  const CwePlan plan =
      plan_common_words(double(ctx.spec.length_tokens - overhead) / item_tokens, rare.size());
  const uint64_t shuffle_seed = rng.next();
  auto build = [&](int64_t n_rare) {
    std::vector<std::string_view> items;
    for (std::string_view w : common) items.insert(items.end(), size_t(plan.common_count), w);
    for (int64_t i = 0; i < n_rare; ++i)
      items.insert(items.end(), size_t(plan.rare_count), rare[i]);
    SampleRng order(mix_seed(shuffle_seed, uint64_t(n_rare)));
    order.shuffle(items);
    return intro + "\n\n" + numbered_list(items) + "\n\n" + question;
  };
  FittedText fit = fit_to_length(ctx.tokenizer, ctx.spec.length_tokens, 0, int64_t(rare.size()),
                                 1.0 / (item_tokens * plan.rare_count), build, sample.task);
  sample.user_message = std::move(fit.text);
  sample.context_tokens = fit.tokens;
  sample.answer_prefix = "The 10 words that appear most often are:";
  sample.answers.assign(common.begin(), common.end());
  sample.max_new_tokens = 96;
}

void build_frequent_words(const TaskContext& ctx, SampleRng& rng, EvalSample& sample) {
  std::vector<std::string> coded;
  while (coded.size() < kCodedVocab) {
    std::string w = coded_word(rng);
    if (std::find(coded.begin(), coded.end(), w) == coded.end()) coded.push_back(std::move(w));
  }
  const std::string intro =
      "Below is a text written in a secret code. It is made of coded words that are not real "
      "English words, and some coded words appear much more often than others.";
  const std::string question =
      "Which 3 coded words appear most often in the text above? Answer with the 3 coded words.";
  const uint64_t shuffle_seed = rng.next();
  auto build = [&](int64_t top_count) {
    const std::vector<int64_t> counts = zipf_counts(top_count);
    std::vector<std::string_view> text;
    for (size_t k = 0; k < counts.size(); ++k) text.insert(text.end(), size_t(counts[k]), coded[k]);
    SampleRng order(mix_seed(shuffle_seed, uint64_t(top_count)));
    order.shuffle(text);
    std::string out = intro + "\n\n";
    for (size_t i = 0; i < text.size(); ++i) {
      if (i) out += ' ';
      out += text[i];
    }
    return out + "\n\n" + question;
  };
  // 24 is the smallest top count whose first four ranks have distinct counts (24, 8, 4, 3).
  const int64_t n_min = 24;
  const int64_t n_max = 8 * int64_t(ctx.spec.length_tokens) + 64;
  FittedText fit = fit_to_length(ctx.tokenizer, ctx.spec.length_tokens, n_min, n_max,
                                 /*top count per token*/ 0.12, build, sample.task);
  const std::vector<int64_t> counts = zipf_counts(fit.n);
  LY_ASSERT(counts.size() > kFrequentWords && counts[kFrequentWords - 1] > counts[kFrequentWords]);
  sample.user_message = std::move(fit.text);
  sample.context_tokens = fit.tokens;
  sample.answer_prefix = "The 3 most frequent coded words are:";
  sample.answers.assign(coded.begin(), coded.begin() + kFrequentWords);
  sample.max_new_tokens = 40;
}

}  // namespace lychee
