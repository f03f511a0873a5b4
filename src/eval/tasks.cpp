// Task names, validation and dispatch, and scoring (see tasks.h).
#include "eval/tasks.h"

#include <cmath>

#include "core/error.h"
#include "eval/task_builders.h"
#include "model/tokenizer.h"

namespace lychee {
namespace {

constexpr TaskKind kAllTasks[] = {
    TaskKind::kPasskey,        TaskKind::kNiahSingle,     TaskKind::kNiahMultiKey,
    TaskKind::kNiahMultiValue, TaskKind::kNiahMultiQuery, TaskKind::kVariableTracking,
    TaskKind::kCommonWords,    TaskKind::kFrequentWords,
};

// The longest target accepted: far beyond any model lychee runs, it only bounds the search.
constexpr int kMaxLengthTokens = 1 << 20;

std::string lower_ascii(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return out;
}

}  // namespace

std::string_view task_name(TaskKind kind) {
  switch (kind) {
    case TaskKind::kPasskey: return "passkey";
    case TaskKind::kNiahSingle: return "niah_single";
    case TaskKind::kNiahMultiKey: return "niah_multikey";
    case TaskKind::kNiahMultiValue: return "niah_multivalue";
    case TaskKind::kNiahMultiQuery: return "niah_multiquery";
    case TaskKind::kVariableTracking: return "vt";
    case TaskKind::kCommonWords: return "cwe";
    case TaskKind::kFrequentWords: return "fwe";
  }
  fail(ErrorCode::kInternal, "task_name: unknown TaskKind {}", int(kind));
}

std::span<const TaskKind> all_tasks() { return kAllTasks; }

TaskKind parse_task_name(std::string_view name) {
  std::string valid;
  for (TaskKind kind : kAllTasks) {
    if (task_name(kind) == name) return kind;
    valid += (valid.empty() ? "" : ", ") + std::string(task_name(kind));
  }
  fail(ErrorCode::kInvalidArgument, "unknown task '{}'; valid tasks: {}", name, valid);
}

TaskGenerator::TaskGenerator(const Tokenizer& tokenizer, Haystack haystack)
    : tokenizer_(tokenizer), haystack_(std::move(haystack)) {}

EvalSample TaskGenerator::make(const TaskSpec& spec) const {
  const std::string_view name = task_name(spec.kind);
  LY_CHECK(spec.length_tokens > 0 && spec.length_tokens <= kMaxLengthTokens,
           ErrorCode::kInvalidArgument, "task {}: length_tokens must be in [1, {}], got {}", name,
           kMaxLengthTokens, spec.length_tokens);
  LY_CHECK(std::isfinite(spec.depth) && spec.depth >= 0.0 && spec.depth <= 1.0,
           ErrorCode::kInvalidArgument, "task {}: depth must be in [0, 1], got {}", name,
           spec.depth);
  EvalSample sample;
  sample.task = std::string(name);
  sample.target_length = spec.length_tokens;
  sample.depth = spec.depth;
  sample.seed = spec.seed;
  // One stream per task, so one seed gives unrelated samples across tasks.
  SampleRng rng(mix_seed(spec.seed, uint64_t(spec.kind)));
  const TaskContext ctx{tokenizer_, haystack_, spec};
  switch (spec.kind) {
    case TaskKind::kPasskey: build_passkey(ctx, rng, sample); break;
    case TaskKind::kNiahSingle:
    case TaskKind::kNiahMultiKey:
    case TaskKind::kNiahMultiValue:
    case TaskKind::kNiahMultiQuery: build_niah(ctx, rng, sample); break;
    case TaskKind::kVariableTracking: build_variable_tracking(ctx, rng, sample); break;
    case TaskKind::kCommonWords: build_common_words(ctx, rng, sample); break;
    case TaskKind::kFrequentWords: build_frequent_words(ctx, rng, sample); break;
  }
  return sample;
}

TokenSpan token_span(const Tokenizer& tok, const std::string& text, size_t at, size_t len, bool add_bos) {
  return {tok.encode(text.substr(0, at), add_bos, true).size(), tok.encode(text.substr(0, at + len), add_bos, true).size()};
}

double score_sample(const EvalSample& sample, const std::string& output) {
  LY_CHECK(!sample.answers.empty(), ErrorCode::kInvalidArgument,
           "score_sample: sample of task '{}' (seed {}) has no answers", sample.task, sample.seed);
  const std::string haystack = lower_ascii(output);
  size_t found = 0;
  for (const std::string& answer : sample.answers)
    if (haystack.find(lower_ascii(answer)) != std::string::npos) ++found;
  return double(found) / double(sample.answers.size());
}

}  // namespace lychee
