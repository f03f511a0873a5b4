// The server's reception: one thread that reads every request whole (head and body, within size
// limits and deadlines) on non-blocking sockets before any HTTP worker sees it, so slow, stalled
// or oversized clients hold a connection slot, never a worker. cpp-httplib (http.cpp) then parses
// and answers a request that is already in memory; between the requests of a keep-alive
// connection the socket comes back here. Refusals (408, 411, 413, 431, 400, 503) are answered
// here, with the connection closed.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace lychee::server {

struct ReceptionLimits {
  size_t max_head_bytes = size_t(16) << 10;  // request line + headers + the blank line
  int max_header_count = 100;
  size_t max_body_bytes = size_t(8) << 20;   // Content-Length; bodies without one are refused (411)
  std::chrono::milliseconds head_timeout{10'000};  // connection or first byte -> end of the head
  std::chrono::milliseconds body_timeout{60'000};  // end of the head -> end of the body
  std::chrono::milliseconds idle_timeout{5'000};   // keep-alive: one request's answer -> the next's first byte
  int max_connections = 1024;                      // open at once: reading, queued and being answered
};

// A connection with one whole request at the front of `bytes` ([0, request_end)); what follows is
// the start of a pipelined next one.
struct Connection {
  int fd = -1;
  std::string bytes;
  size_t request_end = 0;
  int n_served = 0;          // requests answered on this connection before this one
  std::string remote_addr, local_addr;
  int remote_port = -1, local_port = -1;
};

class Reception {
 public:
  // `dispatch` runs on the reception thread and must not block: it hands the connection to a worker,
  // which calls resume() (keep-alive) or close() when the request is answered.
  using Dispatch = std::function<void(std::unique_ptr<Connection>)>;
  Reception(const ReceptionLimits& limits, Dispatch dispatch);
  ~Reception();
  // A newly accepted socket (any thread). Over max_connections it is answered 503 and closed.
  void admit(int fd);
  // The request at the front was answered and the connection stays open (any thread).
  void resume(std::unique_ptr<Connection> c);
  // The connection is done (any thread).
  void close(std::unique_ptr<Connection> c);
  // Closes every connection it holds; later admit/resume close theirs at once. Idempotent.
  void stop();
  int open_connections() const;
  const ReceptionLimits& limits() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Bytes made safe for a log line: control characters, backslash and non-ASCII bytes as \xNN
// escapes, cut to `max_bytes` of input with the full length noted.
std::string printable(std::string_view s, size_t max_bytes = 200);

}  // namespace lychee::server
