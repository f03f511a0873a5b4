// The server's reception (src/server/http_reception.h): a request reaches a worker only whole, and
// slow, oversized or unframed requests are refused with the right status, on socket pairs.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "server/http_reception.h"

namespace lychee::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A reception whose dispatched connections wait in a queue for the test to take.
struct Harness {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Connection>> ready;
  Reception reception;

  explicit Harness(const ReceptionLimits& limits)
      : reception(limits, [this](std::unique_ptr<Connection> c) {
          std::lock_guard lock(mutex);
          ready.push_back(std::move(c));
          cv.notify_all();
        }) {}
  // A connected client: its server side admitted. Returns the client's socket.
  int connect() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    reception.admit(fds[0]);
    return fds[1];
  }
  std::unique_ptr<Connection> take(std::chrono::milliseconds within) {
    std::unique_lock lock(mutex);
    if (!cv.wait_for(lock, within, [this] { return !ready.empty(); })) return nullptr;
    auto c = std::move(ready.front());
    ready.pop_front();
    return c;
  }
};

void send_text(int fd, const std::string& s) { ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), ssize_t(s.size())); }

// What the client receives until the server closes (or `within` passes).
std::string receive_until_closed(int fd, std::chrono::milliseconds within) {
  std::string out;
  const auto end = Clock::now() + within;
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
    if (::poll(&p, 1, int(std::max<int64_t>(1, left.count()))) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

ReceptionLimits small_limits() {
  ReceptionLimits l;
  l.max_head_bytes = 1024;
  l.max_header_count = 8;
  l.max_body_bytes = 4096;
  l.head_timeout = 300ms;
  l.body_timeout = 300ms;
  l.idle_timeout = 200ms;
  l.max_connections = 4;
  return l;
}

TEST(Reception, DispatchesARequestOnlyWhenItsBodyIsWholeAndKeepsWhatFollows) {
  Harness h(small_limits());
  const int client = h.connect();
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n";
  send_text(client, head + "01234");
  EXPECT_EQ(h.take(100ms), nullptr) << "dispatched before its body arrived";
  const std::string next = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  send_text(client, "56789" + next);
  auto c = h.take(2000ms);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->request_end, head.size() + 10);
  EXPECT_EQ(c->bytes.substr(0, c->request_end), head + "0123456789");
  // A worker answered it: the pipelined request is dispatched from the bytes already read.
  c->bytes.erase(0, c->request_end);
  ++c->n_served;
  h.reception.resume(std::move(c));
  auto second = h.take(2000ms);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->bytes.substr(0, second->request_end), next);
  EXPECT_EQ(second->n_served, 1);
  h.reception.close(std::move(second));
  EXPECT_EQ(h.reception.open_connections(), 0);
  ::close(client);
}

TEST(Reception, AnswersAWholeRequestFromAClientThatClosedItsSendingSide) {
  Harness h(small_limits());
  const int client = h.connect();
  send_text(client, "GET /health HTTP/1.1\r\n\r\n");
  ::shutdown(client, SHUT_WR);
  auto c = h.take(2000ms);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->bytes.substr(0, c->request_end), "GET /health HTTP/1.1\r\n\r\n");
  h.reception.close(std::move(c));
  ::close(client);
}

TEST(Reception, AHeadTrickledPastItsDeadlineGets408) {
  Harness h(small_limits());
  const int client = h.connect();
  const auto start = Clock::now();
  // A byte every 50 ms: never idle long, but the head as a whole is late.
  const std::string head = "GET /health HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  std::string got;
  for (char ch : head) {
    if (::send(client, &ch, 1, MSG_NOSIGNAL) != 1) break;
    std::this_thread::sleep_for(50ms);
    if (Clock::now() - start > 800ms) break;
  }
  got = receive_until_closed(client, 2000ms);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  EXPECT_EQ(got.substr(0, 12), "HTTP/1.1 408") << got;
  EXPECT_LT(ms, 2500.0);
  EXPECT_EQ(h.take(0ms), nullptr);
  ::close(client);
}

TEST(Reception, RefusesOversizedOrUnframedRequestsBeforeAWorker) {
  struct Case {
    std::string request, status, part;
  };
  const std::string many_fields = [] {
    std::string s = "GET / HTTP/1.1\r\n";
    for (int i = 0; i < 9; ++i) s += "X-F" + std::to_string(i) + ": v\r\n";
    return s + "\r\n";
  }();
  const Case cases[] = {
      {"GET / HTTP/1.1\r\nX-Big: " + std::string(2000, 'a'), "431", "1024 bytes"},
      {many_fields, "431", "more than 8 header fields"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", "411", "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n", "413", "at most 4096 bytes"},
      {"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", "413", "at most 4096 bytes"},
      {"POST / HTTP/1.1\r\nContent-Length: 12x\r\n\r\n", "400", "Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", "400", "conflicting"},
      {"GARBAGE\r\n\r\n", "400", "request line"},
  };
  for (const Case& k : cases) {
    Harness h(small_limits());
    const int client = h.connect();
    send_text(client, k.request);
    const std::string got = receive_until_closed(client, 3000ms);
    EXPECT_EQ(got.substr(0, 12), "HTTP/1.1 " + k.status) << k.request.substr(0, 60) << " -> " << got;
    EXPECT_NE(got.find(k.part), std::string::npos) << got;
    EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
    EXPECT_EQ(h.take(0ms), nullptr);
    ::close(client);
  }
}

TEST(Reception, CapsOpenConnectionsAndClosesIdleOnes) {
  Harness h(small_limits());  // at most 4 connections
  int clients[4];
  for (int& c : clients) c = h.connect();
  EXPECT_EQ(h.reception.open_connections(), 4);
  const int fifth = h.connect();
  const std::string got = receive_until_closed(fifth, 2000ms);
  EXPECT_EQ(got.substr(0, 12), "HTTP/1.1 503") << got;
  EXPECT_EQ(h.reception.open_connections(), 4);
  ::close(fifth);
  // Connected and silent past the head deadline: closed without an answer.
  for (int c : clients) EXPECT_EQ(receive_until_closed(c, 2000ms), "");
  EXPECT_EQ(h.reception.open_connections(), 0);
  for (int c : clients) ::close(c);
  // Keep-alive: a connection back from its worker with nothing more is closed after idle_timeout.
  const int client = h.connect();
  send_text(client, "GET / HTTP/1.1\r\n\r\n");
  auto c = h.take(2000ms);
  ASSERT_NE(c, nullptr);
  c->bytes.clear();
  ++c->n_served;
  h.reception.resume(std::move(c));
  const auto start = Clock::now();
  EXPECT_EQ(receive_until_closed(client, 2000ms), "");
  EXPECT_LT(Clock::now() - start, 1500ms);
  EXPECT_EQ(h.reception.open_connections(), 0);
  ::close(client);
}

TEST(Reception, AnswersExpectContinueItselfAndDropsTheField) {
  Harness h(small_limits());
  const int client = h.connect();
  send_text(client, "POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  pollfd p{client, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  char buf[64] = {};
  const ssize_t n = ::recv(client, buf, sizeof(buf), 0);
  EXPECT_EQ(std::string(buf, size_t(std::max<ssize_t>(n, 0))), "HTTP/1.1 100 Continue\r\n\r\n");
  send_text(client, "{}");
  auto c = h.take(2000ms);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->bytes.substr(0, c->request_end), "POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
  h.reception.close(std::move(c));
  ::close(client);
}

TEST(Reception, PrintableEscapesControlBytesAndCuts) {
  EXPECT_EQ(printable("/v1/x\r\nINJECTED \x1b[31m\\"), "/v1/x\\x0d\\x0aINJECTED \\x1b[31m\\x5c");
  EXPECT_EQ(printable(std::string(300, 'a'), 4), "aaaa...(300 bytes)");
  EXPECT_EQ(printable("caf\xc3\xa9"), "caf\\xc3\\xa9");
}

}  // namespace
}  // namespace lychee::server
