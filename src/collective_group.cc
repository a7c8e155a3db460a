#include "tutti/collective_group.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "group_util.h"
#include "host_identity.h"
#include "logging.h"
#include "tutti/error.h"
#include "tutti/hash_store.h"
#include "tutti/prefix_store.h"
#include "tutti/store.h"
#include "tutti/tcp_store.h"
#include "tutti/env.h"

namespace tutti {

namespace detail {
BackendFactory find_backend_factory(std::string_view name);  // backend.cc
std::string backend_key(std::string_view name);

std::string escape_name(std::string_view name) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : name) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
        c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}
}  // namespace detail

namespace {

std::string where(const std::string& name, int rank, int world_size) {
  return "group '" + name + "' (rank " + std::to_string(rank) + "/" + std::to_string(world_size) +
         ")";
}

// How long a rank hosting the group's TCP store keeps serving, at destroy, for the others.
constexpr std::chrono::milliseconds kHostLingerTimeout{10000};

// What each rank publishes when it joins an incarnation, and checks of everyone else's.
struct JoinRecord {
  int world_size = 0;
  std::string backend;
  std::string host;
  long pid = 0;

  std::string encode() const {
    return std::to_string(world_size) + "\n" + backend + "\n" + host + "\n" + std::to_string(pid);
  }
  static JoinRecord decode(const std::string& text) {
    JoinRecord r;
    std::istringstream in(text);
    std::string ws, pid;
    std::getline(in, ws);
    std::getline(in, r.backend);
    std::getline(in, r.host);
    std::getline(in, pid);
    r.world_size = std::atoi(ws.c_str());
    r.pid = std::atol(pid.c_str());
    return r;
  }
};

}  // namespace

std::string CollectiveGroup::describe() const { return where(name_, rank_, world_size_); }

CollectiveGroup::CollectiveGroup(std::string name, int rank, int world_size,
                                 std::string backend_name, std::chrono::milliseconds timeout)
    : name_(std::move(name)),
      rank_(rank),
      world_size_(world_size),
      backend_name_(std::move(backend_name)),
      timeout_(timeout) {}

CollectiveGroup::~CollectiveGroup() { destroy(); }

std::shared_ptr<CollectiveGroup> CollectiveGroup::create(int world_size, int rank,
                                                         std::string_view backend,
                                                         std::string_view group_name,
                                                         const GroupOptions& options) {
  const std::string name(group_name);
  const std::string ctx = "init on " + where(name, rank, world_size);
  if (name.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "init: group name must not be empty");
  }
  if (world_size <= 0) {
    throw Error(ErrorCode::kInvalidArgument,
                ctx + ": world size must be positive, got " + std::to_string(world_size));
  }
  if (rank < 0 || rank >= world_size) {
    throw Error(ErrorCode::kInvalidArgument, ctx + ": rank " + std::to_string(rank) +
                                                 " is outside [0, " + std::to_string(world_size) +
                                                 ")");
  }
  if (options.timeout.count() <= 0) {
    throw Error(ErrorCode::kInvalidArgument, ctx + ": timeout must be positive, got " +
                                                 std::to_string(options.timeout.count()) + " ms");
  }
  const std::string requested = detail::backend_key(backend);
  const bool automatic = requested == "auto";
  BackendFactory factory;
  if (!automatic) {
    try {
      factory = detail::find_backend_factory(requested);
    } catch (const Error& e) {
      throw Error(e.code(), ctx + ": " + e.what());
    }
  }

  std::shared_ptr<Store> store = options.store;
  std::string url = options.store_url;
  std::string job_id = options.job_id;
  if (!store && (url == "env://" || (url.empty() && world_size > 1 && has_launch_env()))) {
    try {
      const LaunchEnv env = read_launch_env();
      url = env.store_url;
      if (job_id.empty()) job_id = env.job_id;
    } catch (const Error& e) {
      throw Error(e.code(), ctx + ": " + e.what());
    }
  }
  bool owns_store = false;
  if (!store && !url.empty()) {
    try {
      // Rank 0 hosts a tcp:// store (unless another process already serves the address).
      store = open_store(url, options.timeout, /*host=*/rank == 0);
      owns_store = true;
    } catch (const Error& e) {
      throw Error(e.code(), ctx + ": " + e.what());
    }
  }
  if (!store) {
    if (world_size > 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  ctx + ": a group of " + std::to_string(world_size) +
                      " ranks needs a store to meet through: set GroupOptions::store (e.g. a "
                      "shared HashStore for threads) or GroupOptions::store_url (e.g. "
                      "tcp://HOST:PORT, hosted by rank 0, or file:///tmp/job.store), or launch "
                      "with tutti-run, torchrun, srun or mpirun (env://)");
    }
    store = std::make_shared<HashStore>(options.timeout);
  }
  if (job_id.empty()) {
    if (const char* env_job = std::getenv("TUTTI_JOB_ID")) job_id = env_job;
  }
  if (job_id.empty() && store->check({"tutti/store-nonce"})) job_id = store->get("tutti/store-nonce");

  std::string backend_key = requested;  // "auto" is resolved once every rank has joined
  std::vector<std::string> hosts(world_size);
  hosts[rank] = detail::host_identity();

  // Incarnation: every init of this name through this store takes the next join number, and
  // world_size consecutive joins form one incarnation, so keys of a destroyed incarnation are
  // never read by the next one.
  const std::string base = "tutti/" +
                           (job_id.empty() ? std::string() : "job/" + detail::escape_name(job_id) + "/") +
                           "group/" + detail::escape_name(name);
  const int64_t join = store->add(base + "/joins", 1);
  const int64_t incarnation = (join - 1) / world_size;
  const std::string scope = base + "/" + std::to_string(incarnation);

  JoinRecord mine{world_size, requested, detail::host_identity(), static_cast<long>(::getpid())};
  const std::string my_key = scope + "/rank/" + std::to_string(rank);
  const std::string claimed = store->compare_set(my_key, "", mine.encode());
  if (claimed != mine.encode()) {
    const JoinRecord other = JoinRecord::decode(claimed);
    throw Error(ErrorCode::kInvalidUsage,
                ctx + ": rank " + std::to_string(rank) + " is already claimed by process " +
                    std::to_string(other.pid) + " on host '" + other.host +
                    "': two processes were given the same rank");
  }

  // Meet: every other rank's record, each checked as soon as it arrives, so ranks that
  // disagree on world size or backend fail fast rather than at the timeout.
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(scope + "/rank/" + std::to_string(r));
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + options.timeout;
  std::vector<bool> seen(world_size, false);
  seen[rank] = true;
  int missing_count = world_size - 1;
  auto pause = std::chrono::milliseconds(1);
  try {
    while (missing_count > 0) {
      int first_missing = -1;
      for (int r = 0; r < world_size; ++r) {
        if (seen[r]) continue;
        if (!store->check({keys[r]})) {
          if (first_missing < 0) first_missing = r;
          continue;
        }
        const JoinRecord other = JoinRecord::decode(store->get(keys[r]));
        if (other.world_size != world_size) {
          throw Error(ErrorCode::kInvalidArgument,
                      ctx + ": rank " + std::to_string(r) + " joined with world size " +
                          std::to_string(other.world_size) + ", this rank with " +
                          std::to_string(world_size));
        }
        if (other.backend != requested) {
          throw Error(ErrorCode::kInvalidArgument, ctx + ": rank " + std::to_string(r) +
                                                       " joined with backend '" + other.backend +
                                                       "', this rank with '" + requested + "'");
        }
        hosts[r] = other.host;
        seen[r] = true;
        --missing_count;
      }
      if (missing_count == 0) break;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        std::string missing;
        for (int r = 0; r < world_size; ++r) {
          if (!seen[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        throw Error(ErrorCode::kTimeout,
                    ctx + ": timed out after " + std::to_string(options.timeout.count()) +
                        " ms: " + std::to_string(world_size - missing_count) + " of " +
                        std::to_string(world_size) + " ranks arrived; missing rank(s) " + missing);
      }
      // Sleep in the store until the first missing rank arrives (or a short while passes).
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
      try {
        store->wait({keys[first_missing]}, std::max(std::chrono::milliseconds(1), std::min(pause, left)));
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kTimeout) throw;
      }
      pause = std::min(pause * 2, std::chrono::milliseconds(200));
    }
  } catch (const Error& e) {
    if (std::string(e.what()).rfind(ctx, 0) == 0) throw;
    throw Error(e.code(), ctx + ": " + e.what());
  }

  if (automatic) {
    // Shared memory when every rank runs on this host and the backend is linked; else Gloo.
    const bool one_host = std::all_of(hosts.begin(), hosts.end(),
                                      [&](const std::string& h) { return h == hosts[rank]; });
    backend_key = one_host && is_registered_collective_backend("shm") ? "shm" : "gloo";
    try {
      factory = detail::find_backend_factory(backend_key);
    } catch (const Error& e) {
      throw Error(e.code(), ctx + ": backend 'auto' chose '" + backend_key + "': " + e.what());
    }
  }
  std::shared_ptr<CollectiveGroup> group(
      new CollectiveGroup(name, rank, world_size, backend_key, options.timeout));
  group->store_ = store;
  group->owns_store_ = owns_store;
  group->scope_ = scope;

  BackendContext bctx;
  bctx.group_name = name;
  bctx.rank = rank;
  bctx.world_size = world_size;
  bctx.store = std::make_shared<PrefixStore>(scope + "/backend", store);
  bctx.store->set_timeout(options.timeout);
  bctx.timeout = options.timeout;
  bctx.instance = detail::escape_name(job_id.empty() ? "nojob" : job_id) + "." +
                  detail::escape_name(name) + "." + std::to_string(incarnation);
  try {
    group->backend_ = factory(bctx);
  } catch (const Error& e) {
    throw Error(e.code(), ctx + ": backend '" + backend_key + "': " + e.what());
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInternal, ctx + ": backend '" + backend_key + "': " + e.what());
  }
  if (!group->backend_) {
    throw Error(ErrorCode::kInternal, ctx + ": backend '" + backend_key + "' factory returned null");
  }
  for (DeviceType type : {DeviceType::kCPU, DeviceType::kCUDA}) {
    group->device_supported_[static_cast<size_t>(type)] = group->backend_->supports_device(type);
  }
  for (size_t op = 0; op < group->op_supported_.size(); ++op) {
    group->op_supported_[op] = group->backend_->supports(static_cast<OpType>(op));
  }
  group->max_devices_ = std::max(1, group->backend_->max_devices_per_op());
  TUTTI_LOG_INFO("joined {} with backend '{}' (incarnation {}) in {:.1f} ms", group->describe(),
                 backend_key, incarnation,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  return group;
}

bool CollectiveGroup::is_aborted() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return !abort_reason_.empty();
}

void CollectiveGroup::destroy() noexcept {
  if (destroyed_.exchange(true)) return;
  try {
    // An op running in another thread finishes (or times out) before the backend goes.
    std::lock_guard<std::mutex> lock(op_mutex_);
    if (backend_) backend_->abort();
    backend_.reset();
    leave_store();
    TUTTI_LOG_DEBUG("destroyed {}", describe());
  } catch (const std::exception& e) {
    TUTTI_LOG_WARN("destroying {}: {}", describe(), e.what());
  } catch (...) {
    TUTTI_LOG_WARN("destroying {}: unknown exception", describe());
  }
}

void CollectiveGroup::leave_store() {
  auto* tcp = dynamic_cast<TCPStore*>(store_.get());
  if (owns_store_ && tcp != nullptr && world_size_ > 1) {
    // Best effort and brief: a host that is already gone must not hold destroy up.
    tcp->set_timeout(std::chrono::milliseconds(2000));
    try {
      tcp->set(scope_ + "/left/" + std::to_string(rank_), "1");
      if (tcp->is_hosting()) {
        std::vector<std::string> keys;
        for (int r = 0; r < world_size_; ++r) keys.push_back(scope_ + "/left/" + std::to_string(r));
        tcp->wait(keys, kHostLingerTimeout);
      }
    } catch (const Error& e) {
      TUTTI_LOG_DEBUG("{}: leaving the store: {}", describe(), e.what());
    }
  }
  store_.reset();
}

void CollectiveGroup::fail(ErrorCode code, OpType op, const std::string& what) const {
  throw Error(code, std::string(to_string(op)) + " on " + describe() + ": " + what);
}

void CollectiveGroup::check_tensor(OpType op, const TensorView& t, const char* what) const {
  if (is_destroyed()) fail(ErrorCode::kInvalidUsage, op, "the group was destroyed");
  if (!device_supported_[static_cast<size_t>(t.device().type)]) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(what) + " is on " + t.device().str() + ", which backend '" + backend_name_ +
             "' does not support");
  }
}

void CollectiveGroup::check_rank(OpType op, int value, const char* what, bool allow_self) const {
  if (value < 0 || value >= world_size_) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(what) + " " + std::to_string(value) + " is outside [0, " +
             std::to_string(world_size_) + ")");
  }
  if (!allow_self && value == rank_) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(what) + " " + std::to_string(value) + " is this rank itself");
  }
}

void CollectiveGroup::check_reduce_op(OpType op, ReduceOp reduce_op, DType dtype) const {
  if (reduce_op == ReduceOp::kAvg && !is_floating(dtype)) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string("reduce op avg is only defined for floating dtypes, got ") + to_string(dtype));
  }
}

namespace {
void check_like(const std::function<void(ErrorCode, const std::string&)>& fail,
                const TensorView& t, const TensorView& ref, const std::string& what,
                const char* ref_name) {
  if (t.dtype() != ref.dtype()) {
    fail(ErrorCode::kInvalidArgument, what + " has dtype " + to_string(t.dtype()) + ", " +
                                          ref_name + " has " + to_string(ref.dtype()));
  }
  if (t.shape() != ref.shape()) {
    fail(ErrorCode::kInvalidArgument, what + " is " + t.str() + ", " + ref_name + " is " + ref.str());
  }
  if (t.device() != ref.device()) {
    fail(ErrorCode::kInvalidArgument, what + " is on " + t.device().str() + ", " + ref_name +
                                          " on " + ref.device().str());
  }
}

std::chrono::milliseconds resolve_timeout(std::chrono::milliseconds requested,
                                          std::chrono::milliseconds group_default) {
  return requested == kUseGroupTimeout ? group_default : requested;
}

uint64_t signature(OpType op, DType dtype, int64_t count, int root = -1, int reduce_op = -1) {
  return detail::Fnv1a()
      .mix(static_cast<uint64_t>(op))
      .mix(static_cast<uint64_t>(dtype))
      .mix(static_cast<uint64_t>(count))
      .mix(static_cast<uint64_t>(root))
      .mix(static_cast<uint64_t>(reduce_op))
      .value();
}
}  // namespace

// One op in flight: holds the op lock and the context handed to the backend.
struct CollectiveGroup::Call {
  std::unique_lock<std::mutex> lock;
  OpContext ctx;
  bool skip = false;  // zero elements: counted, but nothing to send
};

CollectiveGroup::Call CollectiveGroup::begin(OpType op, uint64_t sig,
                                             std::chrono::milliseconds timeout, int peer,
                                             bool sending) {
  if (timeout.count() <= 0) {
    fail(ErrorCode::kInvalidArgument, op,
         "timeout must be positive, got " + std::to_string(timeout.count()) + " ms");
  }
  if (!op_supported_[static_cast<size_t>(op)]) {
    fail(ErrorCode::kUnavailable, op,
         "backend '" + backend_name_ + "' does not support '" + to_string(op) + "'");
  }
  Call call{std::unique_lock<std::mutex>(op_mutex_), {}, false};
  if (is_destroyed() || !backend_) fail(ErrorCode::kInvalidUsage, op, "the group was destroyed");
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (!abort_reason_.empty()) {
      fail(ErrorCode::kAborted, op,
           "the group was aborted by an earlier failure (" + abort_reason_ +
               "); destroy it and initialise it again");
    }
  }
  uint64_t seq;
  if (peer < 0) {
    seq = collective_seq_++;
  } else {
    seq = sending ? send_seq_[peer]++ : recv_seq_[peer]++;
  }
  call.ctx.op = op;
  call.ctx.seq = seq;
  // Point-to-point tags also fold in the direction (sender, receiver), so both ends agree.
  detail::Fnv1a h;
  h.mix(seq).mix(sig);
  if (peer >= 0) h.mix(static_cast<uint64_t>(sending ? rank_ : peer)).mix(sending ? peer : rank_);
  call.ctx.tag = static_cast<uint32_t>(h.value() ^ (h.value() >> 32));
  call.ctx.timeout = timeout;
  call.ctx.group_name = &name_;
  call.ctx.rank = rank_;
  call.ctx.world_size = world_size_;
  return call;
}

template <typename Fn>
void CollectiveGroup::run(Call& call, Fn&& fn) {
  if (call.skip) return;
  try {
    fn(call.ctx);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kIoError ||
        e.code() == ErrorCode::kRemoteError || e.code() == ErrorCode::kInternal) {
      std::lock_guard<std::mutex> lock(state_mutex_);
      if (abort_reason_.empty()) abort_reason_ = call.ctx.description() + ": " + e.what();
      TUTTI_LOG_ERROR("aborting {}: {}", describe(), e.what());
    }
    throw;
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(state_mutex_);
      if (abort_reason_.empty()) abort_reason_ = call.ctx.description() + ": " + e.what();
    }
    throw Error(ErrorCode::kInternal, call.ctx.description() + ": " + e.what());
  }
}

void CollectiveGroup::broadcast(TensorView tensor, const BroadcastOptions& opts) {
  const OpType op = OpType::kBroadcast;
  check_tensor(op, tensor, "tensor");
  check_rank(op, opts.root_rank, "root rank");
  auto call = begin(op, signature(op, tensor.dtype(), tensor.numel(), opts.root_rank),
                    resolve_timeout(opts.timeout, timeout_));
  call.skip = tensor.numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->broadcast({tensor}, opts, ctx); });
}

void CollectiveGroup::allreduce(TensorView tensor, const AllreduceOptions& opts) {
  const OpType op = OpType::kAllreduce;
  check_tensor(op, tensor, "tensor");
  check_reduce_op(op, opts.reduce_op, tensor.dtype());
  auto call = begin(op,
                    signature(op, tensor.dtype(), tensor.numel(), -1,
                              static_cast<int>(opts.reduce_op)),
                    resolve_timeout(opts.timeout, timeout_));
  call.skip = tensor.numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->allreduce({tensor}, opts, ctx); });
}

void CollectiveGroup::reduce(TensorView tensor, const ReduceOptions& opts) {
  const OpType op = OpType::kReduce;
  check_tensor(op, tensor, "tensor");
  check_rank(op, opts.root_rank, "root rank");
  check_reduce_op(op, opts.reduce_op, tensor.dtype());
  auto call = begin(op,
                    signature(op, tensor.dtype(), tensor.numel(), opts.root_rank,
                              static_cast<int>(opts.reduce_op)),
                    resolve_timeout(opts.timeout, timeout_));
  call.skip = tensor.numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->reduce({tensor}, opts, ctx); });
}

void CollectiveGroup::allgather(const std::vector<TensorView>& output_list, TensorView input,
                                const AllgatherOptions& opts) {
  const OpType op = OpType::kAllgather;
  check_tensor(op, input, "input");
  if (static_cast<int>(output_list.size()) != world_size_) {
    fail(ErrorCode::kInvalidArgument, op,
         "output list has " + std::to_string(output_list.size()) +
             " tensors, expected one per rank (" + std::to_string(world_size_) + ")");
  }
  auto bad = [&](ErrorCode code, const std::string& what) { fail(code, op, what); };
  for (size_t r = 0; r < output_list.size(); ++r) {
    check_like(bad, output_list[r], input, "output " + std::to_string(r), "input");
  }
  auto call = begin(op, signature(op, input.dtype(), input.numel()),
                    resolve_timeout(opts.timeout, timeout_));
  call.skip = input.numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->allgather({output_list}, {input}, opts, ctx); });
}

void CollectiveGroup::allgather(TensorView output, TensorView input,
                                const AllgatherOptions& opts) {
  const OpType op = OpType::kAllgather;
  check_tensor(op, input, "input");
  check_tensor(op, output, "output");
  if (output.dtype() != input.dtype()) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string("output has dtype ") + to_string(output.dtype()) + ", input has " +
             to_string(input.dtype()));
  }
  if (output.numel() != input.numel() * world_size_) {
    fail(ErrorCode::kInvalidArgument, op,
         "output has " + std::to_string(output.numel()) + " elements, expected world size " +
             std::to_string(world_size_) + " x input's " + std::to_string(input.numel()));
  }
  std::vector<TensorView> parts;
  for (int r = 0; r < world_size_; ++r) {
    parts.push_back(output.slice(r * input.numel(), input.numel()));
  }
  allgather(parts, TensorView(input.data(), input.dtype(), {input.numel()}, input.device()), opts);
}

void CollectiveGroup::reduce_scatter(TensorView output, const std::vector<TensorView>& input_list,
                                     const ReduceScatterOptions& opts) {
  const OpType op = OpType::kReduceScatter;
  check_tensor(op, output, "output");
  check_reduce_op(op, opts.reduce_op, output.dtype());
  if (static_cast<int>(input_list.size()) != world_size_) {
    fail(ErrorCode::kInvalidArgument, op,
         "input list has " + std::to_string(input_list.size()) +
             " tensors, expected one per rank (" + std::to_string(world_size_) + ")");
  }
  auto bad = [&](ErrorCode code, const std::string& what) { fail(code, op, what); };
  for (size_t r = 0; r < input_list.size(); ++r) {
    check_like(bad, input_list[r], output, "input " + std::to_string(r), "output");
  }
  auto call = begin(op,
                    signature(op, output.dtype(), output.numel(), -1,
                              static_cast<int>(opts.reduce_op)),
                    resolve_timeout(opts.timeout, timeout_));
  call.skip = output.numel() == 0;
  run(call,
      [&](const OpContext& ctx) { backend_->reduce_scatter({output}, {input_list}, opts, ctx); });
}

void CollectiveGroup::reduce_scatter(TensorView output, TensorView input,
                                     const ReduceScatterOptions& opts) {
  const OpType op = OpType::kReduceScatter;
  check_tensor(op, input, "input");
  check_tensor(op, output, "output");
  if (output.dtype() != input.dtype()) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string("input has dtype ") + to_string(input.dtype()) + ", output has " +
             to_string(output.dtype()));
  }
  if (input.numel() != output.numel() * world_size_) {
    fail(ErrorCode::kInvalidArgument, op,
         "input has " + std::to_string(input.numel()) + " elements, expected world size " +
             std::to_string(world_size_) + " x output's " + std::to_string(output.numel()));
  }
  std::vector<TensorView> parts;
  for (int r = 0; r < world_size_; ++r) {
    parts.push_back(input.slice(r * output.numel(), output.numel()));
  }
  reduce_scatter(TensorView(output.data(), output.dtype(), {output.numel()}, output.device()),
                 parts, opts);
}

void CollectiveGroup::barrier(const BarrierOptions& opts) {
  const OpType op = OpType::kBarrier;
  if (is_destroyed()) fail(ErrorCode::kInvalidUsage, op, "the group was destroyed");
  auto call = begin(op, signature(op, DType::kUInt8, 0), resolve_timeout(opts.timeout, timeout_));
  run(call, [&](const OpContext& ctx) { backend_->barrier(opts, ctx); });
}

void CollectiveGroup::send(TensorView tensor, int dst_rank, const SendOptions& opts) {
  const OpType op = OpType::kSend;
  check_tensor(op, tensor, "tensor");
  check_rank(op, dst_rank, "destination rank", /*allow_self=*/false);
  auto call = begin(op, signature(OpType::kSend, tensor.dtype(), tensor.numel()),
                    resolve_timeout(opts.timeout, timeout_), dst_rank, /*sending=*/true);
  call.skip = tensor.numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->send({tensor}, dst_rank, opts, ctx); });
}

void CollectiveGroup::recv(TensorView tensor, int src_rank, const RecvOptions& opts) {
  const OpType op = OpType::kRecv;
  check_tensor(op, tensor, "tensor");
  check_rank(op, src_rank, "source rank", /*allow_self=*/false);
  // The signature matches the sender's, so a send meets exactly the recv of its size and dtype.
  auto call = begin(op, signature(OpType::kSend, tensor.dtype(), tensor.numel()),
                    resolve_timeout(opts.timeout, timeout_), src_rank, /*sending=*/false);
  call.skip = tensor.numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->recv({tensor}, src_rank, opts, ctx); });
}

void CollectiveGroup::check_device_list(OpType op, const std::vector<TensorView>& tensors,
                                        const char* what) const {
  if (tensors.empty()) fail(ErrorCode::kInvalidArgument, op, std::string(what) + " list is empty");
  if (static_cast<int>(tensors.size()) > max_devices_) {
    fail(ErrorCode::kInvalidArgument, op,
         "backend '" + backend_name_ + "' takes at most " + std::to_string(max_devices_) +
             " tensor(s) per op, got a list of " + std::to_string(tensors.size()));
  }
  for (size_t d = 0; d < tensors.size(); ++d) {
    const std::string name = std::string(what) + " " + std::to_string(d);
    check_tensor(op, tensors[d], name.c_str());
    if (d > 0) {
      if (tensors[d].dtype() != tensors[0].dtype() || tensors[d].shape() != tensors[0].shape()) {
        fail(ErrorCode::kInvalidArgument, op,
             name + " is " + tensors[d].str() + ", " + what + " 0 is " + tensors[0].str() +
                 ": a list holds one shape and dtype");
      }
    }
    for (size_t e = 0; e < d; ++e) {
      if (tensors[e].device() == tensors[d].device()) {
        fail(ErrorCode::kInvalidArgument, op,
             std::string(what) + "s " + std::to_string(e) + " and " + std::to_string(d) +
                 " are both on " + tensors[d].device().str() + ": one tensor per device");
      }
    }
  }
}

namespace {
// Checks that lists[d] holds `count` tensors shaped, typed and placed like refs[d].
void check_lists(const std::function<void(ErrorCode, const std::string&)>& bad,
                 const std::vector<std::vector<TensorView>>& lists,
                 const std::vector<TensorView>& refs, size_t count, const char* list_name,
                 const char* ref_name) {
  if (lists.size() != refs.size()) {
    bad(ErrorCode::kInvalidArgument, std::string(list_name) + " has " +
                                         std::to_string(lists.size()) + " lists for " +
                                         std::to_string(refs.size()) + " devices");
  }
  for (size_t d = 0; d < lists.size(); ++d) {
    if (lists[d].size() != count) {
      bad(ErrorCode::kInvalidArgument,
          std::string(list_name) + " " + std::to_string(d) + " has " +
              std::to_string(lists[d].size()) + " tensors, expected world size x devices = " +
              std::to_string(count));
    }
    for (size_t k = 0; k < lists[d].size(); ++k) {
      check_like(bad, lists[d][k], refs[d],
                 std::string(list_name) + " " + std::to_string(d) + "[" + std::to_string(k) + "]",
                 ref_name);
    }
  }
}
}  // namespace

void CollectiveGroup::allreduce_multigpu(const std::vector<TensorView>& tensors,
                                         const AllreduceOptions& opts) {
  const OpType op = OpType::kAllreduce;
  check_device_list(op, tensors, "tensor");
  check_reduce_op(op, opts.reduce_op, tensors[0].dtype());
  auto call = begin(op,
                    signature(op, tensors[0].dtype(), tensors[0].numel(),
                              static_cast<int>(tensors.size()), static_cast<int>(opts.reduce_op)),
                    resolve_timeout(opts.timeout, timeout_));
  call.skip = tensors[0].numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->allreduce(tensors, opts, ctx); });
}

// A device list with a root: the list rules, a root rank in range, a root tensor in the list.
void CollectiveGroup::check_rooted_list(OpType op, const std::vector<TensorView>& tensors,
                                        int root_rank, int root_tensor) const {
  check_device_list(op, tensors, "tensor");
  check_rank(op, root_rank, "root rank");
  if (root_tensor < 0 || root_tensor >= static_cast<int>(tensors.size())) {
    fail(ErrorCode::kInvalidArgument, op,
         "root tensor " + std::to_string(root_tensor) + " is outside [0, " +
             std::to_string(tensors.size()) + ")");
  }
}

void CollectiveGroup::reduce_multigpu(const std::vector<TensorView>& tensors,
                                      const ReduceOptions& opts) {
  const OpType op = OpType::kReduce;
  check_rooted_list(op, tensors, opts.root_rank, opts.root_tensor);
  check_reduce_op(op, opts.reduce_op, tensors[0].dtype());
  auto call = begin(op,
                    signature(op, tensors[0].dtype(), tensors[0].numel(),
                              opts.root_rank * 4096 + opts.root_tensor,
                              static_cast<int>(opts.reduce_op)),
                    resolve_timeout(opts.timeout, timeout_));
  call.skip = tensors[0].numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->reduce(tensors, opts, ctx); });
}

void CollectiveGroup::broadcast_multigpu(const std::vector<TensorView>& tensors,
                                         const BroadcastOptions& opts) {
  const OpType op = OpType::kBroadcast;
  check_rooted_list(op, tensors, opts.root_rank, opts.root_tensor);
  auto call = begin(op,
                    signature(op, tensors[0].dtype(), tensors[0].numel(),
                              opts.root_rank * 4096 + opts.root_tensor),
                    resolve_timeout(opts.timeout, timeout_));
  call.skip = tensors[0].numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->broadcast(tensors, opts, ctx); });
}

void CollectiveGroup::allgather_multigpu(const std::vector<std::vector<TensorView>>& output_lists,
                                         const std::vector<TensorView>& inputs,
                                         const AllgatherOptions& opts) {
  const OpType op = OpType::kAllgather;
  check_device_list(op, inputs, "input");
  auto bad = [&](ErrorCode code, const std::string& what) { fail(code, op, what); };
  check_lists(bad, output_lists, inputs, static_cast<size_t>(world_size_) * inputs.size(),
              "output list", "its device's input");
  auto call = begin(op,
                    signature(op, inputs[0].dtype(), inputs[0].numel(),
                              static_cast<int>(inputs.size())),
                    resolve_timeout(opts.timeout, timeout_));
  call.skip = inputs[0].numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->allgather(output_lists, inputs, opts, ctx); });
}

void CollectiveGroup::reduce_scatter_multigpu(
    const std::vector<TensorView>& outputs,
    const std::vector<std::vector<TensorView>>& input_lists, const ReduceScatterOptions& opts) {
  const OpType op = OpType::kReduceScatter;
  check_device_list(op, outputs, "output");
  check_reduce_op(op, opts.reduce_op, outputs[0].dtype());
  auto bad = [&](ErrorCode code, const std::string& what) { fail(code, op, what); };
  check_lists(bad, input_lists, outputs, static_cast<size_t>(world_size_) * outputs.size(),
              "input list", "its device's output");
  auto call = begin(op,
                    signature(op, outputs[0].dtype(), outputs[0].numel(),
                              static_cast<int>(outputs.size()), static_cast<int>(opts.reduce_op)),
                    resolve_timeout(opts.timeout, timeout_));
  call.skip = outputs[0].numel() == 0;
  run(call,
      [&](const OpContext& ctx) { backend_->reduce_scatter(outputs, input_lists, opts, ctx); });
}

// The checks send_multigpu and recv_multigpu share; returns the view of the first n_elements
// (0: all) that travels.
TensorView CollectiveGroup::check_p2p_multigpu(OpType op, const TensorView& tensor, int peer,
                                               int64_t n_elements, int peer_device) const {
  const bool sending = op == OpType::kSend;
  check_tensor(op, tensor, "tensor");
  check_rank(op, peer, sending ? "destination rank" : "source rank", /*allow_self=*/false);
  if (n_elements < 0 || n_elements > tensor.numel()) {
    fail(ErrorCode::kInvalidArgument, op,
         "n_elements " + std::to_string(n_elements) + " is outside [0, " +
             std::to_string(tensor.numel()) + "]");
  }
  if (peer_device < 0) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(sending ? "destination" : "source") + " device index " +
             std::to_string(peer_device) + " is negative");
  }
  return n_elements == 0 ? tensor : TensorView(tensor.data(), tensor.dtype(), {n_elements},
                                               tensor.device());
}

void CollectiveGroup::send_multigpu(TensorView tensor, int dst_rank, int64_t n_elements,
                                    const SendOptions& opts) {
  const TensorView view =
      check_p2p_multigpu(OpType::kSend, tensor, dst_rank, n_elements, opts.dst_device_index);
  // Sender and receiver mix the same pair of device indexes: (sender's, receiver's).
  auto call = begin(OpType::kSend,
                    signature(OpType::kSend, view.dtype(), view.numel(),
                              tensor.device().index * 4096 + opts.dst_device_index, 1),
                    resolve_timeout(opts.timeout, timeout_), dst_rank, /*sending=*/true);
  call.skip = view.numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->send({view}, dst_rank, opts, ctx); });
}

void CollectiveGroup::recv_multigpu(TensorView tensor, int src_rank, int64_t n_elements,
                                    const RecvOptions& opts) {
  const TensorView view =
      check_p2p_multigpu(OpType::kRecv, tensor, src_rank, n_elements, opts.src_device_index);
  auto call = begin(OpType::kRecv,
                    signature(OpType::kSend, view.dtype(), view.numel(),
                              opts.src_device_index * 4096 + tensor.device().index, 1),
                    resolve_timeout(opts.timeout, timeout_), src_rank, /*sending=*/false);
  call.skip = view.numel() == 0;
  run(call, [&](const OpContext& ctx) { backend_->recv({view}, src_rank, opts, ctx); });
}

void CollectiveGroup::synchronize(Device device) {
  if (is_destroyed()) fail(ErrorCode::kInvalidUsage, OpType::kBarrier, "the group was destroyed");
  if (!device_supported_[static_cast<size_t>(device.type)]) {
    throw Error(ErrorCode::kInvalidArgument, "synchronize on " + describe() + ": " +
                                                 device.str() + " is not a device of backend '" +
                                                 backend_name_ + "'");
  }
  std::lock_guard<std::mutex> lock(op_mutex_);
  if (backend_) backend_->synchronize(device);
}

}  // namespace tutti
