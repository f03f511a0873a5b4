// lychee serve: the OpenAI-compatible HTTP server (src/server). Binds first (so a port in use
// fails at once), answers /health with 503 while the model loads, then serves until SIGTERM or
// SIGINT: admission stops (503), running requests finish (up to --drain-seconds), exit 0. A
// signal while the model loads, or a second one while draining, exits at once (128 + signal).
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "app.h"
#include "build_info.h"
#include "core/error.h"
#include "core/log.h"
#include "server/http.h"

namespace lychee::app {

namespace {

struct ServeArgs {
  ModelArgs model;
  PolicyArgs policy;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string model_name;
  int max_running = 4;
  int max_queue = 64;
  int prefill_chunk = 0;  // the device's default (server::default_prefill_chunk)
  int64_t prefix_cache = -1;
  double drain_seconds = 30.0;
  std::string random_weights;
  bool deterministic = false;
  int invariant_chunk = 128;
  int64_t fault_at_step = 0;
};

// SIGINT/SIGTERM are blocked in every thread and taken by sigtimedwait in the main thread: the
// kernel gives a process-directed signal to the main thread first when it waits for it, so no
// thread that a library started with its own mask (the CUDA driver's) receives it and dies of it.
// The server runs in a thread of its own; the first signal after the model loaded drains it, one
// during the load or a second one ends the process at once.
class Signals {
 public:
  Signals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // before any other thread starts: all inherit it
  }
  // Runs `serve` in a thread and takes the signals in this one until it returns (rethrowing what
  // it threw). serve calls loaded() once it serves, then wait_stop() for the first signal.
  void run(const std::function<void(Signals&)>& serve) {
    std::exception_ptr error;
    std::atomic<bool> done{false};
    std::thread worker([&] {
      try {
        serve(*this);
      } catch (...) {
        error = std::current_exception();
      }
      done.store(true);
    });
    const timespec tick{0, 100'000'000};
    while (!done.load()) {
      const int sig = sigtimedwait(&set_, nullptr, &tick);
      if (sig <= 0) continue;
      const char* name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
      std::lock_guard lock(mu_);
      if (!loaded_ || stop_ != 0) {
        std::fprintf(stderr, "lychee serve: %s %s; exiting now\n", name,
                     loaded_ ? "again while draining" : "while the model loads");
        std::fflush(stderr);
        std::_Exit(128 + sig);
      }
      stop_ = sig;
      cv_.notify_all();
    }
    worker.join();
    if (error) std::rethrow_exception(error);
  }
  void loaded() {
    std::lock_guard lock(mu_);
    loaded_ = true;
  }
  int wait_stop() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return stop_ != 0; });
    return stop_;
  }

 private:
  sigset_t set_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool loaded_ = false;
  int stop_ = 0;
};

// The KV pool in tokens: --kv-memory over the bytes a token's K and V take in every layer (f32
// on the CPU; bf16, or FP8 codes and scales with --kv-cache-dtype fp8, on the GPU:
// kv_tokens_for_memory); 0 = the scheduler's default (max running x context). The scheduler caps
// it at the GPU pool's pages.
int64_t kv_tokens(const ServeArgs& a, const Engine& engine) {
  if (a.model.kv_memory_gib <= 0.0) return 0;
  return engine.kv_tokens_for_memory(a.model.kv_memory_gib);
}

std::string model_id(const ServeArgs& a, const Engine& engine) {
  if (!a.model_name.empty()) return a.model_name;
  if (!a.random_weights.empty()) return a.random_weights + "-random";
  if (!a.model.model.empty() && !std::filesystem::exists(a.model.model)) return a.model.model;  // an HF id
  std::filesystem::path p(engine.checkpoint().path());
  if (p.filename().empty()) p = p.parent_path();  // a directory given with a trailing slash
  return p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
}

void serve(const ServeArgs& a, Signals& signals);

void run_serve(const ServeArgs& a) {
  if (log_level() > LogLevel::kInfo && log_level() < LogLevel::kError) set_log_level(LogLevel::kInfo);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not a dead server
  Signals signals;
  signals.run([&a](Signals& s) { serve(a, s); });
}

void serve(const ServeArgs& a, Signals& signals) {
  server::Metrics metrics;
  server::HttpOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.api_key = a.api_key;
  // A streaming or waiting request holds an HTTP thread for its life: room for every running and
  // queued request, plus some for /health, /metrics and requests being refused.
  ho.threads = std::max(64, a.max_running + a.max_queue + 16);
  if (ho.api_key.empty())
    if (const char* k = std::getenv("LYCHEE_API_KEY"); k != nullptr) ho.api_key = k;
  server::HttpServer http(ho, metrics);
  const int port = http.bind();
  std::atomic<bool> listening_done{false};
  std::thread listener([&http, &listening_done] {
    http.listen();
    listening_done.store(true);
  });
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::Scheduler> scheduler;
  try {
    EngineOptions eo = a.model.engine_options(&a.policy);
    eo.max_batch = a.max_running;
    eo.random_shape = a.random_weights;
    engine = std::make_unique<Engine>(eo);
    a.policy.options(engine->config());  // the server's default policy fits the model
    server::SchedulerOptions so;
    so.max_running = a.max_running;
    so.max_queue = a.max_queue;
    so.kv_tokens = kv_tokens(a, *engine);
    so.prefill_chunk = a.prefill_chunk;
    so.max_context = a.model.max_context;
    so.prefix_cache_tokens = a.prefix_cache;
    so.deterministic = a.deterministic;
    so.invariant_chunk = a.invariant_chunk;
    so.fault_at_step = a.fault_at_step;
    scheduler = std::make_unique<server::Scheduler>(*engine, so, &metrics);
  } catch (...) {
    // The listener may not have entered its loop yet (stop() is then a no-op): stop until it ends.
    while (!listening_done.load()) {
      http.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    listener.join();
    throw;
  }
  server::ServerModel sm{engine.get(), model_id(a, *engine), a.policy, scheduler->context(), "", kVersion};
  sm.fingerprint = server::system_fingerprint(
      *engine, fmt::format("deterministic {} invariant_chunk {} weights {} {} {} tp {}", a.deterministic,
                           a.invariant_chunk, a.model.weights, a.model.cpu_weights, a.model.fp8_selector_qkv,
                           a.model.tensor_parallel));
  http.attach(*scheduler, sm);
  std::fprintf(stderr, "lychee serve: listening on http://%s:%d (model %s, device %s)\n", a.host.c_str(), port,
               sm.id.c_str(), engine->device().c_str());
  std::fflush(stderr);

  signals.loaded();
  const int sig = signals.wait_stop();
  const server::SchedulerGauges g = scheduler->gauges();
  std::fprintf(stderr, "lychee serve: %s: no new requests; finishing %d running and %d waiting\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", g.running, g.waiting);
  scheduler->drain();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(a.drain_seconds);
  if (!scheduler->wait_idle(std::chrono::time_point_cast<std::chrono::steady_clock::duration>(deadline))) {
    std::fprintf(stderr, "lychee serve: drain deadline passed; ending the requests still running\n");
    scheduler->abort();  // their streams end with an error event, so the HTTP threads can finish
  }
  // Let the HTTP threads write the last chunks of finished streams (bounded).
  for (int i = 0; i < 200 && http.in_flight() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  http.stop();
  listener.join();
  scheduler.reset();
  std::fprintf(stderr, "lychee serve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat, completions, streaming)");
  const char* g = kGroupServer;
  cmd->add_option("--host", args->host, "Address to listen on (127.0.0.1: this machine only)")->group(g);
  cmd->add_option("--port", args->port, "Port to listen on (0 = any free port)")->check(CLI::Range(0, 65535))->group(g);
  cmd->add_option("--api-key", args->api_key, "Require 'Authorization: Bearer KEY'")
      ->default_str("$LYCHEE_API_KEY")->group(g);
  cmd->add_option("--model-name", args->model_name, "The model id clients pass")->default_str("the file name")->group(g);
  cmd->add_option("--max-running", args->max_running, "Sequences decoded together")->check(positive_int())->group(g);
  cmd->add_option("--max-queue", args->max_queue, "Requests waiting for admission; more get 503")
      ->check(non_negative_int())->group(g);
  cmd->add_option("--prefill-chunk", args->prefill_chunk, "Prompt token-equivalents prefilled per scheduler step")
      ->default_str(fmt::format("{} CPU, {} GPU", server::default_prefill_chunk("cpu"),
                                server::default_prefill_chunk("cuda")))
      ->check(positive_int())
      ->group(g);
  cmd->add_option("--prefix-cache", args->prefix_cache, "KV tokens kept for reuse by prompts with the same start (0 = off)")
      ->default_str("half the pool")->check(CLI::Range(int64_t(-1), int64_t(1) << 40))->group(g);
  cmd->add_option("--drain-seconds,--drain-timeout", args->drain_seconds,
                  "On SIGTERM: how long accepted requests may finish (then they end with an error); exit 0")
      ->check(non_negative_real())->group(g);
  cmd->add_option("--random-weights", args->random_weights, "Benchmarks, GPU only: a model of this shape, random weights")
      ->check(CLI::IsMember(model_shape_names()))->group(kGroupGpu);
  args->model.add(*cmd);
  args->policy.add(*cmd);
  cmd->add_flag("--deterministic", args->deterministic,
                "Every request batch-invariant (seeded ones always are; docs/serving.md)")->group(g);
  cmd->add_option("--invariant-chunk", args->invariant_chunk, "Seeded requests: aligned prompt chunks of N tokens")
      ->check(positive_int())->group(g);
  // Tests only (tests/server): the engine loop throws at this step, as a fault escaping it would.
  cmd->add_option("--debug-fault-step", args->fault_at_step)->group("")->check(CLI::NonNegativeNumber);
  cmd->callback([args] { run_serve(*args); });
}

}  // namespace lychee::app
