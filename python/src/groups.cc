// Groups, ops and Works: tutti.CollectiveGroup, tutti.Work, tutti.P2POp and Ray's free
// functions (allreduce(tensor, group_name, op), ...). Every op converts and checks its tensors
// with the GIL held, then runs without it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "tensors.h"
#include "tutti/collective.h"
#include "tutti/collective_group.h"
#include "tutti/env.h"
#include "tutti/store.h"
#include "tutti/work.h"

namespace tutti::python {
namespace {

using namespace nb::literals;
using GroupPtr = std::shared_ptr<CollectiveGroup>;
using WorkPtr = std::shared_ptr<Work>;

// ---- arguments ------------------------------------------------------------------------------

std::chrono::milliseconds op_timeout(nb::handle timeout, const Site& site) {
  if (timeout.is_none()) return kUseGroupTimeout;
  return to_milliseconds(timeout, site.prefix().c_str(), "timeout");
}

ReduceOp to_reduce_op(nb::handle op, const Site& site) {
  if (op.is_none()) return ReduceOp::kSum;
  ReduceOp value;
  if (nb::try_cast<ReduceOp>(op, value)) return value;
  // Strings ("sum", "max") and enums of other libraries by name (Ray's ReduceOp.SUM).
  std::string text;
  if (nb::isinstance<nb::str>(op)) {
    text = nb::cast<std::string>(op);
  } else if (nb::hasattr(op, "name")) {
    text = text_of(op.attr("name"));
  } else {
    throw TensorTypeError(
        site.prefix() +
        ": op must be a tutti.ReduceOp, a name such as 'sum', "
        "or Ray's ReduceOp, not " +
        nb::cast<std::string>(
            nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(op.ptr()))).attr("__name__"))));
  }
  try {
    return parse_reduce_op(text);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, site.prefix() + ": " + e.what());
  }
}

template <typename Options>
Options make_options(nb::handle timeout, bool async_op, const Site& site) {
  Options o;
  o.timeout = op_timeout(timeout, site);
  o.async_op = async_op;
  return o;
}

// Runs `issue` without the GIL. A blocking op returns None; an async one its Work, which then
// holds the op's Python objects until it goes.
template <typename F>
nb::object run(Keep& keep, bool async_op, F&& issue) {
  release_deferred_keeps();
  WorkPtr work;
  {
    nb::gil_scoped_release release;
    work = issue();
  }
  if (work && !keep.empty() && !work->is_completed()) keep.attach_to(*work);
  if (!async_op) return nb::none();
  return nb::cast(work);
}

std::vector<int64_t> to_counts(nb::handle counts, const Site& site, const char* what) {
  std::vector<int64_t> out;
  if (!is_sequence(counts)) {
    throw TensorTypeError(site.prefix() + ": " + what + " must be a list of element counts");
  }
  for (nb::handle c : counts) out.push_back(nb::cast<int64_t>(c));
  return out;
}

GroupPtr group_named(std::string_view name) {
  return get_group(name);
}

// ---- ops on a group -------------------------------------------------------------------------

nb::object do_allreduce(CollectiveGroup& g, nb::handle tensor, nb::handle op, nb::handle timeout,
                        bool async_op) {
  const Site site{"allreduce", &g};
  Keep keep;
  TensorView t = to_view(tensor, Access::kWrite, site, "tensor", keep);
  auto o = make_options<AllreduceOptions>(timeout, async_op, site);
  o.reduce_op = to_reduce_op(op, site);
  return run(keep, async_op, [&] { return g.allreduce(t, o); });
}

nb::object do_reduce(CollectiveGroup& g, nb::handle tensor, int dst_rank, nb::handle op,
                     nb::handle timeout, bool async_op) {
  const Site site{"reduce", &g};
  Keep keep;
  // Only the root's tensor changes.
  const Access access = dst_rank == g.rank() ? Access::kWrite : Access::kRead;
  TensorView t = to_view(tensor, access, site, "tensor", keep);
  auto o = make_options<ReduceOptions>(timeout, async_op, site);
  o.reduce_op = to_reduce_op(op, site);
  o.root_rank = dst_rank;
  return run(keep, async_op, [&] { return g.reduce(t, o); });
}

nb::object do_broadcast(CollectiveGroup& g, nb::handle tensor, int src_rank, nb::handle timeout,
                        bool async_op) {
  const Site site{"broadcast", &g};
  Keep keep;
  const Access access = src_rank == g.rank() ? Access::kRead : Access::kWrite;
  TensorView t = to_view(tensor, access, site, "tensor", keep);
  auto o = make_options<BroadcastOptions>(timeout, async_op, site);
  o.root_rank = src_rank;
  return run(keep, async_op, [&] { return g.broadcast(t, o); });
}

nb::object do_allgather(CollectiveGroup& g, nb::handle tensor_list, nb::handle tensor,
                        nb::handle timeout, bool async_op) {
  const Site site{"allgather", &g};
  Keep keep;
  TensorView in = to_view(tensor, Access::kRead, site, "tensor", keep);
  auto o = make_options<AllgatherOptions>(timeout, async_op, site);
  if (is_sequence(tensor_list)) {
    auto out = to_views(tensor_list, Access::kWrite, site, "tensor_list", keep);
    return run(keep, async_op, [&] { return g.allgather(out, in, o); });
  }
  TensorView out = to_view(tensor_list, Access::kWrite, site, "output", keep);
  return run(keep, async_op, [&] { return g.allgather(out, in, o); });
}

nb::object do_allgatherv(CollectiveGroup& g, nb::handle output, nb::handle tensor,
                         nb::handle counts, nb::handle timeout, bool async_op) {
  const Site site{"allgatherv", &g};
  Keep keep;
  TensorView out = to_view(output, Access::kWrite, site, "output", keep);
  TensorView in = to_view(tensor, Access::kRead, site, "tensor", keep);
  auto c = to_counts(counts, site, "counts");
  auto o = make_options<AllgathervOptions>(timeout, async_op, site);
  return run(keep, async_op, [&] { return g.allgatherv(out, in, c, o); });
}

nb::object do_reduce_scatter(CollectiveGroup& g, nb::handle tensor, nb::handle tensor_list,
                             nb::handle op, nb::handle timeout, bool async_op) {
  const Site site{"reduce_scatter", &g};
  Keep keep;
  TensorView out = to_view(tensor, Access::kWrite, site, "tensor", keep);
  auto o = make_options<ReduceScatterOptions>(timeout, async_op, site);
  o.reduce_op = to_reduce_op(op, site);
  if (is_sequence(tensor_list)) {
    auto in = to_views(tensor_list, Access::kRead, site, "tensor_list", keep);
    return run(keep, async_op, [&] { return g.reduce_scatter(out, in, o); });
  }
  TensorView in = to_view(tensor_list, Access::kRead, site, "input", keep);
  return run(keep, async_op, [&] { return g.reduce_scatter(out, in, o); });
}

nb::object do_alltoall(CollectiveGroup& g, nb::handle output, nb::handle input, nb::handle timeout,
                       bool async_op) {
  const Site site{"alltoall", &g};
  Keep keep;
  auto o = make_options<AlltoallOptions>(timeout, async_op, site);
  if (is_sequence(output) || is_sequence(input)) {
    auto out = to_views(output, Access::kWrite, site, "output_list", keep);
    auto in = to_views(input, Access::kRead, site, "input_list", keep);
    return run(keep, async_op, [&] { return g.alltoall(out, in, o); });
  }
  TensorView out = to_view(output, Access::kWrite, site, "output", keep);
  TensorView in = to_view(input, Access::kRead, site, "input", keep);
  return run(keep, async_op, [&] { return g.alltoall(out, in, o); });
}

nb::object do_alltoallv(CollectiveGroup& g, nb::handle output, nb::handle input,
                        nb::handle output_counts, nb::handle input_counts, nb::handle timeout,
                        bool async_op) {
  const Site site{"alltoallv", &g};
  Keep keep;
  TensorView out = to_view(output, Access::kWrite, site, "output", keep);
  TensorView in = to_view(input, Access::kRead, site, "input", keep);
  auto oc = to_counts(output_counts, site, "output_counts");
  auto ic = to_counts(input_counts, site, "input_counts");
  auto o = make_options<AlltoallOptions>(timeout, async_op, site);
  return run(keep, async_op, [&] { return g.alltoallv(out, in, oc, ic, o); });
}

nb::object do_gather(CollectiveGroup& g, nb::handle output, nb::handle tensor, int dst_rank,
                     nb::handle timeout, bool async_op) {
  const Site site{"gather", &g};
  Keep keep;
  TensorView in = to_view(tensor, Access::kRead, site, "tensor", keep);
  auto o = make_options<GatherOptions>(timeout, async_op, site);
  o.root_rank = dst_rank;
  // Ranks other than the root may pass None (or an empty list).
  if (output.is_none() || is_sequence(output)) {
    std::vector<TensorView> out;
    if (!output.is_none()) out = to_views(output, Access::kWrite, site, "output_list", keep);
    return run(keep, async_op, [&] { return g.gather(out, in, o); });
  }
  TensorView out = to_view(output, Access::kWrite, site, "output", keep);
  return run(keep, async_op, [&] { return g.gather(out, in, o); });
}

nb::object do_scatter(CollectiveGroup& g, nb::handle tensor, nb::handle input, int src_rank,
                      nb::handle timeout, bool async_op) {
  const Site site{"scatter", &g};
  Keep keep;
  TensorView out = to_view(tensor, Access::kWrite, site, "tensor", keep);
  auto o = make_options<ScatterOptions>(timeout, async_op, site);
  o.root_rank = src_rank;
  if (input.is_none() || is_sequence(input)) {
    std::vector<TensorView> in;
    if (!input.is_none()) in = to_views(input, Access::kRead, site, "input_list", keep);
    return run(keep, async_op, [&] { return g.scatter(out, in, o); });
  }
  TensorView in = to_view(input, Access::kRead, site, "input", keep);
  return run(keep, async_op, [&] { return g.scatter(out, in, o); });
}

nb::object do_send(CollectiveGroup& g, nb::handle tensor, int dst_rank, nb::handle timeout,
                   bool async_op) {
  const Site site{"send", &g};
  Keep keep;
  TensorView t = to_view(tensor, Access::kRead, site, "tensor", keep);
  auto o = make_options<SendOptions>(timeout, async_op, site);
  return run(keep, async_op, [&] { return g.send(t, dst_rank, o); });
}

nb::object do_recv(CollectiveGroup& g, nb::handle tensor, int src_rank, nb::handle timeout,
                   bool async_op) {
  const Site site{"recv", &g};
  Keep keep;
  TensorView t = to_view(tensor, Access::kWrite, site, "tensor", keep);
  auto o = make_options<RecvOptions>(timeout, async_op, site);
  return run(keep, async_op, [&] { return g.recv(t, src_rank, o); });
}

nb::object do_barrier(CollectiveGroup& g, nb::handle timeout, bool async_op) {
  const Site site{"barrier", &g};
  Keep keep;
  auto o = make_options<BarrierOptions>(timeout, async_op, site);
  return run(keep, async_op, [&] { return g.barrier(o); });
}

// A send or receive of batch_isend_irecv, as Python sees it (torch's P2POp).
struct PyP2POp {
  P2POp::Kind kind = P2POp::Kind::kSend;
  nb::object tensor;
  int peer = 0;
  int peer_device_index = kPeerDevice;
};

P2POp::Kind parse_kind(nb::handle op) {
  std::string name;
  if (nb::isinstance<nb::str>(op)) {
    name = nb::cast<std::string>(op);
  } else if (nb::hasattr(op, "__name__")) {
    name = nb::cast<std::string>(op.attr("__name__"));  // tutti.isend / tutti.irecv, torch's too
  }
  if (name == "send" || name == "isend") return P2POp::Kind::kSend;
  if (name == "recv" || name == "irecv") return P2POp::Kind::kRecv;
  throw Error(ErrorCode::kInvalidArgument,
              "P2POp: op must be 'send', 'recv', tutti.isend or tutti.irecv, not " +
                  nb::cast<std::string>(nb::repr(op)));
}

nb::object do_batch(CollectiveGroup& g, nb::handle ops, nb::handle timeout, bool async_op) {
  const Site site{"batch_isend_irecv", &g};
  Keep keep;
  if (!is_sequence(ops)) {
    throw TensorTypeError(site.prefix() + ": p2p_op_list must be a list of tutti.P2POp");
  }
  std::vector<P2POp> batch;
  size_t i = 0;
  for (nb::handle item : ops) {
    PyP2POp* p = nullptr;
    if (!nb::try_cast<PyP2POp*>(item, p) || p == nullptr) {
      throw TensorTypeError(site.prefix() + ": p2p_op_list[" + std::to_string(i) +
                            "] is not a tutti.P2POp");
    }
    const std::string what = "p2p_op_list[" + std::to_string(i) + "].tensor";
    const Access access = p->kind == P2POp::Kind::kSend ? Access::kRead : Access::kWrite;
    P2POp op;
    op.kind = p->kind;
    op.tensor = to_view(p->tensor, access, site, what.c_str(), keep);
    op.peer = p->peer;
    op.peer_device_index = p->peer_device_index;
    batch.push_back(op);
    ++i;
  }
  auto o = make_options<BatchP2POptions>(timeout, async_op, site);
  return run(keep, async_op, [&] { return g.batch_isend_irecv(batch, o); });
}

// ---- multi-device forms (Ray's *_multigpu) -------------------------------------------------

nb::object do_allreduce_multigpu(CollectiveGroup& g, nb::handle tensor_list, nb::handle op,
                                 nb::handle timeout, bool async_op) {
  const Site site{"allreduce_multigpu", &g};
  Keep keep;
  auto ts = to_views(tensor_list, Access::kWrite, site, "tensor_list", keep);
  auto o = make_options<AllreduceOptions>(timeout, async_op, site);
  o.reduce_op = to_reduce_op(op, site);
  return run(keep, async_op, [&] { return g.allreduce_multigpu(ts, o); });
}

nb::object do_reduce_multigpu(CollectiveGroup& g, nb::handle tensor_list, int dst_rank,
                              int dst_tensor, nb::handle op, nb::handle timeout, bool async_op) {
  const Site site{"reduce_multigpu", &g};
  Keep keep;
  auto ts = to_views(tensor_list, Access::kWrite, site, "tensor_list", keep);
  auto o = make_options<ReduceOptions>(timeout, async_op, site);
  o.reduce_op = to_reduce_op(op, site);
  o.root_rank = dst_rank;
  o.root_tensor = dst_tensor;
  return run(keep, async_op, [&] { return g.reduce_multigpu(ts, o); });
}

nb::object do_broadcast_multigpu(CollectiveGroup& g, nb::handle tensor_list, int src_rank,
                                 int src_tensor, nb::handle timeout, bool async_op) {
  const Site site{"broadcast_multigpu", &g};
  Keep keep;
  auto ts = to_views(tensor_list, Access::kWrite, site, "tensor_list", keep);
  auto o = make_options<BroadcastOptions>(timeout, async_op, site);
  o.root_rank = src_rank;
  o.root_tensor = src_tensor;
  return run(keep, async_op, [&] { return g.broadcast_multigpu(ts, o); });
}

std::vector<std::vector<TensorView>> to_view_lists(nb::handle lists, Access access,
                                                   const Site& site, const char* what, Keep& keep) {
  if (!is_sequence(lists)) {
    throw TensorTypeError(site.prefix() + ": " + what + " must be a list of lists of tensors");
  }
  std::vector<std::vector<TensorView>> out;
  size_t i = 0;
  for (nb::handle l : lists) {
    const std::string name = std::string(what) + "[" + std::to_string(i++) + "]";
    out.push_back(to_views(l, access, site, name.c_str(), keep));
  }
  return out;
}

nb::object do_allgather_multigpu(CollectiveGroup& g, nb::handle output_lists, nb::handle input_list,
                                 nb::handle timeout, bool async_op) {
  const Site site{"allgather_multigpu", &g};
  Keep keep;
  auto out = to_view_lists(output_lists, Access::kWrite, site, "output_tensor_lists", keep);
  auto in = to_views(input_list, Access::kRead, site, "input_tensor_list", keep);
  auto o = make_options<AllgatherOptions>(timeout, async_op, site);
  return run(keep, async_op, [&] { return g.allgather_multigpu(out, in, o); });
}

nb::object do_reduce_scatter_multigpu(CollectiveGroup& g, nb::handle output_list,
                                      nb::handle input_lists, nb::handle op, nb::handle timeout,
                                      bool async_op) {
  const Site site{"reduce_scatter_multigpu", &g};
  Keep keep;
  auto out = to_views(output_list, Access::kWrite, site, "output_tensor_list", keep);
  auto in = to_view_lists(input_lists, Access::kRead, site, "input_tensor_lists", keep);
  auto o = make_options<ReduceScatterOptions>(timeout, async_op, site);
  o.reduce_op = to_reduce_op(op, site);
  return run(keep, async_op, [&] { return g.reduce_scatter_multigpu(out, in, o); });
}

nb::object do_send_multigpu(CollectiveGroup& g, nb::handle tensor, int dst_rank, int dst_gpu_index,
                            int64_t n_elements, nb::handle timeout, bool async_op) {
  const Site site{"send_multigpu", &g};
  Keep keep;
  TensorView t = to_view(tensor, Access::kRead, site, "tensor", keep);
  auto o = make_options<SendOptions>(timeout, async_op, site);
  o.dst_device_index = dst_gpu_index;
  return run(keep, async_op, [&] { return g.send_multigpu(t, dst_rank, n_elements, o); });
}

nb::object do_recv_multigpu(CollectiveGroup& g, nb::handle tensor, int src_rank, int src_gpu_index,
                            int64_t n_elements, nb::handle timeout, bool async_op) {
  const Site site{"recv_multigpu", &g};
  Keep keep;
  TensorView t = to_view(tensor, Access::kWrite, site, "tensor", keep);
  auto o = make_options<RecvOptions>(timeout, async_op, site);
  o.src_device_index = src_gpu_index;
  return run(keep, async_op, [&] { return g.recv_multigpu(t, src_rank, n_elements, o); });
}

Device to_device(nb::handle device) {
  if (device.is_none()) return Device::cpu();
  if (PyLong_Check(device.ptr())) return Device::cuda(nb::cast<int>(device));
  const std::string s = text_of(device);
  if (s == "cpu") return Device::cpu();
  if (s.rfind("cuda", 0) == 0) {
    return Device::cuda(s.size() > 5 ? std::stoi(s.substr(5)) : 0);
  }
  throw Error(ErrorCode::kInvalidArgument,
              "synchronize: device '" + s + "' is not known (expected 'cpu', 'cuda:N' or N)");
}

// ---- groups ---------------------------------------------------------------------------------

}  // namespace

GroupOptions group_options(nb::handle store, nb::handle timeout, const std::string& job_id,
                           const char* context) {
  GroupOptions options;
  if (!store.is_none()) {
    if (nb::isinstance<nb::str>(store)) {
      options.store_url = nb::cast<std::string>(store);
    } else {
      std::shared_ptr<Store> s;
      if (!nb::try_cast<std::shared_ptr<Store>>(store, s) || !s) {
        throw TensorTypeError(std::string(context) +
                              ": store must be a store URL (str) or a tutti.Store");
      }
      options.store = std::move(s);
    }
  }
  if (!timeout.is_none()) options.timeout = to_milliseconds(timeout, context, "timeout");
  options.job_id = job_id;
  return options;
}

void bind_groups(nb::module_& m) {
  nb::enum_<ReduceOp>(m, "ReduceOp", "Reduction operators (Ray's ReduceOp, plus AVG).")
      .value("SUM", ReduceOp::kSum)
      .value("PRODUCT", ReduceOp::kProduct)
      .value("MIN", ReduceOp::kMin)
      .value("MAX", ReduceOp::kMax)
      .value("AVG", ReduceOp::kAvg);

  nb::class_<Work>(m, "Work",
                   "The handle of an op that may still be running (c10d's Work). Async ops "
                   "(async_op=True) return one; its tensors belong to the op until wait() has "
                   "returned.")
      .def("is_completed", &Work::is_completed, nb::call_guard<nb::gil_scoped_release>(),
           "True once the op has finished, successfully or not. Never blocks.")
      .def("is_success", &Work::is_success, nb::call_guard<nb::gil_scoped_release>(),
           "True once the op has finished without an error.")
      .def(
          "wait",
          [](Work& w, nb::handle timeout) {
            const auto ms = timeout.is_none() ? kUseGroupTimeout
                                              : to_milliseconds(timeout, "Work.wait", "timeout");
            release_deferred_keeps();
            {
              nb::gil_scoped_release release;
              w.wait(ms);
            }
            return true;
          },
          "timeout"_a = nb::none(),
          "Waits until the op has finished and raises its error if it failed. Returns True. "
          "timeout (seconds): a shorter wait that raises tutti.TimeoutError and leaves the op "
          "running.")
      .def(
          "exception", [](Work& w) { return to_python_exception(w.exception()); },
          "The op's error (a tutti.Error), or None while it runs or after it succeeded.")
      .def_prop_ro("op", [](const Work& w) { return std::string(to_string(w.op())); })
      .def_prop_ro("seq", &Work::seq)
      .def("description", &Work::description)
      .def("__repr__", [](const Work& w) { return "<tutti.Work " + w.description() + ">"; });

  nb::class_<PyP2POp>(m, "P2POp",
                      "One send or receive of batch_isend_irecv (torch's P2POp): "
                      "P2POp('send', tensor, peer), P2POp(tutti.irecv, tensor, peer).")
      .def(
          "__init__",
          [](PyP2POp* self, nb::handle op, nb::handle tensor, int peer, int peer_device_index) {
            new (self) PyP2POp{parse_kind(op), nb::borrow(tensor), peer, peer_device_index};
          },
          "op"_a, "tensor"_a.none(), "peer"_a, "peer_device_index"_a = kPeerDevice)
      .def_prop_ro("op",
                   [](const PyP2POp& p) { return p.kind == P2POp::Kind::kSend ? "send" : "recv"; })
      .def_ro("tensor", &PyP2POp::tensor)
      .def_ro("peer", &PyP2POp::peer)
      .def_ro("peer_device_index", &PyP2POp::peer_device_index)
      .def("__repr__", [](const PyP2POp& p) {
        return std::string("<tutti.P2POp ") +
               (p.kind == P2POp::Kind::kSend ? "send to " : "recv from ") + std::to_string(p.peer) +
               ">";
      });

  auto group = nb::class_<CollectiveGroup>(
      m, "CollectiveGroup",
      "A set of ranks that run collectives together (tutti::CollectiveGroup). Get one with "
      "tutti.get_group(name) after init_collective_group, or CollectiveGroup.create(...) for "
      "ranks that are threads of one process. Every op takes keyword-only timeout (seconds) and "
      "async_op (return a tutti.Work instead of None).");
  group
      .def_static(
          "create",
          [](int world_size, int rank, const std::string& backend, const std::string& name,
             nb::handle store, nb::handle timeout, const std::string& job_id) {
            GroupOptions options = group_options(store, timeout, job_id, "CollectiveGroup.create");
            nb::gil_scoped_release release;
            return CollectiveGroup::create(world_size, rank, backend, name, options);
          },
          "world_size"_a, "rank"_a, "backend"_a = "gloo", "name"_a = "default", nb::kw_only(),
          "store"_a = nb::none(), "timeout"_a = nb::none(), "job_id"_a = "",
          "Joins a group without registering its name (ranks that are threads pass one "
          "tutti.HashStore).")
      .def_static(
          "join",
          [](const std::string& name, nb::handle store, nb::handle timeout,
             const std::string& job_id) {
            GroupOptions options = group_options(store, timeout, job_id, "CollectiveGroup.join");
            if (store.is_none()) options.store_url = "env://";
            nb::gil_scoped_release release;
            return CollectiveGroup::join(name, options);
          },
          "name"_a, nb::kw_only(), "store"_a = nb::none(), "timeout"_a = nb::none(),
          "job_id"_a = "",
          "A new process joins the next grow() of the group created as `name` (or of one shrunk "
          "or grown from it), through its store (a URL, a tutti.Store, or the launcher's when "
          "None); returns the grown group, whose new ranks follow the members'.")
      .def_prop_ro("name", &CollectiveGroup::name)
      .def_prop_ro("rank", &CollectiveGroup::rank)
      .def_prop_ro("world_size", &CollectiveGroup::world_size)
      .def_prop_ro("backend", &CollectiveGroup::backend_name)
      .def_prop_ro("timeout", [](const CollectiveGroup& g) { return g.timeout().count() / 1000.0; })
      .def_prop_ro("global_rank", &CollectiveGroup::global_rank)
      .def_prop_ro("global_ranks", &CollectiveGroup::global_ranks)
      .def_prop_ro("is_destroyed", &CollectiveGroup::is_destroyed)
      .def_prop_ro("is_aborted", &CollectiveGroup::is_aborted)
      .def("describe", &CollectiveGroup::describe)
      .def("__repr__",
           [](const CollectiveGroup& g) {
             return "<tutti.CollectiveGroup " + g.describe() + " backend '" + g.backend_name() +
                    "'>";
           })
      .def("abort", &CollectiveGroup::abort, "reason"_a = "aborted by the application",
           nb::call_guard<nb::gil_scoped_release>())
      .def("destroy", &CollectiveGroup::destroy, nb::call_guard<nb::gil_scoped_release>())
      .def("issue_from_this_thread", &CollectiveGroup::issue_from_this_thread,
           "Hands the group to the calling thread: a gloo or shm group takes its ops from one "
           "thread (its creator, until that thread ends); ops from others fail with "
           "tutti.InvalidUsageError.")
      .def(
          "split",
          [](CollectiveGroup& g, const std::vector<int>& ranks, const std::string& name,
             const std::string& backend, nb::handle timeout, bool local) {
            SplitOptions o;
            o.name = name;
            o.backend = backend;
            o.local = local;
            if (!timeout.is_none()) o.timeout = to_milliseconds(timeout, "split", "timeout");
            nb::gil_scoped_release release;
            return g.split(ranks, o);
          },
          "ranks"_a, "name"_a = "", "backend"_a = "", "timeout"_a = nb::none(), "local"_a = false,
          "Splits a subgroup off: every rank calls it with the same ranks (members get the "
          "subgroup, the others None), or with local=True only the members, from any thread, "
          "meeting under `name` (required, new among this group's local splits).")
      .def(
          "shrink",
          [](CollectiveGroup& g, const std::vector<int>& exclude, const std::string& name,
             const std::string& backend, nb::handle timeout) {
            ShrinkOptions o;
            o.exclude = exclude;
            o.name = name;
            o.backend = backend;
            if (!timeout.is_none()) o.timeout = to_milliseconds(timeout, "shrink", "timeout");
            nb::gil_scoped_release release;
            return g.shrink(o);
          },
          "exclude"_a = std::vector<int>{}, "name"_a = "", "backend"_a = "",
          "timeout"_a = nb::none(),
          "After a failure, the survivors (every rank that is left calls it) form a group of "
          "themselves, renumbered in rank order, through this group's store. Ranks in `exclude`, "
          "and ranks whose process on this host exited or whose store connection closed, are "
          "left out at once; the others are waited for up to `timeout`. Works on an aborted "
          "group; destroy this one after.")
      .def(
          "grow",
          [](CollectiveGroup& g, int add, const std::string& name, const std::string& backend,
             nb::handle timeout) {
            GrowOptions o;
            o.add = add;
            o.name = name;
            o.backend = backend;
            if (!timeout.is_none()) o.timeout = to_milliseconds(timeout, "grow", "timeout");
            nb::gil_scoped_release release;
            return g.grow(o);
          },
          "add"_a = 1, "name"_a = "", "backend"_a = "", "timeout"_a = nb::none(),
          "Admits `add` new processes (each calls CollectiveGroup.join): every member calls it; "
          "the grown group keeps the members' ranks and numbers the new ones after them. This "
          "group stays usable; destroy it when done.")
      .def("allreduce", &do_allreduce, "tensor"_a.none(), "op"_a = nb::none(), nb::kw_only(),
           "timeout"_a = nb::none(), "async_op"_a = false)
      .def("reduce", &do_reduce, "tensor"_a.none(), "dst_rank"_a = 0, "op"_a = nb::none(),
           nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false)
      .def("broadcast", &do_broadcast, "tensor"_a.none(), "src_rank"_a = 0, nb::kw_only(),
           "timeout"_a = nb::none(), "async_op"_a = false)
      .def("allgather", &do_allgather, "tensor_list"_a.none(), "tensor"_a.none(), nb::kw_only(),
           "timeout"_a = nb::none(), "async_op"_a = false)
      .def("allgatherv", &do_allgatherv, "output"_a.none(), "tensor"_a.none(), "counts"_a.none(),
           nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false)
      .def("reducescatter", &do_reduce_scatter, "tensor"_a.none(), "tensor_list"_a.none(),
           "op"_a = nb::none(), nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false)
      .def("reduce_scatter", &do_reduce_scatter, "tensor"_a.none(), "tensor_list"_a.none(),
           "op"_a = nb::none(), nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false)
      .def("alltoall", &do_alltoall, "output"_a.none(), "input"_a.none(), nb::kw_only(),
           "timeout"_a = nb::none(), "async_op"_a = false)
      .def("alltoallv", &do_alltoallv, "output"_a.none(), "input"_a.none(),
           "output_counts"_a.none(), "input_counts"_a.none(), nb::kw_only(),
           "timeout"_a = nb::none(), "async_op"_a = false)
      .def("gather", &do_gather, "output"_a.none(), "tensor"_a.none(), "dst_rank"_a = 0,
           nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false)
      .def("scatter", &do_scatter, "tensor"_a.none(), "input"_a.none(), "src_rank"_a = 0,
           nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false)
      .def("send", &do_send, "tensor"_a.none(), "dst_rank"_a, nb::kw_only(),
           "timeout"_a = nb::none(), "async_op"_a = false)
      .def("recv", &do_recv, "tensor"_a.none(), "src_rank"_a, nb::kw_only(),
           "timeout"_a = nb::none(), "async_op"_a = false)
      .def("batch_isend_irecv", &do_batch, "p2p_op_list"_a.none(), nb::kw_only(),
           "timeout"_a = nb::none(), "async_op"_a = false)
      .def("barrier", &do_barrier, nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false)
      .def("allreduce_multigpu", &do_allreduce_multigpu, "tensor_list"_a.none(),
           "op"_a = nb::none(), nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false)
      .def("reduce_multigpu", &do_reduce_multigpu, "tensor_list"_a.none(), "dst_rank"_a = 0,
           "dst_tensor"_a = 0, "op"_a = nb::none(), nb::kw_only(), "timeout"_a = nb::none(),
           "async_op"_a = false)
      .def("broadcast_multigpu", &do_broadcast_multigpu, "tensor_list"_a.none(), "src_rank"_a = 0,
           "src_tensor"_a = 0, nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false)
      .def("allgather_multigpu", &do_allgather_multigpu, "output_tensor_lists"_a.none(),
           "input_tensor_list"_a.none(), nb::kw_only(), "timeout"_a = nb::none(),
           "async_op"_a = false)
      .def("reducescatter_multigpu", &do_reduce_scatter_multigpu, "output_tensor_list"_a.none(),
           "input_tensor_lists"_a.none(), "op"_a = nb::none(), nb::kw_only(),
           "timeout"_a = nb::none(), "async_op"_a = false)
      .def("send_multigpu", &do_send_multigpu, "tensor"_a.none(), "dst_rank"_a,
           "dst_gpu_index"_a = 0, "n_elements"_a = 0, nb::kw_only(), "timeout"_a = nb::none(),
           "async_op"_a = false)
      .def("recv_multigpu", &do_recv_multigpu, "tensor"_a.none(), "src_rank"_a,
           "src_gpu_index"_a = 0, "n_elements"_a = 0, nb::kw_only(), "timeout"_a = nb::none(),
           "async_op"_a = false)
      .def(
          "synchronize",
          [](CollectiveGroup& g, nb::handle device) {
            const Device d = to_device(device);
            nb::gil_scoped_release release;
            g.synchronize(d);
          },
          "device"_a = nb::none())
      .def(
          "allocate_symmetric",
          [](CollectiveGroup& g, size_t nbytes, const std::string& dtype, nb::handle framework) {
            const DType d = parse_dtype(dtype);
            const Framework fw = parse_framework(framework, "allocate_symmetric");
            const size_t es = dtype_size(d);
            if (nbytes % es != 0) {
              throw Error(ErrorCode::kInvalidArgument, "allocate_symmetric on " + g.describe() +
                                                           ": nbytes " + std::to_string(nbytes) +
                                                           " is not a multiple of " + dtype +
                                                           "'s " + std::to_string(es) + " bytes");
            }
            std::shared_ptr<SymmetricMemory> memory;
            {
              nb::gil_scoped_release release;
              memory = g.allocate_symmetric(nbytes);
            }
            const TensorView v = memory->view(d, {static_cast<int64_t>(nbytes / es)});
            auto* heap = new std::shared_ptr<SymmetricMemory>(std::move(memory));
            nb::capsule owner(heap, [](void* p) noexcept {
              delete static_cast<std::shared_ptr<SymmetricMemory>*>(p);
            });
            return from_view(v, owner, fw, false);
          },
          "nbytes"_a, "dtype"_a = "uint8", "framework"_a = nb::none(),
          "Collective (every rank, same nbytes, in op order): a zeroed 1-D array (numpy, or "
          "torch with framework='torch') in memory the group's backend reaches on every rank. "
          "shm: an allreduce of a tensor in it on every rank copies once (each rank reduces its "
          "slice from every rank's memory into every rank's), several times faster above 16 KiB; "
          "so do reduce, allgather, reduce_scatter and broadcast. gloo, or shm short of memory: "
          "ordinary memory (logged). Freed when the array and its views go; allocate once and "
          "reuse (the peers keep their mapping until the group next allocates).")
      .def(
          "is_symmetric",
          [](const CollectiveGroup& g, nb::handle tensor) {
            const Site site{"is_symmetric", &g};
            Keep keep;
            TensorView t;
            try {
              t = to_view(tensor, Access::kRead, site, "tensor", keep);
            } catch (const Error& e) {
              // Memory no op could take (not contiguous, another device): never symmetric. A
              // non-tensor still raises TensorTypeError.
              if (e.code() == ErrorCode::kInvalidArgument) return false;
              throw;
            }
            return g.is_symmetric(t);
          },
          "tensor"_a,
          "Whether the array or tensor lies within one of this group's allocate_symmetric "
          "allocations that every rank attached (local; False for one no op could take, e.g. "
          "not contiguous). shm's single-copy path needs it on every rank, above 16 KiB.");

  // ---- Ray's free functions, by group name ----

  m.def(
      "init_collective_group",
      [](int world_size, int rank, const std::string& backend, const std::string& group_name,
         nb::handle store, nb::handle timeout, const std::string& job_id) {
        GroupOptions options = group_options(store, timeout, job_id, "init_collective_group");
        nb::gil_scoped_release release;
        init_collective_group(world_size, rank, backend, group_name, options);
      },
      "world_size"_a, "rank"_a, "backend"_a = "gloo", "group_name"_a = "default", nb::kw_only(),
      "store"_a = nb::none(), "timeout"_a = nb::none(), "job_id"_a = "",
      "Joins the named group (Ray's init_collective_group). store: a URL ('tcp://host:port', "
      "'file:///path', 'redis://...', 'env://') or a tutti.Store; None: env:// (a launcher's "
      "variables), or no store for a group of one. timeout: seconds (default 30).");
  m.def(
      "init_collective_group_from_env",
      [](const std::string& backend, const std::string& group_name, nb::handle timeout,
         const std::string& job_id) {
        GroupOptions options =
            group_options(nb::none(), timeout, job_id, "init_collective_group_from_env");
        nb::gil_scoped_release release;
        init_collective_group_from_env(backend, group_name, options);
      },
      "backend"_a = "", "group_name"_a = "default", nb::kw_only(), "timeout"_a = nb::none(),
      "job_id"_a = "",
      "Joins with rank, world size and store from tutti-run, torchrun, Slurm or Open MPI. "
      "backend '': TUTTI_BACKEND, else 'auto'.");
  m.def("destroy_collective_group", &destroy_collective_group, "group_name"_a = "default",
        nb::call_guard<nb::gil_scoped_release>());
  m.def("abort_collective_group", &abort_collective_group, "group_name"_a = "default",
        "reason"_a = "aborted by the application", nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "issue_from_this_thread",
      [](std::string_view group_name) { group_named(group_name)->issue_from_this_thread(); },
      "group_name"_a = "default",
      "get_group(group_name).issue_from_this_thread(): the named group's ops come from the "
      "calling thread from now on.");
  m.def("is_group_initialized", &is_group_initialized, "group_name"_a = "default");
  m.def("get_rank", &get_rank, "group_name"_a = "default");
  m.def("get_collective_group_size", &get_collective_group_size, "group_name"_a = "default");
  m.def("get_group", &group_named, "group_name"_a = "default");
  m.def(
      "new_group",
      [](const std::vector<int>& ranks, const std::string& backend, const std::string& group_name,
         const std::string& parent) {
        nb::gil_scoped_release release;
        return new_group(ranks, backend, group_name, parent);
      },
      "ranks"_a, "backend"_a = "", "group_name"_a = "", "parent"_a = "default");

  m.def(
      "allreduce",
      [](nb::handle tensor, std::string_view group_name, nb::handle op, nb::handle timeout,
         bool async_op) {
        return do_allreduce(*group_named(group_name), tensor, op, timeout, async_op);
      },
      "tensor"_a.none(), "group_name"_a = "default", "op"_a = nb::none(), nb::kw_only(),
      "timeout"_a = nb::none(), "async_op"_a = false,
      "Allreduce in place over the named group (op: tutti.ReduceOp, 'sum', or Ray's ReduceOp).");
  m.def(
      "reduce",
      [](nb::handle tensor, int dst_rank, std::string_view group_name, nb::handle op,
         nb::handle timeout, bool async_op) {
        return do_reduce(*group_named(group_name), tensor, dst_rank, op, timeout, async_op);
      },
      "tensor"_a.none(), "dst_rank"_a = 0, "group_name"_a = "default", "op"_a = nb::none(),
      nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "broadcast",
      [](nb::handle tensor, int src_rank, std::string_view group_name, nb::handle timeout,
         bool async_op) {
        return do_broadcast(*group_named(group_name), tensor, src_rank, timeout, async_op);
      },
      "tensor"_a.none(), "src_rank"_a = 0, "group_name"_a = "default", nb::kw_only(),
      "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "allgather",
      [](nb::handle tensor_list, nb::handle tensor, std::string_view group_name, nb::handle timeout,
         bool async_op) {
        return do_allgather(*group_named(group_name), tensor_list, tensor, timeout, async_op);
      },
      "tensor_list"_a.none(), "tensor"_a.none(), "group_name"_a = "default", nb::kw_only(),
      "timeout"_a = nb::none(), "async_op"_a = false,
      "tensor_list: world_size tensors shaped like tensor, or one tensor of world_size blocks.");
  m.def(
      "allgatherv",
      [](nb::handle output, nb::handle tensor, nb::handle counts, std::string_view group_name,
         nb::handle timeout, bool async_op) {
        return do_allgatherv(*group_named(group_name), output, tensor, counts, timeout, async_op);
      },
      "output"_a.none(), "tensor"_a.none(), "counts"_a.none(), "group_name"_a = "default",
      nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);
  for (const char* name : {"reducescatter", "reduce_scatter"}) {
    m.def(
        name,
        [](nb::handle tensor, nb::handle tensor_list, std::string_view group_name, nb::handle op,
           nb::handle timeout, bool async_op) {
          return do_reduce_scatter(*group_named(group_name), tensor, tensor_list, op, timeout,
                                   async_op);
        },
        "tensor"_a.none(), "tensor_list"_a.none(), "group_name"_a = "default", "op"_a = nb::none(),
        nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false,
        "tensor = the reduction of every rank's tensor_list[rank]; tensor_list: world_size "
        "tensors, or one tensor of world_size blocks.");
  }
  m.def(
      "alltoall",
      [](nb::handle output, nb::handle input, std::string_view group_name, nb::handle timeout,
         bool async_op) {
        return do_alltoall(*group_named(group_name), output, input, timeout, async_op);
      },
      "output"_a.none(), "input"_a.none(), "group_name"_a = "default", nb::kw_only(),
      "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "alltoallv",
      [](nb::handle output, nb::handle input, nb::handle output_counts, nb::handle input_counts,
         std::string_view group_name, nb::handle timeout, bool async_op) {
        return do_alltoallv(*group_named(group_name), output, input, output_counts, input_counts,
                            timeout, async_op);
      },
      "output"_a.none(), "input"_a.none(), "output_counts"_a.none(), "input_counts"_a.none(),
      "group_name"_a = "default", nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "gather",
      [](nb::handle output, nb::handle tensor, int dst_rank, std::string_view group_name,
         nb::handle timeout, bool async_op) {
        return do_gather(*group_named(group_name), output, tensor, dst_rank, timeout, async_op);
      },
      "output"_a.none(), "tensor"_a.none(), "dst_rank"_a = 0, "group_name"_a = "default",
      nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "scatter",
      [](nb::handle tensor, nb::handle input, int src_rank, std::string_view group_name,
         nb::handle timeout, bool async_op) {
        return do_scatter(*group_named(group_name), tensor, input, src_rank, timeout, async_op);
      },
      "tensor"_a.none(), "input"_a.none(), "src_rank"_a = 0, "group_name"_a = "default",
      nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "send",
      [](nb::handle tensor, int dst_rank, std::string_view group_name, nb::handle timeout,
         bool async_op) {
        return do_send(*group_named(group_name), tensor, dst_rank, timeout, async_op);
      },
      "tensor"_a.none(), "dst_rank"_a, "group_name"_a = "default", nb::kw_only(),
      "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "recv",
      [](nb::handle tensor, int src_rank, std::string_view group_name, nb::handle timeout,
         bool async_op) {
        return do_recv(*group_named(group_name), tensor, src_rank, timeout, async_op);
      },
      "tensor"_a.none(), "src_rank"_a, "group_name"_a = "default", nb::kw_only(),
      "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "isend",
      [](nb::handle tensor, int dst_rank, std::string_view group_name, nb::handle timeout) {
        return do_send(*group_named(group_name), tensor, dst_rank, timeout, true);
      },
      "tensor"_a.none(), "dst_rank"_a, "group_name"_a = "default", nb::kw_only(),
      "timeout"_a = nb::none(), "send(..., async_op=True): returns a tutti.Work.");
  m.def(
      "irecv",
      [](nb::handle tensor, int src_rank, std::string_view group_name, nb::handle timeout) {
        return do_recv(*group_named(group_name), tensor, src_rank, timeout, true);
      },
      "tensor"_a.none(), "src_rank"_a, "group_name"_a = "default", nb::kw_only(),
      "timeout"_a = nb::none(), "recv(..., async_op=True): returns a tutti.Work.");
  m.def(
      "batch_isend_irecv",
      [](nb::handle ops, std::string_view group_name, nb::handle timeout, bool async_op) {
        return do_batch(*group_named(group_name), ops, timeout, async_op);
      },
      "p2p_op_list"_a.none(), "group_name"_a = "default", nb::kw_only(), "timeout"_a = nb::none(),
      "async_op"_a = false);
  m.def(
      "barrier",
      [](std::string_view group_name, nb::handle timeout, bool async_op) {
        return do_barrier(*group_named(group_name), timeout, async_op);
      },
      "group_name"_a = "default", nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);

  m.def(
      "allreduce_multigpu",
      [](nb::handle tensor_list, std::string_view group_name, nb::handle op, nb::handle timeout,
         bool async_op) {
        return do_allreduce_multigpu(*group_named(group_name), tensor_list, op, timeout, async_op);
      },
      "tensor_list"_a.none(), "group_name"_a = "default", "op"_a = nb::none(), nb::kw_only(),
      "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "reduce_multigpu",
      [](nb::handle tensor_list, int dst_rank, int dst_tensor, std::string_view group_name,
         nb::handle op, nb::handle timeout, bool async_op) {
        return do_reduce_multigpu(*group_named(group_name), tensor_list, dst_rank, dst_tensor, op,
                                  timeout, async_op);
      },
      "tensor_list"_a.none(), "dst_rank"_a = 0, "dst_tensor"_a = 0, "group_name"_a = "default",
      "op"_a = nb::none(), nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "broadcast_multigpu",
      [](nb::handle tensor_list, int src_rank, int src_tensor, std::string_view group_name,
         nb::handle timeout, bool async_op) {
        return do_broadcast_multigpu(*group_named(group_name), tensor_list, src_rank, src_tensor,
                                     timeout, async_op);
      },
      "tensor_list"_a.none(), "src_rank"_a = 0, "src_tensor"_a = 0, "group_name"_a = "default",
      nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "allgather_multigpu",
      [](nb::handle output_lists, nb::handle input_list, std::string_view group_name,
         nb::handle timeout, bool async_op) {
        return do_allgather_multigpu(*group_named(group_name), output_lists, input_list, timeout,
                                     async_op);
      },
      "output_tensor_lists"_a.none(), "input_tensor_list"_a.none(), "group_name"_a = "default",
      nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);
  for (const char* name : {"reducescatter_multigpu", "reduce_scatter_multigpu"}) {
    m.def(
        name,
        [](nb::handle output_list, nb::handle input_lists, std::string_view group_name,
           nb::handle op, nb::handle timeout, bool async_op) {
          return do_reduce_scatter_multigpu(*group_named(group_name), output_list, input_lists, op,
                                            timeout, async_op);
        },
        "output_tensor_list"_a.none(), "input_tensor_lists"_a.none(), "group_name"_a = "default",
        "op"_a = nb::none(), nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);
  }
  m.def(
      "send_multigpu",
      [](nb::handle tensor, int dst_rank, int dst_gpu_index, std::string_view group_name,
         int64_t n_elements, nb::handle timeout, bool async_op) {
        return do_send_multigpu(*group_named(group_name), tensor, dst_rank, dst_gpu_index,
                                n_elements, timeout, async_op);
      },
      "tensor"_a.none(), "dst_rank"_a, "dst_gpu_index"_a, "group_name"_a = "default",
      "n_elements"_a = 0, nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "recv_multigpu",
      [](nb::handle tensor, int src_rank, int src_gpu_index, std::string_view group_name,
         int64_t n_elements, nb::handle timeout, bool async_op) {
        return do_recv_multigpu(*group_named(group_name), tensor, src_rank, src_gpu_index,
                                n_elements, timeout, async_op);
      },
      "tensor"_a.none(), "src_rank"_a, "src_gpu_index"_a, "group_name"_a = "default",
      "n_elements"_a = 0, nb::kw_only(), "timeout"_a = nb::none(), "async_op"_a = false);
  m.def(
      "synchronize",
      [](nb::handle device, std::string_view group_name) {
        const Device d = to_device(device);
        nb::gil_scoped_release release;
        synchronize(d, group_name);
      },
      "device"_a = nb::none(), "group_name"_a = "default",
      "Waits until the group's ops on `device` have finished (a GPU index, 'cuda:N' or 'cpu'; "
      "CPU: every async op).");

  m.def("local_rank", &local_rank);
  m.def("local_world_size", &local_world_size);
  m.def("read_launch_env", []() {
    const LaunchEnv e = read_launch_env();
    nb::dict d;
    d["rank"] = e.rank;
    d["world_size"] = e.world_size;
    d["local_rank"] = e.local_rank;
    d["local_world_size"] = e.local_world_size;
    d["store_url"] = e.store_url;
    d["job_id"] = e.job_id;
    d["backend"] = e.backend;
    d["source"] = e.source;
    return d;
  });
  m.def("has_launch_env", &has_launch_env);
}

}  // namespace tutti::python
