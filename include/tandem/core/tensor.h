// Tensor: a contiguous row-major array of one dtype, either owning its storage (allocated through
// an Allocator, 64-byte aligned) or a view of storage owned elsewhere. Copies share storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tandem/core/allocator.h"
#include "tandem/core/dtype.h"
#include "tandem/core/shape.h"

namespace tandem {

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised storage from `alloc`.
  static Tensor empty(DType dtype, Shape shape, Allocator& alloc = host_allocator());
  static Tensor zeros(DType dtype, Shape shape, Allocator& alloc = host_allocator());
  // A view of memory the caller owns and keeps alive.
  static Tensor view_of(void* data, DType dtype, Shape shape);

  // Elements [begin, begin + count) of the flattened tensor, as a 1-D view sharing storage.
  Tensor flat_slice(int64_t begin, int64_t count) const;
  // The same elements under another shape with the same element count.
  Tensor reshape(Shape shape) const;
  // A new owning tensor with the same contents.
  Tensor clone(Allocator& alloc = host_allocator()) const;
  // This tensor's elements converted to `dtype` (rounded to nearest even), in a new tensor.
  Tensor to(DType dtype) const;

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }
  bool owning() const { return storage_ != nullptr; }

  void* data() const { return data_; }
  // Typed access: float for f32, uint16_t for bf16/f16 bits. The type must match the dtype.
  template <typename T>
  T* data_as() const {
    check_element_type(sizeof(T), std::is_same_v<T, float>);
    return static_cast<T*>(data_);
  }

  float get(int64_t i) const { return load_as_f32(data_, dtype_, static_cast<size_t>(i)); }
  void set(int64_t i, float v) const { store_from_f32(data_, dtype_, static_cast<size_t>(i), v); }
  void fill(float v) const;

  std::string str() const;  // "f32[4, 8]"

 private:
  void check_element_type(size_t size, bool is_float) const;

  std::shared_ptr<void> storage_;  // null for a view of foreign memory
  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  Shape shape_;
};

}  // namespace tandem
