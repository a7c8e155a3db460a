// What the plugin adapters share (internal): tutti's values as the C ABI's (tutti/plugin.h)
// and the plugins' results as tutti::Error.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tutti/error.h"
#include "tutti/plugin.h"
#include "tutti/tensor_view.h"

namespace tutti::detail {

// A loaded shared object: closed when nothing of it is in use (never, in practice: registered
// backends and transports keep it for the process's life).
struct PluginLibrary {
  std::string name;  // the plugin's
  std::string path;
  void* handle = nullptr;
  void* state = nullptr;  // what its init made
  const tuttiPlugin_v1_t* plugin = nullptr;
};

inline tuttiTensor_v1_t to_c(const TensorView& v) {
  tuttiTensor_v1_t t{};
  t.data = v.data();
  t.dtype = static_cast<tuttiDataType_t>(static_cast<int>(v.dtype()));
  t.ndim = static_cast<int32_t>(v.shape().size());
  t.shape = v.shape().data();
  t.device_type = v.device().type == DeviceType::kCUDA ? TUTTI_DEVICE_CUDA : TUTTI_DEVICE_CPU;
  t.device_index = v.device().index;
  t.numel = v.numel();
  t.nbytes = v.nbytes();
  return t;
}

inline std::vector<tuttiTensor_v1_t> to_c(const std::vector<TensorView>& views) {
  std::vector<tuttiTensor_v1_t> out;
  out.reserve(views.size());
  for (const auto& v : views) out.push_back(to_c(v));
  return out;
}

inline ErrorCode error_code(tuttiResult_t rc) {
  switch (rc) {
    case TUTTI_ERR_INVALID_ARGUMENT: return ErrorCode::kInvalidArgument;
    case TUTTI_ERR_INVALID_USAGE: return ErrorCode::kInvalidUsage;
    case TUTTI_ERR_TIMEOUT: return ErrorCode::kTimeout;
    case TUTTI_ERR_REMOTE: return ErrorCode::kRemoteError;
    case TUTTI_ERR_IO: return ErrorCode::kIoError;
    case TUTTI_ERR_ABORTED: return ErrorCode::kAborted;
    case TUTTI_ERR_UNAVAILABLE: return ErrorCode::kUnavailable;
    default: return ErrorCode::kInternal;
  }
}

inline tuttiResult_t result_of(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return TUTTI_ERR_INVALID_ARGUMENT;
    case ErrorCode::kInvalidUsage: return TUTTI_ERR_INVALID_USAGE;
    case ErrorCode::kTimeout: return TUTTI_ERR_TIMEOUT;
    case ErrorCode::kRemoteError: return TUTTI_ERR_REMOTE;
    case ErrorCode::kIoError: return TUTTI_ERR_IO;
    case ErrorCode::kAborted: return TUTTI_ERR_ABORTED;
    case ErrorCode::kUnavailable: return TUTTI_ERR_UNAVAILABLE;
    default: return TUTTI_ERR_INTERNAL;
  }
}

// Throws unless rc is TUTTI_OK: `what` names who called what ("allreduce #3 on group 'g'
// (rank 1/2): plugin 'p' backend 'b'"), then the plugin's words.
inline void check_plugin(tuttiResult_t rc, const tuttiError_v1_t& err, const std::string& what) {
  if (rc == TUTTI_OK) return;
  tuttiError_v1_t copy = err;
  copy.message[sizeof(copy.message) - 1] = '\0';
  const std::string words = copy.message[0] != '\0' ? copy.message : "no message";
  const bool known = rc >= TUTTI_ERR_INVALID_ARGUMENT && rc <= TUTTI_ERR_INTERNAL;
  throw Error(
      error_code(rc),
      what + ": " + words +
          (known ? "" : " (an unknown result code " + std::to_string(static_cast<int>(rc)) + ")"));
}

// A backend's or transport's device bits (1 << TUTTI_DEVICE_*) as the registries' list.
inline std::vector<DeviceType> devices_of(uint32_t bits) {
  std::vector<DeviceType> out;
  if (bits & (1u << TUTTI_DEVICE_CPU)) out.push_back(DeviceType::kCPU);
  if (bits & (1u << TUTTI_DEVICE_CUDA)) out.push_back(DeviceType::kCUDA);
  return out;
}

// Writes an exception's message into a plugin-facing error; its code.
inline tuttiResult_t report(const std::exception& e, tuttiError_v1_t* err) {
  if (err != nullptr) {
    std::snprintf(err->message, sizeof(err->message), "%s", e.what());
  }
  if (const auto* te = dynamic_cast<const Error*>(&e)) return result_of(te->code());
  return TUTTI_ERR_INTERNAL;
}

}  // namespace tutti::detail
