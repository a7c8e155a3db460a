// The consumer's receive of a two-sided fetch (group_transport.h): on its own thread when its
// pair's lane is idle and the receive is the pair's next op, else queued for the lane and waited
// for; both end a cancel or a timeout the same way.
#include "transfer/group_transport.h"
#include "util/logging.h"

namespace tutti::detail {
namespace {

// How long an aborted receive may take to give its targets back before the get returns anyway;
// past its deadline by as much, the lane gives up on a receive a consumer's thread runs.
constexpr std::chrono::seconds kDrain{5};

}  // namespace

void GroupTransport::receive(int peer, const std::string& peer_agent, uint64_t seq,
                             uint64_t incarnation, std::vector<TensorView> targets,
                             Clock::time_point deadline, const std::atomic<bool>& cancelled,
                             const std::string& waiting_for) {
  auto job = make_job(GroupJob::Kind::kRecv, peer, std::move(targets), deadline, nullptr);
  std::shared_ptr<Lane> here;  // the lane, when this thread runs the receive
  Posting at;
  bool wake = false;  // the lane's thread dozes: it must watch from now
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Lane& l = number_locked(*job, peer_agent, seq, incarnation);
    // Only the pair's next number, with nothing else queued, on a lane that is idle and has its
    // group: anything else (the pair's first transfer, a send queued before it) is the lane's,
    // in its order; and not once cancelled (wait() says so at once).
    if (!cancelled.load() && !l.busy && !l.stopping && l.group && l.next_post == job->seq &&
        l.waiting.empty()) {
      // What may throw first (copies), then what claims the lane.
      at = posting_locked(l);
      l.watch_for = waiting_for;
      l.watch_base = at.base;
      here = lanes_.at(peer);
      ++l.next_post;
      job->posted = true;
      l.busy = true;
      l.watch = &cancelled;
      // An unbounded deadline (time_point::max()) stays unbounded.
      l.watch_until = deadline > Clock::time_point::max() - kDrain ? Clock::time_point::max()
                                                                   : deadline + kDrain;
      wake = l.dozing;
    } else {
      l.waiting[job->seq] = job;
    }
  }
  if (!here) {
    work_.notify_all();
    wait(*job, deadline, cancelled, waiting_for);
    return;
  }
  if (wake) work_.notify_all();
  receive_here(*here, job, at, cancelled, waiting_for);
}

void GroupTransport::receive_here(Lane& l, const std::shared_ptr<GroupJob>& job, const Posting& at,
                                  const std::atomic<bool>& cancelled,
                                  const std::string& waiting_for) {
  bool watched = false;  // the lane's thread aborted the transport for this receive
  std::exception_ptr error;
  {
    // The lane goes back to its thread however this ends, an exception included (`watch`
    // points at the caller's flag).
    struct GiveBack {
      GroupTransport& t;
      Lane& l;
      bool& watched;
      ~GiveBack() {
        bool more = false;                      // queued meanwhile: the lane's turn
        std::shared_ptr<CollectiveGroup> base;  // released after the lock
        {
          std::lock_guard<std::mutex> lock(t.mutex_);
          watched = l.watch == nullptr;
          l.busy = false;
          l.watch = nullptr;
          base = std::move(l.watch_base);
          more = !l.waiting.empty();
        }
        if (more) t.work_.notify_all();
      }
    } give_back{*this, l, watched};
    std::vector<std::shared_ptr<GroupJob>> batch{job};
    error = run_batch_unlocked(l, batch, at);
  }
  // As wait() says it: a cancel (or the watch's deadline) seen by the lane's thread aborted the
  // transport, even where the bytes came meanwhile; the batch's own timeout at the deadline.
  if (watched || (error && cancelled.load())) {
    throw Error(cancelled.load() ? ErrorCode::kAborted : ErrorCode::kTimeout,
                receive_failed_text(cancelled.load() ? "cancelled while" : "timed out", waiting_for,
                                    set()));
  }
  if (!error) return;
  if (Clock::now() >= job->deadline) {
    throw Error(ErrorCode::kTimeout, receive_failed_text("timed out", waiting_for, set()));
  }
  std::rethrow_exception(error);
}

std::string GroupTransport::receiving_from(const char* what, const std::string& waiting_for) {
  return std::string(what) + " receiving from " + waiting_for;
}

std::string GroupTransport::receive_failed_text(const char* what, const std::string& waiting_for,
                                                const std::string& set) const {
  return receiving_from(what, waiting_for) + " over transport '" + name_ + "' (its group '" + set +
         "' is aborted: call reset_transport('" + name_ + "') on every member)";
}

void GroupTransport::wait(GroupJob& job, Clock::time_point deadline,
                          const std::atomic<bool>& cancelled, const std::string& waiting_for) {
  std::unique_lock<std::mutex> lock(mutex_);
  const char* what = nullptr;
  ErrorCode code = ErrorCode::kTimeout;
  while (!job.finished) {
    if (cancelled.load()) {
      what = "cancelled while";
      code = ErrorCode::kAborted;
      break;
    }
    if (Clock::now() >= deadline) {
      what = "timed out";
      break;
    }
    done_.wait_until(lock, std::min(deadline, Clock::now() + kWatchSlice));
  }
  if (job.finished) {
    if (job.error) std::rethrow_exception(job.error);
    return;
  }
  lock.unlock();
  abort(receiving_from(what, waiting_for));
  lock.lock();
  // The receive may be writing the targets: wait until the aborted batch let go of them.
  done_.wait_until(lock, Clock::now() + kDrain, [&] { return job.finished; });
  if (!job.finished) {
    TUTTI_LOG_WARN(
        "direct transport: agent '{}': the aborted receive from {} did not end within "
        "{} s; its targets may still change",
        agent_, waiting_for, kDrain.count());
  }
  throw Error(code, receive_failed_text(what, waiting_for, set_));
}

}  // namespace tutti::detail
