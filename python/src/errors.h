// tutti::Error to Python: the exception class of each ErrorCode (tutti/errors.py), and the
// errors the bindings raise themselves before any I/O.
#pragma once

#include <nanobind/nanobind.h>

#include <exception>
#include <string>

#include "tutti/error.h"

namespace tutti::python {

namespace nb = nanobind;

// Raised by the bindings for an argument that is no tensor tutti can use, or of a dtype it
// lacks: tutti.TensorTypeError (a TypeError and a tutti.InvalidArgumentError).
class TensorTypeError : public std::exception {
 public:
  explicit TensorTypeError(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// Imports tutti.errors and registers the translator. Called once, at module load.
void init_errors();

// The Python exception object for a stored C++ exception (Work.exception()); None for null.
nb::object to_python_exception(const std::exception_ptr& error);

}  // namespace tutti::python
