// CollectiveGroup's ops: check the call, number it, then run it inline, queue it (async ops of
// CPU backends), or hand it to a backend that completes it later (GPU ops).
#include <algorithm>
#include <memory>
#include <optional>
#include <type_traits>

#include "group/group_state.h"
#include "group/group_util.h"
#include "group/op_check.h"
#include "tutti/collective_group.h"
#include "util/local_processes.h"
#include "util/logging.h"
#include "util/op_clock.h"

namespace tutti {
namespace {

std::chrono::milliseconds resolve_timeout(std::chrono::milliseconds requested,
                                          std::chrono::milliseconds group_default) {
  return requested == kUseGroupTimeout ? group_default : requested;
}

// Packs two device indexes (the sender's, the receiver's) into one signature field.
uint64_t pair_of(int a, int b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

using detail::signature_of;

// Every field OpSignature::hash() reads (a field added there must be added here: the size
// check is a reminder).
static_assert(sizeof(OpSignature) == 40, "a field added to OpSignature: compare it here too");
bool same_signature(const OpSignature& a, const OpSignature& b) {
  return a.op == b.op && a.dtype == b.dtype && a.count == b.count && a.root == b.root &&
         a.root_tensor == b.root_tensor && a.devices == b.devices && a.reduce_op == b.reduce_op &&
         a.layout == b.layout;
}

// sig.hash(), from the last op's where it had the same signature (under the op lock). The hash's
// multiplies feed the tag, which the shm backend publishes with a locked store: ~9 ns of the
// ~100 a call costs the core at world size 1.
uint64_t signature_hash(CollectiveGroup::State& s, const OpSignature& sig) {
  if (!same_signature(sig, s.hashed_signature)) {
    s.hashed_signature = sig;
    s.signature_hash = sig.hash();
  }
  return s.signature_hash;
}

// Block r of a single buffer, shaped like `like` (what the list forms expect).
TensorView block(const TensorView& buffer, int r, const TensorView& like) {
  const TensorView flat = buffer.slice(r * like.numel(), like.numel());
  return TensorView(flat.data(), like.dtype(), like.shape(), like.device());
}

// The root's single buffer of gather (its output) or scatter (its input), checked and cut into
// world-size blocks shaped like the other tensor, in rank order (what the list forms take). The
// root's own block may be the other tensor itself; any other overlap is refused.
std::vector<TensorView> root_blocks(const CollectiveGroup::State& s, OpType op,
                                    const TensorView& output, const TensorView& input,
                                    bool output_is_whole) {
  const TensorView& whole = output_is_whole ? output : input;
  const TensorView& part = output_is_whole ? input : output;
  const char* whole_name = output_is_whole ? "output" : "input";
  const char* part_name = output_is_whole ? "input" : "output";
  s.check_tensor(op, whole, whole_name);
  s.check_same_dtype(op, whole, whole_name, part, part_name);
  if (whole.numel() != part.numel() * s.world_size) {
    s.fail(ErrorCode::kInvalidArgument, op,
           std::string(whole_name) + " has " + std::to_string(whole.numel()) +
               " elements, expected world size " + std::to_string(s.world_size) + " x " +
               part_name + "'s " + std::to_string(part.numel()));
  }
  const TensorView mine = whole.slice(s.rank * part.numel(), part.numel());
  if (mine.data() != part.data()) s.check_disjoint(op, output, "output", input, "input");
  std::vector<TensorView> blocks;
  for (int r = 0; r < s.world_size; ++r) blocks.push_back(block(whole, r, part));
  return blocks;
}

// One hash of a list of counts, for signatures.
uint64_t hash_of(const std::vector<int64_t>& counts) {
  detail::WordMix h;
  for (int64_t c : counts) h.mix(static_cast<uint64_t>(c));
  return h.value();
}

std::exception_ptr aborted_error(const CollectiveGroup::State& s, const OpContext& ctx) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(s.state_mutex);
    reason = s.abort_reason;
  }
  return std::make_exception_ptr(Error(
      ErrorCode::kAborted, ctx.description() + ": the group was aborted before this op started (" +
                               (reason.empty() ? std::string("destroyed") : reason) +
                               "); destroy it and initialise it again"));
}

// The flight recorder's view of an op (see flight_recorder.h); no-ops when it is off.
void note_start(const CollectiveGroup::State& s, uint64_t record,
                std::chrono::steady_clock::time_point when) {
  if (s.recorder) s.recorder->start(record, when);
}

// `exclusive`: the caller holds the op lock (an inline op).
void note_finish(const CollectiveGroup::State& s, uint64_t record, const char* error = nullptr,
                 bool exclusive = false) {
  if (!s.recorder) return;
  if (error == nullptr) {
    s.recorder->finish(record, nullptr, exclusive);
  } else {
    const std::string text = error;
    s.recorder->finish(record, &text, exclusive);
  }
}

const char* what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    static thread_local std::string text;
    text = e.what();
    return text.c_str();
  } catch (...) {
    return "unknown error";
  }
}

// A list of one tensor, for the backend, made without allocating: the calling thread's own
// list while no other OneTensor of the thread holds it (a backend that runs another group's op
// from inside its own gets a fresh list there). Lives as long as the backend's call.
class OneTensor {
 public:
  explicit OneTensor(const TensorView& t) {
    static thread_local std::vector<TensorView> spare(1);
    static thread_local bool spare_busy = false;
    if (!spare_busy) {
      spare_busy = true;
      busy_ = &spare_busy;
      spare[0] = t;
      list_ = &spare;
    } else {
      own_.push_back(t);
      list_ = &own_;
    }
  }
  ~OneTensor() {
    if (busy_ != nullptr) *busy_ = false;
  }
  OneTensor(const OneTensor&) = delete;
  OneTensor& operator=(const OneTensor&) = delete;
  operator const std::vector<TensorView>&() const { return *list_; }  // NOLINT

 private:
  const std::vector<TensorView>* list_ = nullptr;
  bool* busy_ = nullptr;
  std::vector<TensorView> own_;
};

// What a blocking op returns, taking the finished call's context over (its group name's
// reference moves instead of being counted up and down again). (Handing out again a Work its
// caller dropped would save ~15 ns of the ~100 a call costs the core, but a Work outliving its
// caller's handle would keep what keep_alive() was given alive too.)
std::shared_ptr<Work> completed_work(OpContext&& ctx) {
  return Work::completed(std::move(ctx));
}

}  // namespace

// One op being issued: the op lock (held while it is numbered and issued, and while an inline
// op runs) and the context handed to the backend.
struct CollectiveGroup::Call {
  // Every member by its own initialiser: `Call{...}` value-initialised the context and the
  // fingerprint, zeroing all 240 bytes first (a `rep stos`, ~8 of the ~110 ns an op costs the
  // core).
  Call(std::unique_lock<std::mutex> held, bool is_async) : lock(std::move(held)), async(is_async) {}
  std::unique_lock<std::mutex> lock;
  OpContext ctx;
  bool skip = false;  // zero elements: nothing to move
  bool async = false;
  bool p2p = false;     // a send, a recv or a batch of them
  int peer = -1;        // the other rank of a send or recv
  uint64_t record = 0;  // its entry in the flight recorder (once run or skipped)
  // Set when the ranks compare their ops' fingerprints before each collective.
  std::optional<detail::Fingerprint> fingerprint;
};

CollectiveGroup::Call CollectiveGroup::begin(OpType op, const OpSignature& sig,
                                             const OpOptions& opts, const Shape* shape, int peer,
                                             bool sending) {
  State& s = *state_;
  // Before the op lock: in a forked child it may be held forever by a thread of the parent.
  if (s.forked()) s.fail(ErrorCode::kInvalidUsage, op, s.forked_message());
  const std::chrono::milliseconds timeout = resolve_timeout(opts.timeout, s.timeout);
  if (timeout.count() <= 0) {
    s.fail(ErrorCode::kInvalidArgument, op,
           "timeout must be positive, got " + std::to_string(timeout.count()) + " ms");
  }
  if (!s.op_supported[static_cast<size_t>(op)]) {
    s.fail(ErrorCode::kUnavailable, op,
           "backend '" + s.backend_name + "' does not support '" + to_string(op) + "'");
  }
  // CPU backends only: the NCCL backend's ops are enqueued on streams, and its users (and
  // tests) issue from a second thread while the first holds an async op; see collective_group.h.
  if (s.runs_inline) s.check_thread(op);
  // Before the op lock too: a hook that destroy() runs on the worker (it drains the queue there)
  // may issue an op on the thread that holds it.
  if (s.destroyed.load()) s.fail(ErrorCode::kInvalidUsage, op, "the group was destroyed");
  Call call(std::unique_lock<std::mutex>(s.op_mutex), opts.async_op);
  if (s.destroyed.load()) s.fail(ErrorCode::kInvalidUsage, op, "the group was destroyed");
  if (s.aborted.load()) {
    std::lock_guard<std::mutex> lock(s.state_mutex);
    s.fail(ErrorCode::kAborted, op,
           "the group was aborted by an earlier failure (" + s.abort_reason +
               "); destroy it and initialise it again");
  }
  call.p2p = peer >= 0 || op == OpType::kBatchP2P;
  uint64_t seq;
  if (op == OpType::kBatchP2P) {
    seq = s.batch_seq++;
  } else if (peer < 0) {
    seq = s.collective_seq++;
  } else {
    seq = sending ? s.send_seq[peer]++ : s.recv_seq[peer]++;
  }
  call.ctx.op = op;
  call.ctx.seq = seq;
  call.ctx.signature = sig;
  const uint64_t hash = signature_hash(s, sig);
  if (peer >= 0) {
    // Point-to-point tags also fold in the direction (sender, receiver), so both ends agree.
    call.ctx.tag = detail::p2p_tag(seq, hash, sending ? s.rank : peer, sending ? peer : s.rank);
  } else {
    call.ctx.tag = detail::collective_tag(seq, hash);
  }
  call.ctx.timeout = timeout;
  call.ctx.group_name = s.name;
  call.ctx.rank = s.rank;
  call.ctx.world_size = s.world_size;
  call.ctx.started = detail::op_now();  // an inline op's deadline counts from here
  // This process runs ops: other jobs' shm ranks on its CPUs count it (local_processes.h).
  detail::note_local_activity(call.ctx.started);
  call.peer = peer;
  if (s.check_ops && !call.p2p && s.runs_inline && s.world_size > 1) {
    call.fingerprint = detail::fingerprint(seq, sig, shape);
  }
  return call;
}

// `issue(backend, ctx)` calls the backend; it owns copies of everything it refers to, because an
// async op runs it after the caller has returned.
template <typename Issue>
CollectiveGroup::WorkPtr CollectiveGroup::submit(Call& call, Issue&& issue) {
  if (call.skip) {
    // Nothing to move. A CPU collective still meets its peers, as a barrier under the op's own
    // tag, so that a rank alone in calling it with no elements fails as any mismatch does
    // instead of returning at once; messages and GPU ops complete at once.
    if (call.p2p || !state_->runs_inline) {
      if (state_->recorder) call.record = state_->recorder->issue(call.ctx, call.peer, true);
      note_finish(*state_, call.record, nullptr, true);
      return completed_work(std::move(call.ctx));
    }
    return run(call,
               [](Backend& b, const OpContext& ctx) { return b.barrier(BarrierOptions{}, ctx); });
  }
  return run(call, std::forward<Issue>(issue));
}

template <typename Issue>
CollectiveGroup::WorkPtr CollectiveGroup::run(Call& call, Issue&& issue) {
  State& s = *state_;
  // An op issued on the group's own worker (from a completion hook: a torch future's callback)
  // runs there and then: queued behind the op whose hook issued it, a wait for it would never end.
  const bool queue_it =
      s.runs_inline && (call.async || s.queued.load() > 0) && !s.queue.on_worker();
  if (s.recorder) call.record = s.recorder->issue(call.ctx, call.peer, !queue_it);
  if (queue_it) {
    // On the group's worker, after the ops queued before it. A blocking call behind async ones
    // waits for its turn there, so ops always run in issue order.
    auto work = std::make_shared<Work>(call.ctx);
    s.queued.fetch_add(1);
    State* state = &s;
    s.queue.push([state, work, queued_ctx = call.ctx, fingerprint = call.fingerprint,
                  record = call.record, fn = std::decay_t<Issue>(std::forward<Issue>(issue))] {
      OpContext ctx = queued_ctx;
      std::exception_ptr error;
      if (state->aborted.load() || state->destroyed.load()) {
        error = aborted_error(*state, ctx);
        note_finish(*state, record, what_of(error));
      } else {
        // Its deadline counts from when it starts, not from when it was queued.
        ctx.started = detail::op_now();
        detail::note_local_activity(ctx.started);  // (as in begin())
        note_start(*state, record, ctx.started);
        try {
          if (fingerprint) detail::check_fingerprints(*state->backend, ctx, *fingerprint);
          WorkPtr inner = fn(*state->backend, ctx);
          if (inner) inner->wait();
          note_finish(*state, record);
        } catch (const Error& e) {
          note_finish(*state, record, e.what());
          state->record_failure(ctx, e);
          error = std::current_exception();
        } catch (const std::exception& e) {
          Error wrapped(ErrorCode::kInternal, ctx.description() + ": " + e.what());
          note_finish(*state, record, wrapped.what());
          state->record_failure(ctx, wrapped);
          error = std::make_exception_ptr(wrapped);
        }
      }
      // No longer queued before it completes: a caller that sees it complete and destroys the
      // group finds nothing running. Then nothing of the group is touched: the Work's hooks may
      // destroy the group, or drop its last reference.
      state->queued.fetch_sub(1);
      work->finish(error);
    });
    call.lock.unlock();
    if (!call.async) work->wait();
    return work;
  }
  WorkPtr work;
  try {
    if (call.fingerprint) detail::check_fingerprints(*s.backend, call.ctx, *call.fingerprint);
    work = issue(*s.backend, call.ctx);
  } catch (const Error& e) {
    note_finish(s, call.record, e.what(), true);
    s.record_failure(call.ctx, e);
    throw;
  } catch (const std::exception& e) {
    Error wrapped(ErrorCode::kInternal, call.ctx.description() + ": " + e.what());
    note_finish(s, call.record, wrapped.what(), true);
    s.record_failure(call.ctx, wrapped);
    throw wrapped;
  }
  if (!work) {
    note_finish(s, call.record, nullptr, true);
    return completed_work(std::move(call.ctx));
  }
  // It completes later (a GPU op): its failure aborts the group as a synchronous one would.
  std::weak_ptr<State> weak = state_;
  work->on_finish([weak, ctx = call.ctx, record = call.record](const std::exception_ptr& error) {
    auto state = weak.lock();
    if (!state) return;
    note_finish(*state, record, error ? what_of(error) : nullptr);
    if (!error) return;
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      state->record_failure(ctx, e);
    } catch (...) {
    }
  });
  return work;
}

using WorkPtr = CollectiveGroup::WorkPtr;

WorkPtr CollectiveGroup::broadcast(TensorView tensor, const BroadcastOptions& opts) {
  const OpType op = OpType::kBroadcast;
  state_->check_tensor(op, tensor, "tensor");
  state_->check_rank(op, opts.root_rank, "root rank");
  auto call = begin(op, signature_of(op, tensor, opts.root_rank), opts, &tensor.shape());
  call.skip = tensor.numel() == 0;
  return submit(call, [t = std::move(tensor), opts](Backend& b, const OpContext& ctx) {
    return b.broadcast(OneTensor(t), opts, ctx);
  });
}

WorkPtr CollectiveGroup::allreduce(TensorView tensor, const AllreduceOptions& opts) {
  const OpType op = OpType::kAllreduce;
  state_->check_tensor(op, tensor, "tensor");
  state_->check_reduce_op(op, opts.reduce_op, tensor.dtype());
  auto call = begin(op, signature_of(op, tensor, -1, static_cast<int>(opts.reduce_op)), opts,
                    &tensor.shape());
  call.skip = tensor.numel() == 0;
  return submit(call, [t = std::move(tensor), opts](Backend& b, const OpContext& ctx) {
    return b.allreduce(OneTensor(t), opts, ctx);
  });
}

WorkPtr CollectiveGroup::reduce(TensorView tensor, const ReduceOptions& opts) {
  const OpType op = OpType::kReduce;
  state_->check_tensor(op, tensor, "tensor");
  state_->check_rank(op, opts.root_rank, "root rank");
  state_->check_reduce_op(op, opts.reduce_op, tensor.dtype());
  auto call = begin(op, signature_of(op, tensor, opts.root_rank, static_cast<int>(opts.reduce_op)),
                    opts, &tensor.shape());
  call.skip = tensor.numel() == 0;
  return submit(call, [t = std::move(tensor), opts](Backend& b, const OpContext& ctx) {
    return b.reduce(OneTensor(t), opts, ctx);
  });
}

WorkPtr CollectiveGroup::allgather(const std::vector<TensorView>& output_list, TensorView input,
                                   const AllgatherOptions& opts) {
  const OpType op = OpType::kAllgather;
  state_->check_tensor(op, input, "input");
  state_->check_list(op, output_list, input, "output", "input");
  state_->check_list_apart(op, output_list, "output", input, "input");
  auto call = begin(op, signature_of(op, input), opts, &input.shape());
  call.skip = input.numel() == 0;
  return submit(call, [outs = std::vector<std::vector<TensorView>>{output_list},
                       in = std::move(input), opts](Backend& b, const OpContext& ctx) {
    return b.allgather(outs, OneTensor(in), opts, ctx);
  });
}

WorkPtr CollectiveGroup::allgather(TensorView output, TensorView input,
                                   const AllgatherOptions& opts) {
  const OpType op = OpType::kAllgather;
  State& s = *state_;
  s.check_tensor(op, input, "input");
  s.check_tensor(op, output, "output");
  s.check_same_dtype(op, output, "output", input, "input");
  if (output.numel() != input.numel() * s.world_size) {
    s.fail(ErrorCode::kInvalidArgument, op,
           "output has " + std::to_string(output.numel()) + " elements, expected world size " +
               std::to_string(s.world_size) + " x input's " + std::to_string(input.numel()));
  }
  // In place when the input is this rank's block of the output; else they must not overlap.
  const TensorView mine = output.slice(s.rank * input.numel(), input.numel());
  if (mine.data() != input.data()) s.check_disjoint(op, output, "output", input, "input");
  auto call = begin(op, signature_of(op, input), opts, &input.shape());
  call.skip = input.numel() == 0;
  return submit(
      call, [out = std::move(output), in = std::move(input), opts](
                Backend& b, const OpContext& ctx) { return b.allgather_into(out, in, opts, ctx); });
}

WorkPtr CollectiveGroup::allgatherv(TensorView output, TensorView input,
                                    const std::vector<int64_t>& counts,
                                    const AllgathervOptions& opts) {
  const OpType op = OpType::kAllgatherv;
  State& s = *state_;
  s.check_tensor(op, input, "input");
  s.check_tensor(op, output, "output");
  s.check_same_dtype(op, output, "output", input, "input");
  s.check_counts(op, counts, "counts", output.numel(), "output");
  if (input.numel() != counts[s.rank]) {
    s.fail(ErrorCode::kInvalidArgument, op,
           "input has " + std::to_string(input.numel()) + " elements, counts[" +
               std::to_string(s.rank) + "] says " + std::to_string(counts[s.rank]));
  }
  int64_t offset = 0;
  for (int r = 0; r < s.rank; ++r) offset += counts[r];
  const TensorView mine = output.slice(offset, input.numel());
  if (mine.data() != input.data()) s.check_disjoint(op, output, "output", input, "input");
  OpSignature sig = signature_of(op, output);
  sig.layout = hash_of(counts);
  auto call = begin(op, sig, opts, &output.shape());
  call.skip = output.numel() == 0;
  return submit(call, [out = std::move(output), in = std::move(input), counts, opts](
                          Backend& b, const OpContext& ctx) {
    return b.allgatherv(out, in, counts, opts, ctx);
  });
}

WorkPtr CollectiveGroup::reduce_scatter(TensorView output,
                                        const std::vector<TensorView>& input_list,
                                        const ReduceScatterOptions& opts) {
  const OpType op = OpType::kReduceScatter;
  state_->check_tensor(op, output, "output");
  state_->check_reduce_op(op, opts.reduce_op, output.dtype());
  state_->check_list(op, input_list, output, "input", "output");
  state_->check_list_apart(op, input_list, "input", output, "output");
  auto call = begin(op, signature_of(op, output, -1, static_cast<int>(opts.reduce_op)), opts,
                    &output.shape());
  call.skip = output.numel() == 0;
  return submit(
      call, [out = std::move(output), ins = std::vector<std::vector<TensorView>>{input_list}, opts](
                Backend& b, const OpContext& ctx) {
        return b.reduce_scatter(OneTensor(out), ins, opts, ctx);
      });
}

WorkPtr CollectiveGroup::reduce_scatter(TensorView output, TensorView input,
                                        const ReduceScatterOptions& opts) {
  const OpType op = OpType::kReduceScatter;
  State& s = *state_;
  s.check_tensor(op, input, "input");
  s.check_tensor(op, output, "output");
  s.check_same_dtype(op, input, "input", output, "output");
  s.check_reduce_op(op, opts.reduce_op, output.dtype());
  if (input.numel() != output.numel() * s.world_size) {
    s.fail(ErrorCode::kInvalidArgument, op,
           "input has " + std::to_string(input.numel()) + " elements, expected world size " +
               std::to_string(s.world_size) + " x output's " + std::to_string(output.numel()));
  }
  // In place when the output is this rank's block of the input; else they must not overlap.
  const TensorView mine = input.slice(s.rank * output.numel(), output.numel());
  if (mine.data() != output.data()) s.check_disjoint(op, output, "output", input, "input");
  auto call = begin(op, signature_of(op, output, -1, static_cast<int>(opts.reduce_op)), opts,
                    &output.shape());
  call.skip = output.numel() == 0;
  return submit(call, [out = std::move(output), in = std::move(input), opts](Backend& b,
                                                                             const OpContext& ctx) {
    return b.reduce_scatter_from(out, in, opts, ctx);
  });
}

WorkPtr CollectiveGroup::alltoall(const std::vector<TensorView>& output_list,
                                  const std::vector<TensorView>& input_list,
                                  const AlltoallOptions& opts) {
  const OpType op = OpType::kAlltoall;
  State& s = *state_;
  s.check_usable(op);
  if (static_cast<int>(input_list.size()) != s.world_size) {
    s.fail(ErrorCode::kInvalidArgument, op,
           "input list has " + std::to_string(input_list.size()) +
               " tensors, expected one per rank (" + std::to_string(s.world_size) + ")");
  }
  s.check_tensor(op, input_list[0], "input 0");
  s.check_list(op, input_list, input_list[0], "input", "input 0");
  s.check_list(op, output_list, input_list[0], "output", "input 0");
  s.check_lists_disjoint(op, output_list, input_list);
  const int64_t n = input_list[0].numel();
  auto call = begin(op, signature_of(op, input_list[0]), opts, &input_list[0].shape());
  call.skip = n == 0;
  return submit(call,
                [outs = output_list, ins = input_list, opts](Backend& b, const OpContext& ctx) {
                  return b.alltoall(outs, ins, opts, ctx);
                });
}

WorkPtr CollectiveGroup::alltoall(TensorView output, TensorView input,
                                  const AlltoallOptions& opts) {
  const OpType op = OpType::kAlltoall;
  State& s = *state_;
  s.check_tensor(op, input, "input");
  s.check_tensor(op, output, "output");
  s.check_same_dtype(op, output, "output", input, "input");
  if (input.numel() != output.numel() || input.numel() % s.world_size != 0) {
    s.fail(ErrorCode::kInvalidArgument, op,
           "input has " + std::to_string(input.numel()) + " elements and output " +
               std::to_string(output.numel()) + ": both must hold world size (" +
               std::to_string(s.world_size) + ") equal blocks");
  }
  s.check_disjoint(op, output, "output", input, "input");
  const int64_t block = input.numel() / s.world_size;
  OpSignature sig = signature_of(op, input);
  sig.count = block;
  auto call = begin(op, sig, opts);
  call.skip = block == 0;
  return submit(call, [out = std::move(output), in = std::move(input),
                       counts = std::vector<int64_t>(s.world_size, block),
                       opts](Backend& b, const OpContext& ctx) {
    return b.alltoall_base(out, in, counts, counts, opts, ctx);
  });
}

WorkPtr CollectiveGroup::alltoallv(TensorView output, TensorView input,
                                   const std::vector<int64_t>& output_counts,
                                   const std::vector<int64_t>& input_counts,
                                   const AlltoallOptions& opts) {
  const OpType op = OpType::kAlltoallv;
  State& s = *state_;
  s.check_tensor(op, input, "input");
  s.check_tensor(op, output, "output");
  s.check_same_dtype(op, output, "output", input, "input");
  s.check_counts(op, input_counts, "input counts", input.numel(), "input");
  s.check_counts(op, output_counts, "output counts", output.numel(), "output");
  s.check_disjoint(op, output, "output", input, "input");
  // Counts differ from rank to rank, so the signature has none; each message's size is part of
  // its own tag, so blocks of different sizes never meet.
  OpSignature sig = signature_of(op, input);
  sig.count = 0;
  auto call = begin(op, sig, opts);
  return submit(call, [out = std::move(output), in = std::move(input), output_counts, input_counts,
                       opts](Backend& b, const OpContext& ctx) {
    return b.alltoall_base(out, in, output_counts, input_counts, opts, ctx);
  });
}

WorkPtr CollectiveGroup::gather(const std::vector<TensorView>& output_list, TensorView input,
                                const GatherOptions& opts) {
  const OpType op = OpType::kGather;
  State& s = *state_;
  s.check_tensor(op, input, "input");
  s.check_rank(op, opts.root_rank, "root rank");
  const bool root = s.rank == opts.root_rank;
  if (root) s.check_list(op, output_list, input, "output", "input");
  auto call = begin(op, signature_of(op, input, opts.root_rank), opts, &input.shape());
  call.skip = input.numel() == 0;
  return submit(
      call, [outs = root ? output_list : std::vector<TensorView>{}, in = std::move(input), opts](
                Backend& b, const OpContext& ctx) { return b.gather(outs, in, opts, ctx); });
}

WorkPtr CollectiveGroup::gather(TensorView output, TensorView input, const GatherOptions& opts) {
  const OpType op = OpType::kGather;
  State& s = *state_;
  s.check_tensor(op, input, "input");
  s.check_rank(op, opts.root_rank, "root rank");
  std::vector<TensorView> outs;
  if (s.rank == opts.root_rank) outs = root_blocks(s, op, output, input, /*output_is_whole=*/true);
  return gather(outs, std::move(input), opts);
}

WorkPtr CollectiveGroup::scatter(TensorView output, const std::vector<TensorView>& input_list,
                                 const ScatterOptions& opts) {
  const OpType op = OpType::kScatter;
  State& s = *state_;
  s.check_tensor(op, output, "output");
  s.check_rank(op, opts.root_rank, "root rank");
  const bool root = s.rank == opts.root_rank;
  if (root) {
    s.check_list(op, input_list, output, "input", "output");
    // The root's own block is copied before the others are sent: an output over another input
    // would overwrite it first.
    s.check_list_apart(op, input_list, "input", output, "output");
  }
  auto call = begin(op, signature_of(op, output, opts.root_rank), opts, &output.shape());
  call.skip = output.numel() == 0;
  return submit(
      call, [out = std::move(output), ins = root ? input_list : std::vector<TensorView>{}, opts](
                Backend& b, const OpContext& ctx) { return b.scatter(out, ins, opts, ctx); });
}

WorkPtr CollectiveGroup::scatter(TensorView output, TensorView input, const ScatterOptions& opts) {
  const OpType op = OpType::kScatter;
  State& s = *state_;
  s.check_tensor(op, output, "output");
  s.check_rank(op, opts.root_rank, "root rank");
  std::vector<TensorView> ins;
  if (s.rank == opts.root_rank) ins = root_blocks(s, op, output, input, /*output_is_whole=*/false);
  return scatter(std::move(output), ins, opts);
}

WorkPtr CollectiveGroup::barrier(const BarrierOptions& opts) {
  const OpType op = OpType::kBarrier;
  state_->check_usable(op);
  OpSignature sig;
  sig.op = op;
  auto call = begin(op, sig, opts);
  return submit(call, [opts](Backend& b, const OpContext& ctx) { return b.barrier(opts, ctx); });
}

WorkPtr CollectiveGroup::send(TensorView tensor, int dst_rank, const SendOptions& opts) {
  const OpType op = OpType::kSend;
  state_->check_tensor(op, tensor, "tensor");
  state_->check_rank(op, dst_rank, "destination rank", /*allow_self=*/false);
  auto call = begin(op, signature_of(OpType::kSend, tensor), opts, nullptr, dst_rank,
                    /*sending=*/true);
  call.skip = tensor.numel() == 0;
  // The peer's device is whichever its matching recv uses (dst_device_index is for the
  // multi-device form).
  SendOptions o = opts;
  o.dst_device_index = kPeerDevice;
  return submit(call, [t = std::move(tensor), dst_rank, o](Backend& b, const OpContext& ctx) {
    return b.send(OneTensor(t), dst_rank, o, ctx);
  });
}

WorkPtr CollectiveGroup::recv(TensorView tensor, int src_rank, const RecvOptions& opts) {
  const OpType op = OpType::kRecv;
  state_->check_tensor(op, tensor, "tensor");
  state_->check_rank(op, src_rank, "source rank", /*allow_self=*/false);
  // The signature matches the sender's, so a send meets exactly the recv of its size and dtype.
  auto call = begin(op, signature_of(OpType::kSend, tensor), opts, nullptr, src_rank,
                    /*sending=*/false);
  call.skip = tensor.numel() == 0;
  RecvOptions o = opts;
  o.src_device_index = kPeerDevice;
  return submit(call, [t = std::move(tensor), src_rank, o](Backend& b, const OpContext& ctx) {
    return b.recv(OneTensor(t), src_rank, o, ctx);
  });
}

WorkPtr CollectiveGroup::batch_isend_irecv(const std::vector<P2POp>& ops,
                                           const BatchP2POptions& opts) {
  const OpType op = OpType::kBatchP2P;
  State& s = *state_;
  s.check_usable(op);
  for (size_t i = 0; i < ops.size(); ++i) {
    const bool sending = ops[i].kind == P2POp::Kind::kSend;
    const std::string what = std::string(sending ? "send " : "recv ") + std::to_string(i);
    s.check_tensor(op, ops[i].tensor, (what + "'s tensor").c_str());
    s.check_rank(op, ops[i].peer,
                 (what + "'s " + (sending ? "destination" : "source") + " rank").c_str(),
                 /*allow_self=*/false);
    if (ops[i].peer_device_index < 0 && ops[i].peer_device_index != kPeerDevice) {
      s.fail(ErrorCode::kInvalidArgument, op,
             what + "'s peer device index " + std::to_string(ops[i].peer_device_index) +
                 " is negative (kPeerDevice, -1, means the peer's own choice)");
    }
  }
  if (ops.empty()) {
    // Nothing to post and nothing to number: not an op the peers take part in.
    OpContext ctx;
    ctx.op = op;
    ctx.group_name = s.name;
    ctx.rank = s.rank;
    ctx.world_size = s.world_size;
    return Work::completed(ctx);
  }
  OpSignature sig;
  sig.op = op;
  auto call = begin(op, sig, opts);
  // Each message is numbered as a plain send or recv would be, so it meets either form.
  std::vector<P2PRequest> requests;
  for (const P2POp& p : ops) {
    const bool sending = p.kind == P2POp::Kind::kSend;
    P2PRequest r;
    r.kind = p.kind;
    r.tensor = p.tensor;
    r.peer = p.peer;
    r.peer_device_index = p.peer_device_index;
    r.seq = sending ? s.send_seq[p.peer]++ : s.recv_seq[p.peer]++;
    r.tag = detail::p2p_tag(r.seq, signature_of(OpType::kSend, p.tensor).hash(),
                            sending ? s.rank : p.peer, sending ? p.peer : s.rank);
    if (r.tensor.numel() != 0) requests.push_back(std::move(r));
  }
  call.skip = requests.empty();
  return submit(call, [requests = std::move(requests), opts](Backend& b, const OpContext& ctx) {
    return b.batch_p2p(requests, opts, ctx);
  });
}

WorkPtr CollectiveGroup::allreduce_multigpu(const std::vector<TensorView>& tensors,
                                            const AllreduceOptions& opts) {
  const OpType op = OpType::kAllreduce;
  state_->check_device_list(op, tensors, "tensor");
  state_->check_reduce_op(op, opts.reduce_op, tensors[0].dtype());
  OpSignature sig = signature_of(op, tensors[0], -1, static_cast<int>(opts.reduce_op));
  sig.devices = static_cast<int>(tensors.size());
  auto call = begin(op, sig, opts, &tensors[0].shape());
  call.skip = tensors[0].numel() == 0;
  return submit(call, [tensors, opts](Backend& b, const OpContext& ctx) {
    return b.allreduce(tensors, opts, ctx);
  });
}

WorkPtr CollectiveGroup::reduce_multigpu(const std::vector<TensorView>& tensors,
                                         const ReduceOptions& opts) {
  const OpType op = OpType::kReduce;
  state_->check_rooted_list(op, tensors, opts.root_rank, opts.root_tensor);
  state_->check_reduce_op(op, opts.reduce_op, tensors[0].dtype());
  OpSignature sig = signature_of(op, tensors[0], opts.root_rank, static_cast<int>(opts.reduce_op));
  sig.root_tensor = opts.root_tensor;
  sig.devices = static_cast<int>(tensors.size());
  auto call = begin(op, sig, opts, &tensors[0].shape());
  call.skip = tensors[0].numel() == 0;
  return submit(call, [tensors, opts](Backend& b, const OpContext& ctx) {
    return b.reduce(tensors, opts, ctx);
  });
}

WorkPtr CollectiveGroup::broadcast_multigpu(const std::vector<TensorView>& tensors,
                                            const BroadcastOptions& opts) {
  const OpType op = OpType::kBroadcast;
  state_->check_rooted_list(op, tensors, opts.root_rank, opts.root_tensor);
  OpSignature sig = signature_of(op, tensors[0], opts.root_rank);
  sig.root_tensor = opts.root_tensor;
  sig.devices = static_cast<int>(tensors.size());
  auto call = begin(op, sig, opts, &tensors[0].shape());
  call.skip = tensors[0].numel() == 0;
  return submit(call, [tensors, opts](Backend& b, const OpContext& ctx) {
    return b.broadcast(tensors, opts, ctx);
  });
}

WorkPtr CollectiveGroup::allgather_multigpu(
    const std::vector<std::vector<TensorView>>& output_lists, const std::vector<TensorView>& inputs,
    const AllgatherOptions& opts) {
  const OpType op = OpType::kAllgather;
  State& s = *state_;
  s.check_device_list(op, inputs, "input");
  s.check_lists(op, output_lists, inputs, static_cast<size_t>(s.world_size) * inputs.size(),
                "output list", "its device's input");
  s.check_lists_apart(op, output_lists, "output list", inputs, "input");
  OpSignature sig = signature_of(op, inputs[0]);
  sig.devices = static_cast<int>(inputs.size());
  auto call = begin(op, sig, opts, &inputs[0].shape());
  call.skip = inputs[0].numel() == 0;
  return submit(call, [output_lists, inputs, opts](Backend& b, const OpContext& ctx) {
    return b.allgather(output_lists, inputs, opts, ctx);
  });
}

WorkPtr CollectiveGroup::reduce_scatter_multigpu(
    const std::vector<TensorView>& outputs, const std::vector<std::vector<TensorView>>& input_lists,
    const ReduceScatterOptions& opts) {
  const OpType op = OpType::kReduceScatter;
  State& s = *state_;
  s.check_device_list(op, outputs, "output");
  s.check_reduce_op(op, opts.reduce_op, outputs[0].dtype());
  s.check_lists(op, input_lists, outputs, static_cast<size_t>(s.world_size) * outputs.size(),
                "input list", "its device's output");
  s.check_lists_apart(op, input_lists, "input list", outputs, "output");
  OpSignature sig = signature_of(op, outputs[0], -1, static_cast<int>(opts.reduce_op));
  sig.devices = static_cast<int>(outputs.size());
  auto call = begin(op, sig, opts, &outputs[0].shape());
  call.skip = outputs[0].numel() == 0;
  return submit(call, [outputs, input_lists, opts](Backend& b, const OpContext& ctx) {
    return b.reduce_scatter(outputs, input_lists, opts, ctx);
  });
}

WorkPtr CollectiveGroup::send_multigpu(TensorView tensor, int dst_rank, int64_t n_elements,
                                       const SendOptions& opts) {
  TensorView view = state_->check_p2p_multigpu(OpType::kSend, tensor, dst_rank, n_elements,
                                               opts.dst_device_index);
  // Sender and receiver mix the same pair of device indexes: (sender's, receiver's).
  OpSignature sig = signature_of(OpType::kSend, view);
  sig.layout = pair_of(tensor.device().index, opts.dst_device_index);
  auto call = begin(OpType::kSend, sig, opts, nullptr, dst_rank, /*sending=*/true);
  call.skip = view.numel() == 0;
  return submit(call, [t = std::move(view), dst_rank, opts](Backend& b, const OpContext& ctx) {
    return b.send(OneTensor(t), dst_rank, opts, ctx);
  });
}

WorkPtr CollectiveGroup::recv_multigpu(TensorView tensor, int src_rank, int64_t n_elements,
                                       const RecvOptions& opts) {
  TensorView view = state_->check_p2p_multigpu(OpType::kRecv, tensor, src_rank, n_elements,
                                               opts.src_device_index);
  OpSignature sig = signature_of(OpType::kSend, view);
  sig.layout = pair_of(opts.src_device_index, tensor.device().index);
  auto call = begin(OpType::kRecv, sig, opts, nullptr, src_rank, /*sending=*/false);
  call.skip = view.numel() == 0;
  return submit(call, [t = std::move(view), src_rank, opts](Backend& b, const OpContext& ctx) {
    return b.recv(OneTensor(t), src_rank, opts, ctx);
  });
}

void CollectiveGroup::State::drain(bool hooks_too) {
  // No queue (NCCL's ops are the streams'); or on the worker (a hook): whatever was queued
  // before the op it runs in is done, and what was queued after cannot be waited for there.
  if (!runs_inline || queue.on_worker()) return;
  // With hooks_too (synchronize), a marker even when nothing is queued: the last op leaves the
  // count before its Work completes (its hooks may still run), and this returns only once they
  // have. Without (a split's ordering), only what is queued: a hook of the last op may wait for
  // a lock the caller holds (torch's backend splits its CUDA group under its issuer's lock).
  if (!hooks_too && queued.load() == 0) return;
  // A marker behind everything queued so far: once it has run, they all have.
  OpContext ctx;
  ctx.op = OpType::kBarrier;
  ctx.group_name = name;
  ctx.rank = rank;
  ctx.world_size = world_size;
  auto marker = std::make_shared<Work>(ctx);
  {
    std::lock_guard<std::mutex> lock(op_mutex);
    if (destroyed.load()) return;  // its queue is stopped: a push would start a worker again
    queued.fetch_add(1);
    queue.push([this, marker] {
      queued.fetch_sub(1);
      marker->finish();
    });
  }
  marker->wait();
}

void CollectiveGroup::synchronize(Device device) {
  State& s = *state_;
  if (s.forked()) {
    throw Error(ErrorCode::kInvalidUsage,
                "synchronize on " + describe() + ": " + s.forked_message());
  }
  if (s.destroyed.load()) {
    throw Error(ErrorCode::kInvalidUsage,
                "synchronize on " + describe() + ": the group was destroyed");
  }
  if (!s.device_supported[static_cast<size_t>(device.type)]) {
    throw Error(ErrorCode::kInvalidArgument, "synchronize on " + describe() + ": " + device.str() +
                                                 " is not a device of backend '" + s.backend_name +
                                                 "'");
  }
  s.drain(/*hooks_too=*/true);
  std::lock_guard<std::mutex> lock(s.op_mutex);
  // A destroy from another thread may have swapped the backend out meanwhile.
  if (std::shared_ptr<Backend> backend = s.current_backend()) backend->synchronize(device);
}

}  // namespace tutti
