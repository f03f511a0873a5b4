#include "server/request.h"

#include <algorithm>
#include <utility>

namespace lychee::server {

int64_t kv_reservation(const GenerationParams& p) {
  return int64_t(p.prompt.size()) + std::max(p.max_tokens - 1, 0);
}

Request::Request(GenerationParams params) : params_(std::move(params)) {}

void Request::cancel() { cancelled_.store(true, std::memory_order_relaxed); }

bool Request::next(RequestUpdate& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  auto ready = [&] { return !pending_.text.empty() || pending_.tokens > 0 || pending_.done; };
  cv_.wait_for(lock, timeout, ready);
  const bool any = ready();
  out.text += pending_.text;
  pending_.text.clear();
  out.tokens += pending_.tokens;
  pending_.tokens = 0;
  for (TokenLogprob& t : pending_.logprobs) out.logprobs.push_back(std::move(t));
  pending_.logprobs.clear();
  if (pending_.done) {
    out.done = true;
    out.finish_reason = pending_.finish_reason;
    out.error = pending_.error;
    out.usage = pending_.usage;
  }
  return any;
}

RequestUpdate Request::wait() {
  RequestUpdate out;
  while (!out.done) next(out, std::chrono::milliseconds(1000));
  return out;
}

void Request::emit(const std::string& text, const TokenLogprob* logprob) {
  {
    std::lock_guard lock(mu_);
    pending_.text += text;
    ++pending_.tokens;
    if (logprob != nullptr) pending_.logprobs.push_back(*logprob);
  }
  cv_.notify_all();
}

void Request::finish(const std::string& reason, const Usage& usage, const std::string& error) {
  {
    std::lock_guard lock(mu_);
    pending_.done = true;
    pending_.finish_reason = reason;
    pending_.usage = usage;
    pending_.error = error;
  }
  cv_.notify_all();
}

}  // namespace lychee::server
