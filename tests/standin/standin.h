// What the stand-in CUDA runtime and NCCL (tests only) tell a test about themselves.
//
// Test binaries never link these symbols: they look them up at run time, so the same binary runs
// against the real libcudart.so.13 and libnccl.so.2, where every lookup comes back empty.
#pragma once

#include <dlfcn.h>

#include <cstdlib>

extern "C" {
// The stand-in CUDA runtime (libcudart.so.13 in tests/standin/).
int tutti_standin_cuda_live_streams(void);  // created and not yet destroyed
int tutti_standin_cuda_live_events(void);   // created and not yet destroyed
int tutti_standin_cuda_bad_handles(void);   // calls that named a destroyed or unknown handle
int tutti_standin_cuda_ipc_opens(void);     // cudaIpcOpenMemHandle calls that succeeded
// The stand-in NCCL (libnccl.so.2 in tests/standin/).
int tutti_standin_nccl_live_comms(void);  // initialised or initialising, not destroyed or aborted
int tutti_standin_nccl_shrinks(void);     // communicators made by ncclCommShrink
int tutti_standin_nccl_concurrent_calls(void);  // a thread called into a communicator that
                                                // another thread was inside (not thread-safe)
}

namespace tutti::standin {

// A counter of the stand-in CUDA runtime or NCCL, or -1 where the real library is loaded.
inline int count(const char* symbol) {
  auto fn = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, symbol));
  return fn != nullptr ? fn() : -1;
}

// True when this process runs on the stand-in CUDA runtime.
inline bool active() {
  return ::dlsym(RTLD_DEFAULT, "tutti_standin_cuda_live_streams") != nullptr;
}

}  // namespace tutti::standin
