// What the direct transport's Python bindings share (internal to tutti._tutti): the wrapper of
// an agent, of a handle, a borrow and a fetch, and the helpers that turn Python's arguments and
// C++'s results into each other. transfer.cc binds TensorRef, the results and the agent's
// constructor; transfer_agent.cc the agent's methods.
//
// Python tensors that were put stay referenced by the agent's wrapper until the C++ agent has
// freed their object (no consumer reads them any more), however early the handle goes: a copy in
// progress never reads memory Python has reused. A ref resolved by the agent that put it returns
// the very objects that were put (Ray's semantics), no copy.
#pragma once

#include <nanobind/nanobind.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "tensors.h"
#include "tutti/transfer_agent.h"

namespace tutti::python {

// What the wrapper holds for an object this agent published.
struct Pinned {
  std::vector<TensorView> views;
  std::unique_ptr<Keep> keep;  // exported buffers and the Python tensors
  nb::list originals;          // the objects as put, returned by the owner's own gets
  bool released = false;       // every Python handle of it has gone
};

class PyAgent {
 public:
  explicit PyAgent(std::shared_ptr<TransferAgent> agent) : agent_(std::move(agent)) {}
  PyAgent(const PyAgent&) = delete;
  PyAgent& operator=(const PyAgent&) = delete;
  ~PyAgent() {
    // The C++ agent may outlive this wrapper (the process-wide one does): keep what it may
    // still publish alive for the rest of the process rather than free memory under it.
    if (Py_IsInitialized() && agent_.use_count() > 1) {
      for (auto& [id, p] : pinned_) {
        (void)p.keep.release();
        p.originals.release();
      }
    }
  }

  TransferAgent& agent() { return *agent_; }
  const std::shared_ptr<TransferAgent>& shared() const { return agent_; }

  void pin(uint64_t id, Pinned pinned) { pinned_[id] = std::move(pinned); }
  Pinned* find(uint64_t id) {
    auto it = pinned_.find(id);
    return it == pinned_.end() ? nullptr : &it->second;
  }
  void mark_released(uint64_t id) {
    if (Pinned* p = find(id)) p->released = true;
    reap();
  }
  // Drops what the C++ agent has freed. With the GIL held.
  void reap() {
    for (auto it = pinned_.begin(); it != pinned_.end();) {
      if (it->second.released && freed(it->second)) {
        it = pinned_.erase(it);
      } else {
        ++it;
      }
    }
  }
  size_t pinned_count() const { return pinned_.size(); }

 private:
  bool freed(const Pinned& p) {
    for (const TensorView& v : p.views) {
      try {
        agent_->wait_tensor_freed(v, std::chrono::milliseconds(0));
      } catch (const Error&) {
        return false;
      }
    }
    return true;
  }

  // Declared first, destroyed last: the C++ agent stops serving before the tensors go.
  std::map<uint64_t, Pinned> pinned_;
  std::shared_ptr<TransferAgent> agent_;
};

// The Python object TransferAgent: a reference to the wrapper (shared with handles and fetches).
struct AgentBox {
  std::shared_ptr<PyAgent> p;
};

struct PyHandle {
  ObjectHandle handle;
  std::shared_ptr<PyAgent> agent;
  uint64_t id = 0;
  bool released = false;

  void release() {
    if (released) return;
    released = true;
    handle.release();
    agent->mark_released(id);
  }
  ~PyHandle() {
    if (!released && Py_IsInitialized()) release();
  }
};

struct PyBorrowed {
  std::shared_ptr<Borrowed> borrowed;
  nb::list arrays;
};

struct PyFetch {
  Fetch fetch;
  std::shared_ptr<PyAgent> agent;
  TensorRef ref;
  nb::object targets;
  std::unique_ptr<Keep> keep;
  Framework framework = Framework::kNumpy;
  long pid = static_cast<long>(::getpid());  // a forked child's copy has no get to wait for

  PyFetch() = default;
  PyFetch(const PyFetch&) = delete;
  PyFetch& operator=(const PyFetch&) = delete;
  // A get still running writes into the targets, which go with this: it is cancelled and waited
  // for first (without the GIL: a get may take a moment to see its cancel).
  ~PyFetch() {
    if (static_cast<long>(::getpid()) != pid) {
      // A forked child: the get's worker (and any lock it held) stayed in the parent. Its state
      // is left alone, never waited for.
      (void)new Fetch(std::move(fetch));
      return;
    }
    if (fetch.is_completed()) return;
    fetch.cancel();
    nb::gil_scoped_release release;
    try {
      fetch.wait();
    } catch (...) {  // its error (kAborted) is nobody's now
    }
  }
};

// Wraps a C++ owner of memory as a Python object (a capsule), the base of arrays over it.
template <typename T>
nb::object owner_of(std::shared_ptr<T> storage) {
  auto* heap = new std::shared_ptr<T>(std::move(storage));
  return nb::capsule(heap, [](void* p) noexcept { delete static_cast<std::shared_ptr<T>*>(p); });
}

TensorRef to_ref(nb::handle ref, const char* op);
// A get's or an agent's timeout: positive (in C++ zero means the agent's default, which a
// Python caller's 0 must not silently become).
std::chrono::milliseconds positive_timeout(nb::handle timeout, const char* op, const char* what);
GetOptions get_options(nb::handle timeout, bool allow_fallback, const char* op,
                       bool copy_on_write = false);
nb::list arrays_of(const std::vector<TensorView>& views, nb::handle owner, Framework framework,
                   bool read_only);
// get() and get_async()'s result in Python: the targets themselves where the caller gave some,
// the objects as put for this agent's own refs, else arrays over the Received buffers.
nb::list result_of(PyAgent& agent, const TensorRef& ref, Received received, nb::handle targets,
                   Framework framework);
PyHandle* do_put(const std::shared_ptr<PyAgent>& agent, nb::handle tensors,
                 const std::string& transport, bool snapshot, uint32_t expected_gets,
                 nb::handle keep_for);
std::vector<TensorView> target_views(nb::handle targets, Keep& keep, const char* op);
nb::object meta_of(const TensorMeta& m);

// The agent's methods (transfer_agent.cc): put, reserve, fulfil and fail; get, borrow and
// get_async; allocate and the freed objects; the groups of two-sided transports.
void bind_agent_objects(nb::class_<AgentBox>& c);
void bind_agent_gets(nb::class_<AgentBox>& c);
void bind_agent_memory(nb::class_<AgentBox>& c);
void bind_agent_groups(nb::class_<AgentBox>& c);

}  // namespace tutti::python
