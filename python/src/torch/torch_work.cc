#include "torch_work.h"

#include <algorithm>

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "tutti/error.h"
#include "tutti/op_type.h"

namespace tutti::torch_backend {

std::exception_ptr to_torch_error(const std::exception_ptr& error) {
  if (!error) return nullptr;
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error&) {
    return error;
  } catch (const Error& e) {
    return std::make_exception_ptr(
        c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                              std::string("tutti (") + to_string(e.code()) + "): " + e.what()));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(c10::DistBackendError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, std::string("tutti: ") + e.what()));
  }
}

void rethrow_as_torch(const std::exception_ptr& error) {
  std::rethrow_exception(to_torch_error(error));
}

TuttiWork::TuttiWork(int rank, c10d::OpType type, std::shared_ptr<tutti::Work> work,
                     std::vector<at::Tensor> outputs, std::function<void()> finish)
    : c10d::Work(rank, type),
      work_(std::move(work)),
      outputs_(std::move(outputs)),
      finish_(std::move(finish)) {}

c10::intrusive_ptr<TuttiWork> TuttiWork::create(int rank, c10d::OpType type,
                                                std::shared_ptr<tutti::Work> work,
                                                std::vector<at::Tensor> outputs,
                                                std::function<void()> finish) {
  auto self = c10::make_intrusive<TuttiWork>(rank, type, std::move(work), std::move(outputs),
                                             std::move(finish));
  // The thread that finishes the op runs the copy-backs, before anyone sees it done (at once,
  // here, when it is done already). The hook's reference keeps the Work until then.
  self->work_->on_finish([self](const std::exception_ptr& error) { self->done(error); });
  return self;
}

c10::intrusive_ptr<TuttiWork> TuttiWork::create_on_stream(int rank, c10d::OpType type,
                                                          std::shared_ptr<tutti::Work> work,
                                                          std::vector<at::Tensor> outputs,
                                                          const c10::Device& device) {
  auto self = c10::make_intrusive<TuttiWork>(rank, type, std::move(work), std::move(outputs),
                                             std::function<void()>());
  // No future and no event yet: a blocking dist.all_reduce on the issuing stream needs neither
  // (each cost microseconds a call on an H200).
  self->issue_stream_ = c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
  self->work_->on_finish([self](const std::exception_ptr& error) { self->done(error); });
  return self;
}

namespace {

// The calling thread's current stream of `issued`'s device waits for what `issued` holds now
// (nothing to do where they are the same stream).
void wait_for_stream(const c10::Stream& issued) {
  const c10::Stream current =
      c10::impl::getDeviceGuardImpl(issued.device_type())->getStream(issued.device());
  if (current == issued) return;
  c10::Event event(issued.device_type());
  event.record(issued);
  event.block(current);
}

}  // namespace

TuttiWork::TuttiWork(int rank, c10d::OpType type, std::vector<c10::intrusive_ptr<TuttiWork>> parts)
    : c10d::Work(rank, type), parts_(std::move(parts)) {
  for (const auto& p : parts_) {
    for (const auto& t : p->outputs_) outputs_.push_back(t);
  }
  done_ = parts_.empty();  // nothing to wait for
}

void TuttiWork::done(const std::exception_ptr& error) {
  std::exception_ptr failure = error;
  if (!failure && finish_) {
    try {
      finish_();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(done_mutex_);
    done_ = true;
    error_ = to_torch_error(failure);
    future = future_;
  }
  if (future && !issue_stream_) {
    if (error_) {
      future->setError(error_);
    } else {
      future->markCompleted(c10::IValue(outputs_));
    }
  }
}

bool TuttiWork::isCompleted() {
  post();
  if (!parts_.empty()) {
    for (const auto& p : parts_) {
      if (!p->isCompleted()) return false;
    }
    return true;
  }
  std::lock_guard<std::mutex> lock(done_mutex_);
  return done_;
}

bool TuttiWork::isSuccess() const {
  if (!parts_.empty()) {
    for (const auto& p : parts_) {
      if (!p->isSuccess()) return false;
    }
    return true;
  }
  std::lock_guard<std::mutex> lock(done_mutex_);
  return done_ && !error_;
}

std::exception_ptr TuttiWork::exception() const {
  for (const auto& p : parts_) {
    if (auto e = p->exception()) return e;
  }
  std::lock_guard<std::mutex> lock(done_mutex_);
  return error_;
}

std::vector<at::Tensor> TuttiWork::result() {
  return outputs_;
}

void TuttiWork::synchronize() {
  // c10d's contract: the current stream waits for the op (a no-op for a host-ordered op, whose
  // Work completes only once its results are in place).
  for (const auto& p : parts_) p->synchronize();
  if (issue_stream_) wait_for_stream(*issue_stream_);
}

bool TuttiWork::wait(std::chrono::milliseconds timeout) {
  post();
  if (!parts_.empty()) {
    // One timeout for the whole, not one per part.
    const bool bounded = timeout.count() > 0;
    const auto deadline =
        bounded ? deadline_after(timeout) : std::chrono::steady_clock::time_point::max();
    for (const auto& p : parts_) {
      p->wait(bounded ? std::max(std::chrono::milliseconds(1),
                                 std::chrono::ceil<std::chrono::milliseconds>(
                                     deadline - std::chrono::steady_clock::now()))
                      : timeout);
    }
    return true;
  }
  if (!work_) return true;  // an empty coalescing block, or a batch with nothing for this rank
  if (issue_stream_) {
    if (work_->is_completed()) {
      if (auto e = exception()) std::rethrow_exception(e);
    }
    wait_for_stream(*issue_stream_);  // the current stream waits; the host does not
    return true;
  }
  try {
    work_->wait(timeout.count() <= 0 ? kUseGroupTimeout : timeout);
  } catch (...) {
    // The op's own error is the one recorded (after its copy-backs); a wait's timeout is its own.
    if (isCompleted() && exception()) std::rethrow_exception(exception());
    rethrow_as_torch(std::current_exception());
  }
  // The hook ran before the waiters woke: done_ is set, with any error of the copy-backs.
  if (auto e = exception()) std::rethrow_exception(e);
  return true;
}

void TuttiWork::abort() {
  // tutti aborts a group, not one op: the caller aborts the process group (ProcessGroup::abort).
}

c10::intrusive_ptr<c10::ivalue::Future> TuttiWork::getFuture() {
  post();
  if (!parts_.empty()) {
    // Done when every part is, failed with the first part's error.
    std::lock_guard<std::mutex> lock(done_mutex_);
    if (future_) return future_;
    // Stream-ordered parts: the whole is too (its value's devices are theirs), and it is
    // completed on streams that wait for every part's issuing stream (the last part to finish
    // may be a host-ordered one, finished on another thread, whose current stream is another).
    std::vector<c10::Stream> issued;
    for (const auto& p : parts_) {
      if (p->issue_stream_ &&
          std::find(issued.begin(), issued.end(), *p->issue_stream_) == issued.end()) {
        issued.push_back(*p->issue_stream_);
      }
    }
    std::vector<c10::Device> devices;
    for (const c10::Stream& s : issued) {
      if (std::find(devices.begin(), devices.end(), s.device()) == devices.end()) {
        devices.push_back(s.device());
      }
    }
    auto all = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), devices);
    future_ = all;
    struct Count {
      std::mutex mutex;
      size_t left;
      std::exception_ptr error;
    };
    auto count = std::make_shared<Count>();
    count->left = parts_.size();
    auto outputs = outputs_;
    for (const auto& p : parts_) {
      p->getFuture()->addCallback([all, count, outputs, issued](c10::ivalue::Future& f) {
        bool last;
        std::exception_ptr error;
        {
          std::lock_guard<std::mutex> lock(count->mutex);
          if (f.hasError() && !count->error) count->error = f.exception_ptr();
          last = --count->left == 0;
          error = count->error;
        }
        if (!last) return;
        if (!error) {
          try {
            // markCompleted records on each device's current stream: make it wait first.
            for (const c10::Stream& s : issued) wait_for_stream(s);
          } catch (...) {
            error = std::current_exception();
          }
        }
        if (error) {
          all->setError(error);
        } else {
          all->markCompleted(c10::IValue(outputs));
        }
      });
    }
    return all;
  }
  std::lock_guard<std::mutex> lock(done_mutex_);
  if (!future_ && issue_stream_) {
    // Complete now, at the issuing stream's point (markCompleted records an event on the
    // current stream, which the future's waiters' streams then wait for).
    // An op already known to have failed gives a failed future, as wait() throws.
    c10::StreamGuard on_issued(*issue_stream_);
    future_ =
        c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                 std::vector<c10::Device>{issue_stream_->device()});
    if (done_ && error_) {
      future_->setError(error_);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }
  if (!future_) {
    future_ =
        c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    if (done_) {
      if (error_) {
        future_->setError(error_);
      } else {
        future_->markCompleted(c10::IValue(outputs_));
      }
    }
  }
  return future_;
}

}  // namespace tutti::torch_backend
