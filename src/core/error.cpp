#include "core/error.h"

namespace lychee {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kInvalidFile: return "invalid file";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kCapacity: return "capacity";
    case ErrorCode::kCuda: return "cuda";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

}  // namespace lychee
