#include "server/http.h"

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <httplib.h>

#include "core/error.h"
#include "core/log.h"

namespace lychee::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Per worker thread: what the log line of the request being answered reports.
thread_local Clock::time_point t_start;
thread_local int t_tokens = 0;

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status() == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status(), e.body());
}

}  // namespace

namespace {

// The accepted socket of a request: cpp-httplib 0.11 (Debian's) hands handlers no socket and has
// no is_connection_closed(), so a non-streaming request finds its descriptor by its peer address
// (the one open socket whose peer is remote_addr:remote_port). -1 when none matches.
int client_socket(const std::string& addr, int port) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    char text[INET6_ADDRSTRLEN] = {};
    int peer_port = -1;
    if (peer.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
      inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
      peer_port = ntohs(a->sin_port);
    } else if (peer.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
      inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
      peer_port = ntohs(a->sin6_port);
    }
    if (peer_port == port && addr == text) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

// Whether the client closed its side (end of stream or an error on the socket): as uvicorn
// reports a disconnect. HTTP clients do not half-close while they wait for a response.
bool client_gone(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace

struct HttpServer::Impl {
  HttpOptions options;
  Metrics& metrics;
  httplib::Server server;
  std::atomic<Scheduler*> scheduler{nullptr};
  ServerModel model;
  std::atomic<int> in_flight{0};
  // cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's
  // library): 64 clients connecting at once overflowed it, and one connection of a 10,000-request
  // GPU soak was reset before its request was read. The socket hook remembers the listening
  // socket; bind() raises its backlog to SOMAXCONN (Linux takes listen() again on it).
  int listen_socket = -1;

  Impl(const HttpOptions& o, Metrics& m) : options(o), metrics(m) {
    server.set_socket_options([this](socket_t s) {
      httplib::default_socket_options(s);
      listen_socket = int(s);
    });
  }
  void raise_backlog() const {
    if (listen_socket >= 0 && ::listen(listen_socket, SOMAXCONN) != 0)
      LY_LOG_WARN("could not raise the listen backlog to {}: {}", SOMAXCONN, std::strerror(errno));
  }

  // Counts a request in flight for its lifetime (a stream's lives in its content provider).
  struct InFlight {
    std::atomic<int>& n;
    explicit InFlight(std::atomic<int>& c) : n(c) { ++n; }
    ~InFlight() { --n; }
  };

  Scheduler& ready_scheduler() {
    Scheduler* s = scheduler.load();
    if (s == nullptr) throw ApiError(503, "the model is loading");
    return *s;
  }

  void routes();
  void completion(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  void stream(Endpoint endpoint, const CompletionRequest& parsed, std::shared_ptr<Request> request,
              ResponseMeta meta, httplib::Response& res);
};

void HttpServer::Impl::completion(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  InFlight guard(in_flight);
  try {
    Scheduler& sched = ready_scheduler();
    const CompletionRequest parsed = parse_request(endpoint, req.body);
    auto request = std::make_shared<Request>(make_params(parsed, model));
    ResponseMeta meta{random_id(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-"), int64_t(std::time(nullptr)),
                      model.id, model.fingerprint};
    sched.submit(request);
    if (parsed.stream) {
      stream(endpoint, parsed, std::move(request), std::move(meta), res);
      return;
    }
    // Non-streaming: wait for the finish, watching the connection so that a client that went
    // away cancels its request (its pages freed within a step), as a stream's does. The socket is
    // looked up only for a request still running 200 ms after it was submitted.
    const auto watch_from = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    int fd = -2;  // -2: not looked up yet; -1: not found
    RequestUpdate u;
    while (!u.done) {
      request->next(u, std::chrono::milliseconds(200));
      if (u.done || std::chrono::steady_clock::now() < watch_from) continue;
      if (fd == -2) fd = client_socket(req.remote_addr, req.remote_port);
      if (fd >= 0 && client_gone(fd)) {
        request->cancel();
        u = request->wait();
        return;  // nobody to answer
      }
    }
    t_tokens = u.usage.completion_tokens;
    if (u.finish_reason == "error") throw ApiError(500, u.error.empty() ? "generation failed" : u.error);
    const ChoiceResult choice{u.text, u.finish_reason, u.logprobs};
    send_json(res, 200, completion_response(endpoint, meta, choice, u.usage, parsed.logprobs));
  } catch (const ApiError& e) {
    metrics.count_request(e.status() == 503 ? "rejected" : e.status() >= 500 ? "error" : "invalid");
    send_error(res, e);
  } catch (const std::exception& e) {
    metrics.count_request("error");
    send_error(res, ApiError(500, e.what()));
  }
}

// Server-Sent Events: a chunk per update, a last chunk with finish_reason, the usage chunk when
// asked, then [DONE]. A write that fails (the client went away) cancels the request.
void HttpServer::Impl::stream(Endpoint endpoint, const CompletionRequest& parsed, std::shared_ptr<Request> request,
                              ResponseMeta meta, httplib::Response& res) {
  struct State {
    std::shared_ptr<Request> request;
    ResponseMeta meta;
    Endpoint endpoint;
    bool logprobs, include_usage;
    bool first = true;
    std::unique_ptr<InFlight> guard;
    ~State() {
      if (request) request->cancel();  // a no-op when it finished
    }
  };
  auto st = std::make_shared<State>();
  st->request = std::move(request);
  st->meta = std::move(meta);
  st->endpoint = endpoint;
  st->logprobs = parsed.logprobs;
  st->include_usage = parsed.include_usage;
  st->guard = std::make_unique<InFlight>(in_flight);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [st](size_t, httplib::DataSink& sink) {
    RequestUpdate u;
    if (!st->request->next(u, std::chrono::milliseconds(250))) {
      if (!sink.is_writable()) {
        st->request->cancel();
        return false;
      }
      return true;  // nothing yet: called again
    }
    std::string out;
    // A chunk per step that generated tokens, even when their text is empty or held back (a stop
    // string's prefix, an incomplete UTF-8 character, ids without text): clients time tokens.
    if (!u.text.empty() || u.tokens > 0 || (st->first && !u.done)) {
      out += sse_event(stream_chunk(st->endpoint, st->meta, u.text, st->logprobs ? &u.logprobs : nullptr, "",
                                    st->first, st->include_usage));
      st->first = false;
    }
    if (u.done) {
      t_tokens = u.usage.completion_tokens;
      if (u.finish_reason == "error") {
        out += sse_event(ApiError(500, u.error.empty() ? "generation failed" : u.error).body());
      } else if (u.finish_reason != "cancelled") {
        out += sse_event(stream_chunk(st->endpoint, st->meta, "", nullptr, u.finish_reason, st->first,
                                      st->include_usage));
        if (st->include_usage) out += sse_event(usage_chunk(st->endpoint, st->meta, u.usage));
      }
      out += kSseDone;
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) {
      st->request->cancel();
      return false;
    }
    if (u.done) {
      sink.done();
      st->guard.reset();
    }
    return true;
  });
}

void HttpServer::Impl::routes() {
  server.set_payload_max_length(options.max_body_bytes);
  const int n_threads = options.threads;
  server.new_task_queue = [n_threads] { return new httplib::ThreadPool(size_t(n_threads)); };

  server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    t_start = Clock::now();
    t_tokens = 0;
    if (options.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + options.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'", "",
                             "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own errors (unknown path 404, body too large 413, ...) get an OpenAI error body.
  server.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message = fmt::format("HTTP {}", res.status);
    if (res.status == 404) message = fmt::format("no such endpoint: {} {}", req.method, req.path);
    if (res.status == 413) message = "the request body is too large";
    if (res.status == 400) message = "malformed HTTP request";
    send_json(res, res.status, ApiError(res.status, message).body());
    return httplib::Server::HandlerResponse::Handled;
  }));
  server.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t_start).count();
    LY_LOG_INFO("{} {} {} tokens {} {:.0f} ms", req.method, req.path, res.status, t_tokens, ms);
  });

  server.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(Endpoint::kChat, req, res);
  });
  server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(Endpoint::kCompletion, req, res);
  });
  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    // 503 while the model loads and while draining (SIGTERM), so a load balancer stops sending.
    Scheduler* s = scheduler.load();
    if (s == nullptr) send_error(res, ApiError(503, "the model is loading"));
    else if (!s->healthy()) send_error(res, ApiError(503, fmt::format("the engine failed: {}", s->fault())));
    else if (s->draining()) send_error(res, ApiError(503, "the server is shutting down"));
    else send_json(res, 200, json{{"status", "ok"}});
  });
  server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    try {
      ready_scheduler();
      json m = {{"id", model.id}, {"object", "model"}, {"created", int64_t(std::time(nullptr))},
                {"owned_by", "lychee"}, {"context_length", model.context}};
      // As llama.cpp's server reports them: what a client needs to build token-id prompts.
      if (model.engine != nullptr) {
        const ModelConfig& c = model.engine->config();
        m["meta"] = {{"n_vocab", model.engine->tokenizer().vocab_size()}, {"n_vocab_model", c.vocab_size},
                     {"n_ctx", model.context}, {"n_ctx_train", c.max_context}, {"n_params", c.n_params()},
                     {"device", model.engine->device()}};
      }
      send_json(res, 200, json{{"object", "list"}, {"data", json::array({m})}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    Scheduler* s = scheduler.load();
    res.set_content(metrics.render(s ? s->gauges() : SchedulerGauges{}), "text/plain; version=0.0.4");
  });
  server.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      ready_scheduler();
      const TokenizeRequest t = parse_tokenize_request(req.body);
      const Tokenizer& tok = model.engine->tokenizer();
      send_json(res, 200, json{{"tokens", tok.encode(t.content, t.add_special && tok.add_bos_default(), true)}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  server.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      ready_scheduler();
      const std::vector<int32_t> ids = parse_detokenize_request(req.body);
      send_json(res, 200, json{{"content", model.engine->tokenizer().decode(ids)}});
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, ApiError(400, fmt::format("'tokens': {}", e.what()), "tokens"));
    }
  });
}

HttpServer::HttpServer(const HttpOptions& options, Metrics& metrics) : impl_(std::make_unique<Impl>(options, metrics)) {
  impl_->routes();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  const HttpOptions& o = impl_->options;
  if (o.port == 0) {
    const int port = impl_->server.bind_to_any_port(o.host);
    LY_CHECK(port > 0, ErrorCode::kInvalidArgument, "cannot listen on {} (any port)", o.host);
    impl_->raise_backlog();
    return port;
  }
  LY_CHECK(impl_->server.bind_to_port(o.host, o.port), ErrorCode::kInvalidArgument,
           "cannot listen on {}:{} (in use, or not an address of this machine)", o.host, o.port);
  impl_->raise_backlog();
  return o.port;
}

void HttpServer::listen() { impl_->server.listen_after_bind(); }

void HttpServer::attach(Scheduler& scheduler, const ServerModel& model) {
  impl_->model = model;
  impl_->scheduler.store(&scheduler);
}

void HttpServer::stop() {
  if (impl_->server.is_running()) impl_->server.stop();
}

int HttpServer::in_flight() const { return impl_->in_flight.load(); }

}  // namespace lychee::server
