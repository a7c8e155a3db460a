// The direct transport in Python: tutti.transfer.TransferAgent (put/reserve/fulfil/fail, get,
// borrow, get_async, wait_tensor_freed, allocate), ObjectHandle, TensorRef (bytes or text),
// Borrowed and Fetch.
//
// Python tensors that were put stay referenced by the agent's wrapper until the C++ agent has
// freed their object (no consumer reads them any more), however early the handle goes: a copy in
// progress never reads memory Python has reused. A ref resolved by the agent that put it returns
// the very objects that were put (Ray's semantics), no copy.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <unistd.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "tensors.h"
#include "tutti/collective_group.h"
#include "tutti/transfer_agent.h"

namespace tutti::python {
namespace {

using namespace nb::literals;

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

TensorRef to_ref(nb::handle ref, const char* op) {
  TensorRef r;
  if (nb::try_cast<TensorRef>(ref, r)) return r;
  if (PyUnicode_Check(ref.ptr())) return TensorRef::from_text(nb::cast<std::string>(ref));
  if (PyBytes_Check(ref.ptr()) || PyByteArray_Check(ref.ptr()) || PyMemoryView_Check(ref.ptr())) {
    return TensorRef::parse(to_bytes(ref, op));
  }
  throw TensorTypeError(
      std::string(op) + ": ref must be a tutti.transfer.TensorRef, its bytes or its text, not " +
      nb::cast<std::string>(nb::repr(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(ref.ptr()))))));
}

// A get's or an agent's timeout: positive (in C++ zero means the agent's default, which a
// Python caller's 0 must not silently become).
std::chrono::milliseconds positive_timeout(nb::handle timeout, const char* op, const char* what) {
  const auto ms = to_milliseconds(timeout, op, what);
  if (ms.count() == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": " + what + " must be positive (None: the agent's " +
                    "fetch timeout), got " + nb::cast<std::string>(nb::repr(timeout)));
  }
  return ms;
}

GetOptions get_options(nb::handle timeout, bool allow_fallback, const char* op,
                       bool copy_on_write = false) {
  GetOptions o;
  if (!timeout.is_none()) o.timeout = positive_timeout(timeout, op, "timeout");
  o.allow_fallback = allow_fallback;
  o.copy_on_write = copy_on_write;
  return o;
}

// Wraps a C++ owner of memory as a Python object (a capsule), the base of arrays over it.
template <typename T>
nb::object owner_of(std::shared_ptr<T> storage) {
  auto* heap = new std::shared_ptr<T>(std::move(storage));
  return nb::capsule(heap, [](void* p) noexcept { delete static_cast<std::shared_ptr<T>*>(p); });
}

nb::list arrays_of(const std::vector<TensorView>& views, nb::handle owner, Framework framework,
                   bool read_only) {
  nb::list out;
  for (const TensorView& v : views) out.append(from_view(v, owner, framework, read_only));
  return out;
}

// get() and get_async()'s result in Python: the targets themselves where the caller gave some,
// the objects as put for this agent's own refs, else arrays over the Received buffers.
nb::list result_of(PyAgent& agent, const TensorRef& ref, Received received, nb::handle targets,
                   Framework framework) {
  if (!targets.is_none()) return nb::list(targets);
  if (ref.owner().uuid == agent.agent().identity().uuid) {
    if (Pinned* p = agent.find(ref.object().id)) return nb::list(p->originals);
  }
  auto shared = std::make_shared<Received>(std::move(received));
  return arrays_of(shared->tensors(), owner_of(shared), framework, false);
}

PyHandle* do_put(const std::shared_ptr<PyAgent>& agent, nb::handle tensors,
                 const std::string& transport, bool snapshot, uint32_t expected_gets,
                 nb::handle keep_for) {
  const Site site{"put", nullptr, "transfer"};
  auto keep = std::make_unique<Keep>();
  nb::list originals = is_sequence(tensors) ? nb::list(tensors) : nb::list();
  if (!is_sequence(tensors)) originals.append(tensors);
  auto views = to_views(originals, Access::kRead, site, "tensors", *keep);
  for (nb::handle t : originals) keep->add(t);
  PutOptions o;
  o.transport = transport;
  o.snapshot = snapshot;
  o.expected_gets = expected_gets;
  if (!keep_for.is_none()) o.keep_for = to_milliseconds(keep_for, "put", "keep_for");
  ObjectHandle h;
  {
    nb::gil_scoped_release release;
    h = agent->agent().put(views, o);
  }
  auto* handle = new PyHandle();
  handle->id = h.ref().object().id;
  handle->handle = std::move(h);
  handle->agent = agent;
  agent->pin(handle->id, Pinned{std::move(views), std::move(keep), originals, false});
  agent->reap();
  return handle;
}

std::vector<TensorView> target_views(nb::handle targets, Keep& keep, const char* op) {
  if (targets.is_none()) return {};
  const Site site{op, nullptr, "transfer"};
  return to_views(targets, Access::kWrite, site, "targets", keep);
}

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

std::shared_ptr<PyAgent>& default_wrapper() {
  static auto* w = new std::shared_ptr<PyAgent>();  // never destroyed (see ~PyAgent)
  return *w;
}

AgentBox default_py_agent() {
  auto& w = default_wrapper();
  if (!w) {
    std::shared_ptr<TransferAgent> a;
    {
      nb::gil_scoped_release release;
      a = default_agent();
    }
    w = std::make_shared<PyAgent>(std::move(a));
  }
  return AgentBox{w};
}

nb::object meta_of(const TensorMeta& m) {
  nb::list shape;
  for (int64_t d : m.shape) shape.append(d);
  return nb::make_tuple(std::string(to_string(m.dtype)), nb::tuple(shape), m.device.str());
}

// TensorRef.
void bind_ref(nb::module_& m) {
  nb::class_<TensorRef>(m, "TensorRef",
                        "A reference to published tensors: hand its bytes (to_bytes) or text "
                        "(to_text) to any process; its agent resolves it with get or borrow. "
                        "Picklable.")
      .def_static(
          "from_bytes",
          [](nb::handle b) { return TensorRef::parse(to_bytes(b, "TensorRef.from_bytes")); })
      .def_static("from_text", [](const std::string& s) { return TensorRef::from_text(s); })
      .def("to_bytes",
           [](const TensorRef& r) {
             const std::string s = r.serialize();
             return nb::bytes(s.data(), s.size());
           })
      .def("to_text", &TensorRef::to_text)
      .def("describe", &TensorRef::describe)
      .def_prop_ro("transport", &TensorRef::transport)
      .def_prop_ro("owner_name", [](const TensorRef& r) { return r.owner().name; })
      .def_prop_ro("object_id", [](const TensorRef& r) { return r.object().id; })
      .def_prop_ro("is_pending", &TensorRef::is_pending)
      .def_prop_ro("is_signed", &TensorRef::is_signed)
      .def_prop_ro(
          "tensors",
          [](const TensorRef& r) {
            nb::list out;
            for (const TensorMeta& t : r.tensors()) out.append(meta_of(t));
            return out;
          },
          "(dtype, shape, device) of each tensor")
      .def("__getstate__",
           [](const TensorRef& r) {
             const std::string s = r.serialize();
             return nb::bytes(s.data(), s.size());
           })
      .def("__setstate__",
           [](TensorRef& r, nb::handle state) {
             new (&r) TensorRef(TensorRef::parse(to_bytes(state, "TensorRef.__setstate__")));
           })
      .def("__repr__",
           [](const TensorRef& r) { return "<tutti.transfer.TensorRef " + r.describe() + ">"; });
}

// ObjectHandle, Borrowed and Fetch: what a put, a borrow and a get_async hand back.
void bind_results(nb::module_& m) {
  nb::class_<PyHandle>(m, "ObjectHandle",
                       "The owner's handle on a published object: the object may be freed once "
                       "every handle is released (release() or garbage collection).")
      .def_prop_ro("ref", [](const PyHandle& h) { return h.handle.ref(); })
      .def("release", &PyHandle::release)
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](PyHandle& h, nb::args) { h.release(); })
      .def("__repr__", [](const PyHandle& h) {
        return "<tutti.transfer.ObjectHandle " + h.handle.ref().describe() +
               (h.released ? " (released)>" : ">");
      });

  nb::class_<PyBorrowed>(m, "Borrowed",
                         "borrow()'s result: read-only numpy arrays over the owner's memory "
                         "(.tensors). The owner cannot free the object while the Borrowed or "
                         "any of its arrays is alive.")
      .def_ro("tensors", &PyBorrowed::arrays)
      .def(
          "release",
          [](PyBorrowed& b) {
            b.arrays = nb::list();
            b.borrowed.reset();
          },
          "Drops this object's hold; the lease ends when no array from it is alive either.")
      .def("__enter__", [](PyBorrowed& b) { return b.arrays; })
      .def("__exit__", [](PyBorrowed& b, nb::args) {
        b.arrays = nb::list();
        b.borrowed.reset();
      });

  nb::class_<PyFetch>(m, "Fetch",
                      "An asynchronous get (get_async), with Work's verbs. Dropped while it "
                      "runs, it cancels the get and waits for its end (its targets may go).")
      .def(
          "is_completed", [](PyFetch& f) { return f.fetch.is_completed(); },
          "True once the get has finished, successfully or not. Never blocks.")
      .def(
          "done", [](PyFetch& f) { return f.fetch.is_completed(); }, "is_completed().")
      .def(
          "wait",
          [](PyFetch& f, nb::handle timeout) {
            const auto ms = timeout.is_none() ? kUseGroupTimeout
                                              : to_milliseconds(timeout, "Fetch.wait", "timeout");
            Received r;
            {
              nb::gil_scoped_release release;
              r = f.fetch.wait(ms);
            }
            return result_of(*f.agent, f.ref, std::move(r), f.targets, f.framework);
          },
          "timeout"_a = nb::none(),
          "Waits (up to the get's own timeout) and returns the tensors; raises the get's error. "
          "timeout (seconds): a shorter wait that raises tutti.TimeoutError and leaves the get "
          "running.")
      .def(
          "exception", [](PyFetch& f) { return to_python_exception(f.fetch.exception()); },
          "The get's error (a tutti.Error), or None while it runs or after it succeeded.")
      .def("cancel", [](PyFetch& f) { f.fetch.cancel(); });
}

// TransferAgent: put, reserve, fulfil, fail.
void bind_agent_objects(nb::class_<AgentBox>& c) {
  c.def(
       "put",
       [](AgentBox& box, nb::handle tensors, const std::string& transport, bool snapshot,
          uint32_t expected_gets, nb::handle keep_for) {
         return do_put(box.p, tensors, transport, snapshot, expected_gets, keep_for);
       },
       "tensors"_a, nb::kw_only(), "transport"_a = "auto", "snapshot"_a = false,
       "expected_gets"_a = 0, "keep_for"_a = nb::none(), nb::rv_policy::take_ownership,
       "Publishes a tensor or a list of tensors in place (snapshot=True: a copy now). They "
       "must stay unchanged until the object is freed (wait_tensor_freed).")
      .def(
          "reserve",
          [](AgentBox& box, nb::handle metas, const std::string& transport) {
            std::vector<TensorMeta> ms;
            for (nb::handle item : metas) {
              nb::tuple t = nb::cast<nb::tuple>(item);
              TensorMeta meta;
              std::string name = text_of(t[0]);
              if (name.rfind("torch.", 0) == 0) name = name.substr(6);
              meta.dtype = parse_dtype(name);
              for (nb::handle d : t[1]) meta.shape.push_back(nb::cast<int64_t>(d));
              ms.push_back(std::move(meta));
            }
            PutOptions o;
            o.transport = transport;
            ObjectHandle h;
            {
              nb::gil_scoped_release release;
              h = box.p->agent().reserve(ms, o);
            }
            auto* handle = new PyHandle();
            handle->id = h.ref().object().id;
            handle->handle = std::move(h);
            handle->agent = box.p;
            return handle;
          },
          "metas"_a, nb::kw_only(), "transport"_a = "auto", nb::rv_policy::take_ownership,
          "A ref now, the data later: metas is a list of (dtype, shape); gets wait until "
          "fulfil() or fail().")
      .def(
          "fulfil",
          [](AgentBox& box, PyHandle& h, nb::handle tensors) {
            const Site site{"fulfil", nullptr, "transfer"};
            auto keep = std::make_unique<Keep>();
            nb::list originals(tensors);
            auto views = to_views(originals, Access::kRead, site, "tensors", *keep);
            for (nb::handle t : originals) keep->add(t);
            {
              nb::gil_scoped_release release;
              box.p->agent().fulfil(h.handle, views);
            }
            box.p->pin(h.id, Pinned{std::move(views), std::move(keep), originals, h.released});
          },
          "handle"_a, "tensors"_a)
      .def(
          "fail",
          [](AgentBox& box, PyHandle& h, const std::string& message) {
            nb::gil_scoped_release release;
            box.p->agent().fail(h.handle, message);
          },
          "handle"_a, "message"_a);
}

// TransferAgent: get, get_async, borrow, wait_tensor_freed.
void bind_agent_gets(nb::class_<AgentBox>& c) {
  c.def(
       "get",
       [](AgentBox& box, nb::handle ref, nb::handle targets, nb::handle timeout,
          bool allow_fallback, nb::handle framework, bool copy_on_write) {
         const TensorRef r = to_ref(ref, "get");
         GetOptions o = get_options(timeout, allow_fallback, "get", copy_on_write);
         Keep keep;
         o.targets = target_views(targets, keep, "get");
         const Framework fw = parse_framework(framework, "get");
         Received received;
         {
           nb::gil_scoped_release release;
           received = box.p->agent().get(r, o);
         }
         return result_of(*box.p, r, std::move(received), targets, fw);
       },
       "ref"_a, nb::kw_only(), "targets"_a = nb::none(), "timeout"_a = nb::none(),
       "allow_fallback"_a = false, "framework"_a = nb::none(), "copy_on_write"_a = false,
       "The tensors of a ref (TensorRef, bytes or text): copies into `targets` (writable, "
       "contiguous, same dtypes and sizes) or into new arrays of `framework` ('numpy' or "
       "'torch'). The agent that put the ref gets the very objects it put. copy_on_write="
       "True (no targets): tensors in shareable memory (allocate(), share_memory_() tensors "
       "the owner registered) come as private copy-on-write mappings of the owner's pages, "
       "no copy; the arrays hold the object at the owner until they go.")
      .def(
          "get_async",
          [](AgentBox& box, nb::handle ref, nb::handle targets, nb::handle timeout,
             bool allow_fallback, nb::handle framework, bool copy_on_write) {
            auto f = std::make_unique<PyFetch>();
            f->ref = to_ref(ref, "get_async");
            GetOptions o = get_options(timeout, allow_fallback, "get_async", copy_on_write);
            f->keep = std::make_unique<Keep>();
            o.targets = target_views(targets, *f->keep, "get_async");
            f->framework = parse_framework(framework, "get_async");
            f->targets = nb::borrow(targets);
            f->agent = box.p;
            {
              nb::gil_scoped_release release;
              f->fetch = box.p->agent().get_async(f->ref, o);
            }
            return f.release();
          },
          "ref"_a, nb::kw_only(), "targets"_a = nb::none(), "timeout"_a = nb::none(),
          "allow_fallback"_a = false, "framework"_a = nb::none(), "copy_on_write"_a = false,
          nb::rv_policy::take_ownership)
      .def(
          "borrow",
          [](AgentBox& box, nb::handle ref, nb::handle timeout, bool allow_fallback) {
            const TensorRef r = to_ref(ref, "borrow");
            GetOptions o = get_options(timeout, allow_fallback, "borrow");
            auto b = std::make_shared<Borrowed>();
            {
              nb::gil_scoped_release release;
              *b = box.p->agent().borrow(r, o);
            }
            auto* result = new PyBorrowed();
            result->borrowed = b;
            result->arrays = arrays_of(b->tensors(), owner_of(b), Framework::kNumpy, true);
            return result;
          },
          "ref"_a, nb::kw_only(), "timeout"_a = nb::none(), "allow_fallback"_a = false,
          nb::rv_policy::take_ownership,
          "Zero-copy, read-only numpy views of the owner's memory (one host, shm transport).")
      .def(
          "wait_tensor_freed",
          [](AgentBox& box, nb::handle tensor, nb::handle timeout) {
            const Site site{"wait_tensor_freed", nullptr, "transfer"};
            Keep keep;
            const TensorView v = to_view(tensor, Access::kRead, site, "tensor", keep);
            const auto ms = timeout.is_none()
                                ? std::chrono::milliseconds::max()
                                : to_milliseconds(timeout, "wait_tensor_freed", "timeout");
            {
              nb::gil_scoped_release release;
              box.p->agent().wait_tensor_freed(v, ms);
            }
            box.p->reap();
          },
          "tensor"_a, "timeout"_a = nb::none(),
          "Waits until no published object overlaps the tensor's bytes (timeout in seconds; "
          "None: no limit); raises tutti.TimeoutError listing what still holds it.");
}

// TransferAgent: allocate, register_memory, unregister_memory.
void bind_agent_memory(nb::class_<AgentBox>& c) {
  c.def(
       "allocate",
       [](AgentBox& box, size_t nbytes, const std::string& dtype, nb::handle framework) {
         const DType d = parse_dtype(dtype);
         const Framework fw = parse_framework(framework, "allocate");
         TensorView v;
         {
           nb::gil_scoped_release release;
           v = box.p->agent().allocate(nbytes, d);
         }
         // Given back when the array (and every view of it) goes.
         auto agent = box.p->shared();
         std::shared_ptr<void> memory(v.data(), [agent, v](void*) {
           try {
             agent->deallocate(v);
           } catch (...) {
           }
         });
         return from_view(v, owner_of(std::move(memory)), fw, false);
       },
       "nbytes"_a, "dtype"_a = "uint8", "framework"_a = nb::none(),
       "A 1-D array in memory the transports share without copying (shm: zero-copy gets and "
       "borrows); given back when the array goes.")
      .def(
          "register_memory",
          [](AgentBox& box, nb::handle region, int fd, uint64_t offset) {
            const Site site{"register_memory", nullptr, "transfer"};
            Keep keep;
            const TensorView v = to_view(region, Access::kRead, site, "region", keep);
            nb::gil_scoped_release release;
            box.p->agent().register_memory(v, fd, offset);
          },
          "region"_a, "fd"_a = -1, "offset"_a = 0,
          "Makes an array's memory shareable once: with fd, the file it is mapped MAP_SHARED from "
          "at offset (page-aligned), so shm consumers map it instead of copying (e.g. a torch "
          "tensor after share_memory_(): its storage's _share_fd_cpu_()). Keep the memory alive "
          "until unregister_memory.")
      .def(
          "unregister_memory",
          [](AgentBox& box, nb::handle region) {
            const Site site{"unregister_memory", nullptr, "transfer"};
            Keep keep;
            const TensorView v = to_view(region, Access::kRead, site, "region", keep);
            nb::gil_scoped_release release;
            box.p->agent().unregister_memory(v);
          },
          "region"_a,
          "Undoes register_memory; raises tutti.InvalidUsageError while an object in it is "
          "still published.");
}

// TransferAgent: the two-sided transports' groups, abort, collect.
void bind_agent_groups(nb::class_<AgentBox>& c) {
  c.def(
       "join_group",
       [](AgentBox& box, const std::string& transport, int world_size, int rank, nb::handle store,
          nb::handle timeout, const std::string& job_id, const std::string& set) {
         GroupOptions o = group_options(store, timeout, job_id, "TransferAgent.join_group");
         nb::gil_scoped_release release;
         box.p->agent().join_group(transport, world_size, rank, o, set);
       },
       "transport"_a, "world_size"_a, "rank"_a, nb::kw_only(), "store"_a = nb::none(),
       "timeout"_a = nb::none(), "job_id"_a = "", "set"_a = "rdt",
       "Joins the group a two-sided transport ('gloo', 'nccl') sends over: collective, every "
       "member calls it with its rank and a store they share (a URL, or one tutti.HashStore "
       "for agents that are threads).")
      .def(
          "attach_group",
          [](AgentBox& box, const std::string& transport, std::shared_ptr<CollectiveGroup> group) {
            nb::gil_scoped_release release;
            box.p->agent().attach_group(transport, std::move(group));
          },
          "transport"_a, "group"_a.none(),
          "Gives a two-sided transport the application's group (use it for nothing else: a "
          "failed transfer aborts it).")
      .def(
          "reset_transport",
          [](AgentBox& box, const std::string& transport) {
            nb::gil_scoped_release release;
            box.p->agent().reset_transport(transport);
          },
          "transport"_a,
          "After a two-sided failure: joins the transport group's next incarnation (collective: "
          "every member calls it). Objects and refs stay valid.")
      .def(
          "transport_group",
          [](AgentBox& box, const std::string& transport) {
            return box.p->agent().transport_group(transport);
          },
          "transport"_a, "The group of a two-sided transport, or None.")
      .def(
          "abort", [](AgentBox& box) { box.p->agent().abort(); },
          "Fails every get in progress with tutti.AbortedError; the agent stays usable.")
      .def(
          "collect",
          [](AgentBox& box) {
            box.p->reap();
            return box.p->pinned_count();
          },
          "Lets go of freed objects' tensors now; returns how many objects it still holds.");
}

}  // namespace

void bind_transfer(nb::module_& parent) {
  nb::module_ m = parent.def_submodule("transfer", "tutti's direct tensor transport");
  bind_ref(m);
  bind_results(m);
  nb::class_<AgentBox> c(
      m, "TransferAgent",
      "A direct-transport agent (tutti::TransferAgent). put() publishes tensors "
      "in place and returns an ObjectHandle whose .ref any process resolves with "
      "its own agent's get() (a copy) or borrow() (zero-copy, read-only).");
  c.def(
       "__init__",
       [](AgentBox* self, const std::string& name, nb::handle fetch_timeout, bool listen_tcp,
          const std::string& tcp_host, nb::handle secret) {
         TransferAgentOptions o;
         o.name = name;
         if (!fetch_timeout.is_none()) {
           o.fetch_timeout = positive_timeout(fetch_timeout, "TransferAgent", "fetch_timeout");
         }
         o.listen_tcp = listen_tcp;
         o.tcp_host = tcp_host;
         if (!secret.is_none()) o.secret = nb::cast<std::string>(secret);
         std::shared_ptr<TransferAgent> a;
         {
           nb::gil_scoped_release release;
           a = TransferAgent::create(o);
         }
         new (self) AgentBox{std::make_shared<PyAgent>(std::move(a))};
       },
       "name"_a = "", nb::kw_only(), "fetch_timeout"_a = nb::none(), "listen_tcp"_a = false,
       "tcp_host"_a = "", "secret"_a = nb::none())
      .def_prop_ro("name", [](AgentBox& box) { return box.p->agent().identity().name; });
  bind_agent_objects(c);
  bind_agent_gets(c);
  bind_agent_memory(c);
  bind_agent_groups(c);
  m.def("default_agent", &default_py_agent, "The process-wide agent (made on first use).");
  m.def("default_agent_made", &default_agent_made,
        "Whether the process-wide agent exists yet (its options, from the environment, are then "
        "fixed).");
}

}  // namespace tutti::python
