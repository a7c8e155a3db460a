// Python objects to TensorViews (numpy arrays through the buffer protocol, torch tensors through
// their attributes, anything else through __dlpack__), and TensorViews back to numpy arrays or
// torch tensors. Every check happens here, before any I/O: a wrong type or dtype raises
// tutti.TensorTypeError (a TypeError), a non-contiguous or read-only array or an unsupported
// device raises tutti.InvalidArgumentError (a ValueError), each naming the op, the group and
// rank, the argument and the offending value.
//
// Threads: call with the GIL held.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>
#include <vector>

#include "tutti/collective_group.h"
#include "tutti/tensor_view.h"
#include "tutti/work.h"

namespace tutti::python {

namespace nb = nanobind;

enum class Access { kRead, kWrite };

// Where a conversion happens, for messages: "allreduce on group 'g' (rank 0/2)".
struct Site {
  const char* op;
  const CollectiveGroup* group = nullptr;
  const char* context = nullptr;  // used when there is no group ("transfer.put")
  std::string prefix() const;
};

// What an op holds until it has finished: exported buffers (released under the GIL) and Python
// objects (capsules, the arrays themselves for async ops). Destroy it with the GIL held.
class Keep {
 public:
  Keep() = default;
  Keep(const Keep&) = delete;
  Keep& operator=(const Keep&) = delete;
  ~Keep();

  // The first object in place (one tensor per call is the common case: no allocation).
  void add(nb::handle object) {
    if (!first_) {
      first_ = nb::borrow(object);
    } else {
      objects_.push_back(nb::borrow(object));
    }
  }
  Py_buffer& add_buffer();
  void drop_last_buffer();
  bool empty() const { return !first_ && objects_.empty() && buffers_.empty(); }
  // Moves what this holds into `work` (kept until the Work goes, then released under the GIL).
  void attach_to(Work& work);

 private:
  nb::object first_;
  std::vector<nb::object> objects_;
  std::vector<std::unique_ptr<Py_buffer>> buffers_;
};

// Releases, under the GIL, the Python objects of async ops whose Works went on threads without
// it (they wait for a pending call on the main thread; every op and Work.wait drains them too,
// since the main thread may not run Python code for a while, e.g. in a Ray actor). Cheap when
// there are none. Subinterpreters are not supported (PyGILState_Check decides who holds the GIL).
void release_deferred_keeps();

// One tensor argument. `what` names it in messages ("tensor", "tensor_list[2]").
TensorView to_view(nb::handle object, Access access, const Site& site, const char* what,
                   Keep& keep);
// A list or tuple of tensors; `what` names the list ("tensor_list").
std::vector<TensorView> to_views(nb::handle sequence, Access access, const Site& site,
                                 const char* what, Keep& keep);
// True for a list or tuple (the list forms of allgather, reduce_scatter, alltoall...).
bool is_sequence(nb::handle object);

// Which framework a result is made for.
enum class Framework { kNumpy, kTorch };
Framework parse_framework(nb::handle name, const char* op);

// A numpy array or torch tensor over `view`'s memory, kept alive by `owner` (a Python object
// that owns the memory). read_only: a numpy array that refuses writes (torch has no such flag).
nb::object from_view(const TensorView& view, nb::handle owner, Framework framework, bool read_only);

// str(object), as UTF-8.
inline std::string text_of(nb::handle object) {
  return nb::cast<std::string>(nb::str(object));
}

// The dtype name of a Python tensor-like object, for messages ("float32", "torch.int16").
std::string dtype_name(nb::handle object);

}  // namespace tutti::python
