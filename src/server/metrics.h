// Server metrics in Prometheus' text exposition format (GET /metrics). Thread-safe: HTTP
// threads count outcomes, the engine thread counts tokens, times and KV reads.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace lychee::server {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // "<name>_bucket{le=...} n" lines, then _sum and _count.
  void render(std::string& out, const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1], the last is +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// What the scheduler reports at render time.
struct SchedulerGauges {
  int running = 0;
  int waiting = 0;
  int64_t kv_pages_used = 0;       // reserved by admitted requests
  int64_t kv_pages_capacity = 0;   // the budget
  int page_tokens = 1;             // tokens per page
  int64_t prefix_cache_pages = 0;  // held by kept prompts (given back whenever a request needs it)
  int prefix_cache_entries = 0;
  bool healthy = true;             // the engine loop runs (false after a fault)
};

class Metrics {
 public:
  Metrics();
  // outcome: "ok", "cancelled", "rejected" (503), "invalid" (4xx), "error" (5xx).
  void count_request(const std::string& outcome);
  void add_tokens(int64_t prompt, int64_t generated);
  void observe_ttft(double seconds);  // from submission (queue included) to the first token
  void observe_tpot(double seconds);
  // At a request's first token: from submission to its (last) admission, and from there on.
  void observe_queue(double seconds);
  void observe_prefill(double seconds);
  // One engine step's wall time on the engine thread and the prompt tokens it prefilled; its kind
  // says what it ran: "prefill" (prompt chunks only), "decode" (decode or speculation only) or
  // "mixed" (both). GPU work a step enqueues without waiting on it counts in a later step.
  void add_step(const std::string& kind, double seconds, int64_t prefill_tokens);
  // KV bytes a finished request's decode steps read, and what full attention would have read.
  void add_kv_reads(const std::string& policy, uint64_t bytes, uint64_t dense_bytes);
  // A request that copied `tokens` prompt tokens from the prefix cache instead of prefilling them.
  void add_prefix_hit(int64_t tokens);
  std::string render(const SchedulerGauges& g) const;
  uint64_t requests(const std::string& outcome) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  uint64_t prefix_hits_ = 0, prefix_tokens_ = 0;
  Histogram ttft_, tpot_, queue_, prefill_;
  struct Steps {
    uint64_t n = 0;
    double seconds = 0.0;
    uint64_t prefill_tokens = 0;
  };
  std::map<std::string, Steps> steps_;  // by kind: prefill, decode, mixed
  struct KvReads {
    uint64_t bytes = 0, dense_bytes = 0;
  };
  std::map<std::string, KvReads> kv_reads_;
};

}  // namespace lychee::server
