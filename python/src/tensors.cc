#include "tensors.h"

#include <dlpack/dlpack.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "errors.h"
#include "tutti/error.h"

namespace tutti::python {
namespace {

constexpr const char* kSupported =
    "bool, int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64";

// DLPack 0.8 added kDLBool; Debian's header (0.6) lacks the name.
constexpr uint8_t kDLBoolCode = 6;

std::string py_type_name(nb::handle object) {
  return nb::cast<std::string>(
      nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(object.ptr()))).attr("__qualname__")));
}

std::string shape_text(const std::vector<int64_t>& values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(values[i]);
  }
  return s + "]";
}

[[noreturn]] void not_contiguous(const Site& site, const char* what,
                                 const std::vector<int64_t>& shape,
                                 const std::vector<int64_t>& strides) {
  throw Error(ErrorCode::kInvalidArgument,
              site.prefix() + ": " + what + " is not contiguous (shape " + shape_text(shape) +
                  ", strides " + shape_text(strides) +
                  " elements): tutti works in place on row-major contiguous memory; pass a "
                  "contiguous array (numpy.ascontiguousarray, tensor.contiguous()) and copy the "
                  "result back");
}

// Row-major compact, size-1 dimensions carrying any stride (strides in elements).
bool is_row_major(const std::vector<int64_t>& shape, const int64_t* strides) {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return true;
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

// ---- numpy and other buffer exporters ---------------------------------------------------------

bool dtype_from_format(const char* format, Py_ssize_t itemsize, DType* out) {
  if (format == nullptr) {
    *out = DType::kUInt8;
    return itemsize == 1;
  }
  char c = format[0];
  if (c == '@' || c == '=' || c == '<') {
    c = format[1];
    ++format;
  } else if (c == '>' || c == '!') {
    return false;  // big-endian
  }
  if (c == '\0' || format[1] != '\0') return false;  // compound or sub-array formats
  switch (c) {
    case '?': *out = DType::kBool; return itemsize == 1;
    case 'b': *out = DType::kInt8; return itemsize == 1;
    case 'B': *out = DType::kUInt8; return itemsize == 1;
    case 'i':
    case 'l':
    case 'q':
      if (itemsize == 4) {
        *out = DType::kInt32;
        return true;
      }
      if (itemsize == 8) {
        *out = DType::kInt64;
        return true;
      }
      return false;
    case 'I':
    case 'L':
    case 'Q':
      if (itemsize == 4) {
        *out = DType::kUInt32;
        return true;
      }
      if (itemsize == 8) {
        *out = DType::kUInt64;
        return true;
      }
      return false;
    case 'e': *out = DType::kFloat16; return itemsize == 2;
    case 'f': *out = DType::kFloat32; return itemsize == 4;
    case 'd': *out = DType::kFloat64; return itemsize == 8;
    default: return false;
  }
}

TensorView from_buffer(nb::handle object, Access access, const Site& site, const char* what,
                       Keep& keep) {
  Py_buffer& view = keep.add_buffer();
  if (PyObject_GetBuffer(object.ptr(), &view, PyBUF_RECORDS_RO) != 0) {
    keep.drop_last_buffer();
    PyErr_Clear();
    throw TensorTypeError(site.prefix() + ": " + what + " (" + py_type_name(object) +
                          ") does not export its memory as an array");
  }
  DType dtype;
  if (!dtype_from_format(view.format, view.itemsize, &dtype)) {
    const std::string name = dtype_name(object);
    throw TensorTypeError(site.prefix() + ": " + what + " has dtype " + name +
                          ", which tutti does not support (" + kSupported + ")");
  }
  std::vector<int64_t> shape(view.shape, view.shape + view.ndim);
  if (view.strides != nullptr) {
    std::vector<int64_t> strides(view.ndim);
    bool whole = true;
    for (int i = 0; i < view.ndim; ++i) {
      whole = whole && view.strides[i] % view.itemsize == 0;
      strides[i] = view.strides[i] / view.itemsize;
    }
    if (!whole || !is_row_major(shape, strides.data())) {
      if (!whole) {
        for (int i = 0; i < view.ndim; ++i) strides[i] = view.strides[i];
      }
      not_contiguous(site, what, shape, strides);
    }
  }
  if (access == Access::kWrite && view.readonly) {
    throw Error(ErrorCode::kInvalidArgument,
                site.prefix() + ": " + what + " is read-only (" + py_type_name(object) +
                    " of dtype " + dtype_name(object) + ", shape " + shape_text(shape) + "), but " +
                    site.op + " writes into it; pass a writable array (e.g. .copy())");
  }
  return TensorView(view.buf, dtype, std::move(shape), Device::cpu());
}

// ---- torch tensors, by their attributes (faster than __dlpack__) ---------------------------

struct TorchInfo {
  PyTypeObject* tensor_type = nullptr;
  nb::dict dtypes;  // torch.dtype -> int(DType)
  bool looked = false;
};

TorchInfo& torch_info() {
  static TorchInfo* info = new TorchInfo();  // never destroyed: used until the process exits
  if (info->tensor_type == nullptr) {
    PyObject* torch = PyImport_GetModule(nb::str("torch").ptr());
    if (torch == nullptr) {
      PyErr_Clear();
      return *info;
    }
    nb::object module = nb::steal(torch);
    if (!nb::hasattr(module, "Tensor") || !nb::hasattr(module, "bfloat16")) return *info;
    const std::pair<const char*, DType> names[] = {
        {"bool", DType::kBool},       {"int8", DType::kInt8},       {"uint8", DType::kUInt8},
        {"int32", DType::kInt32},     {"uint32", DType::kUInt32},   {"int64", DType::kInt64},
        {"uint64", DType::kUInt64},   {"float16", DType::kFloat16}, {"bfloat16", DType::kBFloat16},
        {"float32", DType::kFloat32}, {"float64", DType::kFloat64},
    };
    for (const auto& [name, dtype] : names) {
      if (nb::hasattr(module, name)) info->dtypes[module.attr(name)] = static_cast<int>(dtype);
    }
    info->tensor_type = reinterpret_cast<PyTypeObject*>(module.attr("Tensor").ptr());
    Py_INCREF(info->tensor_type);
  }
  return *info;
}

TensorView from_torch(nb::handle t, const Site& site, const char* what, Keep& keep) {
  TorchInfo& info = torch_info();
  nb::object torch_dtype = t.attr("dtype");
  PyObject* code = PyDict_GetItem(info.dtypes.ptr(), torch_dtype.ptr());
  if (code == nullptr) {
    throw TensorTypeError(site.prefix() + ": " + what + " has dtype " + text_of(torch_dtype) +
                          ", which tutti does not support (" + kSupported + ")");
  }
  const DType dtype = static_cast<DType>(PyLong_AsLong(code));
  nb::object size = t.attr("shape");
  const Py_ssize_t ndim = PyTuple_Size(size.ptr());
  if (ndim < 0) throw nb::python_error();
  std::vector<int64_t> shape(static_cast<size_t>(ndim));
  for (Py_ssize_t i = 0; i < ndim; ++i) {
    shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(size.ptr(), i));
  }
  if (!nb::cast<bool>(t.attr("is_contiguous")())) {
    nb::object stride = t.attr("stride")();
    std::vector<int64_t> strides;
    for (nb::handle s : stride) strides.push_back(nb::cast<int64_t>(s));
    not_contiguous(site, what, shape, strides);
  }
  Device device = Device::cpu();
  if (!nb::cast<bool>(t.attr("is_cpu"))) {
    if (!nb::cast<bool>(t.attr("is_cuda"))) {
      throw Error(ErrorCode::kInvalidArgument, site.prefix() + ": " + what + " is on device " +
                                                   text_of(t.attr("device")) +
                                                   "; tutti takes CPU and CUDA tensors");
    }
    device = Device::cuda(nb::cast<int>(t.attr("get_device")()));
  }
  uintptr_t data = 0;
  try {
    data = nb::cast<uintptr_t>(t.attr("data_ptr")());
  } catch (const nb::python_error& e) {
    throw TensorTypeError(site.prefix() + ": " + what + " has no plain storage (layout " +
                          text_of(t.attr("layout")) + "): " + e.what());
  }
  // Kept as long as the call, or an async op's Work, may touch its memory: a temporary
  // (`g.recv(torch.empty(n), 0, async_op=True)`) is freed once the call returns otherwise.
  keep.add(t);
  return TensorView(reinterpret_cast<void*>(data), dtype, std::move(shape), device);
}

// ---- anything with __dlpack__ -------------------------------------------------------------

TensorView from_dlpack_object(nb::handle object, const Site& site, const char* what, Keep& keep) {
  nb::object capsule;
  try {
    capsule = object.attr("__dlpack__")();
  } catch (const nb::python_error& e) {
    throw TensorTypeError(site.prefix() + ": " + what + " (" + py_type_name(object) +
                          ") could not be exported through __dlpack__: " + e.what());
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) {
    PyErr_Clear();
    throw TensorTypeError(site.prefix() + ": " + what + " (" + py_type_name(object) +
                          "): __dlpack__ returned no 'dltensor' capsule");
  }
  // The capsule (and with it the producer's tensor) lives until the op is over; its destructor
  // calls the deleter, since this consumer does not rename it.
  keep.add(capsule);
  const DLTensor& t = managed->dl_tensor;
  DType dtype;
  bool known = t.dtype.lanes == 1;
  switch (t.dtype.code) {
    case kDLInt:
      dtype = t.dtype.bits == 8 ? DType::kInt8 : t.dtype.bits == 32 ? DType::kInt32 : DType::kInt64;
      known = known && (t.dtype.bits == 8 || t.dtype.bits == 32 || t.dtype.bits == 64);
      break;
    case kDLUInt:
      dtype = t.dtype.bits == 8    ? DType::kUInt8
              : t.dtype.bits == 32 ? DType::kUInt32
                                   : DType::kUInt64;
      known = known && (t.dtype.bits == 8 || t.dtype.bits == 32 || t.dtype.bits == 64);
      break;
    case kDLFloat:
      dtype = t.dtype.bits == 16   ? DType::kFloat16
              : t.dtype.bits == 32 ? DType::kFloat32
                                   : DType::kFloat64;
      known = known && (t.dtype.bits == 16 || t.dtype.bits == 32 || t.dtype.bits == 64);
      break;
    case kDLBfloat:
      dtype = DType::kBFloat16;
      known = known && t.dtype.bits == 16;
      break;
    case kDLBoolCode:
      dtype = DType::kBool;
      known = known && t.dtype.bits == 8;
      break;
    default:
      known = false;
      dtype = DType::kUInt8;
      break;
  }
  if (!known) {
    throw TensorTypeError(site.prefix() + ": " + what + " has dtype " + dtype_name(object) +
                          ", which tutti does not support (" + kSupported + ")");
  }
  Device device;
  switch (t.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost: device = Device::cpu(); break;
    case kDLCUDA: device = Device::cuda(t.device.device_id); break;
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  site.prefix() + ": " + what + " is on DLPack device type " +
                      std::to_string(static_cast<int>(t.device.device_type)) +
                      "; tutti takes CPU and CUDA tensors");
  }
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  if (t.strides != nullptr && !is_row_major(shape, t.strides)) {
    not_contiguous(site, what, shape, std::vector<int64_t>(t.strides, t.strides + t.ndim));
  }
  void* data = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.byte_offset;
  return TensorView(data, dtype, std::move(shape), device);
}

nb::dlpack::dtype to_nb_dtype(DType dtype) {
  nb::dlpack::dtype d;
  d.lanes = 1;
  d.bits = static_cast<uint8_t>(dtype_size(dtype) * 8);
  switch (dtype) {
    case DType::kBool: d.code = static_cast<uint8_t>(nb::dlpack::dtype_code::Bool); break;
    case DType::kInt8:
    case DType::kInt32:
    case DType::kInt64: d.code = static_cast<uint8_t>(nb::dlpack::dtype_code::Int); break;
    case DType::kUInt8:
    case DType::kUInt32:
    case DType::kUInt64: d.code = static_cast<uint8_t>(nb::dlpack::dtype_code::UInt); break;
    case DType::kBFloat16: d.code = static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat); break;
    default: d.code = static_cast<uint8_t>(nb::dlpack::dtype_code::Float); break;
  }
  return d;
}

// Keeps whose last Work went on a thread without the GIL, released later under it. Waiting for
// the GIL on such a thread (a group's worker, finishing an op whose Python handle was dropped)
// could deadlock: the thread holding the GIL may be waiting for this one (a group collected by
// Python joins its worker). So they queue here for a pending call, which the interpreter runs
// on its main thread, or for the next op or Work.wait (release_deferred_keeps), whichever comes
// first.
struct DeferredKeeps {
  std::mutex mutex;
  std::vector<std::unique_ptr<Keep>> keeps;
  std::atomic<bool> scheduled{false};
  std::atomic<bool> any{false};  // keeps is not empty (read without the mutex)
};

DeferredKeeps& deferred_keeps() {
  static auto* d = new DeferredKeeps();  // never destroyed: threads may reach it at exit
  return *d;
}

int release_deferred_keeps_call(void*) {
  deferred_keeps().scheduled.store(false);
  release_deferred_keeps();
  return 0;
}

// Releases the Python references of a Keep that outlived the call (an async op's): at once
// under the GIL, later where this thread does not hold it, never once the interpreter is gone.
struct KeptForWork {
  std::unique_ptr<Keep> keep;
  ~KeptForWork() {
    if (!Py_IsInitialized()) {
      (void)keep.release();  // leaked: nothing may touch Python objects any more
      return;
    }
    if (PyGILState_Check() != 0) {
      keep.reset();
      return;
    }
    DeferredKeeps& d = deferred_keeps();
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      d.keeps.push_back(std::move(keep));
      d.any.store(true);
    }
    // One pending call at a time (the interpreter's queue of them is short); when it is full,
    // or the main thread runs no Python code for a while, the next op or Work.wait releases
    // them (release_deferred_keeps).
    if (!d.scheduled.exchange(true) &&
        Py_AddPendingCall(release_deferred_keeps_call, nullptr) != 0) {
      d.scheduled.store(false);
    }
  }
};

}  // namespace

void release_deferred_keeps() {
  DeferredKeeps& d = deferred_keeps();
  if (!d.any.load(std::memory_order_relaxed)) return;
  std::vector<std::unique_ptr<Keep>> keeps;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    keeps.swap(d.keeps);
    d.any.store(false);
  }
  keeps.clear();
}

std::string Site::prefix() const {
  std::string s = op;
  if (group != nullptr) {
    s += " on ";
    s += group->describe();
  } else if (context != nullptr) {
    s += " (";
    s += context;
    s += ")";
  }
  return s;
}

Keep::~Keep() {
  for (auto& b : buffers_) PyBuffer_Release(b.get());
}

Py_buffer& Keep::add_buffer() {
  buffers_.push_back(std::make_unique<Py_buffer>());
  return *buffers_.back();
}

void Keep::drop_last_buffer() {
  buffers_.pop_back();
}

void Keep::attach_to(Work& work) {
  auto moved = std::make_unique<Keep>();
  moved->first_ = std::move(first_);
  moved->objects_ = std::move(objects_);
  moved->buffers_ = std::move(buffers_);
  auto holder = std::make_shared<KeptForWork>();
  holder->keep = std::move(moved);
  work.keep_alive(std::move(holder));
}

std::string dtype_name(nb::handle object) {
  try {
    if (nb::hasattr(object, "dtype")) return text_of(object.attr("dtype"));
  } catch (const nb::python_error&) {
  }
  return "of " + py_type_name(object);
}

TensorView to_view(nb::handle object, Access access, const Site& site, const char* what,
                   Keep& keep) {
  if (PyObject_CheckBuffer(object.ptr())) return from_buffer(object, access, site, what, keep);
  TorchInfo& torch = torch_info();
  if (torch.tensor_type != nullptr && PyObject_TypeCheck(object.ptr(), torch.tensor_type)) {
    return from_torch(object, site, what, keep);
  }
  if (nb::hasattr(object, "__dlpack__")) return from_dlpack_object(object, site, what, keep);
  if (object.is_none()) {
    throw TensorTypeError(site.prefix() + ": " + what +
                          " is None, not a tensor (a numpy array, a torch tensor, or an object "
                          "with __dlpack__)");
  }
  throw TensorTypeError(site.prefix() + ": " + what + " is a " + py_type_name(object) +
                        ", not a tensor (a numpy array, a torch tensor, or an object with "
                        "__dlpack__)");
}

bool is_sequence(nb::handle object) {
  return PyList_Check(object.ptr()) || PyTuple_Check(object.ptr());
}

std::vector<TensorView> to_views(nb::handle sequence, Access access, const Site& site,
                                 const char* what, Keep& keep) {
  if (!is_sequence(sequence)) {
    throw TensorTypeError(site.prefix() + ": " + what + " must be a list of tensors, not a " +
                          py_type_name(sequence));
  }
  nb::object items = nb::borrow(sequence);
  const size_t n = nb::len(items);
  std::vector<TensorView> views;
  views.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string name = std::string(what) + "[" + std::to_string(i) + "]";
    views.push_back(to_view(items[i], access, site, name.c_str(), keep));
  }
  return views;
}

Framework parse_framework(nb::handle name, const char* op) {
  if (name.is_none()) return Framework::kNumpy;
  const std::string s = text_of(name);
  if (s == "numpy" || s == "np") return Framework::kNumpy;
  if (s == "torch" || s == "pytorch") return Framework::kTorch;
  throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": framework '" + s +
                                               "' is not known (expected 'numpy' or 'torch')");
}

// ---- torch tensors through torch._C._from_dlpack -------------------------------------------
namespace {

// nanobind's export of an ndarray to torch goes through torch.utils.dlpack.from_dlpack in Python
// (2.1 us a tensor here); handing torch's C entry a DLPack capsule takes half that, which counts
// in a get of thousands of tensors.

// A DLManagedTensor, the owner it keeps alive, and its shape after it.
struct TorchExport {
  DLManagedTensor managed;
  PyObject* owner;
};

// False once the interpreter is gone (Py_AtExit): a tensor deleted then leaves its owner be. Not
// Py_IsInitialized, which turns false before the last collections of the finalisation, whose
// tensors must still let their owners go.
std::atomic<bool> python_alive{true};

void torch_export_delete(DLManagedTensor* managed) {
  auto* e = static_cast<TorchExport*>(managed->manager_ctx);
  // Torch may drop its last reference on a thread of its own, without the GIL.
  if (e->owner != nullptr && python_alive.load()) {
    const PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(e->owner);
    PyGILState_Release(gil);
  }
  std::free(e);
}

// A capsule torch never took (it renames the ones it takes, "used_dltensor") deletes its tensor.
void dltensor_capsule_delete(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  managed->deleter(managed);
}

// torch._C._from_dlpack, looked up once under the GIL (nullptr where torch lacks it: nanobind's
// export then). Not a function-local static: its initialiser imports torch, which may give up
// the GIL while another thread waits on the static's guard holding it.
PyObject* torch_from_dlpack() {
  static PyObject* fn = nullptr;
  static bool looked = false;
  if (looked) return fn;
  PyObject* found = nullptr;
  if (PyObject* torch = PyImport_ImportModule("torch")) {
    if (PyObject* c = PyObject_GetAttrString(torch, "_C")) {
      found = PyObject_GetAttrString(c, "_from_dlpack");
      Py_DECREF(c);
    }
    Py_DECREF(torch);
  }
  if (found == nullptr) {
    // Not there (nanobind's export then, for good); anything else (an interrupt) is raised.
    if (!PyErr_ExceptionMatches(PyExc_ImportError) &&
        !PyErr_ExceptionMatches(PyExc_AttributeError)) {
      throw nb::python_error();
    }
    PyErr_Clear();
  }
  if (!looked) {  // another thread may have looked meanwhile (the import gives up the GIL)
    fn = found;   // kept for the process's life
    looked = true;
    Py_AtExit([] { python_alive = false; });
  } else {
    Py_XDECREF(found);
  }
  return fn;
}

nb::object torch_tensor(const TensorView& view, nb::handle owner, PyObject* from_dlpack) {
  const size_t ndim = view.shape().size();
  auto* e = static_cast<TorchExport*>(std::malloc(sizeof(TorchExport) + ndim * sizeof(int64_t)));
  if (e == nullptr) throw std::bad_alloc();
  auto* shape = reinterpret_cast<int64_t*>(e + 1);
  std::copy(view.shape().begin(), view.shape().end(), shape);
  DLTensor& t = e->managed.dl_tensor;
  t.data = view.data();
  t.device.device_type = view.device().is_cuda() ? kDLCUDA : kDLCPU;
  t.device.device_id = view.device().is_cuda() ? view.device().index : 0;
  t.ndim = static_cast<int32_t>(ndim);
  const nb::dlpack::dtype d = to_nb_dtype(view.dtype());  // bool as DLPack's kDLBool
  t.dtype.code = d.code;
  t.dtype.bits = d.bits;
  t.dtype.lanes = d.lanes;
  t.shape = shape;
  t.strides = nullptr;  // compact, row-major
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = torch_export_delete;
  e->owner = owner.ptr();
  Py_XINCREF(e->owner);
  PyObject* capsule = PyCapsule_New(&e->managed, "dltensor", dltensor_capsule_delete);
  if (capsule == nullptr) {
    torch_export_delete(&e->managed);
    throw nb::python_error();
  }
  PyObject* tensor = PyObject_CallOneArg(from_dlpack, capsule);
  Py_DECREF(capsule);
  if (tensor == nullptr) throw nb::python_error();
  return nb::steal(tensor);
}

}  // namespace

nb::object from_view(const TensorView& view, nb::handle owner, Framework framework,
                     bool read_only) {
  // First: torch's own entry builds what it needs from the view (a get of thousands of tensors
  // comes here once for each).
  PyObject* from_dlpack = framework == Framework::kTorch ? torch_from_dlpack() : nullptr;
  if (from_dlpack != nullptr) return torch_tensor(view, owner, from_dlpack);
  std::vector<size_t> shape(view.shape().begin(), view.shape().end());
  const nb::dlpack::dtype dtype = to_nb_dtype(view.dtype());
  const int device_type =
      view.device().is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  const int device_id = view.device().is_cuda() ? view.device().index : 0;
  if (framework == Framework::kTorch) {
    nb::ndarray<nb::pytorch> a(view.data(), shape.size(), shape.data(), owner, nullptr, dtype,
                               device_type, device_id);
    return nb::cast(a, nb::rv_policy::reference);
  }
  if (view.dtype() == DType::kBFloat16) {
    throw TensorTypeError("numpy has no bfloat16: ask for torch tensors (framework='torch')");
  }
  if (read_only) {
    nb::ndarray<nb::numpy, nb::ro> a(view.data(), shape.size(), shape.data(), owner, nullptr, dtype,
                                     device_type, device_id);
    return nb::cast(a, nb::rv_policy::reference);
  }
  nb::ndarray<nb::numpy> a(view.data(), shape.size(), shape.data(), owner, nullptr, dtype,
                           device_type, device_id);
  return nb::cast(a, nb::rv_policy::reference);
}

}  // namespace tutti::python
