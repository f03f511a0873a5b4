// Errors: one exception type with a code, thrown at the boundary with a message that names
// what was wrong and where (file, tensor, field; expected vs actual). The CLI prints it and
// exits non-zero; the server maps the code to an HTTP status.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace lychee {

enum class ErrorCode {
  kInvalidArgument,  // a bad option, request or shape from the caller
  kInvalidFile,      // a corrupt or malformed file (checkpoint, tokenizer, head-role file)
  kNotFound,         // a missing file, tensor or key
  kUnsupported,      // valid input that this build does not handle (architecture, quantisation)
  kCapacity,         // a full KV pool, a context longer than the cache
  kCuda,             // a CUDA runtime or library failure
  kInternal,         // a broken invariant: a bug in lychee
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message) : std::runtime_error(std::move(message)), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace lychee

// LY_CHECK(cond, code, "format", args...): throw lychee::Error when cond is false.
#define LY_CHECK(cond, code, ...)                          \
  do {                                                     \
    if (!(cond)) ::lychee::fail(::lychee::code, __VA_ARGS__); \
  } while (0)

// LY_ASSERT(cond): an internal invariant; failing it is a lychee bug.
#define LY_ASSERT(cond)                                                                    \
  do {                                                                                     \
    if (!(cond))                                                                           \
      ::lychee::fail(::lychee::ErrorCode::kInternal, "internal error: {} ({}:{})", #cond, \
                     __FILE__, __LINE__);                                                  \
  } while (0)
