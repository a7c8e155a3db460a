// tutti._tutti: the extension module behind `import tutti` (see tutti/__init__.py).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "tensors.h"
#include "tutti/backend.h"
#include "tutti/embedding.h"
#include "tutti/error.h"
#include "tutti/version.h"

namespace tutti::python {

std::chrono::milliseconds to_milliseconds(nb::handle value, const char* where, const char* what) {
  double seconds = 0;
  if (nb::hasattr(value, "total_seconds")) {
    seconds = nb::cast<double>(value.attr("total_seconds")());
  } else if (PyFloat_Check(value.ptr()) || PyLong_Check(value.ptr())) {
    seconds = nb::cast<double>(value);
  } else {
    throw TensorTypeError(std::string(where) + ": " + what +
                          " must be a number of seconds or a datetime.timedelta, not " +
                          nb::cast<std::string>(nb::repr(value)));
  }
  if (std::isnan(seconds) || seconds < 0) {
    throw Error(ErrorCode::kInvalidArgument, std::string(where) + ": " + what + " " +
                                                 nb::cast<std::string>(nb::repr(value)) +
                                                 " is negative or NaN");
  }
  const double ms = seconds * 1000.0;
  if (ms >= static_cast<double>(std::numeric_limits<int64_t>::max() / 2)) {
    return std::chrono::milliseconds::max();
  }
  // Up to the next millisecond: a wait never ends before it was asked to (0.0004 s is 1 ms, not
  // the 0 that means "the default" to some calls); less a float's error (0.007 s is 7 ms).
  if (ms <= 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ms - 1e-6))));
}

std::string to_bytes(nb::handle value, const char* where) {
  if (PyBytes_Check(value.ptr())) {
    return std::string(PyBytes_AS_STRING(value.ptr()), PyBytes_GET_SIZE(value.ptr()));
  }
  if (PyUnicode_Check(value.ptr())) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(value.ptr(), &size);
    if (data == nullptr) throw nb::python_error();
    return std::string(data, static_cast<size_t>(size));
  }
  if (PyObject_CheckBuffer(value.ptr())) {
    Py_buffer view;
    if (PyObject_GetBuffer(value.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) throw nb::python_error();
    std::string out(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
    PyBuffer_Release(&view);
    return out;
  }
  throw TensorTypeError(std::string(where) + ": expected bytes or str, not " +
                        nb::cast<std::string>(nb::repr(
                            nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(value.ptr()))))));
}

}  // namespace tutti::python

namespace {

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// tutti's blocking hooks (tutti/embedding.h): a group or an agent whose last Python reference
// goes is torn down without the GIL, so a teardown that waits (a store whose host has gone: 2 s
// a request) does not stop the process's other Python threads. Kept while the interpreter
// finalizes: a thread that lets go of the GIL then may never get it back.
void* release_gil() {
  if (!Py_IsInitialized() || finalizing() || PyGILState_Check() == 0) return nullptr;
  return PyEval_SaveThread();
}

// A thread whose teardown outlasted the interpreter (a daemon thread while the main one
// exited) would be ended by PyEval_RestoreThread (pthread_exit, unwinding through noexcept
// frames: std::terminate); it waits for the process's exit instead, as Python 3.14 parks such
// threads. Its teardown is over: it holds nothing of tutti's.
void take_gil_back(void* state) {
  if (finalizing() || !Py_IsInitialized()) {
    for (;;) ::pause();
  }
  PyEval_RestoreThread(static_cast<PyThreadState*>(state));
}

}  // namespace

NB_MODULE(_tutti, m) {
  using namespace tutti::python;
  namespace nb = nanobind;
  m.doc() = "tutti's C++ library (the package tutti re-exports what users need)";
  init_errors();
  tutti::set_blocking_hooks({&release_gil, &take_gil_back});
  m.attr("__version__") = tutti::version();
  m.def("is_backend_available",
        [](const std::string& name) { return tutti::is_backend_available(name); });
  m.def("registered_backends", &tutti::registered_collective_backends);
  bind_stores(m);
  bind_groups(m);
  bind_transfer(m);
}
