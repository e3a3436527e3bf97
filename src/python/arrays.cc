// Reading the caller's arrays: NumPy through pybind11's buffer view, everything else through
// DLPack, the one zero-copy exchange format of the array libraries. The DLPack structs are
// declared here: a stable C ABI of five plain structs (dlpack.h 0.x, what PyTorch 1.13 exports),
// not worth a build dependency of its own.
#include "arrays.h"

#include <fmt/format.h>
#include <pybind11/numpy.h>

#include <cstdint>

#include "tandem/core/error.h"

namespace tandem::python {
namespace {

// --- The DLPack ABI (github.com/dmlc/dlpack, include/dlpack/dlpack.h, version 0.x).
struct DLDevice {
  int32_t device_type;  // kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, ...
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, ...
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: C-contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDAHost = 3;  // pinned host memory: the CPU reads it where it lies
constexpr uint8_t kDLFloat = 2;
constexpr uint8_t kDLBfloat = 4;

}  // namespace

std::string type_name(const py::handle& h) {
  const std::string module = py::str(h.get_type().attr("__module__"));
  const std::string name = py::str(h.get_type().attr("__name__"));
  return module == "builtins" ? name : module + "." + name;
}

namespace {

// The device a DLPack exporter names, as its library prints it when it can ("cuda:0").
std::string device_name(const py::handle& h, int32_t type, int32_t id) {
  if (py::hasattr(h, "device")) return py::str(h.attr("device"));
  static const char* const kNames[] = {"?",      "cpu",   "cuda", "cuda_host", "opencl",
                                       "vulkan", "metal", "vpi",  "rocm"};
  const char* name = type >= 0 && type < 9 ? kNames[type] : "device type";
  return fmt::format("{}:{}", name, type == 0 || type >= 9 ? type : id);
}

CallerArray from_numpy(const py::array& a, const std::string& where) {
  if ((a.flags() & py::array::c_style) == 0)
    user_error("{}: the array is not C-contiguous (pass numpy.ascontiguousarray(a))", where);
  CallerArray out;
  out.data = const_cast<void*>(a.data());
  out.dtype_name = py::str(a.dtype());
  if (a.dtype().is(py::dtype::of<float>()))
    out.dtype = DType::F32;
  else if (a.dtype().is(py::dtype("float16")))
    out.dtype = DType::F16;
  out.shape.assign(a.shape(), a.shape() + a.ndim());
  out.writable = a.writeable();
  out.owner = a;
  return out;
}

CallerArray from_dlpack(const py::handle& h, const std::string& where) {
  // The protocol: ask the device first, then export (a device the consumer cannot reach is not
  // exported at all).
  int32_t type = 0, id = 0;
  if (py::hasattr(h, "__dlpack_device__")) {
    try {
      const py::tuple device = h.attr("__dlpack_device__")();
      type = device[0].cast<int32_t>();
      id = device[1].cast<int32_t>();
    } catch (const py::error_already_set& e) {
      user_error("{}: a {} on device {}, which DLPack cannot export; tandem reads CPU memory",
                 where, type_name(h),
                 py::hasattr(h, "device") ? std::string(py::str(h.attr("device"))) : e.what());
    }
    if (type != kDLCPU && type != kDLCUDAHost)
      user_error("{}: the tensor is on device {}; tandem reads CPU memory (pass t.cpu())", where,
                 device_name(h, type, id));
  }
  py::object capsule;
  try {
    capsule = h.attr("__dlpack__")();
  } catch (const py::error_already_set& e) {
    user_error("{}: the {} could not be exported with DLPack: {}", where, type_name(h), e.what());
  }
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor"))
    user_error("{}: {}.__dlpack__() did not return a DLPack capsule (or returned a used one)",
               where, type_name(h));
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  // Consumed: the capsule no longer frees the tensor; the owner below does, when tandem is done.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  CallerArray out;
  out.owner = py::capsule(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
    user_error("{}: the tensor is on device {}; tandem reads CPU memory (pass t.cpu())", where,
               device_name(h, t.device.device_type, t.device.device_id));
  out.data = static_cast<char*>(t.data) + t.byte_offset;
  out.shape.assign(t.shape, t.shape + t.ndim);
  out.dtype_name = py::hasattr(h, "dtype") ? std::string(py::str(h.attr("dtype")))
                                           : fmt::format("dlpack(code {}, {} bits, {} lanes)",
                                                         t.dtype.code, t.dtype.bits, t.dtype.lanes);
  if (t.dtype.lanes == 1 && t.dtype.code == kDLFloat && t.dtype.bits == 32) out.dtype = DType::F32;
  if (t.dtype.lanes == 1 && t.dtype.code == kDLFloat && t.dtype.bits == 16) out.dtype = DType::F16;
  if (t.dtype.lanes == 1 && t.dtype.code == kDLBfloat && t.dtype.bits == 16)
    out.dtype = DType::BF16;
  if (t.strides != nullptr) {  // row-major, where a dim of one element may have any stride
    int64_t want = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != want)
        user_error(
            "{}: the tensor is not C-contiguous (shape {}, strides {}; pass "
            "t.contiguous())",
            where, out.shape_str(),
            fmt::format("[{}]", fmt::join(t.strides, t.strides + t.ndim, ", ")));
      want *= t.shape[i];
    }
  }
  return out;
}

}  // namespace

int64_t CallerArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t CallerArray::nbytes() const {
  return dtype ? static_cast<size_t>(numel()) * dtype_size(*dtype) : 0;
}

std::string CallerArray::shape_str() const { return Shape(shape).str(); }

Tensor CallerArray::view() const { return Tensor::view_of(data, *dtype, Shape(shape)); }

bool CallerArray::overlaps(const CallerArray& other) const {
  const auto* a = static_cast<const char*>(data);
  const auto* b = static_cast<const char*>(other.data);
  return nbytes() > 0 && other.nbytes() > 0 && a < b + other.nbytes() && b < a + nbytes();
}

bool is_array_like(const py::handle& h) {
  return py::isinstance<py::array>(h) || py::hasattr(h, "__dlpack__");
}

CallerArray caller_array(const py::handle& h, const std::string& where) {
  if (py::isinstance<py::array>(h)) return from_numpy(py::reinterpret_borrow<py::array>(h), where);
  if (py::hasattr(h, "__dlpack__")) return from_dlpack(h, where);
  user_error("{}: expected a NumPy array or a tensor with __dlpack__ (a torch.Tensor), got {}",
             where, type_name(h));
}

std::string element_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "float32";
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
  }
  return "?";
}

}  // namespace tandem::python
