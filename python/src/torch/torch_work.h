// A tutti op as c10d's Work, for the torch.distributed backend (tutti._torch).
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "tutti/work.h"

namespace tutti::torch_backend {

// tutti errors as torch's: c10::DistBackendError carrying tutti's message (its code named).
std::exception_ptr to_torch_error(const std::exception_ptr& error);
[[noreturn]] void rethrow_as_torch(const std::exception_ptr& error);

// One op: tutti's Work, the tensors torch gets as the result, and what runs once the op is done
// and before anyone sees it done (copies back into non-contiguous tensors, an average's
// division): `finish`, on the thread that completes the op.
class TuttiWork : public c10d::Work {
 public:
  static c10::intrusive_ptr<TuttiWork> create(int rank, c10d::OpType type,
                                              std::shared_ptr<tutti::Work> work,
                                              std::vector<at::Tensor> outputs,
                                              std::function<void()> finish = {});
  // A CUDA op, stream-ordered as c10d's NCCL ops are: the caller's current stream (`device`'s,
  // now) already waits for it (tutti's NCCL backend makes it), and whatever has to follow it
  // (copies back, an average's division) was queued there by the caller. wait() orders the
  // waiting thread's current stream after that stream (nothing to do where it is the same one),
  // without blocking the host; an op that already failed is rethrown. The future is complete as
  // soon as it is asked for, holding that stream's point. Both take the issuing stream's point
  // when called, not at issue: work queued there since is waited for too (never less than the
  // op). synchronize() as wait(). isCompleted() still says whether the GPU has finished the op.
  static c10::intrusive_ptr<TuttiWork> create_on_stream(int rank, c10d::OpType type,
                                                        std::shared_ptr<tutti::Work> work,
                                                        std::vector<at::Tensor> outputs,
                                                        const c10::Device& device);
  // For create (make_intrusive needs it public).
  TuttiWork(int rank, c10d::OpType type, std::shared_ptr<tutti::Work> work,
            std::vector<at::Tensor> outputs, std::function<void()> finish);
  // Several ops as one (coalescing): done when all are, failed with the first error.
  TuttiWork(int rank, c10d::OpType type, std::vector<c10::intrusive_ptr<TuttiWork>> parts);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // For an op not yet posted (a pending point-to-point op): what posts it, called before anyone
  // waits on it or asks whether it is done.
  void set_post(std::function<void()> post) { post_ = std::move(post); }

 private:
  void post() const {
    if (post_) post_();
  }
  // Called once the op (or every part) finished, on the thread that finished it.
  void done(const std::exception_ptr& error);

  std::shared_ptr<tutti::Work> work_;
  std::vector<c10::intrusive_ptr<TuttiWork>> parts_;
  std::vector<at::Tensor> outputs_;
  std::function<void()> finish_;
  std::function<void()> post_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::optional<c10::Stream> issue_stream_;  // create_on_stream's: the caller's stream
  mutable std::mutex done_mutex_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace tutti::torch_backend
