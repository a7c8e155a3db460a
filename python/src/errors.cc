#include "errors.h"

#include <string>

namespace tutti::python {
namespace {

// tutti.errors._BY_CODE and TensorTypeError, kept for the life of the interpreter (never
// decremented: the translator may run during shutdown).
PyObject* g_by_code = nullptr;
PyObject* g_tensor_type_error = nullptr;

PyObject* class_for(ErrorCode code) {
  const Py_ssize_t index = static_cast<Py_ssize_t>(code);
  if (g_by_code != nullptr && index >= 0 && index < PyTuple_GET_SIZE(g_by_code)) {
    return PyTuple_GET_ITEM(g_by_code, index);
  }
  return PyExc_RuntimeError;
}

}  // namespace

void init_errors() {
  nb::module_ errors = nb::module_::import_("tutti.errors");
  g_by_code = nb::object(errors.attr("_BY_CODE")).release().ptr();
  g_tensor_type_error = nb::object(errors.attr("TensorTypeError")).release().ptr();
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(class_for(e.code()), e.what());
    } catch (const TensorTypeError& e) {
      PyErr_SetString(g_tensor_type_error, e.what());
    }
  });
}

nb::object to_python_exception(const std::exception_ptr& error) {
  if (!error) return nb::none();
  PyObject* cls = PyExc_RuntimeError;
  std::string message;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    cls = class_for(e.code());
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown C++ exception";
  }
  return nb::borrow(cls)(nb::str(message.c_str(), message.size()));
}

}  // namespace tutti::python
