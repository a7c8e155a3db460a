// get_async, and its workers: threads reused from get to get instead of one new thread per call
// (until 2026-12-02), as many as gets run at once; an idle one leaves after a while
// (agent_core.h).
#include <algorithm>

#include "transfer/agent_core.h"
#include "transfer/consumer.h"
#include "util/logging.h"

namespace tutti::detail {
namespace {

// How long an idle worker waits for the next get before it leaves.
constexpr std::chrono::seconds kIdle{10};

}  // namespace

void AgentCore::run_async(std::function<std::function<void()>()> job) {
  std::lock_guard<std::mutex> lock(workers_mutex);
  if (workers_stop || stopping) {
    throw Error(ErrorCode::kAborted, "get_async on " + who() + ": the agent is shutting down");
  }
  jobs.push_back(std::move(job));
  if (jobs.size() <= idle_workers) {
    work_ready.notify_one();
    return;
  }
  // Workers that left are past the lock they left under: joining them here takes a moment.
  join_ended(ended_workers);
  // Every queued job has a worker of its own: a get never waits for another to end. The worker
  // holds the agent's state: one that outlives stop() (see stop_workers) stays memory-safe.
  try {
    workers.emplace_back([self = shared_from_this()] { self->worker_loop(); });
  } catch (const std::exception& e) {
    jobs.pop_back();
    throw Error(ErrorCode::kUnavailable, "get_async on " + who() + ": no thread for the get (" +
                                             std::to_string(workers.size()) +
                                             " running): " + e.what());
  }
}

void AgentCore::worker_loop() {
  std::unique_lock<std::mutex> lock(workers_mutex);
  ++idle_workers;
  while (true) {
    const bool woken =
        work_ready.wait_for(lock, kIdle, [&] { return !jobs.empty() || workers_stop; });
    if (!jobs.empty()) {
      auto job = std::move(jobs.front());
      jobs.pop_front();
      --idle_workers;
      lock.unlock();
      // The get; its error is its result, so nothing should escape: what does (no memory) is
      // logged, never let out of the thread.
      std::function<void()> publish;
      try {
        publish = job();
      } catch (const std::exception& e) {
        TUTTI_LOG_ERROR("direct transport: {}: a get_async job failed: {}", who(), e.what());
      }
      job = nullptr;
      // Idle again before the result is out: a caller that waited for it and asks for the next
      // get at once finds this worker, not a new one.
      lock.lock();
      ++idle_workers;
      lock.unlock();
      try {
        if (publish) publish();
      } catch (const std::exception& e) {
        TUTTI_LOG_ERROR("direct transport: {}: publishing a get_async result failed: {}", who(),
                        e.what());
      }
      publish = nullptr;
      lock.lock();
      continue;
    }
    if (workers_stop || !woken) break;
  }
  --idle_workers;
  // Leaves: its handle goes to ended_workers (under the lock, so stop_workers sees it either
  // here or gone), for whoever reaps next; not there, stop_workers left it detached.
  const auto me = std::this_thread::get_id();
  auto it = std::find_if(workers.begin(), workers.end(),
                         [&](const std::thread& t) { return t.get_id() == me; });
  if (it != workers.end()) {
    ended_workers.push_back(std::move(*it));
    workers.erase(it);
  }
  workers_gone.notify_all();
}

void AgentCore::stop_workers(std::chrono::milliseconds grace) {
  std::unique_lock<std::mutex> lock(workers_mutex);
  workers_stop = true;
  work_ready.notify_all();
  if (!workers_gone.wait_for(lock, grace, [&] { return workers.empty(); })) {
    TUTTI_LOG_WARN(
        "direct transport: {}: {} get(s) of get_async still running {} ms after the "
        "agent was stopped; left to end on their own",
        who(), workers.size(), grace.count());
    for (std::thread& t : workers) t.detach();
    workers.clear();
  }
  std::vector<std::thread> ended;
  ended.swap(ended_workers);
  lock.unlock();
  join_ended(ended);
}

Fetch AgentCore::get_async(const TensorRef& ref, const GetOptions& opts) {
  Fetch f;
  f.state_ = std::make_shared<FetchState>();
  f.state_->what = context("get", ref);
  // In progress from here, queued or not: abort() ends it (the get registers the flag again).
  auto queued = std::make_shared<ActiveGet>(*this, &f.state_->cancelled);
  run_async([self = shared_from_this(), state = f.state_, ref, opts,
             queued = std::move(queued)]() mutable -> std::function<void()> {
    auto finish = [state](Received result, std::exception_ptr error) {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->result = std::move(result);
      state->error = error;
      state->finished = true;
      state->cv.notify_all();
    };
    try {
      auto result = std::make_shared<Received>(self->get(ref, opts, &state->cancelled));
      queued.reset();
      return [finish, result] { finish(std::move(*result), nullptr); };
    } catch (...) {
      queued.reset();  // before the error is out: the Fetch may go with it
      // The error at once: making the publishing closure could fail too (no memory).
      finish(Received(), std::current_exception());
      return nullptr;
    }
  });
  return f;
}

}  // namespace tutti::detail
