// The parts of the extension module tutti._tutti, and what they share.
#pragma once

#include <nanobind/nanobind.h>

#include <chrono>
#include <string>

#include "tutti/options.h"

namespace tutti::python {

namespace nb = nanobind;

void bind_groups(nb::module_& m);
void bind_stores(nb::module_& m);
void bind_transfer(nb::module_& m);

// A timeout from Python: seconds (int or float) or a datetime.timedelta. Negative, NaN or
// non-numbers raise tutti.InvalidArgumentError naming `where` and `what`; infinity means no
// deadline (milliseconds::max()).
std::chrono::milliseconds to_milliseconds(nb::handle value, const char* where, const char* what);

// Bytes from Python: bytes, bytearray, memoryview or str (UTF-8).
std::string to_bytes(nb::handle value, const char* where);

// How a group meets: `store` a URL (str) or a tutti.Store (None: the default), `timeout` as
// to_milliseconds takes it (None: the default). Errors name `context`.
GroupOptions group_options(nb::handle store, nb::handle timeout, const std::string& job_id,
                           const char* context);

}  // namespace tutti::python
