// A two-sided transfer's two entries (group_transport.h): the owner's send and the consumer's
// receive. Each runs on the caller's own thread when its pair's lane is idle and it is the pair's
// next op (a send after the owner's reply, a receive at once), else is queued for the lane (a
// receive then waited for); a receive ends a cancel or a timeout the same way on both paths.
#include "transfer/group_transport.h"
#include "util/logging.h"

namespace tutti::detail {
namespace {

// How long an aborted receive may take to give its targets back before the get returns anyway;
// past its deadline by as much, the lane gives up on a receive a consumer's thread runs.
constexpr std::chrono::seconds kDrain{5};

}  // namespace

bool GroupTransport::can_run_here_locked(const Lane& l, const GroupJob& job) {
  // Anything else (the pair's first transfer, one queued before it) is the lane's, in its order.
  return !l.busy && !l.stopping && l.group && l.next_post == job.seq && l.waiting.empty();
}

GroupTransport::Posting GroupTransport::claim_locked(Lane& l, GroupJob& job) {
  Posting at = posting_locked(l);  // what may throw (copies) before what claims the lane
  ++l.next_post;
  job.posted = true;
  l.busy = true;
  return at;
}

uint64_t GroupTransport::send(int peer, const std::string& peer_agent, uint64_t seq,
                              uint64_t incarnation, std::vector<TensorView> tensors,
                              Clock::time_point deadline, std::function<void(bool)> on_done,
                              std::function<void()>* then) {
  auto job =
      make_job(GroupJob::Kind::kSend, peer, std::move(tensors), deadline, std::move(on_done));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Lane& l = number_locked(*job, peer_agent, seq, incarnation);
    // CPU sends only: a CPU consumer that dies fails the send at once as its connections go,
    // where NCCL may not tell, and meanwhile the send holds up the serving thread.
    if (then != nullptr && !*then && !cuda_ && can_run_here_locked(l, *job)) {
      // The answering thread sends once its reply is out: the consumer posts its receive on
      // the reply, and the send starts on a thread that is awake (no hand-off to the lane's).
      // What may throw (allocations) comes before the claim.
      auto at = std::make_shared<Posting>();
      std::function<void()> work = [this, lane = lanes_.at(peer), job, at]() noexcept {
        std::exception_ptr error;
        try {
          error = run_here(*lane, job, *at, nullptr);
        } catch (...) {  // out of memory before the send was posted: the pair is out of step
          error = std::current_exception();
          abort_for_lane(*lane, at->base, "a send could not start");
        }
        if (job->on_done) job->on_done(!error);  // last, as the lane's thread does
      };
      *at = claim_locked(l, *job);  // copies no string: the pair has its group
      *then = std::move(work);
      return job->seq;
    }
    l.waiting[job->seq] = job;
  }
  work_.notify_all();
  return job->seq;
}

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
    // Not once cancelled: wait() says so at once.
    if (!cancelled.load() && can_run_here_locked(l, *job)) {
      l.watch_for = waiting_for;  // what may throw (a copy) before what claims the lane
      at = claim_locked(l, *job);
      here = lanes_.at(peer);
      l.watch_base = at.base;
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

std::exception_ptr GroupTransport::run_here(Lane& l, const std::shared_ptr<GroupJob>& job,
                                            const Posting& at, bool* watched) {
  // The lane goes back to its thread however this ends, an exception included (a receive's
  // `watch` points at its caller's flag).
  struct GiveBack {
    GroupTransport& t;
    Lane& l;
    bool* watched;
    ~GiveBack() {
      bool more = false;                      // queued meanwhile: the lane's turn
      std::shared_ptr<CollectiveGroup> base;  // released after the lock
      {
        std::lock_guard<std::mutex> lock(t.mutex_);
        if (watched != nullptr) *watched = l.watch == nullptr;
        l.busy = false;
        l.watch = nullptr;
        base = std::move(l.watch_base);
        more = !l.waiting.empty();
      }
      if (more) t.work_.notify_all();
    }
  } give_back{*this, l, watched};
  std::vector<std::shared_ptr<GroupJob>> batch{job};
  return run_batch_unlocked(l, batch, at);
}

void GroupTransport::receive_here(Lane& l, const std::shared_ptr<GroupJob>& job, const Posting& at,
                                  const std::atomic<bool>& cancelled,
                                  const std::string& waiting_for) {
  bool watched = false;  // the lane's thread aborted the transport for this receive
  const std::exception_ptr error = run_here(l, job, at, &watched);
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
