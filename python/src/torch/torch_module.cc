// tutti._torch: the torch.distributed backend "tutti" (torch_backend.h), built against the
// installed torch and loaded by tutti.torch, which registers it with
// torch.distributed.Backend.register_backend.
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "torch_backend.h"

namespace py = pybind11;
using tutti::torch_backend::TuttiBackend;

PYBIND11_MODULE(_torch, m) {
  m.doc() = "tutti's torch.distributed backend (use tutti.torch)";
  // torch's own bindings register c10d::Backend: import them first.
  py::module_::import("torch.distributed");

  py::class_<TuttiBackend, c10d::Backend, c10::intrusive_ptr<TuttiBackend>>(m, "TuttiBackend")
      .def_property_readonly("tutti_backend",
                             [](const TuttiBackend& b) { return b.group()->backend_name(); })
      .def_property_readonly("tutti_group", [](const TuttiBackend& b) { return b.group()->name(); })
      .def("empty_symmetric", &TuttiBackend::empty_symmetric, py::arg("size"), py::arg("dtype"),
           py::call_guard<py::gil_scoped_release>(),  // it waits for the other ranks
           "A zeroed CPU tensor in the group's symmetric memory (collective; use "
           "tutti.torch.empty_symmetric)")
      .def(
          "is_symmetric",
          [](const TuttiBackend& b, const at::Tensor& t) {
            // Memory no op could take as it is (another device, not contiguous) never is.
            if (!t.device().is_cpu() || !t.is_contiguous()) return false;
            return b.group()->is_symmetric(t.data_ptr(), t.nbytes());
          },
          py::arg("tensor"),
          "Whether a CPU tensor lies in the group's symmetric memory on this rank (use "
          "tutti.torch.is_symmetric)");

  m.def(
      "create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
         const std::string& backend, const std::string& group_name) {
        // torch's timedelta in seconds: up to the next millisecond, "never" from ~292,000 years
        // on (timedelta.max is more), and positive.
        if (!(timeout_s > 0)) {
          throw py::value_error("tutti: the process group's timeout must be positive, got " +
                                std::to_string(timeout_s) + " s");
        }
        const double ms = std::max(1.0, std::ceil(timeout_s * 1000.0 - 1e-6));
        auto options = c10::make_intrusive<TuttiBackend::Options>(
            ms >= 9.2e15 ? std::chrono::milliseconds::max()
                         : std::chrono::milliseconds(static_cast<int64_t>(ms)));
        options->tutti_backend = backend;
        options->group_name = group_name;
        py::gil_scoped_release release;  // the rendezvous waits for the other ranks
        return c10::make_intrusive<TuttiBackend>(store, rank, size, options);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::arg("backend") = "auto", py::arg("group_name") = "",
      "A TuttiBackend for torch.distributed: meets the other ranks through the store.");
}
