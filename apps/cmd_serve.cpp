// lychee serve: the OpenAI-compatible HTTP server (src/server). Binds first (so a port in use
// fails at once), answers /health with 503 while the model loads, then serves until SIGTERM or
// SIGINT: admission stops (503), running requests finish (up to --drain-seconds), exit 0.
#include <pthread.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "app.h"
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
  int prefill_chunk = 512;
  int64_t prefix_cache = -1;
  double drain_seconds = 30.0;
  std::string random_weights;
};

// The KV pool in tokens: --kv-memory over the bytes a token's K and V take in every layer (f32
// on the CPU, bf16 on the GPU); 0 = the scheduler's default (max running x context).
int64_t kv_tokens(const ServeArgs& a, const Engine& engine) {
  if (a.model.kv_memory_gib <= 0.0) return 0;
  const ModelConfig& c = engine.config();
  const int64_t elem_bytes = engine.device() == "cuda" ? 2 : 4;
  const int64_t per_token = int64_t(c.n_layers) * c.n_kv_heads * c.head_dim * 2 * elem_bytes;
  return int64_t(a.model.kv_memory_gib * double(1ull << 30)) / per_token;
}

std::string model_id(const ServeArgs& a, const Engine& engine) {
  if (!a.model_name.empty()) return a.model_name;
  if (!a.random_weights.empty()) return a.random_weights + "-random";
  if (!a.model.model.empty() && !std::filesystem::exists(a.model.model)) return a.model.model;  // an HF id
  std::filesystem::path p(engine.checkpoint().path());
  if (p.filename().empty()) p = p.parent_path();  // a directory given with a trailing slash
  return p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
}

void run_serve(const ServeArgs& a) {
  if (log_level() > LogLevel::kInfo && log_level() < LogLevel::kError) set_log_level(LogLevel::kInfo);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not a dead server
  // SIGINT/SIGTERM go to sigwait below: blocked here, before any thread starts, so every thread
  // inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

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
  std::thread listener([&http] { http.listen(); });
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
    scheduler = std::make_unique<server::Scheduler>(*engine, so, &metrics);
  } catch (...) {
    http.stop();
    listener.join();
    throw;
  }
  server::ServerModel sm{engine.get(), model_id(a, *engine), a.policy, scheduler->context()};
  http.attach(*scheduler, sm);
  std::fprintf(stderr, "lychee serve: listening on http://%s:%d (model %s, device %s)\n", a.host.c_str(), port,
               sm.id.c_str(), engine->device().c_str());
  std::fflush(stderr);

  int sig = 0;
  sigwait(&signals, &sig);
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
  args->model.add(*cmd);
  args->policy.add(*cmd);
  cmd->add_option("--host", args->host, "Address to listen on (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", args->port, "Port to listen on (0 = any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", args->api_key, "Require 'Authorization: Bearer KEY' (default: $LYCHEE_API_KEY)");
  cmd->add_option("--model-name", args->model_name, "The model id clients pass (default: the file name)");
  cmd->add_option("--max-running", args->max_running, "Sequences decoded together")->check(positive_int());
  cmd->add_option("--max-queue", args->max_queue, "Requests waiting for admission; more get 503")->check(non_negative_int());
  cmd->add_option("--prefill-chunk", args->prefill_chunk, "Prompt token-equivalents prefilled per scheduler step (a token deep in a long prompt weighs more: its attention work)")->check(positive_int());
  cmd->add_option("--prefix-cache", args->prefix_cache,
                  "KV tokens finished prompts may keep for reuse by later prompts that start the same way "
                  "(default: half the pool; 0 = off)")->check(CLI::Range(int64_t(-1), int64_t(1) << 40));
  cmd->add_option("--random-weights", args->random_weights,
                  "Benchmarks, GPU only: serve a model of this shape (llama3-8b, smollm2-135m) with seeded random "
                  "bf16 weights (decode time does not depend on them); -m's tokenizer and chat template")
      ->check(CLI::IsMember(model_shape_names()));
  cmd->add_option("--drain-seconds", args->drain_seconds, "On SIGTERM: how long running requests may finish")
      ->check(non_negative_real());
  cmd->callback([args] { run_serve(*args); });
}

}  // namespace lychee::app
