// Results of a retrieval evaluation: one EvalRecord per (sample, policy) run, written out as JSON
// (every record plus the aggregates) and as Markdown tables (accuracy per task x length x policy,
// an average over tasks, and KV bytes read per decode step against dense attention).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lychee {

struct EvalRecord {
  std::string task;  // task_name(): "passkey", "niah_single", ...
  int length = 0;    // the target length of the sample, in tokens
  double depth = 0;
  uint64_t seed = 0;
  std::string policy;           // "full", "lychee", "tidal", "quest", "duo"
  std::string policy_label;     // policy plus its settings: "lychee budget=256 block=64"
  int budget = 0;               // tokens read per head and step; 0 for full attention
  double score = 0;             // score_sample(), in [0, 1]
  uint64_t kv_bytes_read = 0;   // K and V bytes the policy read, summed over decode steps
  uint64_t kv_bytes_dense = 0;  // what full attention would have read over the same steps
  int decode_steps = 0;
  // eval --speculate: the policy drafted, Full verified (runtime/speculative.h); the output is
  // Full's. Negative when not speculating.
  int64_t drafted = -1, accepted = -1;
  int prompt_tokens = 0;  // the whole rendered chat prompt, in tokens
  std::string output;     // the generated text
  // eval --coverage (CPU): full attention's probability mass on the tokens read, mean over decode
  // steps, layers and query heads, and the most any selection of as many tokens holds
  // (eval/coverage.h); per layer too. Negative when not measured.
  double coverage = -1, coverage_best = -1;
  std::vector<double> coverage_by_layer;
  // Needle tasks with --coverage: the share of full attention's mass on the needle's tokens that
  // the policy read (eval/coverage.h); negative when not measured.
  double needle_recall = -1;
};

// Mean score of one (task, length, policy_label) group.
struct AccuracyCell {
  std::string task;
  int length = 0;
  std::string policy_label;
  int n_samples = 0;
  double mean_score = 0;  // in [0, 1]
};

// The average over tasks for one (length, policy_label): each task's mean weighs the same.
struct AverageCell {
  int length = 0;
  std::string policy_label;
  int n_tasks = 0;
  int n_samples = 0;
  double mean_score = 0;  // in [0, 1]
};

// KV traffic of one (policy_label, length) group; records with no decode step are left out.
struct KvCell {
  std::string policy_label;
  int length = 0;
  int n_samples = 0;
  double bytes_per_step = 0;        // mean over records of kv_bytes_read / decode_steps
  double dense_bytes_per_step = 0;  // mean over records of kv_bytes_dense / decode_steps
  double ratio = 0;                 // bytes_per_step / dense_bytes_per_step (0 when dense is 0)
};

// Mass read of one (policy_label, length) group, over the records that measured it.
struct CoverageCell {
  std::string policy_label;
  int length = 0;
  int n_samples = 0;
  double covered = 0;  // mean of coverage
  double best = 0;     // mean of coverage_best
  int n_needle = 0;    // records with a needle recall
  double needle_recall = 0;  // mean of needle_recall over those
};

// Groups are ordered: tasks as in all_tasks() (unknown names after, by first appearance),
// lengths ascending, policy labels by first appearance.
std::vector<AccuracyCell> summarize_accuracy(const std::vector<EvalRecord>& records);
std::vector<AverageCell> summarize_average(const std::vector<EvalRecord>& records);
std::vector<KvCell> summarize_kv(const std::vector<EvalRecord>& records);
std::vector<CoverageCell> summarize_coverage(const std::vector<EvalRecord>& records);

nlohmann::json record_to_json(const EvalRecord& record);
// Error(kInvalidFile) naming the record index and field when one is missing or mistyped.
EvalRecord record_from_json(const nlohmann::json& j, size_t index);

// {"run": run_info, "records": [...], "summary": {"accuracy": [...], "average": [...],
// "kv": [...]}}. run_info holds what reproduces the run: command, model, commit, date, ...
nlohmann::json records_to_json(const std::vector<EvalRecord>& records,
                               const nlohmann::json& run_info);
// The "records" array of records_to_json's output read back.
std::vector<EvalRecord> records_from_json(const nlohmann::json& results);

// One accuracy table per task (rows = policy_label, columns = lengths, cell = "accuracy% (n)"),
// an "Average" table, then KV bytes read per decode step and the ratio to dense.
std::string records_to_markdown(const std::vector<EvalRecord>& records);

}  // namespace lychee
