// Logging to stderr with levels; the CLI sets the level from -v / --quiet.
#pragma once

#include <cstdio>
#include <utility>

#include <fmt/format.h>

namespace lychee {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level < log_level()) return;
  static constexpr const char* kTags[] = {"debug", "info", "warn", "error"};
  fmt::print(stderr, "[lychee {}] {}\n", kTags[int(level)], fmt::format(format, std::forward<Args>(args)...));
}

#define LY_LOG_DEBUG(...) ::lychee::log(::lychee::LogLevel::kDebug, __VA_ARGS__)
#define LY_LOG_INFO(...) ::lychee::log(::lychee::LogLevel::kInfo, __VA_ARGS__)
#define LY_LOG_WARN(...) ::lychee::log(::lychee::LogLevel::kWarn, __VA_ARGS__)

}  // namespace lychee
