#include "server/http.h"

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>

#include <arpa/inet.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

// The listener's backlog (cpp-httplib's default is 5: 64 clients connecting at once overflowed it
// in a 10,000-request GPU soak); the kernel caps it at net.core.somaxconn.
#define CPPHTTPLIB_LISTEN_BACKLOG SOMAXCONN
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
thread_local std::string t_request_id;

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

constexpr size_t kMaxRequestIdBytes = 128;

// The client's (or a router's) X-Request-Id when it is 1..128 visible ASCII characters, else a new
// one: the id goes back in the response's X-Request-Id and into the request's log line, so a
// request can be followed from the client through a router to this replica's log.
std::string request_id(const httplib::Request& req) {
  const std::string given = req.get_header_value("X-Request-Id");
  bool ok = !given.empty() && given.size() <= kMaxRequestIdBytes;
  for (char c : given) ok = ok && c > 0x20 && c < 0x7f;
  return ok ? given : random_id("req-");
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

constexpr int kWriteTimeoutMs = 5000;   // one blocked write of a response (cpp-httplib's default)
constexpr int kKeepAliveMaxCount = 100; // requests on one connection (cpp-httplib's default)

// Equal keys, in a time that depends on the expected key's length only (not on where they differ).
bool same_key(std::string_view given, std::string_view expected) {
  volatile unsigned char diff = given.size() != expected.size();
  for (size_t i = 0; i < expected.size(); ++i)
    diff = diff | static_cast<unsigned char>((i < given.size() ? given[i] : 0) ^ expected[i]);
  return diff == 0;
}

// "127.0.0.1:8080" -> "127.0.0.1", "[::1]:8080" -> "[::1]", "localhost" -> "localhost".
std::string_view host_part(std::string_view authority) {
  if (!authority.empty() && authority.front() == '[') return authority.substr(0, authority.find(']') + 1);
  return authority.substr(0, authority.find(':'));
}

bool loopback_host(std::string_view host) {
  in_addr a{};
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  return inet_pton(AF_INET, std::string(host).c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

// One request, already read whole by the reception (its bytes in memory); writes go to the socket.
class RequestStream final : public httplib::Stream {
 public:
  explicit RequestStream(const Connection& c) : c_(c) {}
  bool is_readable() const override { return pos_ < c_.request_end; }
  bool is_writable() const override { return wait_writable() && alive(); }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, c_.request_end - pos_);
    std::memcpy(ptr, c_.bytes.data() + pos_, n);
    pos_ += n;
    return ssize_t(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!wait_writable()) return -1;
    const ssize_t n = ::send(c_.fd, ptr, size, MSG_NOSIGNAL);
    return n < 0 && (errno == EAGAIN || errno == EINTR) ? 0 : n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.remote_addr;
    port = c_.remote_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.local_addr;
    port = c_.local_port;
  }
  socket_t socket() const override { return c_.fd; }

 private:
  bool wait_writable() const {
    pollfd p{c_.fd, POLLOUT, 0};
    return ::poll(&p, 1, kWriteTimeoutMs) > 0 && (p.revents & POLLOUT) != 0;
  }
  // The client has not closed its side (HTTP clients do not half-close while they wait).
  bool alive() const {
    pollfd p{c_.fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return true;
    char byte;
    return (p.revents & (POLLERR | POLLHUP | POLLRDHUP)) == 0 && ::recv(c_.fd, &byte, 1, MSG_PEEK) > 0;
  }
  const Connection& c_;
  size_t pos_ = 0;
};

// cpp-httplib's server with the reception in front: the listener's accepted sockets go to the
// reception (its own per-socket routine, overridden), and a worker answers one whole request with
// the library's parser, router and writer (process_request).
class Core final : public httplib::Server {
 public:
  std::function<void(int)> accepted;
  bool answer(const Connection& c, bool close_connection, bool& connection_closed) {
    RequestStream strm(c);
    return process_request(strm, c.remote_addr, c.remote_port, c.local_addr, c.local_port, close_connection,
                           connection_closed, nullptr);
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    accepted(int(sock));
    return true;
  }
};

// The listener's queue runs its task at once: the task hands the socket to the reception.
class InlineQueue final : public httplib::TaskQueue {
 public:
  bool enqueue(std::function<void()> fn) override {
    fn();
    return true;
  }
  void shutdown() override {}
};

}  // namespace

struct HttpServer::Impl {
  HttpOptions options;
  Metrics& metrics;
  Core server;
  std::unique_ptr<httplib::ThreadPool> workers;
  std::atomic<bool> workers_joined{false};
  std::unique_ptr<Reception> reception;
  bool loopback = false;        // bound to a loopback address: Host and Origin must name one
  size_t max_prompt_bytes = 0;  // set by attach(): longer text cannot fit the context
  std::atomic<Scheduler*> scheduler{nullptr};
  ServerModel model;
  std::atomic<int> in_flight{0};
  Impl(const HttpOptions& o, Metrics& m) : options(o), metrics(m) {
    loopback = loopback_host(options.host);
    ReceptionLimits limits = options.limits;
    // Each connection is a descriptor: stay clear of the process's limit (model files, the listener).
    rlimit files{};
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY &&
        rlim_t(limits.max_connections) + 64 > files.rlim_cur) {
      limits.max_connections = std::max(16, int(files.rlim_cur) - 64);
      LY_LOG_WARN("at most {} open connections (the descriptor limit is {}; raise it with ulimit -n)",
                  limits.max_connections, files.rlim_cur);
    }
    workers = std::make_unique<httplib::ThreadPool>(size_t(options.threads));
    reception = std::make_unique<Reception>(limits, [this](std::unique_ptr<Connection> c) {
      Connection* raw = c.release();
      if (!workers->enqueue([this, raw] { answer(std::unique_ptr<Connection>(raw)); }))
        reception->close(std::unique_ptr<Connection>(raw));
    });
    server.accepted = [this](int fd) { reception->admit(fd); };
    server.new_task_queue = [] { return new InlineQueue; };
  }

  // A worker: one request answered; the connection goes back to the reception or is closed.
  void answer(std::unique_ptr<Connection> c) {
    const bool last = c->n_served + 1 >= kKeepAliveMaxCount;
    bool closed = false;
    const bool ok = server.answer(*c, last, closed);
    if (!ok || closed || last) return reception->close(std::move(c));
    // The reception framed the request: bytes a handler left unread (a refused request's body) go too.
    c->bytes.erase(0, c->request_end);
    if (c->bytes.capacity() > (size_t(64) << 10)) c->bytes.shrink_to_fit();  // an idle connection keeps no 8 MiB body
    c->request_end = 0;
    ++c->n_served;
    reception->resume(std::move(c));
  }

  void check_prompt_bytes(size_t n_bytes, const char* field) const;
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

// Before any tokenizing: a token covers at most the longest piece's bytes, and Unicode
// normalisation shortens text at most 3x (three jamo compose into one Hangul syllable), so text
// longer than 3 x context x that cannot fit and is refused without being tokenized.
void HttpServer::Impl::check_prompt_bytes(size_t n_bytes, const char* field) const {
  if (n_bytes <= max_prompt_bytes) return;
  throw ApiError(400, fmt::format("'{}': the text is {} bytes, more than a context of {} tokens can hold (at most "
                                  "{} bytes: 3 x the context x the longest token's {} bytes)",
                                  field, n_bytes, model.context, max_prompt_bytes,
                                  max_prompt_bytes / 3 / size_t(std::max(1, model.context))),
                 field, "context_length_exceeded");
}

void HttpServer::Impl::completion(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  InFlight guard(in_flight);
  try {
    Scheduler& sched = ready_scheduler();
    const CompletionRequest parsed = parse_request(endpoint, req.body);
    size_t n_bytes = parsed.prompt.size();
    for (const ChatMessageIn& m : parsed.messages) n_bytes += m.content.size();
    check_prompt_bytes(n_bytes, endpoint == Endpoint::kChat ? "messages" : "prompt");
    auto request = std::make_shared<Request>(make_params(parsed, model));
    ResponseMeta meta{random_id(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-"), int64_t(std::time(nullptr)),
                      model.id, model.fingerprint};
    sched.submit(request);
    if (parsed.stream) {
      stream(endpoint, parsed, std::move(request), std::move(meta), res);
      return;
    }
    // Non-streaming: wait for the finish, watching the connection so that a client that went
    // away cancels its request (its pages freed within a step), as a stream's does.
    RequestUpdate u;
    while (!u.done) {
      request->next(u, std::chrono::milliseconds(200));
      if (!u.done && req.is_connection_closed()) {
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
  server.set_payload_max_length(options.limits.max_body_bytes);  // the reception refuses longer ones first

  // The request was read whole by the reception, so a refusal here leaves nothing unread on a
  // keep-alive connection (Impl::answer drops the body by the reception's framing).
  server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    t_start = Clock::now();
    t_tokens = 0;
    t_request_id = request_id(req);
    res.set_header("X-Request-Id", t_request_id);  // on every answer, refusals included
    // Bound to loopback, only local names may be asked for: a web page whose name an attacker
    // points at 127.0.0.1 (DNS rebinding) sends its own Host, and a page's cross-site requests
    // carry its Origin. (On other addresses the API key is the guard: docs/serving-security.md.)
    if (loopback) {
      const std::string host = req.get_header_value("Host");
      if (!host.empty() && !loopback_host(host_part(host))) {
        send_error(res, ApiError(403, fmt::format("Host '{}' is not this server's: it listens on loopback only",
                                                  printable(host, 100))));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (req.has_header("Origin")) {
        const std::string origin = req.get_header_value("Origin");
        const size_t scheme = origin.find("://");
        const std::string_view authority =
            scheme == std::string::npos ? std::string_view() : std::string_view(origin).substr(scheme + 3);
        if (!loopback_host(host_part(authority.substr(0, authority.find('/'))))) {
          send_error(res, ApiError(403, fmt::format("requests from web pages of Origin '{}' are not accepted",
                                                    printable(origin, 100))));
          return httplib::Server::HandlerResponse::Handled;
        }
      }
    }
    if (options.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (auth.size() >= kBearer.size() && std::string_view(auth).substr(0, kBearer.size()) == kBearer &&
        same_key(std::string_view(auth).substr(kBearer.size()), options.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'", "",
                             "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own errors (unknown path 404, body too large 413, ...) get an OpenAI error body.
  server.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message = fmt::format("HTTP {}", res.status);
    if (res.status == 404) message = fmt::format("no such endpoint: {} {}", printable(req.method), printable(req.path));
    if (res.status == 413) message = "the request body is too large";
    if (res.status == 400) message = "malformed HTTP request";
    send_json(res, res.status, ApiError(res.status, message).body());
    return httplib::Server::HandlerResponse::Handled;
  }));
  server.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    // A malformed request never reached the pre-routing handler (no id, no start time of its own).
    const bool routed = !t_request_id.empty();
    const double ms = routed ? std::chrono::duration<double, std::milli>(Clock::now() - t_start).count() : 0.0;
    // The path is the client's (percent-decoded: it may hold newlines and terminal escapes).
    LY_LOG_INFO("{} {} {} tokens {} {:.0f} ms id {}", printable(req.method), printable(req.path), res.status,
                routed ? t_tokens : 0, ms, routed ? t_request_id : "-");
    t_request_id.clear();
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
                     {"device", model.engine->device()},
                     {"kv_cache_dtype", kv_cache_dtype_name(model.engine->kv_cache_dtype())}};
      }
      send_json(res, 200, json{{"object", "list"}, {"data", json::array({m})}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  // What a router reads from a worker (sglang-router, docs/serving.md "Past one GPU"): the model's
  // name when the worker joins (SGLang's /server_info and /model_info, and their older /get_
  // names, which the router tries after a 404), and the load its power_of_two policy polls.
  // No model_path: the router would try to load a tokenizer from it (an HF download).
  const auto server_info = [this](const httplib::Request&, httplib::Response& res) {
    try {
      Scheduler& sched = ready_scheduler();
      send_json(res, 200, json{{"served_model_name", model.id}, {"version", model.version},
                               {"context_length", model.context}, {"max_running_requests", sched.max_running()},
                               {"max_total_tokens", sched.kv_capacity() * sched.page_tokens()},
                               {"device", model.engine != nullptr ? model.engine->device() : ""}});
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  };
  server.Get("/server_info", server_info);
  server.Get("/get_server_info", server_info);
  const auto model_info = [this](const httplib::Request&, httplib::Response& res) {
    try {
      ready_scheduler();
      json info = {{"served_model_name", model.id}, {"is_generation", true}};
      if (model.engine != nullptr) info["model_type"] = arch_name(model.engine->config().arch);
      send_json(res, 200, info);
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  };
  server.Get("/model_info", model_info);
  server.Get("/get_model_info", model_info);
  // SGLang's shape: one entry per data-parallel rank (here one); num_tokens is what the router
  // compares: the KV tokens reserved by admitted requests.
  server.Get("/get_load", [this](const httplib::Request&, httplib::Response& res) {
    try {
      const SchedulerGauges g = ready_scheduler().gauges();
      send_json(res, 200, json::array({json{{"dp_rank", 0}, {"num_reqs", g.running + g.waiting},
                                            {"num_waiting_reqs", g.waiting},
                                            {"num_tokens", g.kv_pages_used * g.page_tokens}}}));
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
      check_prompt_bytes(t.content.size(), "content");
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
    return port;
  }
  LY_CHECK(impl_->server.bind_to_port(o.host, o.port), ErrorCode::kInvalidArgument,
           "cannot listen on {}:{} (in use, or not an address of this machine)", o.host, o.port);
  return o.port;
}

void HttpServer::listen() { impl_->server.listen_after_bind(); }

void HttpServer::attach(Scheduler& scheduler, const ServerModel& model) {
  impl_->model = model;
  size_t longest = 1;
  if (model.engine != nullptr) {
    const Tokenizer& tok = model.engine->tokenizer();
    for (int32_t id = 0; id < tok.vocab_size(); ++id) longest = std::max(longest, tok.token_piece(id).size());
  }
  impl_->max_prompt_bytes = 3 * size_t(std::max(1, model.context)) * longest;
  impl_->scheduler.store(&scheduler);
}

void HttpServer::stop() {
  if (impl_->server.is_running()) impl_->server.stop();
  impl_->reception->stop();  // no more requests reach the workers; the ones they answer finish
  if (!impl_->workers_joined.exchange(true)) impl_->workers->shutdown();  // joins: once only
}

int HttpServer::in_flight() const { return impl_->in_flight.load(); }

}  // namespace lychee::server
