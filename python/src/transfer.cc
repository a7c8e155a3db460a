// The direct transport in Python: tutti.transfer.TransferAgent (put/reserve/fulfil/fail, get,
// borrow, get_async, wait_tensor_freed, allocate), ObjectHandle, TensorRef (bytes or text),
// Borrowed and Fetch. This file: the shared helpers, TensorRef, the results and the agent's
// constructor (transfer.h); the agent's methods are in transfer_agent.cc.
#include "transfer.h"

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "errors.h"

namespace tutti::python {

using namespace nb::literals;

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
                       bool copy_on_write) {
  GetOptions o;
  if (!timeout.is_none()) o.timeout = positive_timeout(timeout, op, "timeout");
  o.allow_fallback = allow_fallback;
  o.copy_on_write = copy_on_write;
  return o;
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

nb::object meta_of(const TensorMeta& m) {
  nb::list shape;
  for (int64_t d : m.shape) shape.append(d);
  return nb::make_tuple(std::string(to_string(m.dtype)), nb::tuple(shape), m.device.str());
}

namespace {

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
