// Internal to src/eval: one builder per task, called by TaskGenerator::make after it validated
// the spec and filled the sample's identity fields (task, target_length, depth, seed).
#pragma once

#include "eval/haystack.h"
#include "eval/rng.h"
#include "eval/tasks.h"

namespace lychee {

struct TaskContext {
  const Tokenizer& tokenizer;
  const Haystack& haystack;
  const TaskSpec& spec;
};

// Each sets user_message, answer_prefix, answers, max_new_tokens and context_tokens.
void build_passkey(const TaskContext& ctx, SampleRng& rng, EvalSample& sample);
void build_niah(const TaskContext& ctx, SampleRng& rng, EvalSample& sample);  // the four niah_*
void build_variable_tracking(const TaskContext& ctx, SampleRng& rng, EvalSample& sample);
void build_common_words(const TaskContext& ctx, SampleRng& rng, EvalSample& sample);
void build_frequent_words(const TaskContext& ctx, SampleRng& rng, EvalSample& sample);

}  // namespace lychee
