#include "server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "server/text_stream.h"

namespace lychee::server {

using Clock = std::chrono::steady_clock;

double attention_balance_context(const ModelConfig& c) {
  const double linear = double(c.d_model) * (2.0 * c.q_dim() + 2.0 * c.kv_dim()) + 3.0 * c.d_model * c.d_ff;
  return std::max(1.0, linear / (2.0 * c.q_dim()));
}

double prefill_weight(int64_t n, int64_t position, double k) {
  return double(n) * (1.0 + double(position) / k) + double(n) * double(n) / (2.0 * k);
}

int prefill_tokens_within(double budget, int64_t position, double k) {
  // The largest n with prefill_weight(n, P, k) = n (1 + P / k) + n^2 / (2 k) within budget.
  if (budget <= 0.0) return 0;
  const double b = 1.0 + double(position) / k;
  const double n = k * (std::sqrt(b * b + 2.0 * budget / k) - b);
  return int(std::min(n + 1e-9, double(std::numeric_limits<int>::max())));
}

// --- Scheduler -----------------------------------------------------------------------------------

// A running request's engine-side state (engine thread only).
struct Scheduler::Running {
  std::shared_ptr<Request> request;
  std::unique_ptr<Session> session;
  std::unique_ptr<AttentionPolicy> policy;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<SpeculativeDecoder> spec;  // lychee.speculate: its cycles, from the prompt's end
  TextStream text;
  int64_t reservation = 0;
  size_t n_prefilled = 0;
  int n_generated = 0;
  int32_t last_token = -1;
  int cached_tokens = 0;  // prompt tokens copied from the prefix cache
  bool cacheable = false; // finished normally with its whole prompt prefilled: keep its prompt
  bool invariant = false; // batch-invariant (Scheduler::invariant)
  bool requeued = false;  // went back to the queue (no free KV page to start it)
  Clock::time_point admitted;  // when start() took it from the queue
  Clock::time_point last_token_time;
  bool finished = false;
};

int default_prefill_chunk(const std::string& device) { return device == "cpu" ? 512 : 8192; }

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& options, Metrics* metrics)
    : engine_(engine), options_(options), metrics_(metrics) {
  if (options_.prefill_chunk == 0) options_.prefill_chunk = default_prefill_chunk(engine.device());
  LY_CHECK(options_.max_running >= 1, ErrorCode::kInvalidArgument, "max_running must be >= 1, got {}",
           options_.max_running);
  LY_CHECK(options_.max_queue >= 0, ErrorCode::kInvalidArgument, "max_queue must be >= 0, got {}", options_.max_queue);
  LY_CHECK(options_.prefill_chunk >= 1, ErrorCode::kInvalidArgument,
           "prefill_chunk must be >= 1 (0: the device's default)");
  LY_CHECK(options_.invariant_chunk >= 1, ErrorCode::kInvalidArgument, "invariant_chunk must be >= 1");
  const int model_context = engine.config().max_context;
  context_ = options_.max_context > 0 ? std::min(options_.max_context, model_context) : model_context;
  page_tokens_ = std::max(1, engine.kv_page_tokens());
  const int64_t budget_tokens = options_.kv_tokens > 0 ? options_.kv_tokens : int64_t(options_.max_running) * context_;
  kv_capacity_ = budget_tokens / page_tokens_;
  if (const int64_t pool = engine.kv_pool_pages(); pool > 0 && pool < kv_capacity_) {
    LY_LOG_WARN("KV budget of {} tokens capped at the pool's {} pages of {} tokens", budget_tokens, pool, page_tokens_);
    kv_capacity_ = pool;
  }
  context_ = int(std::min<int64_t>(context_, kv_capacity_ * page_tokens_));
  LY_CHECK(context_ >= 2, ErrorCode::kInvalidArgument, "the KV pool of {} pages of {} tokens is too small for a request",
           kv_capacity_, page_tokens_);
  const int64_t cache_tokens = options_.prefix_cache_tokens < 0 ? kv_capacity_ * page_tokens_ / 2
                                                                 : options_.prefix_cache_tokens;
  if (cache_tokens > 0)
    prefix_cache_ = std::make_unique<PrefixCache>(std::min(pages_for(cache_tokens), kv_capacity_));
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { abort(); }

void Scheduler::abort() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::submit(const std::shared_ptr<Request>& r) {
  LY_CHECK(reservation_pages(r->params()) <= kv_capacity_ && !r->params().prompt.empty(), ErrorCode::kInternal,
           "internal error: a request of {} prompt + {} new tokens was not checked against the context",
           r->params().prompt.size(), r->params().max_tokens);
  {
    std::lock_guard lock(mu_);
    if (failed_.load()) throw ApiError(503, fmt::format("the engine failed and is not serving: {}", fault_));
    if (draining_.load() || stop_) throw ApiError(503, "the server is shutting down");
    if (int(waiting_.size()) >= options_.max_queue && !(waiting_.empty() && n_running_ < options_.max_running))
      throw ApiError(503, fmt::format("the server is busy: {} requests are waiting (--max-queue); retry later",
                                      waiting_.size()));
    r->submitted_ = Clock::now();
    waiting_.push_back(r);
  }
  cv_.notify_all();
}

void Scheduler::drain() {
  draining_.store(true);
  cv_.notify_all();
}

bool Scheduler::wait_idle(Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return idle_cv_.wait_until(lock, deadline, [&] { return waiting_.empty() && n_running_ == 0; });
}

SchedulerGauges Scheduler::gauges() const {
  std::lock_guard lock(mu_);
  SchedulerGauges g{n_running_, int(waiting_.size()), kv_used_, kv_capacity_, page_tokens_};
  if (prefix_cache_) {
    g.prefix_cache_pages = prefix_cache_->tokens_held();
    g.prefix_cache_entries = prefix_cache_->entries();
  }
  g.healthy = !failed_.load();
  return g;
}

std::string Scheduler::fault() const {
  std::lock_guard lock(mu_);
  return fault_;
}

// Takes requests from the front of the queue while the batch and the KV pool have room (first
// come, first served: a large request at the front is not overtaken). Cancelled ones leave
// wherever they wait.
void Scheduler::admit_locked(std::vector<std::shared_ptr<Request>>& admitted) {
  std::erase_if(waiting_, [&](const std::shared_ptr<Request>& r) {
    if (!r->cancelled()) return false;
    r->finish("cancelled", Usage{int(r->params().prompt.size()), 0});
    if (metrics_) metrics_->count_request("cancelled");
    return true;
  });
  while (!waiting_.empty()) {
    const std::shared_ptr<Request>& r = waiting_.front();
    const int64_t need = reservation_pages(r->params());
    if (n_running_ >= options_.max_running) break;
    if (kv_used_ + need > kv_capacity_) break;
    // Kept prompts give way to requests.
    if (prefix_cache_) prefix_cache_->evict_to(kv_capacity_ - kv_used_ - need);
    ++n_running_;
    kv_used_ += need;
    admitted.push_back(r);
    waiting_.pop_front();
  }
}

void Scheduler::loop() {
  std::vector<std::unique_ptr<Running>> running;
  std::unique_lock lock(mu_);
  try {
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !waiting_.empty() || !running.empty(); });
      if (stop_) break;
      std::vector<std::shared_ptr<Request>> admitted;
      admit_locked(admitted);
      lock.unlock();
      for (const std::shared_ptr<Request>& r : admitted) {
        std::unique_ptr<Running> run = start(r);
        if (run) {
          running.push_back(std::move(run));
        } else {
          lock.lock();
          --n_running_;
          kv_used_ -= reservation_pages(r->params());
          lock.unlock();
        }
      }
      ++steps_;
      if (options_.fault_at_step > 0 && steps_ == options_.fault_at_step)
        throw std::runtime_error(fmt::format("injected fault at step {} (SchedulerOptions::fault_at_step)", steps_));
      step(running);
      lock.lock();
      // Finished and cancelled requests leave in the step that finished them; requeued ones wait
      // again at the front of the queue, in their order.
      std::vector<std::shared_ptr<Request>> back;
      for (std::unique_ptr<Running>& r : running)
        if (r->finished) {
          --n_running_;
          kv_used_ -= r->reservation;
          if (r->requeued) back.push_back(r->request);
          else keep_prompt(*r);
          r.reset();
        }
      waiting_.insert(waiting_.begin(), back.begin(), back.end());
      std::erase(running, nullptr);
      if (waiting_.empty() && n_running_ == 0) idle_cv_.notify_all();
    }
  } catch (const std::exception& e) {
    // A fault outside any one request's handling (a broken invariant, memory, the device): the
    // engine's state cannot be trusted, so every request ends and the server reports itself
    // unhealthy instead of terminating the process under the HTTP threads.
    if (!lock.owns_lock()) lock.lock();
    fault_ = e.what();
    failed_.store(true);
    log(LogLevel::kError, "engine loop failed: {}; every request ends with an error and /health answers 503", e.what());
    lock.unlock();
    fail_all(running, fmt::format("the engine failed: {}", e.what()));
    lock.lock();
  }
  // Shutting down (or failed): whatever is left ends with an error.
  const std::string why = failed_.load() ? fmt::format("the engine failed: {}", fault_) : "the server shut down";
  for (std::unique_ptr<Running>& r : running)
    if (r) r->request->finish("error", {}, why);
  for (const std::shared_ptr<Request>& r : waiting_) r->finish("error", {}, why);
  waiting_.clear();
  n_running_ = 0;
  kv_used_ = 0;
  idle_cv_.notify_all();
}

// Ends every running request with `error` (their sessions released), engine thread, mu_ not held.
void Scheduler::fail_all(std::vector<std::unique_ptr<Running>>& running, const std::string& error) {
  for (std::unique_ptr<Running>& r : running) {
    if (!r) continue;
    if (!r->finished) {
      r->request->finish("error", Usage{int(r->request->params().prompt.size()), r->n_generated}, error);
      if (metrics_) metrics_->count_request("error");
    }
    r.reset();
  }
  running.clear();
}

std::unique_ptr<Scheduler::Running> Scheduler::start(const std::shared_ptr<Request>& r) {
  auto run = std::make_unique<Running>();
  run->request = r;
  run->admitted = Clock::now();
  run->reservation = reservation_pages(r->params());
  run->invariant = invariant(r->params());
  try {
    const GenerationParams& p = r->params();
    run->session = engine_.new_session(int(std::max<int64_t>(kv_reservation(p), 1)));
    run->session->set_batch_invariant(run->invariant);
    run->policy = make_policy(p.policy, engine_.config());
    run->session->set_policy(run->policy.get());
    run->sampler = std::make_unique<Sampler>(p.sampling);
    run->text = TextStream(p.stop);
    if (prefix_cache_) {
      PrefixCache::Match m;
      {
        std::lock_guard lock(mu_);  // find marks the entry used; gauges() reads the cache
        m = prefix_cache_->find(p.prompt, {p.cache_salt, run->invariant ? options_.invariant_chunk : 0});
      }
      if (m.session != nullptr) {
        run->session->copy_prefix(*m.session, m.length);
        run->n_prefilled = size_t(m.length);
        run->cached_tokens = m.length;
        if (metrics_) metrics_->add_prefix_hit(m.length);
      }
    }
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kCapacity && engine_.kv_pool_pages() > 0) {
      // No free page for the prefix copy: the cache gives its pages back, the request waits.
      LY_LOG_WARN("request could not start (KV pool): {}; emptying the prefix cache and requeueing it", e.what());
      std::lock_guard lock(mu_);
      if (prefix_cache_) prefix_cache_->clear();
      waiting_.push_front(r);  // the caller gives back its slot and reservation
      return nullptr;
    }
    LY_LOG_WARN("request could not start: {}", e.what());
    r->finish("error", Usage{int(r->params().prompt.size()), 0}, e.what());
    if (metrics_) metrics_->count_request("error");
    return nullptr;
  } catch (const std::exception& e) {
    LY_LOG_WARN("request could not start: {}", e.what());
    r->finish("error", Usage{int(r->params().prompt.size()), 0}, e.what());
    if (metrics_) metrics_->count_request("error");
    return nullptr;
  }
  return run;
}

// One engine step: prompt chunks within the step's prefill budget (a prompt that completes is
// sampled right away), then one decode step of every request past its prompt, batched by the
// backend (Session::decode_batch: on the GPU one launch per layer for the requests that share a
// policy), each sampled as soon as its step has run.
void Scheduler::step(std::vector<std::unique_ptr<Running>>& running) {
  const Clock::time_point t0 = Clock::now();
  std::vector<Running*> decoding, prefilling, speculating;
  for (std::unique_ptr<Running>& rp : running) {
    Running& r = *rp;
    if (r.finished) continue;
    if (r.request->cancelled()) retire(r, "cancelled");
    else if (r.n_prefilled < r.request->params().prompt.size()) prefilling.push_back(&r);
    // The reservation covers prompt + max_tokens, so this is a guard, not a path taken.
    else if (r.session->length() + 1 > r.session->capacity()) retire(r, "length");
    else if (r.spec) speculating.push_back(&r);
    else decoding.push_back(&r);
  }
  // With no request decoding, nobody waits on the step: prompts go in larger chunks (the runner
  // cuts them again to what one forward pass takes), over several prompts. While requests decode,
  // one prompt's chunk at most (each forward pass reads every weight again): a decoding stream's
  // step is at most one bounded chunk longer.
  const bool idle = decoding.empty() && speculating.empty();
  double budget = (idle ? 4.0 : 1.0) * options_.prefill_chunk;
  const size_t max_prompts = idle ? prefilling.size() : 1;
  const double k = attention_balance_context(engine_.config());
  const bool pool = engine_.kv_pool_pages() > 0;
  bool out_of_pages = false, progress = false;
  size_t prompts = 0;
  int64_t prefilled = 0;
  for (Running* rp : prefilling) {
    if (prompts == max_prompts) break;
    Running& r = *rp;
    const std::vector<int32_t>& prompt = r.request->params().prompt;
    try {
      const size_t left = prompt.size() - r.n_prefilled;
      size_t n = 0;
      if (r.invariant) {
        // One aligned chunk, [kC, (k+1)C) or the prompt's end: what the budget lets others do
        // does not change where this prompt's chunks begin and end.
        const size_t chunk = size_t(options_.invariant_chunk);
        n = std::min(left, chunk - r.n_prefilled % chunk);
        if (prompts > 0 && prefill_weight(int64_t(n), int64_t(r.n_prefilled), k) > budget) continue;
      } else {
        n = std::min(left, size_t(prefill_tokens_within(budget, int64_t(r.n_prefilled), k)));
        if (prompts == 0) n = std::max(n, std::min(left, size_t(16)));  // a few tokens, however deep
      }
      if (n == 0) continue;  // nothing of this prompt fits what is left of the budget
      // Dense whatever its length (a 1-token chunk would otherwise be a decode step under the policy).
      r.session->feed(std::span<const int32_t>(prompt.data() + r.n_prefilled, n), false);
      budget -= prefill_weight(int64_t(n), int64_t(r.n_prefilled), k);
      r.n_prefilled += n;
      prefilled += int64_t(n);
      ++prompts;
      progress = true;
      if (r.n_prefilled == prompt.size()) sample_and_emit(r);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kCapacity && pool && r.n_generated == 0) {
        // No free KV page: this prompt starts again later (its pages come back now).
        LY_LOG_WARN("prefill found the KV pool full ({}); the request goes back to the queue", e.what());
        requeue(r);
        out_of_pages = true;
        continue;
      }
      LY_LOG_WARN("request failed: {}", e.what());
      retire(r, "error", e.what());
    } catch (const std::exception& e) {
      LY_LOG_WARN("request failed: {}", e.what());
      retire(r, "error", e.what());
    }
  }
  if (!decoding.empty()) {
    if (decode(decoding)) progress = true;
    else out_of_pages = true;
  }
  if (!speculating.empty()) speculate(speculating, progress, out_of_pages);
  const bool decoded = !decoding.empty() || !speculating.empty();
  if (metrics_ && (prefilled > 0 || decoded))
    metrics_->add_step(prefilled == 0 ? "decode" : decoded ? "mixed" : "prefill",
                       std::chrono::duration<double>(Clock::now() - t0).count(), prefilled);
  if (!out_of_pages) {
    starved_steps_ = 0;
    return;
  }
  // Admission counts pages, so this is a guard: the prefix cache gives its pages back, and the
  // requests that could not step try again next step. Twice without any progress and nothing
  // left to evict: the youngest decoding request ends (its pages free the others).
  const bool evicted = prefix_cache_ && prefix_cache_->entries() > 0;
  if (prefix_cache_) {
    std::lock_guard lock(mu_);
    prefix_cache_->clear();
  }
  starved_steps_ = progress || evicted ? 0 : starved_steps_ + 1;
  const std::vector<Running*>& stepping = !decoding.empty() ? decoding : speculating;
  if (starved_steps_ >= 2 && !stepping.empty()) {
    Running& youngest = *stepping.back();
    retire(youngest, "error", "the KV pool has no free page for this request's next token; retry it later");
    starved_steps_ = 0;
  }
}

// One decode step of every request in `decoding`, each sampled as soon as its step has run.
// False when the KV pool had no page for some of them (those did not step and stay running).
bool Scheduler::decode(const std::vector<Running*>& decoding) {
  std::vector<Session*> sessions;
  std::vector<int32_t> tokens;
  std::vector<int> before;
  for (Running* r : decoding) {
    sessions.push_back(r->session.get());
    tokens.push_back(r->last_token);
    before.push_back(r->session->length());
  }
  auto sample = [&](size_t i) {
    try {
      sample_and_emit(*decoding[i]);
    } catch (const std::exception& e) {
      LY_LOG_WARN("request failed: {}", e.what());
      retire(*decoding[i], "error", e.what());
    }
  };
  try {
    Session::decode_batch(sessions, tokens, sample);
  } catch (const Error& e) {
    // Each batch checks its sessions (and takes their pages) before it runs; a request that
    // stepped was sampled already. Without a free page the others wait for the next step.
    const bool no_page = e.code() == ErrorCode::kCapacity && engine_.kv_pool_pages() > 0;
    LY_LOG_WARN("decode step failed: {}{}", e.what(), no_page ? " (the requests that did not step wait)" : "");
    if (no_page) return false;
    for (size_t i = 0; i < decoding.size(); ++i)
      if (decoding[i]->session->length() == before[i]) retire(*decoding[i], "error", e.what());
  } catch (const std::exception& e) {
    LY_LOG_WARN("decode step failed: {}", e.what());
    for (size_t i = 0; i < decoding.size(); ++i)
      if (decoding[i]->session->length() == before[i]) retire(*decoding[i], "error", e.what());
  }
  return true;
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top_n, const Tokenizer& tok) {
  float max = -INFINITY;
  for (float x : logits) max = std::max(max, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(double(x) - max);
  const double log_z = double(max) + std::log(sum);
  TokenLogprob t;
  // The model's vocabulary may be larger than the tokenizer's: those ids have no text.
  auto piece = [&](int32_t id) { return id < tok.vocab_size() ? tok.token_piece(id) : std::string(); };
  t.token = piece(token);
  t.logprob = float(double(logits[size_t(token)]) - log_z);
  if (top_n > 0) {
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    const size_t n = std::min(size_t(top_n), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + long(n), ids.end(), [&](int32_t a, int32_t b) {
      return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
    });
    for (size_t i = 0; i < n; ++i)
      t.top.push_back({piece(ids[i]), float(double(logits[size_t(ids[i])]) - log_z)});
  }
  return t;
}

// One draft/verify cycle of every speculating request, batched (SpeculativeDecoder::cycle_batch:
// their draft steps and verifications as batched steps), each one's tokens emitted in turn. Where
// the batch fails (a full KV pool, a fault), no request has moved and each cycles alone, so that
// only the one at fault waits or fails. progress: some request cycled (or failed); out_of_pages:
// some request found no KV page (it waits).
void Scheduler::speculate(const std::vector<Running*>& speculating, bool& progress, bool& out_of_pages) {
  if (speculating.size() > 1) {
    std::vector<SpeculativeDecoder*> decoders;
    std::vector<int> limits;
    std::vector<std::vector<int32_t>> out(speculating.size());
    std::vector<std::vector<int32_t>*> outs;
    for (size_t i = 0; i < speculating.size(); ++i) {
      Running& r = *speculating[i];
      decoders.push_back(r.spec.get());
      limits.push_back(r.request->params().max_tokens - r.n_generated);
      outs.push_back(&out[i]);
    }
    try {
      SpeculativeDecoder::cycle_batch(decoders, limits, outs);
      for (size_t i = 0; i < speculating.size(); ++i)
        for (const int32_t token : out[i]) {
          if (speculating[i]->finished) break;
          emit_token(*speculating[i], token, nullptr);
        }
      progress = true;
      return;
    } catch (const std::exception& e) {
      LY_LOG_WARN("batched speculative cycle of {} requests failed ({}); each cycles alone", speculating.size(),
                  e.what());
    }
  }
  for (Running* r : speculating) {
    if (speculate_alone(*r)) progress = true;
    else out_of_pages = true;
  }
}

// One draft/verify cycle of a speculating request by itself, its tokens emitted in turn. False
// when the KV pool had no page for it (the request waits; a failed cycle leaves its cache as it
// was: SpeculativeDecoder::cycle_batch).
bool Scheduler::speculate_alone(Running& r) {
  std::vector<int32_t> out;
  try {
    r.spec->cycle(r.request->params().max_tokens - r.n_generated, out);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kCapacity && engine_.kv_pool_pages() > 0) {
      LY_LOG_WARN("speculative cycle found the KV pool full ({}); the request waits", e.what());
      return false;
    }
    LY_LOG_WARN("request failed: {}", e.what());
    retire(r, "error", e.what());
    return true;
  } catch (const std::exception& e) {
    LY_LOG_WARN("request failed: {}", e.what());
    retire(r, "error", e.what());
    return true;
  }
  for (const int32_t token : out) {
    if (r.finished) break;
    emit_token(r, token, nullptr);
  }
  return true;
}

void Scheduler::sample_and_emit(Running& r) {
  const GenerationParams& p = r.request->params();
  const Tokenizer& tok = engine_.tokenizer();
  if (p.speculate.enabled()) {  // the prompt is in: the decoder draws the first token from its logits
    r.spec = std::make_unique<SpeculativeDecoder>(*r.session, p.sampling, p.speculate);
    emit_token(r, r.spec->first(), nullptr);
    return;
  }
  TokenLogprob lp;
  const int32_t token = r.session->sample(*r.sampler);
  if (p.logprobs) lp = token_logprob(r.session->logits(), token, p.top_logprobs, tok);
  emit_token(r, token, p.logprobs ? &lp : nullptr);
}

void Scheduler::emit_token(Running& r, int32_t token, const TokenLogprob* logprob) {
  const GenerationParams& p = r.request->params();
  const Tokenizer& tok = engine_.tokenizer();
  const TokenLogprob* lp = logprob;
  ++r.n_generated;
  const Clock::time_point now = Clock::now();
  if (metrics_) {
    if (r.n_generated == 1) {
      metrics_->observe_ttft(std::chrono::duration<double>(now - r.request->submitted_).count());
      metrics_->observe_queue(std::chrono::duration<double>(r.admitted - r.request->submitted_).count());
      metrics_->observe_prefill(std::chrono::duration<double>(now - r.admitted).count());
    } else {
      metrics_->observe_tpot(std::chrono::duration<double>(now - r.last_token_time).count());
    }
  }
  r.last_token_time = now;
  r.last_token = token;
  const std::vector<int32_t>& stop_ids = tok.stop_ids();
  if (!p.ignore_eos && std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
    r.request->emit(r.text.finish(), lp);
    retire(r, "stop");
    return;
  }
  const bool has_text = token < tok.vocab_size() && !tok.is_special(token);
  std::string text = r.text.push(has_text ? tok.token_piece(token) : std::string());
  if (r.text.stopped()) {
    r.request->emit(text, lp);
    retire(r, "stop");
  } else if (r.n_generated >= p.max_tokens) {
    r.request->emit(text + r.text.finish(), lp);
    retire(r, "length");
  } else {
    r.request->emit(text, lp);
  }
}

// A finished request's prompt, prefilled densely, is kept for later prompts that start with it
// (mu_ held; running reservations plus the cache's capacity stay within the KV budget).
void Scheduler::keep_prompt(Running& r) {
  if (!prefix_cache_ || !r.cacheable || r.session == nullptr) return;
  const std::vector<int32_t>& prompt = r.request->params().prompt;
  try {
    r.session->set_policy(nullptr);
    r.session->truncate(int(prompt.size()));
    // What the kept session holds: its pages where the backend has a pool (truncate gave the
    // rest back), else its whole capacity (the CPU's cache rows are the session's own).
    const int64_t cost = engine_.kv_pool_pages() > 0 ? pages_for(int64_t(prompt.size()))
                                                     : pages_for(r.session->capacity());
    const GenerationParams& p = r.request->params();
    prefix_cache_->put(std::move(r.session), prompt, {p.cache_salt, r.invariant ? options_.invariant_chunk : 0}, cost);
    // Never over the budget: the cache holds only what the running requests leave free.
    prefix_cache_->evict_to(kv_capacity_ - kv_used_);
  } catch (const std::exception& e) {
    LY_LOG_WARN("prefix cache: a finished prompt was not kept: {}", e.what());
  }
}

// Back to the front of the queue (the loop moves it there; its session and pages go now).
void Scheduler::requeue(Running& r) {
  r.finished = r.requeued = true;
  r.session.reset();
  r.n_prefilled = 0;
}

void Scheduler::retire(Running& r, const std::string& reason, const std::string& error) {
  if (r.finished) return;
  r.finished = true;
  r.cacheable = (reason == "stop" || reason == "length") && r.n_prefilled == r.request->params().prompt.size();
  Usage usage{int(r.request->params().prompt.size()), r.n_generated, r.cached_tokens};
  if (r.spec) {
    usage.speculated = true;
    usage.drafted = r.spec->stats().drafted;
    usage.accepted = r.spec->stats().accepted;
  }
  if (metrics_) {
    metrics_->count_request(reason == "stop" || reason == "length" ? "ok" : reason);
    metrics_->add_tokens(int64_t(r.n_prefilled), r.n_generated);
    const KvReadStats& s = r.session->stats();
    // Bytes as the GPU's pages of the engine's KV dtype hold them (bf16, or FP8 codes and scales).
    const int64_t token_head_bytes = kv_bytes_per_token_head(engine_.kv_cache_dtype(), engine_.config().head_dim);
    metrics_->add_kv_reads(policy_kind_name(r.request->params().policy.kind), s.kv_bytes_at(token_head_bytes),
                           s.dense_kv_bytes_at(token_head_bytes));
  }
  r.request->finish(reason, usage, error);
}

}  // namespace lychee::server
