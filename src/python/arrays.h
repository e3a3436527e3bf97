// The caller's memory as tandem reads it: a NumPy array (the buffer protocol) or any tensor that
// exports itself with DLPack (`__dlpack__`: PyTorch, JAX, CuPy...), checked to lie in CPU memory,
// C-contiguous, and described by its element type and shape, so that a run can bind it with no
// copy (exec::Runner::bind) or read it once.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem::python {

namespace py = pybind11;

struct CallerArray {
  void* data = nullptr;
  std::optional<DType> dtype;  // none: an element type tandem has no dtype for
  std::string dtype_name;      // as the caller's library prints it: "float32", "torch.bfloat16"
  std::vector<int64_t> shape;
  bool writable = true;
  py::object owner;  // keeps the memory alive: the array itself, or the consumed DLPack capsule

  int64_t numel() const;
  size_t nbytes() const;
  std::string shape_str() const;  // "[4, 8]"
  // The memory as a tensor of `dtype` (which must be this array's), a view that does not own it.
  Tensor view() const;
  // Whether this array's bytes and `other`'s overlap.
  bool overlaps(const CallerArray& other) const;
};

// Reads `h`. One UserError naming `where` when it is neither a NumPy array nor a DLPack exporter,
// lies in another device's memory, is not C-contiguous, or cannot be exported (a PyTorch tensor
// that requires grad: pass t.detach()).
CallerArray caller_array(const py::handle& h, const std::string& where);

// Whether `h` is something caller_array reads (a NumPy array or a DLPack exporter).
bool is_array_like(const py::handle& h);

// "list", "torch.Tensor": a value's type, for messages.
std::string type_name(const py::handle& h);

// The NumPy dtype name of a tandem dtype, for messages ("float32", "bfloat16", "float16").
std::string element_name(DType dtype);

}  // namespace tandem::python
