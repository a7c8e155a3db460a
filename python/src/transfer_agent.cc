// The direct transport's agent in Python, its methods (transfer.h): put, reserve, fulfil and
// fail; get, borrow and get_async; allocate and the freed objects; two-sided transports' groups.
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "errors.h"
#include "transfer.h"
#include "tutti/collective_group.h"

namespace tutti::python {

using namespace nb::literals;

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

}  // namespace tutti::python
