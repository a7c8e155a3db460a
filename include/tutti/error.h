// tutti::Error, the one exception type the library throws.
//
// Every failure reaches the caller as a tutti::Error carrying an ErrorCode. Messages name the
// group, the rank, the operation and the offending value, e.g.
//   allreduce on group 'default' (rank 1/4): tensor dtype float16 differs from ...
// Which errors leave a group usable is documented in docs/errors.md: kInvalidArgument and
// kInvalidUsage are raised before any I/O and leave the group as it was; kTimeout, kIoError and
// kRemoteError abort the group (later calls fail with kAborted until it is destroyed and
// initialised again).
#pragma once

#include <stdexcept>
#include <string>

#include "tutti/export.h"

namespace tutti {

enum class ErrorCode {
  kInvalidArgument,  // a value out of what is allowed: rank, root, size, dtype, device...
  kInvalidUsage,     // a call in the wrong state: not initialised, destroyed, twice...
  kTimeout,          // a wait ran past its deadline
  kRemoteError,      // a peer reported a failure or disagreed with this rank
  kIoError,          // the transport failed (connection closed, reset...)
  kAborted,          // the group was aborted by an earlier failure
  kUnavailable,      // a backend or resource is not available in this build or on this host
  kInternal,         // a bug in tutti or in a library underneath it
};

TUTTI_API const char* to_string(ErrorCode code) noexcept;

// Thread-safe to copy and read; thrown by value.
class TUTTI_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);

  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace tutti
