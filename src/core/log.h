// Logging to stderr with levels and timestamps; the CLI sets the level from -v / -q / --log-level.
// One line per message, e.g. "2026-11-27 16:30:12.123 I GET /health 200 tokens 0 1 ms": local time
// to the millisecond, then the level's letter (D, I, W, E), then the message.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace lychee {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();

// "debug", "info", "warn", "error", "off" and back; nullopt for any other name.
std::optional<LogLevel> log_level_from_name(std::string_view name);
const char* log_level_name(LogLevel level);

// The line `message` at `level` logged at `when` (local time), newline included.
std::string format_log_line(LogLevel level, std::chrono::system_clock::time_point when, std::string_view message);
// Writes format_log_line(level, now, message) to stderr in one write, so lines from concurrent
// threads (the server's HTTP threads) never interleave.
void write_log_line(LogLevel level, std::string_view message);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level < log_level()) return;
  write_log_line(level, fmt::format(format, std::forward<Args>(args)...));
}

#define LY_LOG_DEBUG(...) ::lychee::log(::lychee::LogLevel::kDebug, __VA_ARGS__)
#define LY_LOG_INFO(...) ::lychee::log(::lychee::LogLevel::kInfo, __VA_ARGS__)
#define LY_LOG_WARN(...) ::lychee::log(::lychee::LogLevel::kWarn, __VA_ARGS__)
#define LY_LOG_ERROR(...) ::lychee::log(::lychee::LogLevel::kError, __VA_ARGS__)

}  // namespace lychee
