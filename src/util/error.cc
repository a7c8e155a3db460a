#include "tutti/error.h"

namespace tutti {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kInvalidUsage: return "invalid usage";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kRemoteError: return "remote error";
    case ErrorCode::kIoError: return "I/O error";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

}  // namespace tutti
