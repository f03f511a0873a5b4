#include "core/log.h"

#include <unistd.h>

#include <atomic>
#include <ctime>

namespace lychee {

namespace {
std::atomic<LogLevel> g_level{LogLevel::kWarn};
constexpr const char* kNames[] = {"debug", "info", "warn", "error", "off"};
}  // namespace

void set_log_level(LogLevel level) { g_level.store(level); }
LogLevel log_level() { return g_level.load(); }

std::optional<LogLevel> log_level_from_name(std::string_view name) {
  for (int i = 0; i < 5; ++i)
    if (name == kNames[i]) return LogLevel(i);
  return std::nullopt;
}

const char* log_level_name(LogLevel level) { return kNames[int(level)]; }

std::string format_log_line(LogLevel level, std::chrono::system_clock::time_point when, std::string_view message) {
  const auto whole = std::chrono::floor<std::chrono::seconds>(when);
  const std::time_t secs = std::time_t(whole.time_since_epoch().count());
  const long millis = long(std::chrono::duration_cast<std::chrono::milliseconds>(when - whole).count());
  std::tm tm{};
  localtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E', '-'};
  return fmt::format("{}.{:03d} {} {}\n", stamp, millis, kLetters[int(level)], message);
}

void write_log_line(LogLevel level, std::string_view message) {
  const std::string line = format_log_line(level, std::chrono::system_clock::now(), message);
  // One write(2) per line: stdio's buffer could split a long line between two writes.
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) break;
    done += size_t(n);
  }
}

}  // namespace lychee
