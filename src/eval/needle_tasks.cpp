// The haystack tasks: passkey, the four needle-in-a-haystack variants and variable tracking.
// Each hides needle sentences in haystack text between an intro and a question, and fits the
// amount of haystack (in words) to the target length. Prompt texts are lychee's own.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "eval/length_fit.h"
#include "eval/task_builders.h"
#include "eval/words.h"

namespace lychee {
namespace {

constexpr size_t kNeedles =
    4;                      // the multi-needle tasks: keys, values, or queried keys + distractors
constexpr int kVtHops = 4;  // variable tracking: 1 value assignment, then 4 copies

struct NeedlePrompt {
  std::string intro;
  std::vector<std::string> needles;  // placed in this order at spread_depths(depth, n)
  std::string question;
};

// Fits the haystack around the needles to the target length and fills user_message and
// context_tokens. The haystack starts at a sentence chosen by the seed, so samples differ in
// their text as well as their needles.
void fill_haystack_sample(const TaskContext& ctx, SampleRng& rng, const NeedlePrompt& prompt,
                          EvalSample& sample) {
  const Haystack& hay = ctx.haystack;
  const size_t first = hay.sentence_start(rng.below(hay.n_sentences()));
  const std::vector<double> depths = spread_depths(ctx.spec.depth, prompt.needles.size());
  std::vector<Insertion> inserts;
  for (size_t i = 0; i < prompt.needles.size(); ++i)
    inserts.push_back({depths[i], prompt.needles[i]});
  auto build = [&](int64_t n_words) {
    return prompt.intro + "\n\n" + hay.weave(first, size_t(n_words), inserts) + "\n\n" +
           prompt.question;
  };
  const int64_t n_max = 8 * int64_t(ctx.spec.length_tokens) + 64;
  FittedText fit = fit_to_length(ctx.tokenizer, ctx.spec.length_tokens, 0, n_max,
                                 /*words per token*/ 0.7, build, sample.task);
  sample.user_message = std::move(fit.text);
  sample.context_tokens = fit.tokens;
}

// n distinct words of key_words(), in the order drawn.
std::vector<std::string> pick_keys(SampleRng& rng, size_t n) {
  const auto words = key_words();
  std::vector<std::string> keys;
  for (size_t i : rng.distinct(n, words.size())) keys.emplace_back(words[i]);
  return keys;
}

// n distinct numbers of n_digits digits.
std::vector<std::string> pick_numbers(SampleRng& rng, size_t n, int n_digits) {
  std::vector<std::string> out;
  while (out.size() < n) {
    std::string v = random_number(rng, n_digits);
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(std::move(v));
  }
  return out;
}

std::string magic_needle(std::string_view key, std::string_view value) {
  return fmt::format("A special magic number for {} is {}.", key, value);
}

constexpr std::string_view kOneNumberIntro =
    "Below is a long text. Hidden somewhere inside it is a special magic number. Read the text "
    "carefully and remember the number.";
constexpr std::string_view kManyNumbersIntro =
    "Below is a long text. Hidden inside it are several special magic numbers, each one for a "
    "different word. Read the text carefully and remember them.";
constexpr std::string_view kSameKeyIntro =
    "Below is a long text. Hidden inside it are several special magic numbers. Read the text "
    "carefully and remember all of them.";

// niah_single and niah_multikey: one key asked; multikey adds 3 needles of other keys.
NeedlePrompt one_key_prompt(SampleRng& rng, bool distractors, EvalSample& sample) {
  const size_t n = distractors ? kNeedles : 1;
  const std::vector<std::string> keys = pick_keys(rng, n);
  const std::vector<std::string> values = pick_numbers(rng, n, 7);
  NeedlePrompt p;
  p.intro = std::string(distractors ? kManyNumbersIntro : kOneNumberIntro);
  for (size_t i = 0; i < n; ++i) p.needles.push_back(magic_needle(keys[i], values[i]));
  const size_t asked = rng.below(n);
  p.question = fmt::format(
      "What is the special magic number for {} in the text above? Answer with the seven-digit "
      "number.",
      keys[asked]);
  sample.answer_prefix = fmt::format("The special magic number for {} is", keys[asked]);
  sample.answers = {values[asked]};
  sample.max_new_tokens = 24;
  return p;
}

NeedlePrompt multivalue_prompt(SampleRng& rng, EvalSample& sample) {
  const std::string key = pick_keys(rng, 1)[0];
  const std::vector<std::string> values = pick_numbers(rng, kNeedles, 7);
  NeedlePrompt p;
  p.intro = std::string(kSameKeyIntro);
  for (const std::string& v : values) p.needles.push_back(magic_needle(key, v));
  p.question = fmt::format(
      "What are all the special magic numbers for {} in the text above? List every one of them.",
      key);
  sample.answer_prefix = fmt::format("The special magic numbers for {} are", key);
  sample.answers = values;
  sample.max_new_tokens = 64;
  return p;
}

NeedlePrompt multiquery_prompt(SampleRng& rng, EvalSample& sample) {
  const std::vector<std::string> keys = pick_keys(rng, kNeedles);
  const std::vector<std::string> values = pick_numbers(rng, kNeedles, 7);
  NeedlePrompt p;
  p.intro = std::string(kManyNumbersIntro);
  for (size_t i = 0; i < kNeedles; ++i) p.needles.push_back(magic_needle(keys[i], values[i]));
  const std::vector<size_t> asked = rng.distinct(2, kNeedles);
  const std::string& k0 = keys[asked[0]];
  const std::string& k1 = keys[asked[1]];
  p.question = fmt::format(
      "What are the special magic numbers for {} and for {} in the text above? Give both numbers.",
      k0, k1);
  sample.answer_prefix = fmt::format("The special magic numbers for {} and {} are", k0, k1);
  sample.answers = {values[asked[0]], values[asked[1]]};
  sample.max_new_tokens = 48;
  return p;
}

}  // namespace

void build_passkey(const TaskContext& ctx, SampleRng& rng, EvalSample& sample) {
  const std::string key = random_number(rng, 5);
  NeedlePrompt p;
  p.intro =
      "Below is a long text. Hidden somewhere inside it is a pass key, a five-digit number. Read "
      "the text carefully and remember the pass key.";
  p.needles = {fmt::format("The pass key is {}. Keep it in mind: {} is the pass key.", key, key)};
  p.question = "What is the pass key hidden in the text above? Answer with the five-digit number.";
  sample.answer_prefix = "The pass key is";
  sample.answers = {key};
  sample.max_new_tokens = 16;
  fill_haystack_sample(ctx, rng, p, sample);
}

void build_niah(const TaskContext& ctx, SampleRng& rng, EvalSample& sample) {
  NeedlePrompt p;
  switch (ctx.spec.kind) {
    case TaskKind::kNiahSingle: p = one_key_prompt(rng, false, sample); break;
    case TaskKind::kNiahMultiKey: p = one_key_prompt(rng, true, sample); break;
    case TaskKind::kNiahMultiValue: p = multivalue_prompt(rng, sample); break;
    case TaskKind::kNiahMultiQuery: p = multiquery_prompt(rng, sample); break;
    default: fail(ErrorCode::kInternal, "build_niah: task {} is not a niah task", sample.task);
  }
  fill_haystack_sample(ctx, rng, p, sample);
}

void build_variable_tracking(const TaskContext& ctx, SampleRng& rng, EvalSample& sample) {
  std::vector<std::string> names;
  while (names.size() < size_t(kVtHops) + 1) {
    std::string v = variable_name(rng);
    if (std::find(names.begin(), names.end(), v) == names.end()) names.push_back(std::move(v));
  }
  const std::string value = random_number(rng, 5);
  NeedlePrompt p;
  // No example assignment in the intro: a small model copies it into its answer.
  p.intro =
      "Below is a long text. Hidden inside it are variable assignments: some give a variable a "
      "number, and others give a variable the value of another variable. Read the text carefully "
      "and follow every assignment.";
  p.needles.push_back(fmt::format("VAR {} = {}.", names[0], value));
  for (size_t i = 1; i < names.size(); ++i)
    p.needles.push_back(fmt::format("VAR {} = VAR {}.", names[i], names[i - 1]));
  p.question = fmt::format(
      "Which variables are assigned the value {} in the text above, directly or through other "
      "variables? List all of them.",
      value);
  sample.answer_prefix = fmt::format("The variables assigned the value {} are:", value);
  sample.answers = names;
  sample.max_new_tokens = 64;
  fill_haystack_sample(ctx, rng, p, sample);
}

}  // namespace lychee
