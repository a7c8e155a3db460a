#include "torch_backend.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <type_traits>

#include "torch_store.h"
#include "tutti/error.h"

// Names torch changed after 2.11 (the device image's): PREMUL_SUM's supplement was
// NCCLPreMulSumSupplement and is PreMulSumSupplement, and OpType gained the coalesced
// into-tensor ops. The module builds against either: `c10d::X` finds a name c10d declares itself
// first, and only otherwise these incomplete stand-ins, which the code below tells apart.
namespace tutti_torch_compat {
struct PreMulSumSupplement;
struct NCCLPreMulSumSupplement;
}  // namespace tutti_torch_compat
namespace c10d {
using namespace ::tutti_torch_compat;  // NOLINT(google-build-using-namespace)
}  // namespace c10d

namespace tutti::torch_backend {

// What issues the ops, shared with the Works of pending point-to-point ops.
struct TuttiBackend::Issuer {
  std::shared_ptr<CollectiveGroup> cpu;
  std::shared_ptr<CollectiveGroup> cuda;  // on tutti's NCCL backend, made on the first CUDA op
  c10::intrusive_ptr<c10d::Store> store;
  size_t inline_bytes = 64 << 10;
  std::recursive_mutex mutex;
  std::thread::id thread;  // the thread the groups were last handed to
  bool coalescing = false;
  std::vector<c10::intrusive_ptr<TuttiWork>> coalesced;
  struct Pending {
    P2POp op;
    std::shared_ptr<tutti::Work> work;  // finished when the batch posting it is
    at::Device device;
  };
  std::vector<Pending> pending;
  uint64_t seq = 0;
  uint64_t monitored = 0;

  // With the lock held.
  CollectiveGroup& group_for(const at::Device& device) {
    CollectiveGroup* g = cpu.get();
    if (device.is_cuda()) {
      if (!cuda) {
        // Every rank's first CUDA op is the same op: all of them split here together.
        adopt(*cpu);
        SplitOptions o;
        o.name = cpu->name() + ".cuda";
        o.backend = "nccl";
        std::vector<int> all(static_cast<size_t>(cpu->world_size()));
        std::iota(all.begin(), all.end(), 0);
        cuda = cpu->split(all, o);
      }
      g = cuda.get();
    }
    adopt(*g);
    return *g;
  }

  void adopt(CollectiveGroup& g) {
    const auto me = std::this_thread::get_id();
    if (thread != me) {
      cpu->issue_from_this_thread();
      if (cuda) cuda->issue_from_this_thread();
      thread = me;
    }
    (void)g;
  }

  // Posts the pending point-to-point ops as one batch. With the lock held.
  void flush() {
    if (pending.empty()) return;
    std::vector<Pending> batch;
    batch.swap(pending);
    std::vector<P2POp> ops;
    for (const auto& p : batch) ops.push_back(p.op);
    std::vector<std::shared_ptr<tutti::Work>> works;
    for (const auto& p : batch) works.push_back(p.work);
    try {
      CollectiveGroup& g = group_for(batch.front().device);
      BatchP2POptions o;
      o.async_op = true;
      if (batch.front().device.is_cuda()) o.stream = current_stream(batch.front().device);
      auto done = g.batch_isend_irecv(ops, o);
      done->on_finish([works](const std::exception_ptr& error) {
        for (const auto& w : works) w->finish(error);
      });
    } catch (...) {
      const auto error = std::current_exception();
      for (const auto& w : works) w->finish(error);
    }
  }

  static void* current_stream(const at::Device& device) {
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
  }
};

namespace {

template <typename T, typename = void>
struct Complete : std::false_type {};
template <typename T>
struct Complete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};
// PREMUL_SUM's supplement: whichever of the two names this torch declares (see the top).
using PreMulSum = std::conditional_t<Complete<c10d::PreMulSumSupplement>::value,
                                     c10d::PreMulSumSupplement, c10d::NCCLPreMulSumSupplement>;

// TuttiBackend::Options::clone has no `override` (torch 2.11 has no Backend::Options::clone):
// where torch declares one, its signature must be ours, or ours would not override it.
template <typename B>
constexpr bool clone_matches() {
  if constexpr (requires { &B::clone; }) {
    return std::is_same_v<decltype(&B::clone), c10::intrusive_ptr<B> (B::*)() const>;
  } else {
    return true;
  }
}
static_assert(clone_matches<c10d::Backend::Options>(),
              "c10d::Backend::Options::clone changed: TuttiBackend::Options::clone must follow");

// The coalesced into-tensor ops' OpType where torch has one, else the single op's.
template <typename E>
constexpr E allgather_coalesced_type() {
  if constexpr (requires { E::ALLGATHER_INTO_TENSOR_COALESCED; }) {
    return E::ALLGATHER_INTO_TENSOR_COALESCED;
  } else {
    return E::_ALLGATHER_BASE;
  }
}
template <typename E>
constexpr E reduce_scatter_coalesced_type() {
  if constexpr (requires { E::REDUCE_SCATTER_TENSOR_COALESCED; }) {
    return E::REDUCE_SCATTER_TENSOR_COALESCED;
  } else {
    return E::_REDUCE_SCATTER_BASE;
  }
}

std::chrono::milliseconds op_timeout(std::chrono::milliseconds t) {
  return t.count() < 0 ? kUseGroupTimeout : t;
}

size_t bytes_of(const std::vector<at::Tensor>& ts) {
  size_t n = 0;
  for (const auto& t : ts) n += t.nbytes();
  return n;
}

std::vector<Staged> stage_all(const std::vector<at::Tensor>& ts) {
  std::vector<Staged> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(stage(t));
  return out;
}

// Whether two tensors share memory (on one device, neither empty).
bool share_memory(const at::Tensor& a, const at::Tensor& b) {
  if (a.device() != b.device() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* x = static_cast<const char*>(a.data_ptr());
  const auto* y = static_cast<const char*>(b.data_ptr());
  return x < y + b.nbytes() && y < x + a.nbytes();
}

// A list form's entry `q` that shares memory with the op's other tensor, which tutti's group
// refuses but for this rank's own entry being that tensor itself (in place), while torch's Gloo
// and NCCL take it (all_gather([x] * W, x)).
bool aliases(const at::Tensor& entry, size_t q, const at::Tensor& other, int rank) {
  const bool in_place = static_cast<int>(q) == rank && entry.data_ptr() == other.data_ptr() &&
                        entry.nbytes() == other.nbytes();
  return !in_place && share_memory(entry, other);
}

// Staged tensor `s`, which the op only writes, gets a buffer of its own, copied back after it.
void own_buffer(Staged& s) {
  s.work = at::empty_like(s.work, at::MemoryFormat::Contiguous);
  s.copied = true;
}

const at::Tensor& one(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "tutti: ", op, " takes one tensor per process (got ", ts.size(),
              "); for several devices use one process per device");
  return ts[0];
}

// A reduce op as tutti's, with the factor a PREMUL_SUM scales by first (1: none).
ReduceOp reduce_op(const c10d::ReduceOp& op, const at::Tensor& t, const char* what, double& factor,
                   at::Tensor& tensor_factor) {
  factor = 1.0;
  const bool complex = t.is_complex();
  const bool boolean = t.scalar_type() == at::kBool;
  auto refuse = [&](const char* name) -> ReduceOp {
    TORCH_CHECK(false, "tutti: ", what, ": ReduceOp.", name, " is not supported for ",
                t.scalar_type(), " tensors",
                boolean ? ""
                        : " (tutti reduces with SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM; "
                          "BAND and BOR for bool tensors)");
  };
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::kSum;
    case c10d::ReduceOp::AVG: return ReduceOp::kAvg;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<PreMulSum*>(op.supplement_.get());
      TORCH_CHECK(s != nullptr, "tutti: ", what, ": PREMUL_SUM without its factor");
      if (s->tensor_factor.defined()) {
        tensor_factor = s->tensor_factor;
      } else {
        factor = s->double_factor;
      }
      return ReduceOp::kSum;
    }
    case c10d::ReduceOp::PRODUCT:
      if (complex) return refuse("PRODUCT");
      return ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      if (complex) return refuse("MIN");
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      if (complex) return refuse("MAX");
      return ReduceOp::kMax;
    case c10d::ReduceOp::BAND:
      if (boolean) return ReduceOp::kMin;  // and
      return refuse("BAND");
    case c10d::ReduceOp::BOR:
      if (boolean) return ReduceOp::kMax;  // or
      return refuse("BOR");
    case c10d::ReduceOp::BXOR: return refuse("BXOR");
    default: return refuse("UNUSED");
  }
}

// Scales `t` in place by a PREMUL_SUM's factor.
void premultiply(at::Tensor& t, double factor, const at::Tensor& tensor_factor) {
  if (tensor_factor.defined()) {
    t.mul_(tensor_factor.to(t.device()));
  } else if (factor != 1.0) {
    t.mul_(factor);
  }
}

// A flat view of a tensor (the single-buffer forms take elements, whatever the shape).
TensorView flat(const at::Tensor& t, Use use, const std::string& what) {
  TensorView v = view_of(t, use, what);
  return TensorView(v.data(), v.dtype(), {v.numel()}, v.device());
}

std::vector<TensorView> views(const std::vector<Staged>& staged, Use use, const std::string& what) {
  std::vector<TensorView> out;
  out.reserve(staged.size());
  for (const auto& s : staged) out.push_back(view_of(s.work, use, what));
  return out;
}

std::vector<at::Tensor> originals(const std::vector<Staged>& staged) {
  std::vector<at::Tensor> out;
  for (const auto& s : staged) out.push_back(s.original);
  return out;
}

}  // namespace

TuttiBackend::TuttiBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                           c10::intrusive_ptr<Options> options)
    : c10d::Backend(rank, size), issuer_(std::make_shared<Issuer>()), options_(std::move(options)) {
  issuer_->store = store;
  if (const char* v = std::getenv("TUTTI_TORCH_INLINE_BYTES")) {
    issuer_->inline_bytes = static_cast<size_t>(std::strtoull(v, nullptr, 10));
  }
  GroupOptions g;
  g.store = std::make_shared<TorchStore>(store, options_->timeout);
  g.timeout = options_->timeout;
  g.job_id = "torch";  // the store is the process group's own, already scoped to it
  const std::string name =
      options_->group_name.empty() ? std::string("torch") : "torch:" + options_->group_name;
  try {
    issuer_->cpu = CollectiveGroup::create(size, rank, options_->tutti_backend, name, g);
  } catch (...) {
    rethrow_as_torch(std::current_exception());
  }
  issuer_->thread = std::this_thread::get_id();
}

TuttiBackend::TuttiBackend(std::shared_ptr<Issuer> issuer, c10::intrusive_ptr<Options> options)
    : c10d::Backend(issuer->cpu->rank(), issuer->cpu->world_size()),
      issuer_(std::move(issuer)),
      options_(std::move(options)) {}

TuttiBackend::~TuttiBackend() {
  try {
    std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
    issuer_->flush();
  } catch (...) {
  }
  if (issuer_->cuda) issuer_->cuda->destroy();
  if (issuer_->cpu) issuer_->cpu->destroy();
}

std::shared_ptr<CollectiveGroup> TuttiBackend::group() const {
  return issuer_->cpu;
}

at::Tensor TuttiBackend::empty_symmetric(const std::vector<int64_t>& sizes, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype);
  size_t bytes = c10::elementSize(dtype);
  for (int64_t d : sizes) {
    TORCH_CHECK(d >= 0, "tutti: empty_symmetric: a negative size ", d);
    TORCH_CHECK(d == 0 || bytes <= (size_t{1} << 62) / static_cast<size_t>(d),
                "tutti: empty_symmetric: ", sizes, " is too large");
    bytes *= static_cast<size_t>(d);
  }
  if (bytes == 0) return at::empty(sizes, options);  // every rank asked for nothing alike
  std::shared_ptr<SymmetricMemory> memory;
  {
    std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
    TORCH_CHECK(!issuer_->coalescing,
                "tutti: empty_symmetric inside a coalescing block (it is an op of its own: call "
                "it before the block)");
    try {
      issuer_->flush();  // the allocation is an op in the order: pending ones go first
      memory = issuer_->group_for(at::Device(at::kCPU)).allocate_symmetric(bytes);
    } catch (...) {
      rethrow_as_torch(std::current_exception());
    }
  }
  void* data = memory->data();
  auto* holder = new std::shared_ptr<SymmetricMemory>(std::move(memory));
  return at::from_blob(
      data, sizes, [holder](void*) { delete holder; }, options);
}

template <typename Issue>
c10::intrusive_ptr<c10d::Work> TuttiBackend::run(c10d::OpType type, const at::Device& device,
                                                 bool async, size_t bytes,
                                                 std::vector<Staged> staged,
                                                 std::vector<at::Tensor> outputs,
                                                 std::function<void()> finish, Issue&& issue) {
  std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
  std::shared_ptr<tutti::Work> work;
  try {
    issuer_->flush();
    CollectiveGroup& g = issuer_->group_for(device);
    OpOptions o;
    o.async_op =
        device.is_cuda() || issuer_->coalescing || (async && bytes > issuer_->inline_bytes);
    if (device.is_cuda()) o.stream = Issuer::current_stream(device);
    work = issue(g, o);
  } catch (...) {
    rethrow_as_torch(std::current_exception());
  }
  ++issuer_->seq;
  auto done = [staged = std::move(staged), finish = std::move(finish)] {
    if (finish) finish();
    for (const auto& s : staged) s.copy_back();
  };
  if (device.is_cuda()) {
    // Stream-ordered, as c10d's NCCL ops: what follows the op is queued now on the current
    // stream, which waits for it; nothing waits on the host (TuttiWork::create_on_stream).
    try {
      done();
    } catch (...) {
      rethrow_as_torch(std::current_exception());
    }
    // The staged tensors stay alive until the op has finished on the GPU, as on the CPU path.
    work->keep_alive(std::make_shared<decltype(done)>(std::move(done)));
    return result(
        TuttiWork::create_on_stream(getRank(), type, std::move(work), std::move(outputs), device));
  }
  return result(
      TuttiWork::create(getRank(), type, std::move(work), std::move(outputs), std::move(done)));
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::result(c10::intrusive_ptr<TuttiWork> work) {
  if (issuer_->coalescing) issuer_->coalesced.push_back(work);
  return work;
}

// Copies the per-op option fields tutti reads from an OpOptions `o` into a derived options struct.
template <typename T>
T with(const OpOptions& o, std::chrono::milliseconds timeout) {
  T t;
  t.async_op = o.async_op;
  t.stream = o.stream;
  t.timeout = op_timeout(timeout);
  return t;
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  const at::Tensor& t = one(tensors, "broadcast");
  auto staged = stage_all({t});
  const TensorView v = view_of(staged[0].work, Use::kMove, "broadcast");
  return run(c10d::OpType::BROADCAST, t.device(), opts.asyncOp, t.nbytes(), staged, tensors, {},
             [&](CollectiveGroup& g, const OpOptions& o) {
               auto b = with<BroadcastOptions>(o, opts.timeout);
               b.root_rank = static_cast<int>(opts.rootRank);
               return g.broadcast(v, b);
             });
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  const at::Tensor& t = one(tensors, "allreduce");
  double factor;
  at::Tensor tensor_factor;
  const ReduceOp op = reduce_op(opts.reduceOp, t, "allreduce", factor, tensor_factor);
  auto staged = stage_all({t});
  premultiply(staged[0].work, factor, tensor_factor);
  const TensorView v = view_of(staged[0].work, Use::kReduce, "allreduce");
  return run(c10d::OpType::ALLREDUCE, t.device(), opts.asyncOp, t.nbytes(), staged, tensors, {},
             [&](CollectiveGroup& g, const OpOptions& o) {
               auto a = with<AllreduceOptions>(o, opts.timeout);
               a.reduce_op = op;
               return g.allreduce(v, a);
             });
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
  std::vector<c10::intrusive_ptr<TuttiWork>> parts;
  for (auto& t : tensors) {
    std::vector<at::Tensor> one_tensor{t};
    auto w = allreduce(one_tensor, opts);
    parts.push_back(c10::static_intrusive_pointer_cast<TuttiWork>(w));
  }
  return c10::make_intrusive<TuttiWork>(getRank(), c10d::OpType::ALLREDUCE_COALESCED,
                                        std::move(parts));
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  const at::Tensor& t = one(tensors, "reduce");
  double factor;
  at::Tensor tensor_factor;
  const ReduceOp op = reduce_op(opts.reduceOp, t, "reduce", factor, tensor_factor);
  auto staged = stage_all({t});
  if (factor != 1.0 || tensor_factor.defined()) {
    // A scaled copy: a non-root's tensor stays as it was, the root's takes the result.
    if (!staged[0].copied) staged[0].work = t.clone();
    staged[0].copied = getRank() == opts.rootRank;
    premultiply(staged[0].work, factor, tensor_factor);
  }
  const TensorView v = view_of(staged[0].work, Use::kReduce, "reduce");
  return run(c10d::OpType::REDUCE, t.device(), opts.asyncOp, t.nbytes(), staged, tensors, {},
             [&](CollectiveGroup& g, const OpOptions& o) {
               auto r = with<ReduceOptions>(o, opts.timeout);
               r.reduce_op = op;
               r.root_rank = static_cast<int>(opts.rootRank);
               return g.reduce(v, r);
             });
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const at::Tensor& in = one(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, "tutti: allgather takes one output list per process");
  auto in_staged = stage_all({in});
  auto out_staged = stage_all(outputs[0]);
  // Where some output aliases the input, every output over it gets a buffer of its own (also
  // this rank's in place), so that the copies back land in list order, as with torch's Gloo.
  bool aliased = false;
  for (size_t q = 0; q < out_staged.size(); ++q) {
    aliased = aliased || aliases(out_staged[q].work, q, in_staged[0].work, getRank());
  }
  for (Staged& s : out_staged) {
    if (aliased && share_memory(s.work, in_staged[0].work)) own_buffer(s);
  }
  const TensorView input = view_of(in_staged[0].work, Use::kMove, "allgather");
  const auto output_views = views(out_staged, Use::kMove, "allgather");
  auto keep = std::make_shared<std::vector<Staged>>(in_staged);  // read until the op is done
  return run(
      c10d::OpType::ALLGATHER, in.device(), opts.asyncOp, bytes_of(outputs[0]), out_staged,
      outputs[0], [keep] {},
      [&](CollectiveGroup& g, const OpOptions& o) {
        return g.allgather(output_views, input, with<AllgatherOptions>(o, opts.timeout));
      });
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  auto in_staged = stage_all({input});
  auto out_staged = stage_all({output});
  const TensorView in = flat(in_staged[0].work, Use::kMove, "all_gather_into_tensor");
  const TensorView out = flat(out_staged[0].work, Use::kMove, "all_gather_into_tensor");
  auto keep = std::make_shared<std::vector<Staged>>(in_staged);  // read until the op is done
  return run(
      c10d::OpType::_ALLGATHER_BASE, input.device(), opts.asyncOp, output.nbytes(), out_staged,
      {output}, [keep] {},
      [&](CollectiveGroup& g, const OpOptions& o) {
        return g.allgather(out, in, with<AllgatherOptions>(o, opts.timeout));
      });
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
  TORCH_CHECK(outputs.size() == inputs.size(), "tutti: allgather_coalesced: ", outputs.size(),
              " output lists for ", inputs.size(), " inputs");
  std::vector<c10::intrusive_ptr<TuttiWork>> parts;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> out{outputs[i]};
    std::vector<at::Tensor> in{inputs[i]};
    parts.push_back(c10::static_intrusive_pointer_cast<TuttiWork>(allgather(out, in, opts)));
  }
  return c10::make_intrusive<TuttiWork>(getRank(), c10d::OpType::ALLGATHER_COALESCED,
                                        std::move(parts));
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
  TORCH_CHECK(outputs.size() == inputs.size(),
              "tutti: allgather_into_tensor_coalesced: ", outputs.size(), " outputs for ",
              inputs.size(), " inputs");
  std::vector<c10::intrusive_ptr<TuttiWork>> parts;
  for (size_t i = 0; i < inputs.size(); ++i) {
    parts.push_back(c10::static_intrusive_pointer_cast<TuttiWork>(
        _allgather_base(outputs[i], inputs[i], opts)));
  }
  return c10::make_intrusive<TuttiWork>(getRank(), allgather_coalesced_type<c10d::OpType>(),
                                        std::move(parts));
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::GatherOptions& opts) {
  const at::Tensor& in = one(inputs, "gather");
  const bool root = getRank() == opts.rootRank;
  TORCH_CHECK(!root || outputs.size() == 1, "tutti: gather: the root takes one output list");
  auto in_staged = stage_all({in});
  auto out_staged = root ? stage_all(outputs[0]) : std::vector<Staged>{};
  const TensorView input = view_of(in_staged[0].work, Use::kMove, "gather");
  const auto output_views = views(out_staged, Use::kMove, "gather");
  auto keep = std::make_shared<std::vector<Staged>>(in_staged);  // read until the op is done
  return run(
      c10d::OpType::GATHER, in.device(), opts.asyncOp, in.nbytes() * getSize(), out_staged,
      root ? outputs[0] : std::vector<at::Tensor>{}, [keep] {},
      [&](CollectiveGroup& g, const OpOptions& o) {
        auto go = with<GatherOptions>(o, opts.timeout);
        go.root_rank = static_cast<int>(opts.rootRank);
        return g.gather(output_views, input, go);
      });
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  const at::Tensor& out = one(outputs, "scatter");
  const bool root = getRank() == opts.rootRank;
  TORCH_CHECK(!root || inputs.size() == 1, "tutti: scatter: the root takes one input list");
  auto out_staged = stage_all({out});
  auto in_staged = root ? stage_all(inputs[0]) : std::vector<Staged>{};
  const TensorView output = view_of(out_staged[0].work, Use::kMove, "scatter");
  const auto input_views = views(in_staged, Use::kMove, "scatter");
  auto keep = std::make_shared<std::vector<Staged>>(in_staged);  // read until the op is done
  return run(
      c10d::OpType::SCATTER, out.device(), opts.asyncOp, out.nbytes() * getSize(), out_staged,
      outputs, [keep] {},
      [&](CollectiveGroup& g, const OpOptions& o) {
        auto so = with<ScatterOptions>(o, opts.timeout);
        so.root_rank = static_cast<int>(opts.rootRank);
        return g.scatter(output, input_views, so);
      });
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = one(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1, "tutti: reduce_scatter takes one input list per process");
  double factor;
  at::Tensor tensor_factor;
  const ReduceOp op = reduce_op(opts.reduceOp, out, "reduce_scatter", factor, tensor_factor);
  auto out_staged = stage_all({out});
  std::vector<Staged> in_staged;
  for (const auto& t : inputs[0]) {
    Staged s = stage(t);
    if (factor != 1.0 || tensor_factor.defined()) {
      s.work = s.copied ? s.work : t.clone();  // scaled: a copy, never the caller's input
      s.copied = false;
      premultiply(s.work, factor, tensor_factor);
    }
    in_staged.push_back(std::move(s));
  }
  for (size_t q = 0; q < in_staged.size(); ++q) {
    if (aliases(in_staged[q].work, q, out_staged[0].work, getRank())) {
      own_buffer(out_staged[0]);
      break;
    }
  }
  const TensorView output = view_of(out_staged[0].work, Use::kReduce, "reduce_scatter");
  const auto input_views = views(in_staged, Use::kReduce, "reduce_scatter");
  auto keep = std::make_shared<std::vector<Staged>>(in_staged);  // alive until done
  return run(
      c10d::OpType::REDUCE_SCATTER, out.device(), opts.asyncOp, bytes_of(inputs[0]), out_staged,
      outputs, [keep] {},
      [&](CollectiveGroup& g, const OpOptions& o) {
        auto r = with<ReduceScatterOptions>(o, opts.timeout);
        r.reduce_op = op;
        return g.reduce_scatter(output, input_views, r);
      });
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  double factor;
  at::Tensor tensor_factor;
  const ReduceOp op =
      reduce_op(opts.reduceOp, input, "reduce_scatter_tensor", factor, tensor_factor);
  auto out_staged = stage_all({output});
  Staged in = stage(input);
  if (factor != 1.0 || tensor_factor.defined()) {
    in.work = in.copied ? in.work : input.clone();
    in.copied = false;
    premultiply(in.work, factor, tensor_factor);
  }
  const TensorView out = flat(out_staged[0].work, Use::kReduce, "reduce_scatter_tensor");
  const TensorView in_view = flat(in.work, Use::kReduce, "reduce_scatter_tensor");
  auto keep = std::make_shared<Staged>(in);
  return run(
      c10d::OpType::_REDUCE_SCATTER_BASE, input.device(), opts.asyncOp, input.nbytes(), out_staged,
      {output}, [keep] {},
      [&](CollectiveGroup& g, const OpOptions& o) {
        auto r = with<ReduceScatterOptions>(o, opts.timeout);
        r.reduce_op = op;
        return g.reduce_scatter(out, in_view, r);
      });
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
  TORCH_CHECK(outputs.size() == inputs.size(),
              "tutti: reduce_scatter_tensor_coalesced: ", outputs.size(), " outputs for ",
              inputs.size(), " inputs");
  std::vector<c10::intrusive_ptr<TuttiWork>> parts;
  for (size_t i = 0; i < inputs.size(); ++i) {
    parts.push_back(c10::static_intrusive_pointer_cast<TuttiWork>(
        _reduce_scatter_base(outputs[i], inputs[i], opts)));
  }
  return c10::make_intrusive<TuttiWork>(getRank(), reduce_scatter_coalesced_type<c10d::OpType>(),
                                        std::move(parts));
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_splits,
                                                           std::vector<int64_t>& input_splits,
                                                           const c10d::AllToAllOptions& opts) {
  auto out_staged = stage_all({output});
  Staged in = stage(input);
  const TensorView out = flat(out_staged[0].work, Use::kMove, "all_to_all_single");
  const TensorView in_view = flat(in.work, Use::kMove, "all_to_all_single");
  auto keep = std::make_shared<Staged>(in);
  if (output_splits.empty() && input_splits.empty()) {
    return run(
        c10d::OpType::ALLTOALL_BASE, input.device(), opts.asyncOp, input.nbytes(), out_staged,
        {output}, [keep] {},
        [&](CollectiveGroup& g, const OpOptions& o) {
          return g.alltoall(out, in_view, with<AlltoallOptions>(o, opts.timeout));
        });
  }
  // Splits count rows (the first dimension): tutti counts elements (or bytes, for dtypes it
  // moves as bytes).
  auto counts = [&](const at::Tensor& t, const TensorView& v, const std::vector<int64_t>& splits,
                    const char* which) {
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    const int64_t per_row = rows > 0 ? v.numel() / rows : 0;
    std::vector<int64_t> c;
    if (splits.empty()) {
      TORCH_CHECK(rows % getSize() == 0, "tutti: all_to_all_single: ", which, " has ", rows,
                  " rows, not a multiple of the world size ", getSize(), " (give splits)");
      c.assign(static_cast<size_t>(getSize()), rows / getSize() * per_row);
    } else {
      for (int64_t s : splits) c.push_back(s * per_row);
    }
    return c;
  };
  const auto out_counts = counts(output, out, output_splits, "the output");
  const auto in_counts = counts(input, in_view, input_splits, "the input");
  return run(
      c10d::OpType::ALLTOALL_BASE, input.device(), opts.asyncOp, input.nbytes(), out_staged,
      {output}, [keep] {},
      [&](CollectiveGroup& g, const OpOptions& o) {
        return g.alltoallv(out, in_view, out_counts, in_counts,
                           with<AlltoallOptions>(o, opts.timeout));
      });
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(outputs.size() == static_cast<size_t>(getSize()) &&
                  inputs.size() == static_cast<size_t>(getSize()),
              "tutti: all_to_all: ", inputs.size(), " inputs and ", outputs.size(),
              " outputs for a world of ", getSize());
  auto out_staged = stage_all(outputs);
  auto in_staged = stage_all(inputs);
  const auto out_views = views(out_staged, Use::kMove, "all_to_all");
  const auto in_views = views(in_staged, Use::kMove, "all_to_all");
  const int me = getRank();
  TORCH_CHECK(out_views[me].nbytes() == in_views[me].nbytes(),
              "tutti: all_to_all: ", "this rank's output block ", me, " has ",
              out_views[me].nbytes(), " bytes for ", in_views[me].nbytes(), " sent to itself");
  // Every other block is a send and a receive of one batch, on every rank: a rank whose blocks
  // are all alike may face one whose are not (its own block, or another pair's), so a path chosen
  // by each rank's own blocks (the collective for alike ones) met another on the peer. This
  // rank's own block is copied once the batch is done: its output may lie over an input that
  // goes to another rank.
  auto keep = std::make_shared<std::vector<Staged>>(in_staged);
  // And its own input kept apart where another rank's block lands over it (a receive would
  // overwrite it before the copy).
  at::Tensor own_in = in_staged[me].work;
  for (int r = 0; r < getSize(); ++r) {
    if (r != me && share_memory(out_staged[r].work, own_in)) {
      own_in = own_in.clone();
      break;
    }
  }
  auto own = [out = out_staged[me].work, in = own_in, keep]() mutable {
    out.view(-1).copy_(in.view(-1));
  };
  const at::Device device = inputs[0].device();
  return run(c10d::OpType::ALLTOALL, device, opts.asyncOp, bytes_of(inputs), out_staged, outputs,
             std::move(own), [&](CollectiveGroup& g, const OpOptions& o) {
               std::vector<P2POp> ops;
               for (int r = 0; r < getSize(); ++r) {
                 if (r == me) continue;
                 ops.push_back(P2POp::send(in_views[r], r));
                 ops.push_back(P2POp::recv(out_views[r], r));
               }
               return g.batch_isend_irecv(ops, with<BatchP2POptions>(o, opts.timeout));
             });
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::p2p(std::vector<at::Tensor>& tensors, int peer,
                                                 bool send) {
  const char* what = send ? "send" : "recv";
  const at::Tensor& t = one(tensors, what);
  std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
  Staged s = stage(t);
  if (!issuer_->pending.empty()) {
    TORCH_CHECK(issuer_->pending.front().device == t.device(), "tutti: ", what,
                ": point-to-point ops of one batch must be on one device (", t.device(), " after ",
                issuer_->pending.front().device, ")");
  }
  const TensorView v = view_of(s.work, Use::kMove, what);
  OpContext ctx;
  ctx.op = send ? OpType::kSend : OpType::kRecv;
  ctx.rank = getRank();
  ctx.world_size = getSize();
  ctx.group_name = std::make_shared<const std::string>(issuer_->cpu->name());
  auto placeholder = std::make_shared<tutti::Work>(ctx);
  issuer_->pending.push_back(
      {send ? P2POp::send(v, peer) : P2POp::recv(v, peer), placeholder, t.device()});
  ++issuer_->seq;
  auto work = TuttiWork::create(getRank(), send ? c10d::OpType::SEND : c10d::OpType::RECV,
                                placeholder, {t}, [s] { s.copy_back(); });
  if (!issuer_->coalescing) {
    // Posted with the next wait, collective or coalescing block's end: a pair's isend and
    // irecv then travel together whatever their order.
    std::weak_ptr<Issuer> weak = issuer_;
    work->set_post([weak] {
      if (auto issuer = weak.lock()) {
        std::lock_guard<std::recursive_mutex> lock(issuer->mutex);
        issuer->flush();
      }
    });
  }
  return result(work);
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::send(std::vector<at::Tensor>& tensors, int dst, int) {
  return p2p(tensors, dst, true);
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::recv(std::vector<at::Tensor>& tensors, int src, int) {
  return p2p(tensors, src, false);
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::recvAnysource(std::vector<at::Tensor>&, int) {
  TORCH_CHECK(false,
              "tutti: recv from any source is not supported (tutti matches messages by "
              "sender: name the source rank)");
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::barrier(const c10d::BarrierOptions& opts) {
  // On the CPU group (a CUDA barrier would only order the streams; the host waits either way).
  return run(c10d::OpType::BARRIER, at::Device(at::kCPU), opts.asyncOp, 0, {}, {}, {},
             [&](CollectiveGroup& g, const OpOptions& o) {
               return g.barrier(with<BarrierOptions>(o, opts.timeout));
             });
}

// Like gloo's: rank 0 waits for each rank in turn and names those that did not come.
void TuttiBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
  try {
    issuer_->flush();
  } catch (...) {
    rethrow_as_torch(std::current_exception());
  }
  const auto timeout = opts.timeout.count() < 0 ? options_->timeout : opts.timeout;
  // Under this formation of the group: a group made again in a store that outlives it (torchrun's
  // agent store, a reused store=) or a split sharing it would find the earlier keys there, and
  // every wait would pass at once.
  const std::string base = "tutti/monitored_barrier/" + issuer_->cpu->instance() + "/" +
                           std::to_string(issuer_->monitored++) + "/";
  auto& store = *issuer_->store;
  // Saturating: a timeout of milliseconds::max() (torch's timedelta.max) is no deadline.
  const auto start = std::chrono::steady_clock::now();
  const auto room = std::chrono::steady_clock::time_point::max() - start;
  const auto deadline = timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(room)
                            ? std::chrono::steady_clock::time_point::max()
                            : start + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  const std::string group = issuer_->cpu->name();
  if (getRank() != 0) {
    store.set(base + std::to_string(getRank()), std::vector<uint8_t>{1});
    try {
      store.wait({base + "done"}, left());
    } catch (const c10::Error& e) {
      TORCH_CHECK_WITH(DistBackendError, false, "tutti: monitored_barrier on group '", group,
                       "' (rank ", getRank(), "/", getSize(),
                       "): rank 0 did not release it within ", timeout.count(), " ms (",
                       e.what_without_backtrace(), ")");
    }
    return;
  }
  std::vector<int> missing;
  for (int r = 1; r < getSize(); ++r) {
    try {
      store.wait({base + std::to_string(r)}, left());
    } catch (const c10::Error&) {
      missing.push_back(r);
      if (!wait_all_ranks) break;
    }
  }
  if (!missing.empty()) {
    std::string names;
    for (int r : missing) names += (names.empty() ? "" : ", ") + std::to_string(r);
    TORCH_CHECK_WITH(DistBackendError, false, "tutti: monitored_barrier on group '", group,
                     "' (rank 0/", getSize(), "): rank(s) ", names, " did not reach it within ",
                     timeout.count(), " ms", wait_all_ranks ? "" : " (the first missing rank)");
  }
  store.set(base + "done", std::vector<uint8_t>{1});
}

uint64_t TuttiBackend::getSequenceNumberForGroup() {
  std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
  return issuer_->seq;
}

void TuttiBackend::startCoalescing() {
  std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
  TORCH_CHECK(!issuer_->coalescing, "tutti: startCoalescing inside a coalescing block");
  issuer_->coalescing = true;
  issuer_->coalesced.clear();
}

c10::intrusive_ptr<c10d::Work> TuttiBackend::endCoalescing() {
  std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
  TORCH_CHECK(issuer_->coalescing, "tutti: endCoalescing without startCoalescing");
  issuer_->coalescing = false;
  try {
    issuer_->flush();  // the block's sends and receives, as one batch
  } catch (...) {
    rethrow_as_torch(std::current_exception());
  }
  std::vector<c10::intrusive_ptr<TuttiWork>> parts;
  parts.swap(issuer_->coalesced);
  return c10::make_intrusive<TuttiWork>(getRank(), c10d::OpType::COALESCED, std::move(parts));
}

c10::intrusive_ptr<c10d::Backend> TuttiBackend::split(
    const c10::intrusive_ptr<c10d::Store>&, const std::vector<int>& ranks,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  std::lock_guard<std::recursive_mutex> lock(issuer_->mutex);
  auto options = c10::make_intrusive<Options>(opts ? opts->timeout : options_->timeout);
  options->tutti_backend = options_->tutti_backend;
  if (opts) {
    options->group_name = opts->group_name;
    options->global_ranks_in_group = opts->global_ranks_in_group;
  }
  auto issuer = std::make_shared<Issuer>();
  issuer->store = issuer_->store;
  issuer->inline_bytes = issuer_->inline_bytes;
  try {
    issuer_->flush();
    SplitOptions s;
    s.local = true;  // only the members call split_group's backend split
    s.name =
        issuer_->cpu->name() + "/" + (options->group_name.empty() ? "split" : options->group_name);
    s.timeout = options->timeout;
    issuer_->adopt(*issuer_->cpu);
    issuer->cpu = issuer_->cpu->split(ranks, s);
  } catch (...) {
    rethrow_as_torch(std::current_exception());
  }
  if (!issuer->cpu) return nullptr;
  issuer->thread = std::this_thread::get_id();
  return c10::intrusive_ptr<c10d::Backend>(
      c10::make_intrusive<TuttiBackend>(std::move(issuer), std::move(options)));
}

void TuttiBackend::abort() {
  if (issuer_->cuda) issuer_->cuda->abort("torch.distributed aborted the process group");
  issuer_->cpu->abort("torch.distributed aborted the process group");
}

void TuttiBackend::shutdown() {
  if (issuer_->cuda) issuer_->cuda->destroy();
  issuer_->cpu->destroy();
}

}  // namespace tutti::torch_backend
