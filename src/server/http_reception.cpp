#include "server/http_reception.h"

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/error.h"
#include "core/json_io.h"
#include "core/log.h"
#include "server/schema.h"

namespace lychee::server {

using Clock = std::chrono::steady_clock;

std::string printable(std::string_view s, size_t max_bytes) {
  std::string out;
  const size_t n = std::min(s.size(), max_bytes);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\') out += fmt::format("\\x{:02x}", c);
    else out += char(c);
  }
  if (n < s.size()) out += fmt::format("...({} bytes)", s.size());
  return out;
}

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

const char* reason_phrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

// A whole response that closes the connection, with an OpenAI-style error body.
std::string refusal(int status, const std::string& message) {
  const std::string body = dump_json(ApiError(status, message).body());
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n{}",
                     status, reason_phrase(status), body.size(), status == 503 ? "Retry-After: 1\r\n" : "", body);
}

// Best effort on a non-blocking socket: a refusal or a 100 Continue is small enough for an empty
// send buffer, and a client that filled it is not owed an answer.
void send_all(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    s.remove_prefix(size_t(n));
  }
}

void address_of(const sockaddr_storage& a, std::string& addr, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof(text));
    port = ntohs(in->sin6_port);
  }
  addr = text;
}

// What the reception needs of a request head: its framing (Content-Length), the 100-continue
// it answers itself, and the request line for its log.
struct Head {
  std::string method, target;
  size_t content_length = 0;
  size_t expect_begin = 0, expect_end = 0;  // the "Expect: 100-continue" line, [begin, end) of the bytes
  int status = 0;                           // 0: fine; else the refusal
  std::string message;
};

Head parse_head(std::string_view head, const ReceptionLimits& limits) {
  Head h;
  auto fail = [&h](int status, std::string message) {
    h.status = status;
    h.message = std::move(message);
    return h;
  };
  size_t line_end = head.find("\r\n");
  const std::string_view request_line = head.substr(0, line_end);
  const size_t sp1 = request_line.find(' '), sp2 = request_line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1) return fail(400, "malformed HTTP request line");
  h.method = std::string(request_line.substr(0, sp1));
  h.target = std::string(request_line.substr(sp1 + 1, sp2 - sp1 - 1));
  bool have_length = false;
  int n_headers = 0;
  for (size_t begin = line_end + 2; begin < head.size(); begin = line_end + 2) {
    line_end = head.find("\r\n", begin);
    const std::string_view line = head.substr(begin, line_end - begin);
    if (line.empty()) break;  // the blank line that ends the head
    if (++n_headers > limits.max_header_count)
      return fail(431, fmt::format("more than {} header fields", limits.max_header_count));
    const size_t colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos || line.front() == ' ' || line.front() == '\t' ||
        trim(line.substr(0, colon)).size() != colon)
      return fail(400, fmt::format("malformed header field in line {} of the request head", n_headers + 1));
    const std::string_view name = line.substr(0, colon), value = trim(line.substr(colon + 1));
    if (iequals(name, "Transfer-Encoding"))
      return fail(411, "request bodies need a Content-Length (Transfer-Encoding is not accepted)");
    if (iequals(name, "Content-Length")) {
      uint64_t n = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (value.empty() || ec == std::errc::result_out_of_range) {
        if (ec == std::errc::result_out_of_range)
          return fail(413, fmt::format("the request body is too large (at most {} bytes)", limits.max_body_bytes));
        return fail(400, "invalid Content-Length");
      }
      if (ec != std::errc() || end != value.data() + value.size()) return fail(400, "invalid Content-Length");
      if (have_length && n != h.content_length) return fail(400, "conflicting Content-Length fields");
      have_length = true;
      h.content_length = size_t(n);
      if (n > limits.max_body_bytes)
        return fail(413, fmt::format("the request body of {} bytes is too large (at most {} bytes)", n,
                                     limits.max_body_bytes));
    }
    if (iequals(name, "Expect")) {
      if (!iequals(value, "100-continue")) return fail(400, "unsupported Expect field");
      h.expect_begin = begin;
      h.expect_end = line_end + 2;
    }
  }
  return h;
}

enum class Phase {
  kIdle,     // keep-alive, between requests
  kHead,     // reading the request head
  kBody,     // reading the body
  kClosing,  // refused: our side shut, discarding what the client still sends until it closes
};

struct Slot {
  std::unique_ptr<Connection> c;
  Phase phase = Phase::kHead;
  Clock::time_point deadline;
  size_t scanned = 0;  // bytes searched for the end of the head
  std::string method, target;
};

}  // namespace

struct Reception::Impl {
  ReceptionLimits limits;
  Dispatch dispatch;
  int epoll_fd = -1;
  int wake_fd = -1;
  std::atomic<int> n_open{0};
  std::atomic<bool> stopping{false};
  std::mutex inbox_mutex;
  std::vector<std::unique_ptr<Connection>> inbox;  // admitted or resumed, not yet watched
  std::unordered_map<int, Slot> slots;             // reception thread only
  std::thread thread;

  void wake() const {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof(one));
  }
  void finish(std::unique_ptr<Connection> c) {
    // Counted out before the close: a client that sees its connection end, and a caller of
    // open_connections() after that, must not find it still counted.
    --n_open;
    ::close(c->fd);
  }
  void drop(int fd) {
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    finish(std::move(slots.at(fd).c));
    slots.erase(fd);
  }
  void refuse(Slot& s, int status, const std::string& message) {
    LY_LOG_INFO("{} {} {} refused before a worker: {}", s.method.empty() ? "-" : printable(s.method),
                s.target.empty() ? "-" : printable(s.target), status, message);
    send_all(s.c->fd, refusal(status, message));
    ::shutdown(s.c->fd, SHUT_WR);
    // Closing with unread bytes would reset the connection and could destroy the answer before the
    // client reads it: the rest is read and dropped until the client closes, for a second at most.
    s.phase = Phase::kClosing;
    s.deadline = Clock::now() + std::chrono::seconds(1);
  }
  void watch(std::unique_ptr<Connection> c);
  void on_readable(int fd);
  void progress(int fd);
  void expire();
  void loop();
};

void Reception::Impl::watch(std::unique_ptr<Connection> c) {
  const int fd = c->fd;
  if (stopping) return finish(std::move(c));
  Slot s;
  s.phase = c->bytes.empty() && c->n_served > 0 ? Phase::kIdle : Phase::kHead;
  s.deadline = Clock::now() + (s.phase == Phase::kIdle ? limits.idle_timeout : limits.head_timeout);
  s.c = std::move(c);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    LY_LOG_WARN("reception: cannot watch socket {}: {}", fd, std::strerror(errno));
    return finish(std::move(s.c));
  }
  slots.emplace(fd, std::move(s));
  progress(fd);  // a pipelined next request may be here already
}

void Reception::Impl::on_readable(int fd) {
  Slot& s = slots.at(fd);
  std::string& b = s.c->bytes;
  // Read no further than the request needs: its head (and a little body) or its whole body.
  const size_t cap = s.phase == Phase::kBody ? s.c->request_end : limits.max_head_bytes + (size_t(64) << 10);
  char chunk[64 << 10];
  while (s.phase == Phase::kClosing || b.size() < cap) {
    const size_t want = s.phase == Phase::kClosing ? sizeof(chunk) : std::min(sizeof(chunk), cap - b.size());
    const ssize_t n = ::recv(fd, chunk, want, 0);
    if (n == 0) {  // the client closed, or only its sending side: a whole request there is still answered
      if (s.phase != Phase::kClosing) progress(fd);
      if (slots.count(fd) != 0) drop(fd);
      return;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      return drop(fd);
    }
    if (s.phase != Phase::kClosing) b.append(chunk, size_t(n));
  }
  if (s.phase != Phase::kClosing) progress(fd);
}

void Reception::Impl::progress(int fd) {
  Slot& s = slots.at(fd);
  Connection& c = *s.c;
  if (s.phase == Phase::kIdle && !c.bytes.empty()) {
    s.phase = Phase::kHead;
    s.deadline = Clock::now() + limits.head_timeout;
  }
  if (s.phase == Phase::kHead) {
    const size_t from = s.scanned >= 3 ? s.scanned - 3 : 0;
    const size_t at = c.bytes.find("\r\n\r\n", from);
    if (at == std::string::npos || at + 4 > limits.max_head_bytes) {
      s.scanned = c.bytes.size();
      if (c.bytes.size() > limits.max_head_bytes)
        refuse(s, 431, fmt::format("the request head exceeds {} bytes", limits.max_head_bytes));
      return;
    }
    size_t head_end = at + 4;
    Head h = parse_head(std::string_view(c.bytes).substr(0, head_end), limits);
    s.method = std::move(h.method);
    s.target = std::move(h.target);
    if (h.status != 0) return refuse(s, h.status, h.message);
    if (h.expect_end > 0) {
      // Answered here (the body is read here); the line goes so that the parser does not answer again.
      c.bytes.erase(h.expect_begin, h.expect_end - h.expect_begin);
      head_end -= h.expect_end - h.expect_begin;
      if (h.content_length > 0 && c.bytes.size() < head_end + h.content_length)
        send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n");
    }
    c.request_end = head_end + h.content_length;
    s.phase = Phase::kBody;
    s.deadline = Clock::now() + limits.body_timeout;
  }
  if (s.phase == Phase::kBody && c.bytes.size() >= c.request_end) {
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    std::unique_ptr<Connection> whole = std::move(s.c);
    slots.erase(fd);
    dispatch(std::move(whole));
  }
}

void Reception::Impl::expire() {
  const auto now = Clock::now();
  std::vector<int> late;
  for (const auto& [fd, s] : slots)
    if (now >= s.deadline) late.push_back(fd);
  for (int fd : late) {
    Slot& s = slots.at(fd);
    if (s.phase == Phase::kIdle || s.phase == Phase::kClosing) {
      drop(fd);
    } else if (s.phase == Phase::kHead && s.c->bytes.empty()) {
      drop(fd);  // connected and never sent a byte: no request to answer
    } else {
      const auto limit = s.phase == Phase::kHead ? limits.head_timeout : limits.body_timeout;
      refuse(s, 408, fmt::format("the request {} did not arrive within {} ms", s.phase == Phase::kHead ? "head" : "body",
                                 limit.count()));
    }
  }
}

void Reception::Impl::loop() {
  epoll_event events[64];
  while (!stopping) {
    const int n = epoll_wait(epoll_fd, events, 64, 100);  // the deadlines are checked at least every 100 ms
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd) {
        uint64_t count = 0;
        [[maybe_unused]] const ssize_t r = ::read(wake_fd, &count, sizeof(count));
      } else if (slots.count(fd) != 0) {
        on_readable(fd);
      }
    }
    std::vector<std::unique_ptr<Connection>> arrived;
    {
      std::lock_guard lock(inbox_mutex);
      arrived.swap(inbox);
    }
    for (auto& c : arrived) watch(std::move(c));
    expire();
  }
}

Reception::Reception(const ReceptionLimits& limits, Dispatch dispatch) : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  impl_->dispatch = std::move(dispatch);
  impl_->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  impl_->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  LY_CHECK(impl_->epoll_fd >= 0 && impl_->wake_fd >= 0, ErrorCode::kInternal, "reception: epoll/eventfd: {}",
           std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = impl_->wake_fd;
  epoll_ctl(impl_->epoll_fd, EPOLL_CTL_ADD, impl_->wake_fd, &ev);
  impl_->thread = std::thread([impl = impl_.get()] { impl->loop(); });
}

Reception::~Reception() {
  stop();
  ::close(impl_->wake_fd);
  ::close(impl_->epoll_fd);
}

void Reception::admit(int fd) {
  if (impl_->stopping || impl_->n_open.load() >= impl_->limits.max_connections) {
    if (!impl_->stopping)
      LY_LOG_INFO("connection refused: {} connections are open (the limit)", impl_->limits.max_connections);
    send_all(fd, refusal(503, fmt::format("too many connections (at most {})", impl_->limits.max_connections)));
    ::close(fd);
    return;
  }
  ++impl_->n_open;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  auto c = std::make_unique<Connection>();
  c->fd = fd;
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) address_of(a, c->remote_addr, c->remote_port);
  len = sizeof(a);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) address_of(a, c->local_addr, c->local_port);
  resume(std::move(c));
}

void Reception::resume(std::unique_ptr<Connection> c) {
  {
    std::lock_guard lock(impl_->inbox_mutex);
    if (!impl_->stopping) {
      impl_->inbox.push_back(std::move(c));
      impl_->wake();
      return;
    }
  }
  close(std::move(c));
}

void Reception::close(std::unique_ptr<Connection> c) { impl_->finish(std::move(c)); }

void Reception::stop() {
  {
    std::lock_guard lock(impl_->inbox_mutex);
    if (impl_->stopping.exchange(true)) return;
    impl_->wake();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
  for (auto& [fd, s] : impl_->slots) impl_->finish(std::move(s.c));
  impl_->slots.clear();
  for (auto& c : impl_->inbox) impl_->finish(std::move(c));
  impl_->inbox.clear();
}

int Reception::open_connections() const { return impl_->n_open.load(); }

const ReceptionLimits& Reception::limits() const { return impl_->limits; }

}  // namespace lychee::server
