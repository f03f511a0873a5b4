#include "server/metrics.h"

#include <fmt/format.h>

namespace lychee::server {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28}),
      queue_({0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}),
      prefill_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}) {
  for (const char* o : {"ok", "cancelled", "rejected", "invalid", "error"}) requests_[o] = 0;
  for (const char* k : {"prefill", "decode", "mixed"}) steps_[k] = Steps{};
}

void Metrics::count_request(const std::string& outcome) {
  std::lock_guard lock(mu_);
  ++requests_[outcome];
}

void Metrics::add_tokens(int64_t prompt, int64_t generated) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += uint64_t(prompt);
  generated_tokens_ += uint64_t(generated);
}

void Metrics::observe_ttft(double s) {
  std::lock_guard lock(mu_);
  ttft_.observe(s);
}

void Metrics::observe_tpot(double s) {
  std::lock_guard lock(mu_);
  tpot_.observe(s);
}

void Metrics::observe_queue(double s) {
  std::lock_guard lock(mu_);
  queue_.observe(s);
}

void Metrics::observe_prefill(double s) {
  std::lock_guard lock(mu_);
  prefill_.observe(s);
}

void Metrics::add_step(const std::string& kind, double seconds, int64_t prefill_tokens) {
  std::lock_guard lock(mu_);
  Steps& st = steps_[kind];
  ++st.n;
  st.seconds += seconds;
  st.prefill_tokens += uint64_t(prefill_tokens);
}

void Metrics::add_kv_reads(const std::string& policy, uint64_t bytes, uint64_t dense_bytes) {
  std::lock_guard lock(mu_);
  kv_reads_[policy].bytes += bytes;
  kv_reads_[policy].dense_bytes += dense_bytes;
}

uint64_t Metrics::requests(const std::string& outcome) const {
  std::lock_guard lock(mu_);
  auto it = requests_.find(outcome);
  return it == requests_.end() ? 0 : it->second;
}

void Metrics::add_prefix_hit(int64_t tokens) {
  std::lock_guard lock(mu_);
  ++prefix_hits_;
  prefix_tokens_ += uint64_t(tokens);
}

std::string Metrics::render(const SchedulerGauges& g) const {
  std::lock_guard lock(mu_);
  std::string out;
  out += "# HELP lychee_requests_total Finished requests by outcome.\n# TYPE lychee_requests_total counter\n";
  for (const auto& [outcome, n] : requests_) out += fmt::format("lychee_requests_total{{outcome=\"{}\"}} {}\n", outcome, n);
  out += "# HELP lychee_prompt_tokens_total Prompt tokens prefilled.\n# TYPE lychee_prompt_tokens_total counter\n";
  out += fmt::format("lychee_prompt_tokens_total {}\n", prompt_tokens_);
  out += "# HELP lychee_generated_tokens_total Tokens generated.\n# TYPE lychee_generated_tokens_total counter\n";
  out += fmt::format("lychee_generated_tokens_total {}\n", generated_tokens_);
  out += "# HELP lychee_time_to_first_token_seconds From submission (the queue included) to the first generated token.\n";
  out += "# TYPE lychee_time_to_first_token_seconds histogram\n";
  ttft_.render(out, "lychee_time_to_first_token_seconds");
  out += "# HELP lychee_time_per_output_token_seconds Between generated tokens of a request.\n";
  out += "# TYPE lychee_time_per_output_token_seconds histogram\n";
  tpot_.render(out, "lychee_time_per_output_token_seconds");
  out += "# HELP lychee_request_queue_seconds From submission to admission (a running slot and KV pages).\n";
  out += "# TYPE lychee_request_queue_seconds histogram\n";
  queue_.render(out, "lychee_request_queue_seconds");
  out += "# HELP lychee_request_prefill_seconds From admission to the first generated token (the prompt's prefill).\n";
  out += "# TYPE lychee_request_prefill_seconds histogram\n";
  prefill_.render(out, "lychee_request_prefill_seconds");
  out += "# HELP lychee_engine_steps_total Engine steps by what they ran (prefill: prompt chunks only; decode: decode "
         "steps only; mixed: both).\n# TYPE lychee_engine_steps_total counter\n";
  for (const auto& [kind, st] : steps_) out += fmt::format("lychee_engine_steps_total{{kind=\"{}\"}} {}\n", kind, st.n);
  out += "# HELP lychee_engine_step_seconds_total Wall time of engine steps on the engine thread, by kind.\n";
  out += "# TYPE lychee_engine_step_seconds_total counter\n";
  for (const auto& [kind, st] : steps_)
    out += fmt::format("lychee_engine_step_seconds_total{{kind=\"{}\"}} {}\n", kind, st.seconds);
  out += "# HELP lychee_engine_prefill_tokens_total Prompt tokens prefilled by engine steps, by kind.\n";
  out += "# TYPE lychee_engine_prefill_tokens_total counter\n";
  for (const auto& [kind, st] : steps_)
    out += fmt::format("lychee_engine_prefill_tokens_total{{kind=\"{}\"}} {}\n", kind, st.prefill_tokens);
  out += "# HELP lychee_running_requests Sequences in the running batch.\n# TYPE lychee_running_requests gauge\n";
  out += fmt::format("lychee_running_requests {}\n", g.running);
  out += "# HELP lychee_waiting_requests Requests queued for admission.\n# TYPE lychee_waiting_requests gauge\n";
  out += fmt::format("lychee_waiting_requests {}\n", g.waiting);
  const int64_t free_pages = g.kv_pages_capacity - g.kv_pages_used - g.prefix_cache_pages;
  out += "# HELP lychee_kv_pages_used KV pages reserved by admitted requests.\n# TYPE lychee_kv_pages_used gauge\n";
  out += fmt::format("lychee_kv_pages_used {}\n", g.kv_pages_used);
  out += "# HELP lychee_kv_pages_free KV pages neither reserved nor held by cached prompts.\n";
  out += "# TYPE lychee_kv_pages_free gauge\n";
  out += fmt::format("lychee_kv_pages_free {}\n", free_pages);
  out += "# HELP lychee_kv_pages_total The KV budget in pages (capped at the pool's).\n# TYPE lychee_kv_pages_total gauge\n";
  out += fmt::format("lychee_kv_pages_total {}\n", g.kv_pages_capacity);
  out += "# HELP lychee_kv_page_tokens Tokens per KV page.\n# TYPE lychee_kv_page_tokens gauge\n";
  out += fmt::format("lychee_kv_page_tokens {}\n", g.page_tokens);
  out += "# HELP lychee_kv_tokens_used KV capacity reserved by admitted requests, in tokens (pages x page tokens).\n";
  out += "# TYPE lychee_kv_tokens_used gauge\n";
  out += fmt::format("lychee_kv_tokens_used {}\n", g.kv_pages_used * g.page_tokens);
  out += "# HELP lychee_kv_tokens_free KV capacity not reserved, in tokens (pages x page tokens).\n";
  out += "# TYPE lychee_kv_tokens_free gauge\n";
  out += fmt::format("lychee_kv_tokens_free {}\n", free_pages * g.page_tokens);
  out += "# HELP lychee_engine_healthy 1 while the engine loop runs, 0 after a fault.\n# TYPE lychee_engine_healthy gauge\n";
  out += fmt::format("lychee_engine_healthy {}\n", g.healthy ? 1 : 0);
  out += "# HELP lychee_prefix_cache_hits_total Requests that reused a cached prompt prefix.\n";
  out += "# TYPE lychee_prefix_cache_hits_total counter\n";
  out += fmt::format("lychee_prefix_cache_hits_total {}\n", prefix_hits_);
  out += "# HELP lychee_prefix_cache_reused_tokens_total Prompt tokens copied from the prefix cache, not prefilled.\n";
  out += "# TYPE lychee_prefix_cache_reused_tokens_total counter\n";
  out += fmt::format("lychee_prefix_cache_reused_tokens_total {}\n", prefix_tokens_);
  out += "# HELP lychee_prefix_cache_tokens KV capacity held by cached prompts, in tokens (freed when requests need it).\n";
  out += "# TYPE lychee_prefix_cache_tokens gauge\n";
  out += fmt::format("lychee_prefix_cache_tokens {}\n", g.prefix_cache_pages * g.page_tokens);
  out += "# HELP lychee_prefix_cache_entries Cached prompts.\n# TYPE lychee_prefix_cache_entries gauge\n";
  out += fmt::format("lychee_prefix_cache_entries {}\n", g.prefix_cache_entries);
  // The by-policy families appear with their first sample: an empty family has no label names, and
  // a router that merges its replicas' metrics (sglang-router's /engine_metrics) refuses to merge
  // it with another replica's {policy=...} family.
  if (kv_reads_.empty()) return out;
  out += "# HELP lychee_kv_read_bytes_total KV bytes decode steps read (in the GPU pages' dtype: bf16, or FP8 codes and scales), by policy.\n";
  out += "# TYPE lychee_kv_read_bytes_total counter\n";
  for (const auto& [policy, r] : kv_reads_)
    out += fmt::format("lychee_kv_read_bytes_total{{policy=\"{}\"}} {}\n", policy, r.bytes);
  out += "# HELP lychee_kv_read_dense_bytes_total What full attention would have read, by policy.\n";
  out += "# TYPE lychee_kv_read_dense_bytes_total counter\n";
  for (const auto& [policy, r] : kv_reads_)
    out += fmt::format("lychee_kv_read_dense_bytes_total{{policy=\"{}\"}} {}\n", policy, r.dense_bytes);
  out += "# HELP lychee_kv_read_ratio KV bytes read relative to full attention, by policy.\n";
  out += "# TYPE lychee_kv_read_ratio gauge\n";
  for (const auto& [policy, r] : kv_reads_)
    out += fmt::format("lychee_kv_read_ratio{{policy=\"{}\"}} {}\n", policy,
                       r.dense_bytes > 0 ? double(r.bytes) / double(r.dense_bytes) : 1.0);
  return out;
}

}  // namespace lychee::server
