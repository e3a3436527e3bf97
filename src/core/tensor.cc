// Tensor storage, views and conversions.
#include "tandem/core/tensor.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "tandem/core/error.h"

namespace tandem {

Tensor Tensor::empty(DType dtype, Shape shape, Allocator& alloc) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  const size_t bytes = t.nbytes();
  void* p = alloc.allocate(bytes);
  t.storage_ = std::shared_ptr<void>(p, [&alloc, bytes](void* q) { alloc.deallocate(q, bytes); });
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape, Allocator& alloc) {
  Tensor t = empty(dtype, std::move(shape), alloc);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::view_of(void* data, DType dtype, Shape shape) {
  Tensor t;
  t.data_ = data;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::flat_slice(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin + count > numel())
    user_error("slice [{}, {}) is out of range for tensor {}", begin, begin + count, str());
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin) * dtype_size(dtype_);
  t.shape_ = Shape{count};
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  if (shape.numel() != numel())
    user_error("cannot reshape {} to {}: element counts differ", str(), shape.str());
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone(Allocator& alloc) const {
  Tensor t = empty(dtype_, shape_, alloc);
  if (nbytes() > 0) std::memcpy(t.data_, data_, nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(dtype, shape_);
  for (int64_t i = 0; i < numel(); ++i) t.set(i, get(i));
  return t;
}

// The value converted once, then stored as its bits: a gradient buffer is zeroed every step, and
// an element-by-element conversion of a large model's took tens of milliseconds.
void Tensor::fill(float v) const {
  const int64_t n = numel();
  if (n == 0) return;
  if (dtype_ == DType::F32) {
    std::fill_n(static_cast<float*>(data_), n, v);
    return;
  }
  set(0, v);  // every other dtype is 16 bits wide (dtype_size)
  uint16_t* bits = static_cast<uint16_t*>(data_);
  std::fill_n(bits + 1, n - 1, bits[0]);
}

std::string Tensor::str() const { return fmt::format("{}{}", dtype_name(dtype_), shape_.str()); }

void Tensor::check_element_type(size_t size, bool is_float) const {
  const bool ok = dtype_ == DType::F32 ? (size == 4 && is_float) : (size == 2 && !is_float);
  if (!ok) internal_error(fmt::format("typed access of size {} to a {} tensor", size, str()));
}

}  // namespace tandem
