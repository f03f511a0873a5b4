// The engine thread and its handoff with the HTTP threads.
//
// One thread owns the Engine and every Session. HTTP threads parse and validate a request into
// GenerationParams (native, tokenized), wrap it in a Request and submit it; they then wait on the
// Request's condition variable for text and the finish. Nothing else crosses between the threads.
//
// Continuous batching at the session level: every step admits waiting requests (a KV budget in
// tokens: the sum of the admitted requests' prompt + max_tokens must fit the pool), prefills
// prompt chunks within a budget of prefill_chunk token-equivalents (cut across steps; a prompt
// token at position P weighs 1 + P / K, K the context length at which a token's attention work
// equals its weights' work, so the chunks of a long prompt shrink as it grows and the running
// requests' step time stays bounded; while requests decode, one prompt's chunk per step, the
// oldest first; with no request decoding, four times the budget over several prompts), decodes
// one token for each running request (one batched step: Session::decode_batch), and retires
// finished and cancelled requests, releasing their capacity in the same step.
// Prefix reuse: a finished request's session is kept, truncated to its prompt, in a PrefixCache
// (its pages counted in the KV budget, given back least recently used first when admission
// needs room); a later prompt starting with a kept prompt copies those tokens instead of
// prefilling them (usage.prompt_tokens_details.cached_tokens says how many). Entries are shared
// only among requests of the same cache_salt.
// Capacity is counted in the KV cache's pages (Engine::kv_page_tokens): a request reserves the
// pages of prompt + max_tokens - 1 tokens, and the budget is capped at the pages the pool holds,
// so admitted requests cannot run the pool dry. Should a step still find no free page, the
// prefix cache is emptied and the requests that could not step try again (a prompt not yet
// started goes back to the front of the queue) instead of failing.
// Batch-invariant requests (seeded ones, or all with SchedulerOptions::deterministic) give the
// same tokens whatever else runs and whatever the prefix cache holds: their prompts are prefilled
// in chunks aligned to invariant_chunk tokens ([kC, (k+1)C), so their numerics do not depend on
// the other requests' budget use), they copy only prefixes kept by such requests and only whole
// chunks of them (the copied K/V and the chunks left are then those of their own prefill), and
// they decode in batches of batch-invariant sessions (Session::set_batch_invariant). Sampling is
// counter-based on (seed, position), so the same logits give the same draw.
// Faults: an exception escaping the engine loop ends every running and waiting request with an
// error (500), turns healthy() false (/health 503) and refuses new requests (503).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "attention/policies.h"
#include "runtime/engine.h"
#include "runtime/prefix_cache.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/schema.h"

namespace lychee::server {

// The context length at which one token's attention work (4 x n_heads x head_dim FLOPs per
// cached token and layer) equals the work of its weights (2 x the layer's linear parameters).
double attention_balance_context(const ModelConfig& c);
// What n prompt tokens from `position` weigh in token-equivalents: each token at position p
// weighs 1 + p / k (the continuous sum: n (1 + position / k) + n^2 / (2 k)).
double prefill_weight(int64_t n, int64_t position, double k);
// The most prompt tokens to prefill from `position` within `budget` token-equivalents (0 when
// even one token does not fit).
int prefill_tokens_within(double budget, int64_t position, double k);

// prefill_chunk's default on a device ("cpu", "cuda"): 512 on the CPU, whose prefill runs at a few
// hundred tokens a second, so a step with a chunk stays well under a second; 8192 on a GPU (vLLM's
// token budget per step on H100/H200-class GPUs), where a step reads the weights once whatever its
// rows and a long prompt's deep chunks shrink with the attention weight: one H200, Llama-3-8B
// shape, 32K prompts, 1-64 clients, 2048 gave 17.8-19.7 output tok/s (TPOT 68 ms) and 8192
// 20.5-21.2 (TPOT 217 ms, vLLM's 287-310), TTFT p99 at 16 clients 28.1 -> 23.6 s
// (docs/results/gpu/session17).
int default_prefill_chunk(const std::string& device);

struct SchedulerOptions {
  int max_running = 4;     // sequences in the running batch
  int max_queue = 64;      // waiting requests; more are refused (503)
  int64_t kv_tokens = 0;   // the KV pool in tokens; 0 = max_running x context
  // Prompt token-equivalents prefilled per step, over all requests (see above); 0 = the device's
  // default (default_prefill_chunk).
  int prefill_chunk = 0;
  int max_context = 0;     // longest sequence; 0 = the model's context
  int64_t prefix_cache_tokens = -1;  // KV tokens kept prompts may hold; -1 = half the pool; 0 = off
  bool deterministic = false;        // every request batch-invariant, seeded or not
  // Batch-invariant requests' prompt chunks, aligned: [kC, (k+1)C). Smaller reuses the prefix
  // cache at a finer grain (a copy is a whole number of chunks) but prefills in more passes.
  int invariant_chunk = 128;
  int64_t fault_at_step = 0;         // tests: the engine loop throws at this step (0 = never)
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const SchedulerOptions& options, Metrics* metrics = nullptr);
  ~Scheduler();  // finishes what is left with an error and joins the engine thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // The longest sequence a request may have (prompt + generated): the model's context, capped by
  // max_context and by the KV pool.
  int context() const { return context_; }
  // The KV budget in pages of page_tokens() tokens: SchedulerOptions::kv_tokens (or max_running x
  // context) capped by the engine's pool.
  int64_t kv_capacity() const { return kv_capacity_; }
  int page_tokens() const { return page_tokens_; }
  int max_running() const { return options_.max_running; }
  // False once a fault ended the engine loop (fault() says what); /health answers 503 then.
  bool healthy() const { return !failed_.load(); }
  std::string fault() const;
  // Queues r. ApiError(503) when the queue is full or the server is draining.
  void submit(const std::shared_ptr<Request>& r);
  // Stops admitting new submissions (503); queued and running requests go on.
  void drain();
  bool draining() const { return draining_.load(); }
  // Ends every queued and running request with an error and stops the engine thread (the drain
  // deadline passed); later submissions get 503.
  void abort();
  // Waits until no request is queued or running, or the deadline; returns whether idle.
  bool wait_idle(std::chrono::steady_clock::time_point deadline);
  SchedulerGauges gauges() const;

 private:
  struct Running;
  void loop();
  void admit_locked(std::vector<std::shared_ptr<Request>>& admitted);
  std::unique_ptr<Running> start(const std::shared_ptr<Request>& r);
  void step(std::vector<std::unique_ptr<Running>>& running);
  bool decode(const std::vector<Running*>& decoding);
  void sample_and_emit(Running& r);
  void emit_token(Running& r, int32_t token, const TokenLogprob* logprob);
  void speculate(const std::vector<Running*>& speculating, bool& progress, bool& out_of_pages);
  bool speculate_alone(Running& r);
  void retire(Running& r, const std::string& reason, const std::string& error = "");
  void requeue(Running& r);
  void keep_prompt(Running& r);
  void fail_all(std::vector<std::unique_ptr<Running>>& running, const std::string& error);
  int64_t pages_for(int64_t tokens) const { return (tokens + page_tokens_ - 1) / page_tokens_; }
  int64_t reservation_pages(const GenerationParams& p) const { return pages_for(kv_reservation(p)); }
  bool invariant(const GenerationParams& p) const { return options_.deterministic || p.seeded; }

  Engine& engine_;
  SchedulerOptions options_;
  Metrics* metrics_;
  int context_ = 0;
  int page_tokens_ = 1;
  int64_t kv_capacity_ = 0;  // pages

  mutable std::mutex mu_;
  std::condition_variable cv_;       // the engine thread waits for work
  std::condition_variable idle_cv_;  // wait_idle
  std::deque<std::shared_ptr<Request>> waiting_;
  int n_running_ = 0;
  int64_t kv_used_ = 0;                        // pages reserved by running requests (the cache holds the rest)
  int64_t steps_ = 0;                          // engine steps run
  int starved_steps_ = 0;                      // consecutive steps that found no free page and made no progress
  std::atomic<bool> failed_{false};
  std::string fault_;                          // mu_
  std::unique_ptr<PrefixCache> prefix_cache_;  // engine thread (admission holds mu_ too); null: off
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  std::thread thread_;
};

// The log-softmax of the chosen token and of the top_n most likely tokens (most likely first, ties
// by id), from a step's raw logits; ids past the tokenizer's vocabulary have no text. The server's
// logprobs and the Python package's.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top_n, const Tokenizer& tok);

}  // namespace lychee::server
