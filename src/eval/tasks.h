// Retrieval tasks for comparing sparse-decoding policies: passkey, needle-in-a-haystack variants,
// variable tracking, common- and frequent-word extraction, each built to a target length in
// tokens of a given tokenizer and scored by substring match. See docs/eval.md for the prompt
// texts and the depth and length rules.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eval/haystack.h"

namespace lychee {

class Tokenizer;

enum class TaskKind {
  kPasskey,
  kNiahSingle,
  kNiahMultiKey,
  kNiahMultiValue,
  kNiahMultiQuery,
  kVariableTracking,
  kCommonWords,
  kFrequentWords,
};

// "passkey", "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe",
// "fwe".
std::string_view task_name(TaskKind kind);
// The inverse of task_name; Error(kInvalidArgument) listing the valid names.
TaskKind parse_task_name(std::string_view name);
// Every task, in the order above.
std::span<const TaskKind> all_tasks();

struct TaskSpec {
  TaskKind kind = TaskKind::kPasskey;
  int length_tokens = 0;  // target length of the user message, in tokens
  double depth = 0.5;     // in [0, 1]: where the needles go; cwe and fwe ignore it
  uint64_t seed = 0;
};

struct EvalSample {
  std::string task;
  int target_length = 0;
  double depth = 0;
  uint64_t seed = 0;
  std::string user_message;          // the context plus the question: the chat's user turn
  std::string answer_prefix;         // text that starts the assistant turn ("The pass key is")
  std::vector<std::string> answers;  // strings the output must contain
  int max_new_tokens = 32;
  int context_tokens = 0;  // measured token count of user_message
};

class TaskGenerator {
 public:
  // Keeps a reference to tokenizer: it must outlive the generator.
  TaskGenerator(const Tokenizer& tokenizer, Haystack haystack);

  // Deterministic in (spec, haystack): the same spec gives the same sample on every platform.
  // context_tokens lands within length_tolerance(spec.length_tokens) of spec.length_tokens.
  // Error(kInvalidArgument) for a depth outside [0, 1] or a length out of reach.
  EvalSample make(const TaskSpec& spec) const;

  const Haystack& haystack() const { return haystack_; }

 private:
  const Tokenizer& tokenizer_;
  Haystack haystack_;
};

// The fraction of sample.answers found in output, in [0, 1]: case-insensitive (ASCII) substring
// match of each answer. Error(kInvalidArgument) for a sample without answers.
double score_sample(const EvalSample& sample, const std::string& output);

// Where the passage text[at, at + len) lands among the tokens of text (encoded with add_bos and
// special tokens parsed, as prompts are): [first, end) = the token counts of the text up to the
// passage's start and up to its end. A token merged across the passage's start belongs to the
// text before it (callers that want it take first - 1).
struct TokenSpan {
  size_t first = 0, end = 0;
};
TokenSpan token_span(const Tokenizer& tok, const std::string& text, size_t at, size_t len, bool add_bos);

}  // namespace lychee
