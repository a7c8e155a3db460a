// Work: the handle of one op that may still be running (c10d's Work).
//
// Every op of a CollectiveGroup returns one. A blocking call (the default) returns it already
// completed; with `opts.async_op = true` a CPU backend returns at once and runs the op on the
// group's worker thread, in issue order; an NCCL op completes when its CUDA work has finished on
// the GPU. The buffers of an op that is still running belong to it: keep them alive and leave
// them alone until wait() has returned (or is_completed() is true).
//
// Threads: every method may be called from any thread, any number of times. wait() and
// is_completed() never run the op themselves.
// Errors: wait() rethrows the op's tutti::Error; a failed op aborts its group exactly as a
// failed blocking call does (see docs/errors.md).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tutti/export.h"
#include "tutti/op_type.h"
#include "tutti/options.h"

namespace tutti {

class TUTTI_API Work {
 public:
  explicit Work(OpContext ctx);
  virtual ~Work();
  // A Work that has already finished successfully (what a blocking call returns).
  static std::shared_ptr<Work> completed(const OpContext& ctx);
  static std::shared_ptr<Work> completed(OpContext&& ctx);  // takes ctx's references over
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  OpType op() const { return ctx_.op; }
  uint64_t seq() const { return ctx_.seq; }
  // "allreduce #12 on group 'default' (rank 1/4)"
  std::string description() const { return ctx_.description(); }

  // True once the op has finished, successfully or not. Never blocks.
  bool is_completed();
  // True once the op has finished without an error.
  bool is_success();
  // Waits on the host until the op has finished, then rethrows its error if it failed.
  // kUseGroupTimeout (the default) waits as long as the op itself may take: its own timeout
  // bounds it. A shorter timeout that passes first throws Error(kTimeout) saying the op is still
  // running; that leaves the op and its group as they were, and wait() may be called again.
  void wait(std::chrono::milliseconds timeout = kUseGroupTimeout);
  // The op's error; null while it runs or after it succeeded.
  std::exception_ptr exception();
  // Keeps `object` alive as long as this Work (e.g. the framework tensor behind a view).
  void keep_alive(std::shared_ptr<const void> object);

  // For backends and the group: completes the Work once (later calls are ignored); a null error
  // means success. Runs the completion hook, then wakes every waiter.
  void finish(std::exception_ptr error = nullptr);
  // Runs `hook(error)` once, when the Work finishes, on the thread that finishes it and before
  // any waiter wakes (at once, here, if it already has). Hooks added several times all run, in
  // the order they were added. A hook must not throw or wait for other ops of the group.
  void on_finish(std::function<void(const std::exception_ptr&)> hook);

 protected:
  // For Works that something outside tutti's threads completes (a GPU event): called while not
  // finished, by is_completed() and, every poll_interval(), by wait(); it calls finish() once it
  // sees the op done, and returns true then.
  virtual bool poll() { return false; }
  // 0 (the default): wait() sleeps until finish() is called. Else it polls at this interval.
  virtual std::chrono::microseconds poll_interval() const { return std::chrono::microseconds(0); }

  const OpContext& context() const { return ctx_; }

 private:
  // What waiting and completing need, made on first use: a Work that is complete when made
  // (every blocking call's) usually never needs it.
  struct Sync {
    std::mutex mutex;
    std::condition_variable cv;
    std::exception_ptr error;
    std::function<void(const std::exception_ptr&)> hook;
    std::vector<std::shared_ptr<const void>> keep_alive;
    bool finishing = false;  // finish() runs the hooks: one added meanwhile runs there too
  };
  Sync& sync();

  const OpContext ctx_;
  std::atomic<bool> done_{false};
  std::atomic<Sync*> sync_{nullptr};
};

}  // namespace tutti
