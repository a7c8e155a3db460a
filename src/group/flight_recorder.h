// The flight recorder: per group, a ring of its last ops (sequence number, op, signature, state,
// when it was issued, started and ended), dumped when the group is aborted (a timeout, a
// transport error, a peer's abort, the application's abort) and on demand (a signal), so that
// `tutti-flight` can merge the ranks' dumps and say which rank is behind and on which op
// (internal to the core).
//
// Environment:
//   TUTTI_FLIGHT_RECORDER_SIZE    ops kept per group (default 64; 0 turns the recorder off)
//   TUTTI_FLIGHT_RECORDER_DIR     where dumps go, one file per group and rank
//                                 (tutti-flight.<instance>.rank<r>.txt, replaced by each dump);
//                                 unset: the last ops go to the log (warning level) instead
//   TUTTI_FLIGHT_RECORDER_SIGNAL  with a directory: the signal that dumps every group of the
//                                 process (USR1, the default, or USR2; 0 for none). Installed
//                                 only where the program left that signal at its default.
//
// The dump format, one record per line, fields as key=value with values percent-encoded
// (see escape_name), is read by tools/tutti_flight.cc:
//   tutti-flight-record 1
//   group name=... instance=... rank=R world=W backend=... pid=P host=... dumped_us=T reason=...
//   op id=N seq=S kind=collective|send|recv|batch peer=P op=allreduce sig=... state=...
//      issued_us=T started_us=T ended_us=T error=...
//   end
// Times are wall-clock microseconds since the epoch (0: not yet); state is issued (queued
// behind other ops), started, completed or failed.
//
// Threads: every method may be called from any thread. The per-op calls take no lock the
// group's other threads hold: each entry has a lock of its own, contended only by the dump and by
// an op finishing after `capacity` later ones were issued (so they cost the fast path a few
// nanoseconds, and no clock read at issue: the op's start time comes with its context).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tutti/op_type.h"

namespace tutti::detail {

class FlightRecorder {
 public:
  struct Identity {
    std::string name;
    std::string instance;
    int rank = 0;
    int world_size = 1;
    std::string backend;
  };

  // A recorder for one group, registered for signal dumps; null when TUTTI_FLIGHT_RECORDER_SIZE
  // is 0.
  static std::shared_ptr<FlightRecorder> create(Identity identity);
  explicit FlightRecorder(Identity identity, size_t capacity);
  ~FlightRecorder();

  // Records an op as issued at ctx.started (now, where unset); returns its id for start() and
  // finish(). `peer`: the other rank of a send or recv, else -1. `running`: the op starts at once
  // (an inline op), no start() follows.
  uint64_t issue(const OpContext& ctx, int peer, bool running);
  // A queued op begins, at `when`.
  void start(uint64_t id, std::chrono::steady_clock::time_point when);
  // error null: completed.
  void finish(uint64_t id, const std::string* error);

  // Writes the dump (to the directory, else the log). Never throws.
  void dump(const std::string& reason) const;
  // The dump's text.
  std::string text(const std::string& reason) const;

 private:
  enum class State : uint8_t { kIssued, kStarted, kCompleted, kFailed };
  struct Entry {
    std::atomic<uint32_t> busy{0};  // the entry's lock (see Threads)
    uint64_t id = 0;  // 0: unused
    uint64_t seq = 0;
    OpSignature sig;
    int peer = -1;
    State state = State::kIssued;
    int64_t issued_us = 0, started_us = 0, ended_us = 0;
    std::string error;
  };
  // The entry of op `id`, locked; unlock() it. Null (nothing locked) where a later op took it.
  Entry* lock(uint64_t id);
  static void unlock(Entry& e) { e.busy.store(0, std::memory_order_release); }
  static void lock_entry(Entry& e);
  int64_t now_us() const;
  int64_t wall_us(std::chrono::steady_clock::time_point t) const;

  const Identity identity_;
  // Wall-clock time at a steady-clock instant: entries read only the (cheap) steady clock.
  const std::chrono::steady_clock::time_point steady_base_;
  const int64_t wall_base_us_;
  const size_t capacity_;
  const std::unique_ptr<Entry[]> ring_;
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace tutti::detail
