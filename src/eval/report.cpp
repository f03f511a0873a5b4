// Aggregation and the JSON and Markdown writers (see report.h).
#include "eval/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <tuple>

#include "core/error.h"
#include "eval/tasks.h"

namespace lychee {
namespace {

using nlohmann::json;

std::vector<std::string> task_order(const std::vector<EvalRecord>& records) {
  std::vector<std::string> order;
  for (TaskKind kind : all_tasks()) {
    const std::string name(task_name(kind));
    if (std::any_of(records.begin(), records.end(), [&](const auto& r) { return r.task == name; }))
      order.push_back(name);
  }
  for (const EvalRecord& r : records)
    if (std::find(order.begin(), order.end(), r.task) == order.end()) order.push_back(r.task);
  return order;
}

std::vector<int> length_order(const std::vector<EvalRecord>& records) {
  std::vector<int> lengths;
  for (const EvalRecord& r : records) lengths.push_back(r.length);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
}

std::vector<std::string> label_order(const std::vector<EvalRecord>& records) {
  std::vector<std::string> labels;
  for (const EvalRecord& r : records)
    if (std::find(labels.begin(), labels.end(), r.policy_label) == labels.end())
      labels.push_back(r.policy_label);
  return labels;
}

struct Mean {
  int n = 0;
  double total = 0;
  double value() const { return n > 0 ? total / n : 0.0; }
};

std::string format_bytes(double bytes) {
  if (bytes < 1024.0) return fmt::format("{:.0f} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  for (bytes /= 1024.0; bytes >= 1024.0 && u < 3; bytes /= 1024.0) ++u;
  return fmt::format("{:.2f} {}", bytes, units[u]);
}

// A Markdown table: the first column left-aligned, the others right-aligned.
std::string md_table(const std::vector<std::string>& header,
                     const std::vector<std::vector<std::string>>& rows) {
  std::string out = "|";
  for (const std::string& h : header) out += " " + h + " |";
  out += "\n|";
  for (size_t i = 0; i < header.size(); ++i) out += i == 0 ? "---|" : "---:|";
  out += "\n";
  for (const auto& row : rows) {
    out += "|";
    for (const std::string& cell : row) out += " " + cell + " |";
    out += "\n";
  }
  return out + "\n";
}

template <typename T>
T field(const json& j, const char* key, size_t index) {
  LY_CHECK(j.is_object() && j.contains(key), ErrorCode::kInvalidFile,
           "eval record {}: field '{}' is missing", index, key);
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    fail(ErrorCode::kInvalidFile, "eval record {}: field '{}' has the wrong type ({}): {}", index,
         key, j.at(key).type_name(), e.what());
  }
}

}  // namespace

std::vector<AccuracyCell> summarize_accuracy(const std::vector<EvalRecord>& records) {
  std::map<std::tuple<std::string, int, std::string>, Mean> groups;
  for (const EvalRecord& r : records) {
    Mean& m = groups[{r.task, r.length, r.policy_label}];
    ++m.n;
    m.total += r.score;
  }
  std::vector<AccuracyCell> cells;
  for (const std::string& task : task_order(records))
    for (const std::string& label : label_order(records))
      for (int length : length_order(records)) {
        const auto it = groups.find({task, length, label});
        if (it != groups.end())
          cells.push_back({task, length, label, it->second.n, it->second.value()});
      }
  return cells;
}

std::vector<AverageCell> summarize_average(const std::vector<EvalRecord>& records) {
  std::map<std::pair<int, std::string>, AverageCell> groups;
  for (const AccuracyCell& c : summarize_accuracy(records)) {
    AverageCell& a = groups[{c.length, c.policy_label}];
    a.length = c.length;
    a.policy_label = c.policy_label;
    ++a.n_tasks;
    a.n_samples += c.n_samples;
    a.mean_score += c.mean_score;  // a sum until divided below
  }
  std::vector<AverageCell> cells;
  for (const std::string& label : label_order(records))
    for (int length : length_order(records)) {
      const auto it = groups.find({length, label});
      if (it == groups.end()) continue;
      AverageCell a = it->second;
      a.mean_score /= a.n_tasks;
      cells.push_back(a);
    }
  return cells;
}

std::vector<KvCell> summarize_kv(const std::vector<EvalRecord>& records) {
  std::map<std::pair<std::string, int>, std::pair<Mean, Mean>> groups;  // (read, dense) per step
  for (const EvalRecord& r : records) {
    if (r.decode_steps <= 0) continue;
    auto& [read, dense] = groups[{r.policy_label, r.length}];
    ++read.n, ++dense.n;
    read.total += double(r.kv_bytes_read) / r.decode_steps;
    dense.total += double(r.kv_bytes_dense) / r.decode_steps;
  }
  std::vector<KvCell> cells;
  for (const std::string& label : label_order(records))
    for (int length : length_order(records)) {
      const auto it = groups.find({label, length});
      if (it == groups.end()) continue;
      const auto& [read, dense] = it->second;
      const double ratio = dense.value() > 0 ? read.value() / dense.value() : 0.0;
      cells.push_back({label, length, read.n, read.value(), dense.value(), ratio});
    }
  return cells;
}

std::vector<CoverageCell> summarize_coverage(const std::vector<EvalRecord>& records) {
  std::map<std::pair<std::string, int>, std::array<Mean, 3>> groups;  // covered, best, needle recall
  for (const EvalRecord& r : records) {
    if (r.coverage < 0) continue;
    auto& m = groups[{r.policy_label, r.length}];
    ++m[0].n, ++m[1].n;
    m[0].total += r.coverage;
    m[1].total += r.coverage_best;
    if (r.needle_recall >= 0) ++m[2].n, m[2].total += r.needle_recall;
  }
  std::vector<CoverageCell> cells;
  for (const std::string& label : label_order(records))
    for (int length : length_order(records)) {
      const auto it = groups.find({label, length});
      if (it == groups.end()) continue;
      const auto& m = it->second;
      cells.push_back({label, length, m[0].n, m[0].value(), m[1].value(), m[2].n, m[2].value()});
    }
  return cells;
}

json record_to_json(const EvalRecord& r) {
  json j{{"task", r.task},
         {"length", r.length},
         {"depth", r.depth},
         {"seed", r.seed},
         {"policy", r.policy},
         {"policy_label", r.policy_label},
         {"budget", r.budget},
         {"score", r.score},
         {"kv_bytes_read", r.kv_bytes_read},
         {"kv_bytes_dense", r.kv_bytes_dense},
         {"decode_steps", r.decode_steps},
         {"prompt_tokens", r.prompt_tokens},
         {"output", r.output}};
  if (r.coverage >= 0) {
    j["coverage"] = r.coverage;
    j["coverage_best"] = r.coverage_best;
    j["coverage_by_layer"] = r.coverage_by_layer;
  }
  if (r.needle_recall >= 0) j["needle_recall"] = r.needle_recall;
  if (r.drafted >= 0) {
    j["drafted"] = r.drafted;
    j["accepted"] = r.accepted;
  }
  return j;
}

EvalRecord record_from_json(const json& j, size_t index) {
  EvalRecord r;
  r.task = field<std::string>(j, "task", index);
  r.length = field<int>(j, "length", index);
  r.depth = field<double>(j, "depth", index);
  r.seed = field<uint64_t>(j, "seed", index);
  r.policy = field<std::string>(j, "policy", index);
  r.policy_label = field<std::string>(j, "policy_label", index);
  r.budget = field<int>(j, "budget", index);
  r.score = field<double>(j, "score", index);
  r.kv_bytes_read = field<uint64_t>(j, "kv_bytes_read", index);
  r.kv_bytes_dense = field<uint64_t>(j, "kv_bytes_dense", index);
  r.decode_steps = field<int>(j, "decode_steps", index);
  r.prompt_tokens = field<int>(j, "prompt_tokens", index);
  r.output = field<std::string>(j, "output", index);
  if (j.contains("drafted")) {  // written only by eval --speculate
    r.drafted = field<int64_t>(j, "drafted", index);
    r.accepted = field<int64_t>(j, "accepted", index);
  }
  if (j.contains("coverage")) {  // written only by eval --coverage
    r.coverage = field<double>(j, "coverage", index);
    r.coverage_best = field<double>(j, "coverage_best", index);
    r.coverage_by_layer = field<std::vector<double>>(j, "coverage_by_layer", index);
  }
  if (j.contains("needle_recall")) r.needle_recall = field<double>(j, "needle_recall", index);
  return r;
}

json records_to_json(const std::vector<EvalRecord>& records, const json& run_info) {
  json out{{"run", run_info}, {"records", json::array()}};
  for (const EvalRecord& r : records) out["records"].push_back(record_to_json(r));
  json accuracy = json::array(), average = json::array(), kv = json::array();
  for (const AccuracyCell& c : summarize_accuracy(records))
    accuracy.push_back({{"task", c.task},
                        {"length", c.length},
                        {"policy_label", c.policy_label},
                        {"n_samples", c.n_samples},
                        {"mean_score", c.mean_score}});
  for (const AverageCell& c : summarize_average(records))
    average.push_back({{"length", c.length},
                       {"policy_label", c.policy_label},
                       {"n_tasks", c.n_tasks},
                       {"n_samples", c.n_samples},
                       {"mean_score", c.mean_score}});
  for (const KvCell& c : summarize_kv(records))
    kv.push_back({{"policy_label", c.policy_label},
                  {"length", c.length},
                  {"n_samples", c.n_samples},
                  {"bytes_per_step", c.bytes_per_step},
                  {"dense_bytes_per_step", c.dense_bytes_per_step},
                  {"ratio", c.ratio}});
  out["summary"] = {{"accuracy", accuracy}, {"average", average}, {"kv", kv}};
  const std::vector<CoverageCell> coverage = summarize_coverage(records);
  if (!coverage.empty()) {
    out["summary"]["coverage"] = json::array();
    for (const CoverageCell& c : coverage)
      out["summary"]["coverage"].push_back({{"policy_label", c.policy_label},
                                            {"length", c.length},
                                            {"n_samples", c.n_samples},
                                            {"covered", c.covered},
                                            {"best", c.best},
                                            {"n_needle", c.n_needle},
                                            {"needle_recall", c.needle_recall}});
  }
  return out;
}

std::vector<EvalRecord> records_from_json(const json& results) {
  LY_CHECK(results.is_object() && results.contains("records") && results["records"].is_array(),
           ErrorCode::kInvalidFile, "eval results: no \"records\" array");
  std::vector<EvalRecord> records;
  for (size_t i = 0; i < results["records"].size(); ++i)
    records.push_back(record_from_json(results["records"][i], i));
  return records;
}

namespace {

std::vector<std::string> length_header(const std::vector<int>& lengths, const char* extra) {
  std::vector<std::string> header{"policy"};
  for (int length : lengths) header.push_back(std::to_string(length));
  if (extra != nullptr) header.push_back(extra);
  return header;
}

std::string accuracy_tables(const std::vector<EvalRecord>& records) {
  const std::vector<int> lengths = length_order(records);
  std::map<std::tuple<std::string, int, std::string>, AccuracyCell> cells;
  for (const AccuracyCell& c : summarize_accuracy(records))
    cells[{c.task, c.length, c.policy_label}] = c;
  std::string out;
  for (const std::string& task : task_order(records)) {
    std::vector<std::vector<std::string>> rows;
    for (const std::string& label : label_order(records)) {
      std::vector<std::string> row{label};
      for (int length : lengths) {
        const auto it = cells.find({task, length, label});
        row.push_back(it == cells.end() ? "-"
                                        : fmt::format("{:.1f} ({})", 100.0 * it->second.mean_score,
                                                      it->second.n_samples));
      }
      rows.push_back(std::move(row));
    }
    out += "## " + task + "\n\n" + md_table(length_header(lengths, nullptr), rows);
  }
  return out;
}

std::string average_table(const std::vector<EvalRecord>& records) {
  const std::vector<int> lengths = length_order(records);
  std::map<std::pair<int, std::string>, AverageCell> cells;
  for (const AverageCell& c : summarize_average(records)) cells[{c.length, c.policy_label}] = c;
  std::vector<std::vector<std::string>> rows;
  for (const std::string& label : label_order(records)) {
    std::vector<std::string> row{label};
    Mean over_lengths;
    for (int length : lengths) {
      const auto it = cells.find({length, label});
      if (it == cells.end()) {
        row.push_back("-");
        continue;
      }
      row.push_back(
          fmt::format("{:.1f} ({})", 100.0 * it->second.mean_score, it->second.n_samples));
      ++over_lengths.n;
      over_lengths.total += it->second.mean_score;
    }
    row.push_back(fmt::format("{:.1f}", 100.0 * over_lengths.value()));
    rows.push_back(std::move(row));
  }
  return "## Average\n\nThe mean over tasks of each task's accuracy (every task weighs the same); "
         "(n) counts samples over all tasks; \"all\" is the mean over the lengths.\n\n" +
         md_table(length_header(lengths, "all"), rows);
}

std::string kv_tables(const std::vector<EvalRecord>& records) {
  const std::vector<int> lengths = length_order(records);
  std::map<std::pair<std::string, int>, KvCell> cells;
  for (const KvCell& c : summarize_kv(records)) cells[{c.policy_label, c.length}] = c;
  std::vector<std::vector<std::string>> bytes_rows, ratio_rows;
  for (const std::string& label : label_order(records)) {
    std::vector<std::string> bytes_row{label}, ratio_row{label};
    for (int length : lengths) {
      const auto it = cells.find({label, length});
      const bool has = it != cells.end();
      bytes_row.push_back(has ? format_bytes(it->second.bytes_per_step) : "-");
      ratio_row.push_back(has ? fmt::format("{:.3f}", it->second.ratio) : "-");
    }
    bytes_rows.push_back(std::move(bytes_row));
    ratio_rows.push_back(std::move(ratio_row));
  }
  return "# KV cache reads\n\n## KV bytes read per decode step\n\nMean over samples of K and V "
         "bytes read per decode step, all layers and heads.\n\n" +
         md_table(length_header(lengths, nullptr), bytes_rows) +
         "## Bytes read / dense\n\nMean bytes read per step over the mean bytes full attention "
         "reads over the same steps.\n\n" +
         md_table(length_header(lengths, nullptr), ratio_rows);
}

std::string coverage_table(const std::vector<EvalRecord>& records) {
  const std::vector<CoverageCell> all = summarize_coverage(records);
  if (all.empty()) return "";
  const std::vector<int> lengths = length_order(records);
  std::map<std::pair<std::string, int>, CoverageCell> cells;
  for (const CoverageCell& c : all) cells[{c.policy_label, c.length}] = c;
  std::vector<std::vector<std::string>> rows;
  for (const std::string& label : label_order(records)) {
    std::vector<std::string> row{label};
    for (int length : lengths) {
      const auto it = cells.find({label, length});
      if (it == cells.end()) {
        row.push_back("-");
        continue;
      }
      std::string cell = fmt::format("{:.3f} / {:.3f}", it->second.covered, it->second.best);
      if (it->second.n_needle > 0) cell += fmt::format("; needle {:.3f}", it->second.needle_recall);
      row.push_back(cell);
    }
    rows.push_back(std::move(row));
  }
  return "## Attention mass read\n\nMean over samples, decode steps, layers and query heads of full "
         "attention's probability mass on the tokens the policy read / the most mass any as many "
         "tokens hold; \"needle\": on needle tasks, the share of full attention's mass on the needle's "
         "tokens that the policy read (eval/coverage.h).\n\n" +
         md_table(length_header(lengths, nullptr), rows);
}

}  // namespace

std::string records_to_markdown(const std::vector<EvalRecord>& records) {
  if (records.empty()) return "# Retrieval accuracy\n\nNo records.\n";
  return "# Retrieval accuracy\n\nEach cell: the mean score in % (the fraction of expected "
         "answers found in the output, case-insensitive) and, in brackets, the number of "
         "samples. Columns are prompt lengths in tokens.\n\n" +
         accuracy_tables(records) + average_table(records) + kv_tables(records) + coverage_table(records);
}

}  // namespace lychee
