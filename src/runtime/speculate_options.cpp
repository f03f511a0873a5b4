// SpeculateOptions' validation and its text form (`--speculate off|N|auto`, the server's
// lychee.speculate): pure, so the server's request schema (and its fuzz target) links it without
// the speculative decoder.
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "runtime/speculative.h"

namespace lychee {

void SpeculateOptions::validate() const {
  LY_CHECK(gamma >= 0 && gamma <= kMaxSpeculate, ErrorCode::kInvalidArgument,
           "speculate must be 0..{} drafted tokens per cycle, got {}", kMaxSpeculate, gamma);
  LY_CHECK(max_gamma >= 1 && max_gamma <= kMaxSpeculate, ErrorCode::kInvalidArgument,
           "speculate's largest γ must be 1..{}, got {}", kMaxSpeculate, max_gamma);
}

SpeculateOptions parse_speculate(const std::string& text, const std::string& what) {
  SpeculateOptions o;
  if (text == "auto") {
    o.adaptive = true;
    o.gamma = 4;
    return o;
  }
  if (text == "off") return o;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  LY_CHECK(!text.empty() && end != nullptr && *end == '\0' && v >= 0 && v <= kMaxSpeculate,
           ErrorCode::kInvalidArgument, "{} must be a count of drafted tokens 0..{}, \"auto\" or \"off\", got \"{}\"",
           what, kMaxSpeculate, text);
  o.gamma = int(v);
  return o;
}

}  // namespace lychee
