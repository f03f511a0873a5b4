// A request between the HTTP threads and the engine thread (scheduler.h): its validated
// parameters, and the handoff of its text and finish (a mutex and a condition variable).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "attention/policies.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"
#include "server/schema.h"

namespace lychee::server {

class Scheduler;

// A request in the engine's terms, validated and tokenized by the HTTP thread.
struct GenerationParams {
  std::vector<int32_t> prompt;
  int max_tokens = 16;  // >= 1; prompt + max_tokens - 1 fits the context
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool logprobs = false;
  int top_logprobs = 0;
  bool ignore_eos = false;  // the model's stop tokens do not end the request (stop strings still do)
  PolicyOptions policy;
  // Self-speculative decoding with `policy` as the draft: one draft/verify cycle per engine step,
  // batched with the other speculating requests' (Scheduler::speculate), apart from the plain
  // decode step.
  SpeculateOptions speculate;
  bool seeded = false;     // the client gave the seed: batch-invariant (see above)
  std::string cache_salt;  // the prefix-cache namespace ("" = the shared one)
};

// The reservation of a request in KV tokens: every fed token (the last sampled one is not fed);
// the scheduler counts it in pages.
int64_t kv_reservation(const GenerationParams& p);

// What the HTTP thread collects from a running request.
struct RequestUpdate {
  std::string text;                    // new final text (stop strings removed)
  std::vector<TokenLogprob> logprobs;  // one per new generated token (with logprobs)
  int tokens = 0;                      // new generated tokens (a token's text may be held back or empty)
  bool done = false;
  std::string finish_reason;           // "stop", "length", "cancelled" or "error"
  std::string error;                   // with "error"
  Usage usage;
};

class Request {
 public:
  explicit Request(GenerationParams params);
  const GenerationParams& params() const { return params_; }
  // The client went away: the engine drops the request at its next step.
  void cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  // Waits until there is new text or the finish, or until `timeout`; moves what arrived into
  // `out` (text appended) and returns whether anything did.
  bool next(RequestUpdate& out, std::chrono::milliseconds timeout);
  // Waits for the finish and returns everything.
  RequestUpdate wait();

  // Engine thread.
  void emit(const std::string& text, const TokenLogprob* logprob);
  void finish(const std::string& reason, const Usage& usage, const std::string& error = "");

 private:
  GenerationParams params_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  RequestUpdate pending_;  // not yet taken by the HTTP thread
  std::chrono::steady_clock::time_point submitted_{};  // set by Scheduler::submit (queue time, TTFT)
  friend class Scheduler;
};

}  // namespace lychee::server
