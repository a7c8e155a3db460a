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
// Threads: issue() is called under the group's op lock (one issuer at a time); start(), finish()
// and the dump from any thread. The per-op calls take no lock and make no locked instruction:
// every field is a relaxed atomic (plain stores on x86), issue() brackets its writes with a
// version the dump reads before and after (retrying a torn read), and a finish from outside the
// op lock claims the entry's state with one compare-and-swap, so that an entry reused by an op
// issued a ring's length later (the capacity rounded up to a power of two) is never marked with
// the old op's end. Errors, on the failure path only, are kept under a mutex. Nor is there a clock
// read at issue: the op's start time comes with its context; its end is read from the ops' clock
// (util/op_clock.h, the time stamp counter where the kernel trusts it).
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
  // error null: completed. `exclusive`: called under the op lock that issue() is called under
  // (an inline op), so that no issue() can reuse the entry meanwhile.
  void finish(uint64_t id, const std::string* error, bool exclusive = false);

  // Writes the dump (to the directory, else the log). Never throws.
  void dump(const std::string& reason) const;
  // The dump's text.
  std::string text(const std::string& reason) const;

 private:
  enum class State : uint8_t { kIssued, kStarted, kCompleted, kFailed };
  // One op. `tag` holds (id << 2) | state, so that a finish can claim it for its own id.
  struct Entry {
    std::atomic<uint64_t> version{0};  // odd while issue() writes the entry
    std::atomic<uint64_t> tag{0};      // 0: unused
    std::atomic<uint64_t> seq{0};
    std::atomic<uint64_t> sig[5] = {};  // OpSignature, packed (pack_sig)
    std::atomic<int64_t> peer{-1};
    std::atomic<int64_t> issued_us{0}, started_us{0}, ended_us{0};
  };
  // What the dump reads of an entry.
  struct Copy {
    uint64_t id = 0, seq = 0;
    OpSignature sig;
    int peer = -1;
    State state = State::kIssued;
    int64_t issued_us = 0, started_us = 0, ended_us = 0;
    std::string error;
  };
  static uint64_t tag_of(uint64_t id, State state) {
    return id << 2 | static_cast<uint64_t>(state);
  }
  size_t slot(uint64_t id) const { return static_cast<size_t>(id & mask_); }
  // Moves op `id`'s entry from a running state to `to`; false where another op took the entry.
  bool claim(Entry& e, uint64_t id, State to, bool exclusive);
  Copy read(uint64_t id) const;
  int64_t now_us() const;
  int64_t wall_us(std::chrono::steady_clock::time_point t) const;

  const Identity identity_;
  // Wall-clock time at a steady-clock instant: entries read only the ops' (cheap) steady time.
  const std::chrono::steady_clock::time_point steady_base_;
  const int64_t wall_base_us_;
  const size_t capacity_;  // the ops a dump shows
  // The ring holds the next power of two (an entry's index is a mask, not a division: the
  // division was ~40% of issue()'s time).
  const uint64_t mask_;
  const std::unique_ptr<Entry[]> ring_;
  std::atomic<uint64_t> next_id_{1};  // written only by issue(), under the op lock
  mutable std::mutex errors_mutex_;
  std::vector<std::pair<uint64_t, std::string>> errors_;  // by entry: the id it is for, the text
};

}  // namespace tutti::detail
