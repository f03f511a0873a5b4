// The retrieval evaluation: generates samples, prefills each prompt once (densely, as every
// policy does), then decodes it under every policy from the same prefilled cache and scores the
// answers, counting the KV bytes each policy read.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "attention/policies.h"
#include "eval/report.h"
#include "eval/tasks.h"
#include "runtime/engine.h"
#include "runtime/speculative.h"

namespace lychee {

struct EvalConfig {
  std::vector<TaskKind> tasks;
  std::vector<int> lengths;          // target lengths of the user message, in tokens
  std::vector<double> depths;        // needle depths (tasks without depth run once per length)
  int samples = 1;                   // samples per (task, length, depth)
  uint64_t seed = 0;
  std::vector<PolicyOptions> policies;
  bool synthetic_haystack = false;   // else the Paul Graham essays under models_dir()
  int correct_every = 0;             // cache correction (0 = off)
  bool coverage = false;             // measure the attention mass each policy reads (CPU only)
  // Self-speculative decoding with each policy as the draft (records get drafted / accepted; the
  // outputs are then Full's).
  SpeculateOptions speculate;
};

// A line of progress per sample (to stderr by the CLI).
using EvalProgress = std::function<void(const std::string& line)>;

std::vector<EvalRecord> run_eval(Engine& engine, const EvalConfig& config, const EvalProgress& progress = {});

// The budget a policy's label reports (0 for full attention).
int policy_budget(const PolicyOptions& o);

}  // namespace lychee
