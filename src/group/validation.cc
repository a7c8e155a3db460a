// The checks CollectiveGroup runs before any I/O: each names op, group, rank and the offending
// value, and leaves the group as it was.
#include <algorithm>
#include <atomic>
#include <memory>
#include <tuple>

#include "group/group_state.h"
#include "group/group_util.h"

namespace tutti {

std::string CollectiveGroup::State::describe() const {
  return "group '" + *name + "' (rank " + std::to_string(rank) + "/" + std::to_string(world_size) +
         ")";
}

void CollectiveGroup::State::fail(ErrorCode code, OpType op, const std::string& what) const {
  throw Error(code, std::string(to_string(op)) + " on " + describe() + ": " + what);
}

void CollectiveGroup::State::check_usable(OpType op) const {
  if (forked()) fail(ErrorCode::kInvalidUsage, op, forked_message());
  if (destroyed.load()) fail(ErrorCode::kInvalidUsage, op, "the group was destroyed");
}

namespace {

// Who the calling thread is: a serial number never given to another thread, and a token that
// lives exactly as long as the thread.
struct ThreadIdentity {
  uint64_t serial;
  std::shared_ptr<const void> token;
};

const ThreadIdentity& this_thread_identity() {
  static std::atomic<uint64_t> next{1};
  thread_local const ThreadIdentity me{next.fetch_add(1), std::make_shared<const char>(0)};
  return me;
}

}  // namespace

void CollectiveGroup::State::check_thread(OpType op) {
  const ThreadIdentity& me = this_thread_identity();
  if (owner_serial.load(std::memory_order_acquire) == me.serial) return;
  std::lock_guard<std::mutex> lock(owner_mutex);
  if (owner.expired()) {
    // The thread that issued the group's ops has ended: this one takes them over.
    owner = me.token;
    owner_serial.store(me.serial, std::memory_order_release);
    return;
  }
  fail(ErrorCode::kInvalidUsage, op,
       "called from a thread other than the one that issues this group's ops (the thread that "
       "created the group, or took it over): ops of two threads could be numbered in a "
       "different order on each rank and swap their data unnoticed. Issue a group's ops from one "
       "thread (async ops keep several in flight), or hand it over with "
       "issue_from_this_thread()");
}

void CollectiveGroup::State::take_thread() {
  const ThreadIdentity& me = this_thread_identity();
  std::lock_guard<std::mutex> lock(owner_mutex);
  owner = me.token;
  owner_serial.store(me.serial, std::memory_order_release);
}

std::string CollectiveGroup::State::forked_message() const {
  return "the group belongs to the parent process (pid " + std::to_string(creator_pid) +
         "), this is a forked child; fork before creating groups, or create new ones in the "
         "child";
}

void CollectiveGroup::State::check_tensor(OpType op, const TensorView& t, const char* what) const {
  check_usable(op);
  if (!device_supported[static_cast<size_t>(t.device().type)]) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(what) + " is on " + t.device().str() + ", which backend '" + backend_name +
             "' does not support");
  }
}

void CollectiveGroup::State::check_rank(OpType op, int value, const char* what,
                                        bool allow_self) const {
  if (value < 0 || value >= world_size) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(what) + " " + std::to_string(value) + " is outside [0, " +
             std::to_string(world_size) + ")");
  }
  if (!allow_self && value == rank) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(what) + " " + std::to_string(value) + " is this rank itself");
  }
}

void CollectiveGroup::State::check_reduce_op(OpType op, ReduceOp reduce_op, DType dtype) const {
  if (reduce_op == ReduceOp::kAvg && !is_floating(dtype)) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string("reduce op avg is only defined for floating dtypes, got ") + to_string(dtype));
  }
}

void CollectiveGroup::State::check_like(OpType op, const TensorView& t, const TensorView& ref,
                                        const std::string& what, const char* ref_name) const {
  if (t.dtype() != ref.dtype()) {
    fail(ErrorCode::kInvalidArgument, op,
         what + " has dtype " + to_string(t.dtype()) + ", " + ref_name + " has " +
             to_string(ref.dtype()));
  }
  if (t.shape() != ref.shape()) {
    fail(ErrorCode::kInvalidArgument, op,
         what + " is " + t.str() + ", " + ref_name + " is " + ref.str());
  }
  if (t.device() != ref.device()) {
    fail(ErrorCode::kInvalidArgument, op,
         what + " is on " + t.device().str() + ", " + ref_name + " on " + ref.device().str());
  }
}

// A list of one tensor per rank, each shaped, typed and placed like ref.
void CollectiveGroup::State::check_list(OpType op, const std::vector<TensorView>& list,
                                        const TensorView& ref, const char* item_name,
                                        const char* ref_name) const {
  if (static_cast<int>(list.size()) != world_size) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(item_name) + " list has " + std::to_string(list.size()) +
             " tensors, expected one per rank (" + std::to_string(world_size) + ")");
  }
  for (size_t r = 0; r < list.size(); ++r) {
    check_like(op, list[r], ref, std::string(item_name) + " " + std::to_string(r), ref_name);
  }
}

void CollectiveGroup::State::check_same_dtype(OpType op, const TensorView& a, const char* a_name,
                                              const TensorView& b, const char* b_name) const {
  if (a.dtype() != b.dtype()) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(a_name) + " has dtype " + to_string(a.dtype()) + ", " + b_name + " has " +
             to_string(b.dtype()));
  }
  if (a.device() != b.device()) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(a_name) + " is on " + a.device().str() + ", " + b_name + " on " +
             b.device().str());
  }
}

// Per-rank element counts: world_size of them, none negative, summing to `total`.
void CollectiveGroup::State::check_counts(OpType op, const std::vector<int64_t>& counts,
                                          const char* what, int64_t total,
                                          const char* total_name) const {
  if (static_cast<int>(counts.size()) != world_size) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(what) + " has " + std::to_string(counts.size()) +
             " entries, expected one per rank (" + std::to_string(world_size) + ")");
  }
  int64_t sum = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] < 0) {
      fail(ErrorCode::kInvalidArgument, op,
           std::string(what) + "[" + std::to_string(r) +
               "] is negative: " + std::to_string(counts[r]));
    }
    if (__builtin_add_overflow(sum, counts[r], &sum)) {  // it wrapped (to 0, say) and passed
      fail(ErrorCode::kInvalidArgument, op,
           std::string(what) + " add up to more than 2^63 elements (at entry " + std::to_string(r) +
               ": " + std::to_string(counts[r]) + "), " + total_name + " has " +
               std::to_string(total));
    }
  }
  if (sum != total) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(what) + " add up to " + std::to_string(sum) + " elements, " + total_name +
             " has " + std::to_string(total));
  }
}

void CollectiveGroup::State::check_device_list(OpType op, const std::vector<TensorView>& tensors,
                                               const char* what) const {
  if (tensors.empty()) fail(ErrorCode::kInvalidArgument, op, std::string(what) + " list is empty");
  if (static_cast<int>(tensors.size()) > max_devices) {
    fail(ErrorCode::kInvalidArgument, op,
         "backend '" + backend_name + "' takes at most " + std::to_string(max_devices) +
             " tensor(s) per op, got a list of " + std::to_string(tensors.size()));
  }
  for (size_t d = 0; d < tensors.size(); ++d) {
    const std::string item = std::string(what) + " " + std::to_string(d);
    check_tensor(op, tensors[d], item.c_str());
    if (d > 0) {
      if (tensors[d].dtype() != tensors[0].dtype() || tensors[d].shape() != tensors[0].shape()) {
        fail(ErrorCode::kInvalidArgument, op,
             item + " is " + tensors[d].str() + ", " + what + " 0 is " + tensors[0].str() +
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

// A device list with a root: the list rules, a root rank in range, a root tensor in the list.
void CollectiveGroup::State::check_rooted_list(OpType op, const std::vector<TensorView>& tensors,
                                               int root_rank, int root_tensor) const {
  check_device_list(op, tensors, "tensor");
  check_rank(op, root_rank, "root rank");
  if (root_tensor < 0 || root_tensor >= static_cast<int>(tensors.size())) {
    fail(ErrorCode::kInvalidArgument, op,
         "root tensor " + std::to_string(root_tensor) + " is outside [0, " +
             std::to_string(tensors.size()) + ")");
  }
}

// lists[d] holds `count` tensors shaped, typed and placed like refs[d].
void CollectiveGroup::State::check_lists(OpType op,
                                         const std::vector<std::vector<TensorView>>& lists,
                                         const std::vector<TensorView>& refs, size_t count,
                                         const char* list_name, const char* ref_name) const {
  if (lists.size() != refs.size()) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(list_name) + " has " + std::to_string(lists.size()) + " lists for " +
             std::to_string(refs.size()) + " devices");
  }
  for (size_t d = 0; d < lists.size(); ++d) {
    if (lists[d].size() != count) {
      fail(ErrorCode::kInvalidArgument, op,
           std::string(list_name) + " " + std::to_string(d) + " has " +
               std::to_string(lists[d].size()) +
               " tensors, expected world size x devices = " + std::to_string(count));
    }
    for (size_t k = 0; k < lists[d].size(); ++k) {
      check_like(op, lists[d][k], refs[d],
                 std::string(list_name) + " " + std::to_string(d) + "[" + std::to_string(k) + "]",
                 ref_name);
    }
  }
}

namespace {

// Whether two tensors share a byte (on one device, neither empty).
bool overlap(const TensorView& a, const TensorView& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0 || a.device() != b.device()) return false;
  const auto* a0 = static_cast<const char*>(a.data());
  const auto* b0 = static_cast<const char*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

// Ops that read one buffer while writing the other refuse buffers that overlap.
void CollectiveGroup::State::check_disjoint(OpType op, const TensorView& a, const char* a_name,
                                            const TensorView& b, const char* b_name) const {
  if (overlap(a, b)) {
    fail(ErrorCode::kInvalidArgument, op,
         std::string(a_name) + " and " + b_name + " overlap: this op cannot run in place");
  }
}

void CollectiveGroup::State::check_list_apart(OpType op, const std::vector<TensorView>& list,
                                              const char* item_name, const TensorView& one,
                                              const char* one_name, int own) const {
  if (own < 0) own = rank;
  for (size_t q = 0; q < list.size(); ++q) {
    const TensorView& t = list[q];
    if (static_cast<int>(q) == own && t.data() == one.data()) continue;  // in place
    if (overlap(t, one)) {
      fail(ErrorCode::kInvalidArgument, op,
           std::string(item_name) + " " + std::to_string(q) + " and " + one_name +
               " overlap: only " + item_name + " " + std::to_string(own) +
               " (this rank's) may be " + one_name + " itself, in place");
    }
  }
}

void CollectiveGroup::State::check_lists_disjoint(OpType op, const std::vector<TensorView>& outs,
                                                  const std::vector<TensorView>& ins) const {
  // Output q may be input q itself when q is this rank (its block stays in place); any other
  // overlap between an output and an input is refused, naming both. Inputs may share bytes (they
  // are only read), and so may outputs (as every list form allows). Sorted by address: the
  // lists hold one tensor per rank, and a pairwise check would be quadratic in the world.
  const auto fail_overlap = [&](size_t out, size_t in) {
    fail(ErrorCode::kInvalidArgument, op,
         "output " + std::to_string(out) + " and input " + std::to_string(in) +
             " overlap: only output " + std::to_string(rank) + " (this rank's) may be input " +
             std::to_string(rank) + " itself, in place");
  };
  const size_t own = static_cast<size_t>(rank);
  const bool in_place =
      own < outs.size() && own < ins.size() && outs[own].data() == ins[own].data() &&
      outs[own].nbytes() == ins[own].nbytes() && outs[own].device() == ins[own].device();
  if (in_place) {
    for (size_t q = 0; q < ins.size(); ++q) {
      if (q != own && overlap(outs[own], ins[q])) fail_overlap(own, q);
    }
  }
  struct Span {
    int device_type;
    int device_index;
    const char* lo;
    const char* hi;
    bool output;
    size_t index;
  };
  std::vector<Span> spans;
  spans.reserve(outs.size() + ins.size());
  auto add = [&](const TensorView& t, bool output, size_t index) {
    if (t.nbytes() == 0) return;
    const auto* lo = static_cast<const char*>(t.data());
    spans.push_back(
        {static_cast<int>(t.device().type), t.device().index, lo, lo + t.nbytes(), output, index});
  };
  for (size_t q = 0; q < outs.size(); ++q) {
    if (!(in_place && q == own)) add(outs[q], true, q);
  }
  for (size_t q = 0; q < ins.size(); ++q) add(ins[q], false, q);
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.device_type, a.device_index, a.lo) <
           std::tie(b.device_type, b.device_index, b.lo);
  });
  // The farthest-reaching output and input so far on the current device: a span that begins
  // before one of the other kind ends overlaps it.
  const Span* far_out = nullptr;
  const Span* far_in = nullptr;
  for (size_t k = 0; k < spans.size(); ++k) {
    const Span& sp = spans[k];
    if (k > 0 && (sp.device_type != spans[k - 1].device_type ||
                  sp.device_index != spans[k - 1].device_index)) {
      far_out = far_in = nullptr;
    }
    const Span* other = sp.output ? far_in : far_out;
    if (other != nullptr && other->hi > sp.lo) {
      sp.output ? fail_overlap(sp.index, other->index) : fail_overlap(other->index, sp.index);
    }
    const Span*& far = sp.output ? far_out : far_in;
    if (far == nullptr || sp.hi > far->hi) far = &sp;
  }
}

void CollectiveGroup::State::check_lists_apart(OpType op,
                                               const std::vector<std::vector<TensorView>>& lists,
                                               const char* list_name,
                                               const std::vector<TensorView>& ones,
                                               const char* one_name) const {
  for (size_t d = 0; d < lists.size() && d < ones.size(); ++d) {
    const std::string item = std::string(list_name) + " " + std::to_string(d) + " entry";
    const std::string one = std::string(one_name) + " " + std::to_string(d);
    check_list_apart(op, lists[d], item.c_str(), ones[d], one.c_str(),
                     rank * static_cast<int>(ones.size()) + static_cast<int>(d));
  }
}

// The checks send_multigpu and recv_multigpu share; returns the view of the first n_elements
// (0: all) that travels.
TensorView CollectiveGroup::State::check_p2p_multigpu(OpType op, const TensorView& tensor, int peer,
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
  return n_elements == 0 ? tensor
                         : TensorView(tensor.data(), tensor.dtype(), {n_elements}, tensor.device());
}

}  // namespace tutti
