// The HTTP face of the server (cpp-httplib): OpenAI's /v1/chat/completions, /v1/completions and
// /v1/models, /health, /metrics, and llama.cpp's /tokenize and /detokenize. The reception
// (http_reception.h) reads each request whole before a worker thread gets it; workers parse,
// validate, submit to the Scheduler and stream; they never touch the engine's sessions.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/http_reception.h"
#include "server/metrics.h"
#include "server/params.h"
#include "server/scheduler.h"

namespace lychee::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0 = any free port
  std::string api_key;                   // "" = no authentication
  int threads = 64;                      // HTTP worker threads (each streaming or waiting request holds one;
                                         // lychee serve: max_running + max_queue + 16, at least 64)
  ReceptionLimits limits;                // request size, deadlines, open connections (capped by RLIMIT_NOFILE)
};

class HttpServer {
 public:
  HttpServer(const HttpOptions& options, Metrics& metrics);
  ~HttpServer();
  // Binds the socket; Error(kInvalidArgument) naming host and port when it cannot. Returns the port.
  int bind();
  // Serves until stop() (blocking). Before attach(), /health answers 503 and generation 503.
  void listen();
  // The model is loaded: requests go to `scheduler`.
  void attach(Scheduler& scheduler, const ServerModel& model);
  void stop();
  // Requests being answered (a stream counts until its last chunk is written).
  int in_flight() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lychee::server
